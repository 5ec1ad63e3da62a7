"""Distillation teachers: something that scores the student's own sampled tokens (algorithm.teacher).

    teacher.logprobs(sequences) -> one list of per-completion-token log-probs per sequence

A teacher scores the same token ids the student sampled, so it must read them as the same text: a teacher with
another tokenizer is refused when the run starts (`check_same_tokenizer`), never silently misaligned.
`ModelTeacher` is a second, frozen model (a bigger model, or a checkpoint trained by posttrain). Teachers that
are the policy itself with extra context (a hint, an insight) plug in here with the same one method.
"""

from __future__ import annotations

import collections.abc as abc
from dataclasses import replace
from typing import Any, Protocol

from posttrain.errors import PosttrainError
from posttrain.training.protocol import PolicyTrainer
from posttrain.types import Batch, Sequence


class TeacherError(PosttrainError, ValueError):
    """A teacher that cannot score this student's tokens."""


class Teacher(Protocol):
    """One list per sequence (None: no opinion on that sequence; NaN entries: no opinion on that token), scored at
    `temperature` (the student's this step: StepSettings.temperature; None: the trainer's own)."""

    # Hints placed at the turn's start because the prompt did not end with the chat suffix (a self-hint teacher's
    # count, reported each step; a model teacher places none).
    unaligned: int

    def logprobs(
        self, sequences: list[Sequence], temperature: float | None = None
    ) -> abc.Sequence[list[float] | None]: ...


class ModelTeacher:
    """A frozen HF causal LM scored with the trainer's own log-prob path (same micro-batching, prefix sharing and
    temperature as the student's scores, so the two are comparable token for token)."""

    def __init__(self, model: Any, trainer: PolicyTrainer, name: str = "teacher"):
        self.model, self.trainer, self.name = model.eval().requires_grad_(False), trainer, name
        self.unaligned = 0  # scores the student's own tokens: no hint to place

    def logprobs(self, sequences: list[Sequence], temperature: float | None = None) -> list[list[float]]:
        return self.trainer.compute_logprobs(Batch(list(sequences)), model=self.model, temperature=temperature)


def check_same_tokenizer(student_tok: Any, teacher_tok: Any, teacher_name: str) -> None:
    """Refuse a teacher that would read the student's token ids as different text."""
    a, b = student_tok.get_vocab(), teacher_tok.get_vocab()
    if a == b:
        return
    only_a = sorted(set(a) - set(b))[:3]
    moved = sorted(t for t in set(a) & set(b) if a[t] != b[t])[:3]
    detail = (
        f"tokens only the student has: {only_a}"
        if only_a
        else f"tokens with other ids: {moved}"
        if moved
        else f"tokens only the teacher has: {sorted(set(b) - set(a))[:3]}"
    )
    raise TeacherError(
        f"teacher {teacher_name!r} has a different tokenizer than the policy ({len(b)} vs {len(a)} tokens; {detail}). "
        "On-policy distillation scores the student's own token ids, so the teacher must share its tokenizer: pick a "
        "teacher of the same family (or a checkpoint of the same model)."
    )


def load_teacher(
    name: str,
    student_tok: Any,
    trainer: PolicyTrainer,
    device: str,
    dtype: str,
    attn_implementation: str,
    seed: int = 0,
    log=print,
) -> ModelTeacher:
    from posttrain.models.load import load_model

    model, tok = load_model(name, dtype, attn_implementation, seed=seed, log=log)
    check_same_tokenizer(student_tok, tok, name)
    return ModelTeacher(model.to(device), trainer, name=name)


NO_OPINION = float("nan")  # a teacher log-prob the trainer replaces by the student's own (distillation term 0)


def chat_suffix_ids(tokenizer: Any) -> list[int]:
    """The tokens a chat prompt ends with after its last message's content (for SmolLM2:
    `<|im_end|>\\n<|im_start|>assistant\\n`): a hint goes before them, inside the last message. Empty for a
    tokenizer without a chat template (raw-text prompts: the hint is appended to the prompt)."""
    if not getattr(tokenizer, "chat_template", None):
        return []
    probe = "\u2063probe\u2063"
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": probe}], tokenize=False, add_generation_prompt=True
    )
    tail = text[text.rindex(probe) + len(probe) :]
    return list(tokenizer(tail, add_special_tokens=False)["input_ids"])


