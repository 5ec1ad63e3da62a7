"""The local HF judge backend on tiny-random: probabilities, batching equals one at a time, the rubric path."""

import pytest

from posttrain.rewards.judges import JudgeCache, JudgeRunner, LocalHFBackend, PairwiseJudge, PointwiseJudge
from posttrain.rewards.rubric import RewardComponent, Rubric


@pytest.fixture(scope="module")
def backend():
    from posttrain.models import load_model

    model, tok = load_model("tiny-random", seed=0)
    return LocalHFBackend("tiny-random", model_obj=model, tokenizer=tok, max_batch=3)


def test_yes_prob_in_unit_interval_and_batch_invariant(backend):
    prompts = ["Is the sky blue?", "Is this reply JSON?\n{}", "x" * 50, "Say yes."]
    batched = backend.yes_prob(prompts)  # two forwards (max_batch 3), left-padded
    single = [backend.yes_prob([p])[0] for p in prompts]
    assert all(0.0 <= p <= 1.0 for p in batched)
    assert batched == pytest.approx(single, abs=1e-4)


def test_generate_returns_text(backend):
    out = backend.generate(["Rank: [1] a [2] b"], max_tokens=4)
    assert len(out) == 1 and isinstance(out[0], str)


def test_pointwise_in_rubric_with_cache(backend, tmp_path):
    judge = PointwiseJudge(JudgeRunner(backend, JudgeCache(tmp_path / "c.sqlite")),
                           "Reply: {completion}\nIs the reply JSON? Answer Yes or No.")
    rubric = Rubric([RewardComponent("judge", judge, pass_threshold=0.5)])
    s1 = rubric.score(["{}", "hello"], [{"prompt": "p"}] * 2)
    assert not any(s.failed for s in s1)
    judge.drain_metrics()
    s2 = rubric.score(["{}", "hello"], [{"prompt": "p"}] * 2)
    assert [s.reward for s in s2] == [s.reward for s in s1]
    assert judge.drain_metrics()["judge/cache_hit"] == 1.0


def test_pairwise_on_local_model(backend, tmp_path):
    pj = PairwiseJudge(JudgeRunner(backend, JudgeCache(None)), "A: {a}\nB: {b}\nIs A better than B? Answer Yes or No.")
    scores = pj(["one", "two", "three"])
    assert len(scores) == 3 and all(0 <= s <= 1 for s in scores)
    m = pj.drain_metrics()
    assert m["judge/pairs"] == 3 and 0 <= m["judge/position_flips"] <= 3


def test_a_judge_prompt_past_the_judge_models_context_fails_alone():
    """Issue #52: a long completion quoted in a judge prompt went past the judge model's positions; in generate()
    one such prompt failed every prompt of the call."""
    from posttrain.rewards.judges.errors import JudgeBadOutput
    from posttrain.rewards.judges.local_hf import LocalHFBackend

    judge = LocalHFBackend("tiny-random")
    long_ = "Is this right? " + "x" * 3000  # the tiny model has 1024 positions, about a token a character
    probs = judge.yes_prob(["Is 2+2=4?", long_, "Is the sky blue?"])
    assert isinstance(probs[1], JudgeBadOutput) and "does not fit" in str(probs[1])
    assert all(isinstance(p, float) and 0.0 <= p <= 1.0 for p in (probs[0], probs[2]))
    texts = judge.generate(["Rate this: ok", long_], max_tokens=4)
    assert isinstance(texts[0], str) and isinstance(texts[1], JudgeBadOutput)
