"""Hint-conditioned self-distillation (algorithm.hint_distill, loop/teacher.SelfHintTeacher): the hint lands
token for token at the turn the feedback is about, the teacher scores the student's own tokens after it and has
no opinion before it, and the term is exactly zero when the teacher's context equals the student's."""

import math
from dataclasses import replace

import pytest
import torch

from posttrain.algos import LOSSES, LossParams
from posttrain.algos.loss_terms import with_terms
from posttrain.config import load_config
from posttrain.guidance.teacher import SelfHintTeacher, chat_suffix_ids
from posttrain.loop import train
from posttrain.loop.batch import feedback_hint
from posttrain.models.template_check import render_ids
from posttrain.models.tiny import tiny_random_model
from posttrain.obs import read_metrics
from posttrain.training.trainer import Trainer
from posttrain.types import Batch, Trajectory, Turn, sequence_of


@pytest.fixture(scope="module")
def tiny_model():
    torch.manual_seed(0)
    return tiny_random_model(seed=0)


def _ids(tok, text):
    return list(tok(text, add_special_tokens=False)["input_ids"])


def _three_turn_episode(tok):
    """user -> A0 -> tool R0 -> A1 -> tool R1 -> A2, built with the chat template's own prefix property."""
    p0 = render_ids(tok, [{"role": "user", "content": "find x"}], add_generation_prompt=True)
    end = _ids(tok, "<|im_end|>")
    c0, c1, c2 = _ids(tok, "call a") + end, _ids(tok, "call b") + end, _ids(tok, "done") + end
    env0 = _ids(tok, "\n<|im_start|>tool\nR0<|im_end|>\n<|im_start|>assistant\n")
    env1 = _ids(tok, "\n<|im_start|>tool\nR1<|im_end|>\n<|im_start|>assistant\n")
    p1 = p0 + c0 + env0
    p2 = p1 + c1 + env1
    turns = [Turn(p, c, [-1.0] * len(c), 0) for p, c in ((p0, c0), (p1, c1), (p2, c2))]
    return Trajectory(turns=turns), (p0, c0, p1, c1, p2, c2)


def _trainer(model, tok):
    return Trainer(model, pad_id=tok.pad_token_id, lr=1e-3, temperature=1.0)


def test_single_turn_hint_goes_inside_the_user_message(tiny_model):
    model, tok = tiny_model
    prompt = render_ids(tok, [{"role": "user", "content": "count"}], add_generation_prompt=True)
    completion = _ids(tok, "aaa")
    traj = Trajectory(turns=[Turn(prompt, completion, [-1.0] * 3, 0)], feedback="more a")
    seq = sequence_of(traj, hint=feedback_hint(traj))
    teacher = SelfHintTeacher(_trainer(model, tok), tok)
    view, at, n = teacher.hinted(seq)
    k = len(chat_suffix_ids(tok))
    assert at == len(prompt) - k
    assert view.prompt_ids == prompt[:-k] + _ids(tok, "\n\nHint: more a") + prompt[-k:]
    assert view.completion_ids == completion
    assert tok.decode(view.prompt_ids).endswith("count\n\nHint: more a<|im_end|>\n<|im_start|>assistant\n")
    (lp,) = teacher.logprobs([seq])
    direct = _trainer(model, tok).compute_logprobs(Batch([view]))[0]
    assert lp == pytest.approx(direct)
    assert teacher.unaligned == 0


@pytest.mark.parametrize("turn", [0, 1, 2])
def test_multi_turn_hint_goes_at_the_problematic_turn(tiny_model, turn):
    model, tok = tiny_model
    traj, (p0, c0, p1, c1, p2, c2) = _three_turn_episode(tok)
    traj = replace(traj, feedback="use tool b", feedback_turn=turn)
    seq = sequence_of(traj, hint=feedback_hint(traj))
    assert seq.hint_at == len([p0, p1, p2][turn])
    teacher = SelfHintTeacher(_trainer(model, tok), tok)
    view, at, n_hint = teacher.hinted(seq)
    full = view.prompt_ids + view.completion_ids
    text = tok.decode(full)
    # the hint closes the message right before the assistant turn it is about, and nowhere else
    before_turn = {0: "find x", 1: "R0", 2: "R1"}[turn]
    assert f"{before_turn}\n\nHint: use tool b<|im_end|>\n<|im_start|>assistant\n" in text
    assert text.count("Hint:") == 1
    # every original token is still there, in order, with the hint's tokens spliced in at one place
    assert full[:at] + full[at + n_hint:] == seq.prompt_ids + seq.completion_ids
    lp = teacher.logprobs([seq])[0]
    assert len(lp) == len(seq.completion_ids)
    start = at - len(seq.prompt_ids)
    if start > 0:  # earlier turns: no opinion (the student's own context there)
        assert all(math.isnan(x) for x in lp[:start]) and not any(math.isnan(x) for x in lp[start:])
    direct = _trainer(model, tok).compute_logprobs(Batch([view]))[0]
    tail = direct[max(start, 0) + (n_hint if start > 0 else 0):]
    assert lp[max(start, 0):] == pytest.approx(tail)


