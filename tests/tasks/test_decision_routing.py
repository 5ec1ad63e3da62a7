"""The built-in `decision-routing` task and its rewards (rewards/decision.py)."""

from __future__ import annotations

import json

import pytest

from posttrain.envs.smoke_checks import check_task, score_completion
from posttrain.envs.task import Task
from posttrain.tasks import builtin_task_factory
from posttrain.tasks.decision_data import LABELS
from posttrain.tasks.decision_routing import answer, demonstrate, make_task
from posttrain.rewards.decision import Decision, parse_decision
from posttrain.rewards.telemetry import drain_task_metrics


@pytest.fixture(scope="module")
def task() -> Task:
    return make_task(seed=0)


def test_shape_and_split(task: Task) -> None:
    assert builtin_task_factory("decision-routing") is make_task
    assert len(task.train_rows) == 200 and len(task.eval_rows) == 60
    assert sum(r["ambiguous"] for r in task.train_rows) > 10 and sum(r["ambiguous"] for r in task.eval_rows) > 3
    train_text = {r["text"] for r in task.train_rows}
    assert not train_text & {r["text"] for r in task.eval_rows}  # no held-out message seen in training
    for r in task.train_rows + task.eval_rows:
        assert abs(sum(r["gold"].values()) - 1.0) < 1e-9 and set(r["gold"]) <= set(LABELS)
        assert r["label"] in LABELS and (len(r["gold"]) > 1 or r["ambiguous"] or r["gold"][r["label"]] == 1.0)
    assert make_task(seed=0).train_rows == task.train_rows  # deterministic
    assert make_task(seed=0, n_train=20).eval_rows == task.eval_rows


def test_demonstrations_score_best(task: Task) -> None:
    for row in [r for r in task.train_rows if r["ambiguous"]][:3] + task.train_rows[:3]:
        (reply,) = task.demonstrate(row)
        s = score_completion(task, row, reply)
        assert s.components["decision_schema"] == 1.0 and s.components["calibration"] == pytest.approx(1.0)
    drain_task_metrics(task)


def test_varied_demonstrations_pass_with_a_spread_of_confidences() -> None:
    t = make_task(seed=0, demos="varied")
    rows = [r for r in t.train_rows if r["ambiguous"]][:3] + t.train_rows[:40]
    confidences = set()
    for row in rows:
        (reply,) = t.demonstrate(row)
        s = score_completion(t, row, reply)
        calibrated = score_completion(t, row, demonstrate(row)[0])
        # The same label as the calibrated demonstration (a valid decision, as right as it), any confidence.
        assert s.components["decision_schema"] == 1.0, reply
        assert s.components["decision_correct"] == calibrated.components["decision_correct"], reply
        confidences.add(json.loads(reply)["confidence"])
        assert t.demonstrate(row) == [reply]  # deterministic
    assert len(confidences) >= 5  # the point: the confidence varies, so RL has something to choose between
    drain_task_metrics(t)
    with pytest.raises(ValueError, match="demos must be one of"):
        make_task(demos="random")


def test_env_check_passes(task: Task) -> None:
    results = check_task(task)
    assert len(results) >= 4 and all(r.ok for r in results), results


@pytest.mark.parametrize("text,why", [
    ("not json", "not one JSON"),
    ('{"label": "billing", "probs": {"billing": 1.0}}', "keys"),
    ('{"label": "sales", "probs": {"billing": 1.0}, "confidence": 1}', "unknown label"),
    ('{"label": "billing", "probs": {"sales": 1.0}, "confidence": 1}', "unknown label"),
    ('{"label": "billing", "probs": {"billing": 0.5}, "confidence": 1}', "sum"),
    ('{"label": "billing", "probs": {"billing": 1.5, "refund": -0.5}, "confidence": 1}', "in [0, 1]"),
    ('{"label": "billing", "probs": {"billing": 1.0}, "confidence": 2}', "confidence"),
    ('{"label": "billing", "probs": {"billing": true}, "confidence": 1}', "number"),
    ('{"label": "billing", "probs": {"billing": NaN}, "confidence": 1}', "not one JSON"),
])
def test_parse_rejects(text: str, why: str) -> None:
    got = parse_decision(text, LABELS)
    assert isinstance(got, str) and why in got


def test_parse_accepts_partial_probs_and_fences() -> None:
    d = parse_decision('```json\n{"label": "refund", "probs": {"refund": 0.8, "shipping": 0.2}, "confidence": 0.8}\n```',
                       LABELS)
    assert isinstance(d, Decision) and d.probs["billing"] == 0.0 and d.probs["refund"] == 0.8


def _row(task: Task, ambiguous: bool) -> dict:
    return next(r for r in task.train_rows if r["ambiguous"] == ambiguous)