class SelfHintTeacher:
    """The policy itself with a hint in its context (algorithm.hint_distill; the Composer 2.5 recipe).

    For a sequence that carries a hint (its trajectory's feedback), the teacher reads the same tokens with the
    hint inserted right before the turn it is about: at the end of that turn's user or tool message, before the
    chat template's assistant header. It scores the student's own completion tokens after that point; tokens
    before it (earlier turns) and sequences without a hint get `NO_OPINION`, so the distillation term is exactly
    zero there. The teacher is the current policy, frozen for the step: as the student learns, so does the teacher.
    """

    def __init__(
        self, trainer: PolicyTrainer, tokenizer: Any, max_hint_tokens: int = 64, max_context: int | None = None
    ):
        self.trainer, self.tok, self.max_hint_tokens = trainer, tokenizer, max_hint_tokens
        # A sequence already near the model's context has no room for the hint: no opinion on it, rather than a
        # teacher pass past the model's positions.
        self.max_context = max_context
        self.suffix = chat_suffix_ids(tokenizer)
        self.unaligned = 0  # hints placed at the turn start because the prompt did not end with the chat suffix

    def hint_ids(self, hint: str) -> list[int]:
        """The hint's tokens, as written into the context (the stepper's hint function formats it)."""
        ids = list(self.tok(hint, add_special_tokens=False)["input_ids"])
        return ids[: self.max_hint_tokens]

    def _fits(self, seq: Sequence) -> bool:
        total = len(seq.prompt_ids) + len(seq.completion_ids) + len(self.hint_ids(seq.hint or ""))
        return self.max_context is None or total <= self.max_context

    def insertion(self, seq: Sequence) -> int:
        """The index in prompt_ids + completion_ids where the hint's tokens go."""
        at = len(seq.prompt_ids) if seq.hint_at is None else seq.hint_at
        full = seq.prompt_ids + seq.completion_ids
        k = len(self.suffix)
        if k and at >= k and full[at - k : at] == self.suffix:
            return at - k
        if k:
            self.unaligned += 1
        return at

    def hinted(self, seq: Sequence) -> tuple[Sequence, int, int]:
        """The teacher's view of `seq`: (the hinted sequence, the insertion index, the hint's length)."""
        hint = self.hint_ids(seq.hint or "")
        at = self.insertion(seq)
        full = seq.prompt_ids + seq.completion_ids
        n_prompt = len(seq.prompt_ids) + (len(hint) if at <= len(seq.prompt_ids) else 0)
        toks = full[:at] + hint + full[at:]
        mask = (
            seq.loss_mask
            if at <= len(seq.prompt_ids)
            else (
                seq.loss_mask[: at - len(seq.prompt_ids)] + [0] * len(hint) + seq.loss_mask[at - len(seq.prompt_ids) :]
            )
        )
        return (
            Sequence(
                prompt_ids=toks[:n_prompt],
                completion_ids=toks[n_prompt:],
                loss_mask=mask,
                sampler_logprobs=[0.0] * (len(toks) - n_prompt),
            ),
            at,
            len(hint),
        )

    def logprobs(self, sequences: list[Sequence], temperature: float | None = None) -> list[list[float] | None]:
        todo = [i for i, s in enumerate(sequences) if s.hint and self._fits(s)]
        out: list[list[float] | None] = [None] * len(sequences)
        if not todo:
            return out
        views = [self.hinted(sequences[i]) for i in todo]
        # Each hinted view has its own prompt: its own group, so prefix sharing never mixes two of them.
        batch = Batch([replace(v, group_id=j) for j, (v, _, _) in enumerate(views)])
        scored = self.trainer.compute_logprobs(batch, temperature=temperature)
        for i, (_view, at, n_hint), lp in zip(todo, views, scored, strict=True):
            s = sequences[i]
            start = at - len(s.prompt_ids)  # where the hint sits in completion coordinates (< 0: in the prompt)
            if start <= 0:
                out[i] = list(lp)
            else:  # a later turn: earlier tokens keep the student's own view, the hint's tokens are dropped
                out[i] = [NO_OPINION] * start + list(lp[start + n_hint :])
        return out
