"""`ttrl`: wrap any task for test-time RL (`posttrain ttrl --task NAME`, docs/ttrl.md).

    mode=majority (TTRL)       the task's prompts without labels; reward = agreement of the extracted answer with
                               the group's majority answer (rewards/majority_vote.py). The task's own rubric, which
                               reads labels, is dropped. Labels of the training rows are thrown away when the task is
                               built; held-out labels are kept aside (never in a row) for the eval's pass@1 and maj@n.
    mode=discover (TTT-Discover)  one problem (`problem`: its index among the training rows); reward = how much a
                               completion's score beats the best score so far (rewards/best_so_far.py), the score
                               being the task's own rubric reward. The rubric stays (weight 0) so its components are
                               still logged.

Options: base (the task), mode, extractor (EXTRACTORS; default the base task's in TASK_EXTRACTORS, else
last_number), tie (first | none), label_column (default answer), problem, baseline, state_file; any other option
goes to the base task (e.g. n_train=32).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from posttrain.envs.smoke_checks import SmokeCheck
from posttrain.envs.task import Task, TaskLoadError
from posttrain.rewards.best_so_far import BestSoFarReward
from posttrain.rewards.majority_vote import EXTRACTORS, SMOKE_PREFIX, TIE_RULES, LabelAudit, MajorityVoteReward
from posttrain.rewards.rubric import RewardComponent, Rubric
from posttrain.tasks.load import load_task

MODES = ("majority", "discover")
TASK_EXTRACTORS = {"arith": "last_number", "json-extract": "exact", "search-qa": "last_line"}
ID = "ttrl_id"


def make_task(
    base: str = "arith",
    mode: str = "majority",
    extractor: str | None = None,
    tie: str = "first",
    label_column: str = "answer",
    problem: int = 0,
    baseline: float = 0.0,
    state_file: str | None = None,
    **base_options: Any,
) -> Task:
    if mode not in MODES:
        raise TaskLoadError(f"ttrl: mode must be one of {', '.join(MODES)}, got {mode!r}")
    if base == "ttrl":
        raise TaskLoadError("ttrl: base must be another task, not ttrl itself")
    inner = load_task(base, base_options)
    if mode == "discover":
        return _discover(inner, problem, baseline, state_file)
    name = extractor or TASK_EXTRACTORS.get(base, "last_number")
    if name not in EXTRACTORS:
        raise TaskLoadError(f"ttrl: unknown extractor {name!r}; known: {', '.join(EXTRACTORS)}")
    if tie not in TIE_RULES:
        raise TaskLoadError(f"ttrl: tie must be one of {', '.join(TIE_RULES)}, got {tie!r}")
    extract = EXTRACTORS[name]
    # Training rows: the label is dropped here and kept nowhere. Held-out rows: kept aside by id, for the audit.
    train_rows = [{**_strip(r, label_column), ID: f"train-{i}"} for i, r in enumerate(inner.train_rows)]
    labels: dict[str, str] = {}
    eval_rows = []
    for i, r in enumerate(inner.eval_rows):
        if r.get(label_column) is not None:
            raw = str(r[label_column]).strip()
            labels[f"eval-{i}"] = extract(raw) or raw  # the label in the extractor's own form ('12.0' -> '12')
        eval_rows.append({**_strip(r, label_column), ID: f"eval-{i}"})
    checks = []
    if labels.get("eval-0"):  # the extractor and the label plumbing, on a copy of held-out row 0 that is not counted
        labels[SMOKE_PREFIX + "0"] = labels["eval-0"]
        smoke_row = {**eval_rows[0], ID: SMOKE_PREFIX + "0"}
        checks = [
            SmokeCheck("the held-out label passes the label audit", row=smoke_row, completion=labels["eval-0"]),
            SmokeCheck("an empty answer does not", row=smoke_row, completion="", expect="fail"),
        ]
    votes = MajorityVoteReward(extract, tie, label_columns=(label_column,), id_column=ID)
    audit = LabelAudit(labels, extract, votes, id_column=ID)
    rubric = Rubric([RewardComponent("label_match", audit, weight=0.0)], pass_component="label_match")
    return dataclasses.replace(
        inner,
        name=f"ttrl-{inner.name}",
        train_rows=train_rows,
        eval_rows=eval_rows,
        rubric=rubric,
        group_rewards=[votes],
        group_reward_weights=[1.0],
        smoke_checks=checks,
        demonstrate=None,
        judges={},
        train_pass=False,
        description=f"TTRL on {inner.name}: majority-vote reward ({name}, tie={tie})",
    )


def _strip(row: dict[str, Any], label_column: str) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k != label_column}


def _discover(inner: Task, problem: int, baseline: float, state_file: str | None) -> Task:
    if not 0 <= problem < len(inner.train_rows):
        raise TaskLoadError(f"ttrl: problem must be in [0, {len(inner.train_rows) - 1}], got {problem}")
    row = {**inner.train_rows[problem], ID: f"problem-{problem}"}
    scorer_rubric = inner.rubric
    conv = inner.conversational

    def scorer(completions: list[Any], rows: list[dict[str, Any]]) -> list[float | None]:
        comps = [[{"role": "assistant", "content": c}] if conv and isinstance(c, str) else c for c in completions]
        cols = [{k: v for k, v in r.items() if k not in ("prompt", "prompts")} for r in rows]
        return [None if s.failed else s.reward for s in scorer_rubric.score(comps, cols)]

    logged = Rubric(
        [dataclasses.replace(c, weight=0.0) for c in inner.rubric.components],
        pass_component=inner.rubric.pass_component,
        gates=list(inner.rubric.gates),
    )
    improve = BestSoFarReward(scorer, baseline=baseline, state_file=state_file, id_column=ID)
    return dataclasses.replace(
        inner,
        name=f"ttrl-discover-{inner.name}",
        train_rows=[row],
        eval_rows=[row],
        rubric=logged,
        group_rewards=[improve],
        group_reward_weights=[1.0],
        smoke_checks=[],
        demonstrate=None,
        description=f"TTT-Discover on {inner.name} problem {problem}: best-so-far improvement",
    )
