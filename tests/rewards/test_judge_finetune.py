"""`posttrain judge finetune`: bad data refused, a tiny judge learns a separable question, the built-in examples
carry the hidden rule's labels, product-blurb's judge reward, and re-tuned judges never reuse cached verdicts."""

import json
import os

import pytest
from typer.testing import CliRunner

from posttrain.cli.app import app
from posttrain.tasks import product_blurb as pb
from posttrain.rewards.judges import LocalHFBackend
from posttrain.rewards.judges.finetune import JudgeDataError, check_examples, finetune_judge, load_examples


@pytest.mark.parametrize("rows, match", [
    ([], "no examples"),
    ([{"answer": "Yes"}], "no 'question'"),
    ([{"question": "  ", "answer": "Yes"}], "no 'question'"),
    ([{"question": "Is it?", "answer": "maybe"}], "must be Yes or No"),
    ([{"question": "Is it?", "answer": 1}], "must be Yes or No"),
    (["Is it?"], "no 'question'"),
])
def test_bad_examples_are_refused(rows, match):
    with pytest.raises(JudgeDataError, match=match):
        check_examples(rows, "data")


def test_answers_are_normalised_and_files_split(tmp_path):
    assert check_examples([{"question": "q", "answer": " yes "}], "d") == [{"question": "q", "answer": "Yes"}]
    f = tmp_path / "d.jsonl"
    f.write_text("".join(json.dumps({"question": f"q{i}", "answer": "No"}) + "\n" for i in range(20)))
    train, held = load_examples(str(f))
    assert len(train) == 18 and len(held) == 2 and not {r["question"] for r in train} & {r["question"] for r in held}
    with pytest.raises(FileNotFoundError, match="not a built-in"):
        load_examples(str(tmp_path / "missing.jsonl"))


def test_builtin_examples_carry_the_hidden_rule():
    train, held = load_examples("product-blurb", n_train=200, n_eval=40)
    assert len(train) == 200 and len(held) == 40
    assert 0.4 < sum(r["answer"] == "Yes" for r in train) / len(train) < 0.6  # chosen and rejected, balanced
    nouns = {n for n, _ in pb.items("eval")}
    assert all(any(f" {n}" in r["question"] for n in nouns) for r in held[:10])  # held-out items are unseen nouns
    r = train[0]
    text = r["question"].split("Product description: ", 1)[1].split("\n\nDoes this", 1)[0]
    colour = r["question"].split("name the colour ", 1)[1].split(" and have", 1)[0]
    assert (r["answer"] == "Yes") == pb.rule_ok(text, colour)


def test_a_tiny_judge_learns_a_separable_question(tmp_path):
    # Yes when the question names "apple", No for "stone": separable by one word, learnable in a few steps.
    rows = [{"question": f"Item {i}: {w}. Is it food?", "answer": a}
            for i in range(40) for w, a in (("apple", "Yes"), ("stone", "No"))]
    res = finetune_judge(rows[:64], rows[64:], tmp_path / "judge", model="tiny-random", steps=40, batch_size=16,
                         lr=3e-3, log=lambda s: None)
    assert res.accuracy_after >= 0.95 and res.loss_last < res.loss_first, res
    meta = json.loads((tmp_path / "judge" / "posttrain_judge.json").read_text())
    assert meta["accuracy_after"] == res.accuracy_after and meta["base_model"] == "tiny-random"
    probs = LocalHFBackend(str(tmp_path / "judge")).yes_prob(["Item 99: apple. Is it food?",
                                                              "Item 99: stone. Is it food?"])
    assert probs[0] > 0.5 > probs[1]  # the saved folder judges as it was trained


def test_a_re_tuned_judge_folder_gets_a_new_cache_identity(tmp_path):
    d = tmp_path / "j"
    d.mkdir()
    (d / "model.safetensors").write_bytes(b"x" * 10)
    first = LocalHFBackend(str(d)).judge_id
    (d / "model.safetensors").write_bytes(b"y" * 11)
    os.utime(d / "model.safetensors", ns=(1, 1))
    assert LocalHFBackend(str(d)).judge_id != first
    assert LocalHFBackend("default").judge_id == "hf:default"


def test_product_blurb_judge_reward(tmp_path):
    with pytest.raises(FileNotFoundError, match="judge finetune"):
        pb.make_task(reward="judge", judge_model=str(tmp_path / "none"))
    t = pb.make_task(reward="judge", judge_model="tiny-random", n_train=4, n_eval=2)
    names = [c.name for c in t.rubric.components]
    assert names == ["hidden_rule", "judge"] and t.rubric.pass_component == "hidden_rule" and "judge" in t.judges
    assert [c.weight for c in t.rubric.components] == [0.0, 1.0]  # the judge is the only reward


def test_cli_refuses_bad_data(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text(json.dumps({"question": "q", "answer": "perhaps"}) + "\n")
    res = CliRunner().invoke(app, ["judge", "finetune", "--data", str(f), "--model", "tiny-random"])
    assert res.exit_code != 0 and "Yes or No" in res.output


def test_time_budget_stops_training_early(tmp_path):
    rows = [{"question": f"Item {i}: apple?", "answer": "Yes"} for i in range(8)]
    res = finetune_judge(rows, rows[:2], tmp_path / "j", model="tiny-random", steps=1000, batch_size=2,
                         time_budget_s=1e-9, log=lambda s: None)
    assert res.steps == 0  # the budget is checked before each step; the untrained model is still saved
    assert (tmp_path / "j" / "config.json").exists()
    with pytest.raises(ValueError, match="time_budget_s > 0"):
        finetune_judge(rows, rows[:2], tmp_path / "k", model="tiny-random", time_budget_s=0, log=lambda s: None)
