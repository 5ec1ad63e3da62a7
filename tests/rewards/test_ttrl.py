"""Test-time RL rewards: majority vote and its tie rule, the label-leak guard, training rows without labels (and
removing them changes nothing), the held-out label audit (pass@1, maj@n), and the best-so-far bookkeeping of the
continuous (TTT-Discover) mode, its state file included."""

import asyncio
import json

import pytest

from posttrain.envs.base import score_groups
from posttrain.envs.scoring import score_of
from posttrain.envs.task import TaskLoadError
from posttrain.tasks.load import load_task
from posttrain.rewards.best_so_far import BestSoFarReward, improvement_rewards
from posttrain.rewards.majority_vote import (LabelAudit, LabelLeakError, MajorityVoteReward, Vote, last_line,
                                             last_number, majority_vote)
from posttrain.rewards.telemetry import drain_task_metrics
from posttrain.types import Trajectory, Turn


def test_majority_vote_and_the_tie_rule():
    assert majority_vote(["3", "4", "3", None]) == Vote("3", 2, 3, False)
    # a tie: "first" takes the tied answer that appears first in the group; "none" gives no majority
    assert majority_vote(["5", "4", "4", "5"]).label == "5" and majority_vote(["5", "4", "4", "5"]).tie
    assert majority_vote(["4", "5", "5", "4"]).label == "4"
    assert majority_vote(["5", "4", "4", "5"], tie="none") == Vote(None, 2, 4, True)
    assert majority_vote([None, None]) == Vote(None, 0, 0, False)  # nobody answered: nobody is rewarded
    with pytest.raises(ValueError, match="tie must be one of"):
        majority_vote(["1"], tie="random")


def test_extractors():
    assert last_number("3 + 4 = 7.0") == "7" and last_number("it is -12") == "-12" and last_number("x") is None
    assert last_number("1.50") == "1.5" and last_line("work\n\n Paris \n") == "paris"


def test_group_reward_agreement_and_tie_none():
    r = MajorityVoteReward(last_number)
    assert r(["7", "the answer is 7", "8", "no idea"], ttrl_id=["a"] * 4) == [1.0, 1.0, 0.0, 0.0]
    assert MajorityVoteReward(last_number, tie="none")(["1", "2"]) == [0.0, 0.0]
    m = r.drain_metrics()
    assert m == {"ttrl/groups": 1.0, "ttrl/majority_share": 0.5, "ttrl/no_answer": 0.25, "ttrl/ties": 0.0}


def test_the_reward_refuses_labels():
    r = MajorityVoteReward(last_number)
    with pytest.raises(LabelLeakError, match="label column"):
        r(["1", "1"], answer=["1", "1"])
    # through the loop's group scoring, a labelled row fails its samples (counted), it does not train on them
    task = load_task("ttrl", {"base": "arith", "n_train": 4, "n_eval": 2})

    class Env:
        def __init__(self, task):
            self.task = task

        async def score(self, trajs):
            return [score_of(t) for t in trajs]

    leaky = {**task.train_rows[0], "answer": "3"}
    g = [Trajectory([Turn([1], [2], [0.0], 0)], completion_text="3", row=leaky) for _ in range(2)]
    (g,) = asyncio.run(score_groups(Env(task), [g]))
    assert all(t.failed and "label column" in t.error for t in g)


def test_training_rows_carry_no_labels_and_removing_them_changes_nothing(tmp_path):
    base = tmp_path / "unlabelled.py"
    base.write_text("from posttrain.tasks.arith import make_task as arith\n\n"
                    "def make_task(**kw):\n    t = arith(**kw)\n"
                    "    t.train_rows = [{k: v for k, v in r.items() if k != 'answer'} for r in t.train_rows]\n"
                    "    return t\n")
    labelled = load_task("ttrl", {"base": "arith", "n_train": 8, "n_eval": 4})
    unlabelled = load_task("ttrl", {"base": f"{base}:make_task", "n_train": 8, "n_eval": 4})
    assert labelled.train_rows == unlabelled.train_rows
    assert not any("answer" in r for r in labelled.train_rows)
    completions = ["12", "12", "3", "x"]
    for row in labelled.train_rows:
        cols = {k: [v] * 4 for k, v in row.items() if k != "prompt"}
        assert labelled.group_rewards[0](completions, **cols) == unlabelled.group_rewards[0](completions, **cols)


