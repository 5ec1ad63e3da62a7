"""`decision-routing`: route a customer-support message to one label, with probabilities and a confidence (the
Clef-style calibrated decision: a bounded, typed answer a workflow can act on, and a confidence it can trust).

Each row is a chat prompt plus `gold` (label -> share: {label: 1.0} for a clear message, a distribution for an
ambiguous one), `ambiguous` (bool) and `label` (the gold majority, for reading). Data: decision_data.py; train and
held-out rows use disjoint templates and disjoint ambiguous messages.

Rubric (rewards/decision.py): `decision_schema` (a rubric gate: invalid JSON, an unknown label or probabilities that
are not a distribution -> reward 0), `decision_correct` (the gold share of the chosen label; the pass component, at
0.5, so a majority label on an ambiguous item passes) and `calibration` (`calibration="rlcr"`, default:
1 - (confidence - correct)^2, which with the correctness term makes RLCR's reward plus 1; `"brier"`:
1 - multi-class Brier / 2). Metrics: decision/accuracy, ece, brier, confidence, tokens_per_decision, and the
reliability bins (docs/decision.md).
"""

from __future__ import annotations

import json
import random
import zlib
from typing import Any

from posttrain.envs.smoke_checks import SmokeCheck
from posttrain.envs.task import Task
from posttrain.rewards.decision import CALIBRATIONS, DecisionRewards
from posttrain.rewards.rubric import RewardComponent, Rubric
from posttrain.tasks import decision_data as D

SYSTEM = "You route customer support messages. Labels: " + ", ".join(D.LABELS) + "."
# Short on purpose: SmolLM2-135M must write the whole answer in ~60 tokens. Only the likely labels need a
# probability (the rest count as 0), which keeps the JSON short. A concrete example, not a placeholder outline
# ({"label": L, ...}): with the outline the default model wrote prose on 24 of 24 held-out prompts.
USER = (
    'Message: "{text}"\nReply with only JSON like {{"label": "billing", "probs": {{"billing": 0.7, '
    '"refund": 0.3}}, "confidence": 0.7}}: probs sum to 1, confidence is your chance of being right.'
)

DEFAULT_WEIGHTS = {"decision_schema": 0.1, "decision_correct": 1.0, "calibration": 1.0}


def _fill(template: str, rng: random.Random) -> str:
    return template.format(**{k: rng.choice(v) for k, v in D.SLOTS.items()})


def _row(text: str, gold: dict[str, float], ambiguous: bool) -> dict[str, Any]:
    return {
        "prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER.format(text=text)}],
        "gold": dict(gold),
        "label": max(gold, key=gold.__getitem__),
        "ambiguous": ambiguous,
        "text": text,
    }


