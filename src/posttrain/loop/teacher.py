"""Distillation teachers: something that scores the student's own sampled tokens (algorithm.teacher).

    teacher.logprobs(sequences) -> one list of per-completion-token log-probs per sequence

A teacher scores the same token ids the student sampled, so it must read them as the same text: a teacher with
another tokenizer is refused when the run starts (`check_same_tokenizer`), never silently misaligned.
`ModelTeacher` is a second, frozen model (a bigger model, or a checkpoint trained by posttrain). Teachers that
are the policy itself with extra context (a hint, an insight) plug in here with the same one method.
"""

from __future__ import annotations

from typing import Any, Protocol

from posttrain.types import Batch, Sequence


class TeacherError(ValueError):
    """A teacher that cannot score this student's tokens."""


class Teacher(Protocol):
    def logprobs(self, sequences: list[Sequence]) -> list[list[float]]: ...


class ModelTeacher:
    """A frozen HF causal LM scored with the trainer's own log-prob path (same micro-batching, prefix sharing and
    temperature as the student's scores, so the two are comparable token for token)."""

    def __init__(self, model: Any, trainer: Any, name: str = "teacher"):
        self.model, self.trainer, self.name = model.eval().requires_grad_(False), trainer, name

    def logprobs(self, sequences: list[Sequence]) -> list[list[float]]:
        return self.trainer.compute_logprobs(Batch(list(sequences)), model=self.model)


def check_same_tokenizer(student_tok: Any, teacher_tok: Any, teacher_name: str) -> None:
    """Refuse a teacher that would read the student's token ids as different text."""
    a, b = student_tok.get_vocab(), teacher_tok.get_vocab()
    if a == b:
        return
    only_a = sorted(set(a) - set(b))[:3]
    moved = sorted(t for t in set(a) & set(b) if a[t] != b[t])[:3]
    detail = (f"tokens only the student has: {only_a}" if only_a
              else f"tokens with other ids: {moved}" if moved else f"tokens only the teacher has: {sorted(set(b) - set(a))[:3]}")
    raise TeacherError(
        f"teacher {teacher_name!r} has a different tokenizer than the policy ({len(b)} vs {len(a)} tokens; {detail}). "
        "On-policy distillation scores the student's own token ids, so the teacher must share its tokenizer: pick a "
        "teacher of the same family (or a checkpoint of the same model).")


def load_teacher(name: str, student_tok: Any, trainer: Any, device: str, dtype: str, attn_implementation: str,
                 seed: int = 0, log=print) -> ModelTeacher:
    from posttrain.models.load import load_model

    model, tok = load_model(name, dtype, attn_implementation, seed=seed, log=log)
    check_same_tokenizer(student_tok, tok, name)
    return ModelTeacher(model.to(device), trainer, name=name)