def test_label_audit_pass_at_1_and_majority_correct_on_held_out_only():
    task = load_task("ttrl", {"base": "arith", "n_train": 4, "n_eval": 2})
    votes, audit = task.group_rewards[0], task.rubric.components[0].func
    label = audit.labels["eval-0"]
    wrong = str(int(label) + 1)
    ev = {"ttrl_id": ["eval-0"] * 4}
    votes([label, label, wrong, "?"], **ev)  # majority right
    votes([wrong, wrong, label, label], ttrl_id=["eval-1"] * 4)  # a tie, broken towards the first: wrong
    assert audit([label, wrong, "?", label], **ev) == [1.0, 0.0, 0.0, 1.0]
    votes(["1", "1"], ttrl_id=["train-0"] * 2)  # training groups: no label known, nothing recorded
    assert audit(["1", "1"], ttrl_id=["train-0"] * 2) == [0.0, 0.0]
    audit([label], ttrl_id=["smoke-0"])  # env-check rows: scored, never counted
    m = drain_task_metrics(task)
    correct1 = float(audit.labels["eval-1"] == wrong)
    assert m["ttrl/pass_at_1"] == 0.5 and m["ttrl/labelled_groups"] == 2.0
    assert m["ttrl/majority_correct"] == (1.0 + correct1) / 2 and m["ttrl/groups"] == 3.0
    assert drain_task_metrics(task) == {}


def test_bad_ttrl_options():
    for opts, msg in [({"mode": "vote"}, "mode must be one of"), ({"extractor": "regex"}, "unknown extractor"),
                      ({"tie": "coin"}, "tie must be one of"), ({"base": "ttrl"}, "not ttrl itself"),
                      ({"mode": "discover", "base": "count-a", "problem": 999}, "problem must be in")]:
        with pytest.raises(TaskLoadError, match=msg):
            load_task("ttrl", {"base": "arith", **opts})


def test_improvement_bookkeeping():
    rewards, best = improvement_rewards([0.2, 0.5, None], 0.0)
    assert rewards == [0.2, 0.5, 0.0] and best == 0.5
    rewards, best = improvement_rewards([0.4, 0.7], best)  # compared with the best before this group
    assert rewards == [0.0, pytest.approx(0.2)] and best == 0.7
    rewards, best = improvement_rewards([0.1, None], best)  # nothing better: no reward, the best stays
    assert rewards == [0.0, 0.0] and best == 0.7


def test_best_so_far_reward_keeps_and_persists_its_state(tmp_path):
    state = tmp_path / "best.json"
    scorer = lambda completions, rows: [c.count("a") / len(c) if c else None for c in completions]  # noqa: E731
    r = BestSoFarReward(scorer, state_file=state)
    assert r(["ab", "aaab", ""], ttrl_id=["p"] * 3) == [0.5, 0.75, 0.0]
    assert r(["aaaa", "b"], ttrl_id=["p"] * 2) == [0.25, 0.0]
    assert r(["aa"], ttrl_id=["p"]) == [0.0]
    saved = json.loads(state.read_text())
    assert saved["best"] == {"p": 1.0} and saved["best_text"] == {"p": "aaaa"}
    again = BestSoFarReward(scorer, state_file=state)  # a new run with the same file carries on
    assert again(["aaab"], ttrl_id=["p"]) == [0.0] and again.best["p"] == 1.0
    m = r.drain_metrics()
    assert m["ttrl/best_score"] == 1.0 and m["ttrl/improved_groups"] == pytest.approx(2 / 3)


def test_discover_mode_wraps_a_task_scorer():
    task = load_task("ttrl", {"base": "count-a", "mode": "discover", "problem": 3})
    assert len(task.train_rows) == 1 and task.train_rows[0]["ttrl_id"] == "problem-3"
    assert all(c.weight == 0.0 for c in task.rubric.components)  # the rubric only logs; the reward is improvement
    row = task.train_rows[0]
    cols = {k: [v] * 2 for k, v in row.items() if k != "prompt"}
    fn = task.group_rewards[0]
    assert fn(["ab", "bb"], **cols) == [0.5, 0.0]
    assert fn(["aaab", "a"], **cols) == [0.25, 0.5]
