"""On-policy distillation through the real loop (algorithm.teacher): the teacher's log-probs reach the loss,
a teacher that is the student adds nothing, pure distillation pulls the student toward another model, and a
teacher with another tokenizer is refused with a clear error."""

import pytest

from posttrain.config import load_config
from posttrain.loop import train
from posttrain.guidance.teacher import TeacherError, check_same_tokenizer
from posttrain.models.tiny import tiny_random_model, tiny_tokenizer
from posttrain.obs import read_metrics

FAST = ["model.name=tiny-random", "task.name=count-a", "logging.tensorboard=false", "logging.console=false",
        "loop.eval_prompts=4", "loop.save_every=0", "loop.prompts_per_step=2", "loop.eval_before=false"]


def _train(tmp_path, *extra):
    res = train(load_config(None, FAST + [f"run.output_dir={tmp_path}"] + list(extra)))
    return [r for r in read_metrics(str(res.run_dir)) if r["kind"] == "train"]


def _sharpened_teacher(d, seed=0, scale=3.0):
    """tiny-random with its final norm scaled up: the student's own distribution, sharpened (a direction the
    student can learn in a few steps), saved as an HF folder with the same tokenizer."""
    import torch

    model, tok = tiny_random_model(seed=seed)
    with torch.no_grad():
        model.model.norm.weight.mul_(scale)
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return model


@pytest.fixture(scope="module")
def other_model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("teacher")
    _sharpened_teacher(d)
    return d


def _exact_kl(student, teacher, seqs):
    """Mean per-token KL(student || teacher) over the whole vocabulary at each completion position."""
    import torch

    tot = n = 0.0
    with torch.no_grad():
        for prompt, completion in seqs:
            ids = torch.tensor([prompt + completion])
            ls = torch.log_softmax(student(ids).logits[0, len(prompt) - 1:-1], -1)
            lt = torch.log_softmax(teacher(ids).logits[0, len(prompt) - 1:-1], -1)
            tot += float((ls.exp() * (ls - lt)).sum())
            n += len(completion)
    return tot / n


def test_teacher_equal_to_student_adds_no_kl(tmp_path):
    recs = _train(tmp_path, "loop.steps=1", "algorithm.teacher.model=tiny-random")
    assert abs(recs[0]["train/teacher/kl"]) < 1e-5, recs[0]["train/teacher/kl"]
    assert "time/teacher" in recs[0]


def test_pure_distillation_pulls_the_student_toward_the_teacher(tmp_path, other_model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    student0, tok = tiny_random_model(seed=0)
    teacher = AutoModelForCausalLM.from_pretrained(other_model_dir).eval()
    g = torch.Generator().manual_seed(0)
    probe = [(tok.encode(f"count the a in {w}"), torch.randint(4, len(tok) - 1, (12,), generator=g).tolist())
             for w in ("banana", "kiwi", "avocado", "papaya")]
    res = train(load_config(None, FAST + [f"run.output_dir={tmp_path}", "loop.steps=25", "loop.prompts_per_step=4",
                                          f"algorithm.teacher.model={other_model_dir}", "algorithm.teacher.rl_weight=0",
                                          "trainer.lr=3e-3", "sampling.temperature=1.0", "sampling.max_tokens=16"]))
    student1 = AutoModelForCausalLM.from_pretrained(res.run_dir / "final").eval()
    before, after = _exact_kl(student0, teacher, probe), _exact_kl(student1, teacher, probe)
    assert after < 0.75 * before, (before, after)
    recs = [r for r in read_metrics(str(res.run_dir)) if r["kind"] == "train"]
    assert all(r["train/teacher/kl"] == r["train/teacher/kl"] for r in recs)  # logged every step, finite


def test_zero_advantage_groups_still_train_when_distilling(tmp_path, other_model_dir):
    # count-a on a random model: most groups have no reward spread; distillation must still see them
    recs = _train(tmp_path, "loop.steps=1", f"algorithm.teacher.model={other_model_dir}")
    assert recs[0]["train/zero_adv_seqs_skipped"] == 0.0


def test_teacher_with_another_tokenizer_is_refused(tmp_path):
    other = tiny_tokenizer()
    other.add_tokens(["<extra_token>"])
    with pytest.raises(TeacherError, match="different tokenizer"):
        check_same_tokenizer(tiny_tokenizer(), other, "other")


def test_run_with_a_mismatched_teacher_stops_before_training(tmp_path):
    d = tmp_path / "mismatched"
    model, tok = tiny_random_model(seed=1)
    tok.add_tokens(["<extra_token>"])
    model.resize_token_embeddings(len(tok))
    model.save_pretrained(d)
    tok.save_pretrained(d)
    with pytest.raises(TeacherError, match="different tokenizer"):
        _train(tmp_path / "runs", "loop.steps=1", f"algorithm.teacher.model={d}")


def test_missing_teacher_folder_is_a_clear_error(tmp_path):
    from posttrain.models.load import ModelLoadError

    with pytest.raises(ModelLoadError, match="not found"):
        _train(tmp_path, "loop.steps=1", f"algorithm.teacher.model={tmp_path}/nope")


def test_a_hint_that_would_push_a_sequence_past_the_context_gets_no_opinion(tiny):
    """Issue #52: the teacher's hinted view is the sequence + the hint; past the model's context it is skipped."""
    from posttrain.guidance.teacher import SelfHintTeacher
    from posttrain.types import Sequence

    _, tok = tiny

    class Trainer:
        def compute_logprobs(self, batch, model=None, temperature=None):
            return [[0.0] * len(s.completion_ids) for s in batch.sequences]

    seq = Sequence(prompt_ids=[5] * 90, completion_ids=[6] * 8, loss_mask=[1] * 8, sampler_logprobs=[0.0] * 8,
                   hint="look again")
    assert SelfHintTeacher(Trainer(), tok, max_context=None).logprobs([seq])[0] is not None
    assert SelfHintTeacher(Trainer(), tok, max_context=100).logprobs([seq]) == [None]