def test_rlcr_rewards(task: Task) -> None:
    row = _row(task, False)
    gold, wrong = row["label"], next(x for x in LABELS if x != row["label"])
    right_sure = score_completion(task, row, answer(gold, {gold: 1.0}, 1.0))
    right_unsure = score_completion(task, row, answer(gold, {gold: 0.5, wrong: 0.5}, 0.5))
    wrong_sure = score_completion(task, row, answer(wrong, {wrong: 1.0}, 1.0))
    wrong_unsure = score_completion(task, row, answer(wrong, {wrong: 0.5, gold: 0.5}, 0.5))
    assert right_sure.reward == pytest.approx(0.1 + 1 + 1)  # schema + correct + (1 - 0^2)
    assert right_unsure.reward == pytest.approx(0.1 + 1 + 0.75)
    assert wrong_sure.reward == pytest.approx(0.1)  # the worst valid answer: sure and wrong
    assert wrong_unsure.reward == pytest.approx(0.1 + 0.75)  # hedging a miss beats a sure miss
    assert score_completion(task, row, "prose").reward == 0.0  # the gate
    drain_task_metrics(task)


def test_ambiguous_items_score_the_gold_share(task: Task) -> None:
    row = _row(task, True)
    top = max(row["gold"], key=row["gold"].get)
    s = score_completion(task, row, answer(top, {top: 1.0}, row["gold"][top]))
    assert s.components["decision_correct"] == pytest.approx(row["gold"][top])
    assert s.components["calibration"] == pytest.approx(1.0)  # confidence equal to its chance of agreement
    assert s.passed == (row["gold"][top] >= 0.5)
    drain_task_metrics(task)


def test_brier_option_and_bad_options() -> None:
    t = make_task(calibration="brier", n_train=12, n_eval=0)
    row = next(r for r in t.train_rows if not r["ambiguous"])
    g = row["label"]
    assert score_completion(t, row, answer(g, {g: 1.0}, 0.2)).components["calibration"] == 1.0  # probs, not conf
    with pytest.raises(ValueError, match="log score"):
        make_task(calibration="log")
    with pytest.raises(ValueError, match="unknown weight"):
        make_task(weights={"nope": 1.0})


def test_metrics_each_drain(task: Task) -> None:
    drain_task_metrics(task)
    rows = [r for r in task.train_rows if not r["ambiguous"]][:4]
    comps = [[{"role": "assistant", "content": answer(r["label"], {r["label"]: 1.0}, 0.95)}] for r in rows[:2]]
    comps += [[{"role": "assistant", "content": answer("other" if r["label"] != "other" else "billing",
                                                          {"other" if r["label"] != "other" else "billing": 1.0}, 0.95)}]
              for r in rows[2:3]]
    comps += [[{"role": "assistant", "content": "nope"}]]
    cols = [{k: v for k, v in r.items() if k != "prompt"} for r in rows]
    task.rubric.score(comps, cols, completion_ids=[[1] * 10, [1] * 20, [1] * 30, [1] * 40])
    m = drain_task_metrics(task)
    assert m["decision/n"] == 4 and m["decision/valid_rate"] == 0.75
    assert m["decision/accuracy"] == pytest.approx(0.5) and m["decision/accuracy_valid"] == pytest.approx(2 / 3)
    assert m["decision/tokens_per_decision"] == 25
    assert m["decision/confidence"] == pytest.approx(0.95)
    assert m["decision/ece"] == pytest.approx(abs(2 / 3 - 0.95))
    assert m["decision/brier"] == pytest.approx(2 / 3)
    assert m["decision/rel/b9/n"] == 3 and m["decision/rel/b9/correct_sum"] == 2
    assert drain_task_metrics(task) == {}  # drained


def test_smoke_checks_do_not_reach_the_metrics(task: Task) -> None:
    drain_task_metrics(task)
    check_task(task)
    assert drain_task_metrics(task) == {}


def test_prompt_and_answer_are_short(task: Task) -> None:
    # Measured with SmolLM2-135M-Instruct's tokenizer: prompts <= 113 tokens, this answer 44 (budget: 96).
    # Characters here, so the test needs no model download.
    assert max(len(r["prompt"][0]["content"]) + len(r["prompt"][1]["content"]) for r in task.eval_rows) < 400
    good = answer("billing", {"billing": 0.7, "account": 0.2, "refund": 0.1}, 0.7)
    assert len(good) < 100 and json.loads(good)


def test_eval_logs_decision_metrics(tiny) -> None:
    from posttrain.envs.single_turn import SingleTurnEnv
    from posttrain.loop.evaluate import evaluate
    from posttrain.sampling.scripted import ScriptedSampler
    from posttrain.types import SampleParams

    _, tok = tiny
    t = make_task(n_train=8, n_eval=6)
    rows = [r for r in t.eval_rows if not r["ambiguous"]][:4]
    replies = [answer(r["label"], {r["label"]: 0.8, "other" if r["label"] != "other" else "billing": 0.2}, 0.8)
               for r in rows]
    env = SingleTurnEnv(t, tok, SampleParams(max_tokens=96))
    m, _ = evaluate(env, ScriptedSampler(tok, replies), rows, SampleParams(max_tokens=96))
    assert m["eval/decision/n"] == 4 and m["eval/decision/accuracy"] == 1.0
    assert m["eval/decision/confidence"] == pytest.approx(0.8) and m["eval/decision/ece"] == pytest.approx(0.2)
    assert m["eval/decision/tokens_per_decision"] > 10 and m["eval/decision/rel/b8/n"] == 4