def test_the_loss_mask_of_a_later_turn_keeps_env_tokens_out(tiny_model):
    model, tok = tiny_model
    traj, _ = _three_turn_episode(tok)
    traj = replace(traj, feedback="x", feedback_turn=2)
    seq = sequence_of(traj, hint=feedback_hint(traj))
    view, at, n_hint = SelfHintTeacher(_trainer(model, tok), tok).hinted(seq)
    start = at - len(seq.prompt_ids)
    assert view.loss_mask[start:start + n_hint] == [0] * n_hint
    assert view.loss_mask[:start] + view.loss_mask[start + n_hint:] == seq.loss_mask


def test_sequences_without_feedback_get_no_teacher(tiny_model):
    model, tok = tiny_model
    traj, _ = _three_turn_episode(tok)
    assert SelfHintTeacher(_trainer(model, tok), tok).logprobs([sequence_of(traj)]) == [None]


def _distill_only_grads(model, tok, seqs):
    trainer = _trainer(model, tok)
    params = LossParams(distill_coef=1.0, rl_weight=0.0, distill_prefix="hint")
    m = trainer.forward_backward(Batch(seqs), with_terms(LOSSES["ppo_clip"]), params).metrics
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    total = sum(float(g.abs().sum()) for g in grads)
    model.zero_grad(set_to_none=True)
    return total, m


def test_kl_term_is_zero_when_the_teacher_equals_the_student(tiny_model):
    """An empty hint: the teacher reads exactly the student's context, so KL and its gradient are 0; and
    sequences the teacher has no opinion on (None, NaN) add nothing either."""
    model, tok = tiny_model
    traj, _ = _three_turn_episode(tok)
    traj = replace(traj, feedback="anything", feedback_turn=1)
    seq = sequence_of(traj, hint=feedback_hint(traj))
    teacher = SelfHintTeacher(_trainer(model, tok), tok, max_hint_tokens=1)
    teacher.hint_ids = lambda hint: []  # the hint that says nothing
    seq = replace(seq, teacher_logprobs=teacher.logprobs([seq])[0])
    grad, m = _distill_only_grads(model, tok, [seq])
    assert grad < 1e-6 and abs(m["train/hint/kl"]) < 1e-6, (grad, m)
    other = sequence_of(_three_turn_episode(tok)[0])  # no teacher at all
    grad, _ = _distill_only_grads(model, tok, [other])
    assert grad == 0.0
    # and a real hint does move the student
    seq = replace(seq, teacher_logprobs=SelfHintTeacher(_trainer(model, tok), tok).logprobs([seq])[0])
    grad, m = _distill_only_grads(model, tok, [seq])
    assert grad > 0 and m["train/hint/kl"] != 0.0


FAST = ["model.name=tiny-random", "task.name=count-a", "logging.tensorboard=false", "logging.console=false",
        "loop.eval_prompts=4", "loop.save_every=0", "loop.prompts_per_step=2", "loop.eval_before=false"]


def test_hint_distillation_runs_in_the_loop_and_logs(tmp_path):
    res = train(load_config(None, FAST + [f"run.output_dir={tmp_path}", "loop.steps=2",
                                          "algorithm.hint_distill.enabled=true"]))
    recs = [r for r in read_metrics(str(res.run_dir)) if r["kind"] == "train"]
    assert len(recs) == 2
    for r in recs:
        assert r["hint/share"] > 0.5  # tiny-random almost never passes count-a: nearly every sample has feedback
        assert math.isfinite(r["train/hint/kl"])
        assert r["hint/unaligned"] == 0
    import json

    samples = [json.loads(line) for line in (res.run_dir / "samples.jsonl").read_text().splitlines()]
    assert any("feedback" in s and "letter a" in s["feedback"] for s in samples)


def test_config_refuses_two_teachers_and_a_template_without_slot():
    with pytest.raises(Exception, match="one distillation teacher"):
        load_config(None, ["algorithm.hint_distill.enabled=true", "algorithm.teacher.model=tiny-random"])
    with pytest.raises(Exception, match="must contain"):
        load_config(None, ["algorithm.hint_distill.template=Hint"])
