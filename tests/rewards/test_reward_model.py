"""Bradley-Terry reward models: the loss math, data loading, training on tiny-random, folder checks, scoring."""

import json
import math
import random

import pytest
import torch

from posttrain.rewards.reward_model import (RewardModelError, check_reward_model_folder, format_pair, load_scorer,
                                            reward_model)
from posttrain.training.preference_data import PreferenceDataError, load_pairs, to_pairs
from posttrain.training.reward_model_fit import RMTrainConfig, bradley_terry_loss, pair_accuracy, train_reward_model


def test_bt_loss_is_log2_at_a_tie_and_falls_with_the_margin():
    z = torch.zeros(4)
    assert bradley_terry_loss(z, z).item() == pytest.approx(math.log(2))
    c, r = torch.tensor([2.0, -1.0]), torch.tensor([0.5, 0.0])
    manual = -sum(math.log(1 / (1 + math.exp(-(a - b)))) for a, b in zip(c.tolist(), r.tolist())) / 2
    assert bradley_terry_loss(c, r).item() == pytest.approx(manual, rel=1e-6)
    assert bradley_terry_loss(torch.tensor([5.0]), torch.tensor([0.0])) < bradley_terry_loss(
        torch.tensor([1.0]), torch.tensor([0.0]))
    # logsigmoid: a confidently wrong pair costs its margin, not inf
    assert bradley_terry_loss(torch.tensor([-100.0]), torch.tensor([0.0])).item() == pytest.approx(100.0)
    # a required margin shifts the difference
    assert bradley_terry_loss(torch.tensor([1.0]), torch.tensor([0.0]), torch.tensor([1.0])).item() == \
        pytest.approx(math.log(2))


def test_bt_loss_gradient_raises_chosen_and_lowers_rejected():
    c, r = torch.zeros(3, requires_grad=True), torch.zeros(3, requires_grad=True)
    bradley_terry_loss(c, r).backward()
    assert (c.grad < 0).all() and (r.grad > 0).all()
    assert torch.allclose(c.grad, -r.grad)


def test_pair_accuracy():
    assert pair_accuracy([1, 2, 3], [0, 3, 1]) == pytest.approx(2 / 3)
    assert pair_accuracy([1.0], [1.0]) == 0.0  # a tie is a miss: a constant model scores 0
    assert math.isnan(pair_accuracy([], []))
    with pytest.raises(ValueError):
        pair_accuracy([1], [])


def test_format_pair_reads_strings_and_messages():
    assert format_pair("hi", "hello") == "User: hi\nAssistant: hello"
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert format_pair(msgs, [{"role": "assistant", "content": "yo"}]) == "System: be brief\nUser: hi\nAssistant: yo"
    assert format_pair(None, "x") == "Assistant: x"


def test_bad_preference_rows_fail_clearly(tmp_path):
    with pytest.raises(PreferenceDataError, match="row 1 has no rejected"):
        to_pairs([{"prompt": "p", "chosen": "a", "rejected": "b"}, {"prompt": "p", "chosen": "a"}])
    with pytest.raises(PreferenceDataError, match="empty"):
        to_pairs([{"prompt": "p", "chosen": " ", "rejected": "b"}])
    with pytest.raises(PreferenceDataError, match="not found"):
        load_pairs(str(tmp_path / "nope.jsonl"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "p", "chosen": "a", "rejected": "b"}\n{not json\n')
    with pytest.raises(PreferenceDataError, match="bad.jsonl:2"):
        load_pairs(str(bad))


def test_message_list_pairs_take_the_last_message_as_response():
    (p,) = to_pairs([{"chosen": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "good"}],
                      "rejected": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "bad"}]}])
    assert p.chosen == "good" and p.rejected == "bad" and p.prompt == [{"role": "user", "content": "q"}]


def test_builtin_and_jsonl_sources(tmp_path):
    train, held = load_pairs("product-blurb")
    assert len(train) == 3000 and len(held) == 400
    f = tmp_path / "pairs.jsonl"
    f.write_text("".join(json.dumps({"prompt": "p", "chosen": f"a{i}", "rejected": f"b{i}"}) + "\n" for i in range(5)))
    train, held = load_pairs(str(f))
    assert len(train) == 5 and held is None