def _rows(n: int, part: int, rng: random.Random) -> list[dict[str, Any]]:
    """`n` rows from one part of the pools: the ambiguous messages of that part (at most one row in 8, so they stay
    a minority), then clear messages with labels balanced (counts differ by at most one), shuffled."""
    ambiguous = D.split(D.AMBIGUOUS)[part][: n // 8]
    rows = [_row(t, g, True) for t, g in ambiguous]
    labels = [D.LABELS[i % len(D.LABELS)] for i in range(n - len(rows))]
    for label in labels:
        rows.append(_row(_fill(rng.choice(D.split(D.TEMPLATES[label])[part]), rng), {label: 1.0}, False))
    rng.shuffle(rows)
    return rows


def answer(label: str, probs: dict[str, float], confidence: float) -> str:
    """A well-formed answer (smoke checks, demonstrations)."""
    return json.dumps({"label": label, "probs": probs, "confidence": confidence})


def demonstrate(row: dict[str, Any]) -> list[str]:
    """A calibrated answer for a row: the majority label, the gold distribution as probs, and the majority's share
    as confidence (what the calibration term rewards most)."""
    gold = row["gold"]
    return [answer(row["label"], dict(gold), gold[row["label"]])]


VARIED_CONFIDENCES = (0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


def demonstrate_varied(row: dict[str, Any]) -> list[str]:
    """The right label with a confidence that says nothing: one of VARIED_CONFIDENCES, picked by a hash of the
    message (deterministic), the label's probability equal to it and the rest on the next most likely label.

    Why: the calibrated demonstrations teach confidence 1.0 on every clear message, so after the warm start the policy
    writes the same confidence token on every sample and RL has no variation in it to learn from (measured: GRPO after
    that warm start raised ECE, docs/results/tasks.md). A warm start that teaches the format and the labels but spreads
    the confidence leaves calibration to RL, the setting RLCR trains in (a model whose stated confidence means nothing
    yet)."""
    gold = row["gold"]
    label = row["label"]
    c = VARIED_CONFIDENCES[zlib.crc32(row["text"].encode()) % len(VARIED_CONFIDENCES)]
    rest = sorted((k for k in gold if k != label), key=gold.get, reverse=True)
    other = rest[0] if rest else D.LABELS[(D.LABELS.index(label) + 1) % len(D.LABELS)]
    probs = {label: c} if c == 1.0 else {label: c, other: round(1.0 - c, 2)}
    return [answer(label, probs, c)]


DEMOS = {"calibrated": demonstrate, "varied": demonstrate_varied}


def make_task(
    seed: int = 0,
    n_train: int = 200,
    n_eval: int = 60,
    calibration: str = "rlcr",
    weights: dict[str, float] | None = None,
    prob_tolerance: float = 0.05,
    demos: str = "calibrated",
) -> Task:
    """The `decision-routing` task. Deterministic in `seed`; held-out rows do not depend on `n_train`.
    `calibration`: "rlcr" (default) or "brier" (the calibration component's scoring rule). `weights` overrides
    component weights by name (decision_schema, decision_correct, calibration). `prob_tolerance`: how far from 1
    the probabilities may sum. `demos`: the warm start's demonstrations, "calibrated" (the gold share as
    confidence) or "varied" (right labels, uninformative confidences: calibration is left to RL)."""
    if calibration not in CALIBRATIONS:
        raise ValueError(
            f"calibration must be one of {', '.join(CALIBRATIONS)}, got {calibration!r} "
            "(no log score: it is unbounded, docs/decision.md)"
        )
    if n_train < 1 or n_eval < 0:
        raise ValueError(f"need n_train >= 1 and n_eval >= 0, got n_train={n_train}, n_eval={n_eval}")
    if demos not in DEMOS:
        raise ValueError(f"demos must be one of {', '.join(DEMOS)}, got {demos!r}")
    w = dict(DEFAULT_WEIGHTS)
    for k, v in (weights or {}).items():
        if k not in w:
            raise ValueError(f"unknown weight {k!r}; components: {', '.join(w)}")
        w[k] = float(v)
    r = DecisionRewards(D.LABELS, calibration, prob_tolerance)
    rubric = Rubric(
        [
            RewardComponent("decision_schema", r.schema, weight=w["decision_schema"]),
            RewardComponent("decision_correct", r.correct, weight=w["decision_correct"], pass_threshold=0.5),
            RewardComponent("calibration", r.calibration_score, weight=w["calibration"], pass_threshold=0.9),
        ],
        pass_component="decision_correct",
        gates=["decision_schema"],
    )
    master = random.Random(seed)
    train_rng, eval_rng = random.Random(master.getrandbits(64)), random.Random(master.getrandbits(64))
    train_rows = _rows(n_train, 0, train_rng)
    clear = next(row for row in train_rows if not row["ambiguous"])
    smoke = {**clear, "smoke": True}  # the ledger skips these: they are not the policy's decisions
    gold, other = clear["label"], next(x for x in D.LABELS if x != clear["label"])
    checks = [
        SmokeCheck(
            "the gold label, confident, passes", row=smoke, completion=answer(gold, {gold: 0.9, other: 0.1}, 0.9)
        ),
        SmokeCheck("a wrong label fails", row=smoke, completion=answer(other, {other: 1.0}, 1.0), expect="fail"),
        SmokeCheck(
            "probabilities that do not sum to 1 fail",
            row=smoke,
            completion=answer(gold, {gold: 0.9, other: 0.9}, 0.9),
            expect="fail",
        ),
        SmokeCheck("an unknown label fails", row=smoke, completion=answer("sales", {"sales": 1.0}, 0.9), expect="fail"),
        SmokeCheck("prose fails", row=smoke, completion=f"The label is {gold}.", expect="fail"),
    ]
    return Task(
        name="decision-routing",
        train_rows=train_rows,
        eval_rows=_rows(n_eval, 1, eval_rng),
        rubric=rubric,
        smoke_checks=checks,
        max_tokens=96,
        stop=["\n\n", "\n```"],
        demonstrate=DEMOS[demos],  # a supervised warm start (warm_start.steps)
        description=(
            f"Route a support message to one of {len(D.LABELS)} labels with probabilities and a confidence; "
            f"rewards: valid decision (gate), correctness, calibration ({calibration})."
        ),
    )