def test_missing_folder_is_a_clear_error(tmp_path):
    with pytest.raises(RewardModelError, match="not found.*posttrain rm train"):
        reward_model(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(RewardModelError, match="no config.json"):
        reward_model(tmp_path / "empty")


def test_a_folder_that_is_not_a_reward_model_is_a_clear_error(tmp_path):
    from posttrain.models.tiny import tiny_random_model

    model, tok = tiny_random_model()
    model.save_pretrained(tmp_path / "policy")
    with pytest.raises(RewardModelError, match="not a reward model.*LlamaForCausalLM"):
        reward_model(tmp_path / "policy")
    cls = tmp_path / "classifier"
    cls.mkdir()
    (cls / "config.json").write_text(json.dumps({"architectures": ["LlamaForSequenceClassification"],
                                                 "id2label": {"0": "a", "1": "b"}}))
    with pytest.raises(RewardModelError, match="2 labels"):
        check_reward_model_folder(cls)


def _trivial_pairs(n, seed):
    """Chosen ends in one letter of a pair, rejected in the other (a/z, b/y, c/x, d/w): the last token decides,
    which a 2-layer random model can learn. Four letter pairs, so a random head does not order them all right."""
    rng = random.Random(seed)
    words = ["cat", "dog", "sun", "map", "key", "box", "cup", "pen"]
    out = []
    for i in range(n):
        good, bad = ["a", "b", "c", "d"][i % 4], ["z", "y", "x", "w"][i % 4]
        out.append({"prompt": f"say {rng.choice(words)}", "chosen": f"{rng.choice(words)} {good}",
                    "rejected": f"{rng.choice(words)} {bad}"})
    return out


@pytest.fixture(scope="module")
def tiny_rm(tmp_path_factory):
    out = tmp_path_factory.mktemp("rm") / "tiny"
    res = train_reward_model(RMTrainConfig(data=_trivial_pairs(96, 0), eval_data=_trivial_pairs(32, 1),
                                           model="tiny-random", out=str(out), epochs=3, lr=3e-3, batch_size=8,
                                           train_embeddings=True, threads=1, log_every=1000), log=lambda s: None)
    return res


def test_rm_training_on_tiny_random_learns_a_trivial_rule(tiny_rm):
    assert tiny_rm.eval_accuracy >= 0.9 > tiny_rm.eval_accuracy_before, (tiny_rm.eval_accuracy_before,
                                                                          tiny_rm.eval_accuracy)
    assert tiny_rm.epochs[-1]["loss"] < math.log(2)
    meta = json.loads((__import__("pathlib").Path(tiny_rm.out) / "posttrain_reward_model.json").read_text())
    assert meta["eval_accuracy"] == tiny_rm.eval_accuracy
    check_reward_model_folder(tiny_rm.out)


def test_reward_model_function_scores_in_batches_and_loads_once(tiny_rm):
    fn = reward_model(tiny_rm.out, batch_size=3)
    prompts = ["say cat"] * 8
    good = fn(["dog a"] * 4 + ["dog z"] * 4, prompts=prompts)
    assert len(good) == 8 and min(good[:4]) > max(good[4:])
    assert load_scorer(tiny_rm.out) is load_scorer(tiny_rm.out)
    # chat-format completions score like the same text
    chat = fn([[{"role": "assistant", "content": "dog a"}]], prompts=["say cat"])
    assert chat[0] == pytest.approx(good[0], abs=1e-5)


def test_config_rewards_add_a_reward_model_to_any_task(tiny_rm):
    from posttrain.tasks.load import load_task
    from posttrain.rewards.from_config import add_rewards

    task = load_task("count-a")
    rubric = add_rewards(task.rubric, [{"fn": "reward_model", "path": tiny_rm.out, "weight": 0.5, "name": "rm"}])
    assert [c.name for c in rubric.components] == ["a_fraction", "rm"]
    assert rubric.pass_component == "a_fraction"
    (s,) = rubric.score(["aaa"], [{"word": "cat"}], prompts=["say a cat"])
    assert not s.failed and s.components["a_fraction"] == 1.0
    with pytest.raises(ValueError, match="is not a reward"):
        add_rewards(task.rubric, [{"fn": "nope"}])
    with pytest.raises(ValueError, match=r"task.rewards\[0\].path: Field required"):
        add_rewards(task.rubric, [{"fn": "reward_model"}])


def test_product_blurb_task_trains_on_the_rm_and_passes_on_the_rule(tiny_rm):
    from posttrain.envs.smoke_checks import check_task
    from posttrain.tasks.load import load_task

    task = load_task("product-blurb", {"rm": tiny_rm.out})
    assert [c.name for c in task.rubric.components] == ["hidden_rule", "reward_model"]
    assert task.rubric.components[0].weight == 0.0 and task.rubric.pass_component == "hidden_rule"
    assert all(r.ok for r in check_task(task))
    with pytest.raises(RewardModelError):
        load_task("product-blurb", {"rm": "/nonexistent/rm"})
    oracle = load_task("product-blurb", {"reward": "rule"})
    assert [c.name for c in oracle.rubric.components] == ["hidden_rule"]
