"""A trained reward model as a rubric component: `reward_model(path)` -> a TRL-style reward function.

    rubric = Rubric([RewardComponent("rm", reward_model("runs/rm/product-blurb"))])

The folder is what `posttrain rm train` writes (training/reward_model_fit.py): a HF sequence-classification model with
one output (`AutoModelForSequenceClassification`, num_labels=1) and its tokenizer; any such folder works, e.g. a
published reward model saved with `save_pretrained`. The function scores `format_pair(prompt, completion)`, the same
text the model was trained on, in batches of `batch_size`; the model is loaded on the first call and kept (one copy per
folder and device for the whole process), so a task built many times loads it once.

The folder is checked when the function is made (config only, no weights), so a wrong path fails when the task
loads, not in the middle of a run: missing folder, no config.json, or a config that is not a one-output
sequence classifier each raise `RewardModelError` naming what was found.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from posttrain.errors import PosttrainError
from posttrain.rewards.text import completion_text

# Written next to the weights by `posttrain rm train`: how the model was trained (data, accuracy, format).
RM_META = "posttrain_reward_model.json"


class RewardModelError(PosttrainError, ValueError):
    pass


def default_rm_dir(name: str) -> Path:
    """Where `posttrain rm train --data NAME` saves by default: $POSTTRAIN_CACHE/reward_models/NAME."""
    from posttrain.models.default import cache_dir

    return cache_dir() / "reward_models" / name


def check_reward_model_folder(path: str | Path) -> dict[str, Any]:
    """The folder's config.json as a dict, or RewardModelError saying why this is not a reward-model folder."""
    p = Path(path).expanduser()
    train_hint = "train one with `posttrain rm train` (see docs/reward_models.md)"
    if not p.exists():
        raise RewardModelError(f"reward model folder not found: {p}; {train_hint}")
    if not p.is_dir():
        raise RewardModelError(f"reward model path {p} is a file, not a folder; {train_hint}")
    cfg_path = p / "config.json"
    if not cfg_path.exists():
        hint = (
            " (it holds a LoRA adapter only: `posttrain rm train` saves merged weights)"
            if (p / "adapter_config.json").exists()
            else ""
        )
        raise RewardModelError(f"{p} holds no config.json, so it is not a HF model folder{hint}; {train_hint}")
    try:
        cfg = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as e:
        raise RewardModelError(f"{cfg_path} is not valid JSON: {e}") from None
    archs = cfg.get("architectures") or []
    if not any(str(a).endswith("ForSequenceClassification") for a in archs):
        raise RewardModelError(
            f"{p} is not a reward model: its architectures are {archs or 'not set'}, expected a "
            f"*ForSequenceClassification head (a causal LM folder is a policy, not a reward model); {train_hint}"
        )
    n_labels = len(cfg.get("id2label") or {}) or cfg.get("num_labels", 1)
    if n_labels != 1:
        raise RewardModelError(
            f"{p} is a sequence classifier with {n_labels} labels; a reward model has exactly one output (num_labels=1)"
        )
    return cfg


def _messages_text(messages: Sequence[dict[str, Any]]) -> str:
    return "\n".join(
        f"{str(m.get('role', 'user')).capitalize()}: {completion_text(m.get('content', ''))}" for m in messages
    )


def format_pair(prompt: Any, response: Any) -> str:
    """The text a reward model scores: the prompt's messages as `Role: content` lines, then the response.

    Plain text rather than the tokenizer's chat template: it is the same for every tokenizer (tiny-random has a
    different template than SmolLM2, whose template adds a ~20-token default system prompt to every pair), and
    short, which matters on a CPU. Training and scoring both use this function, so they cannot disagree."""
    if isinstance(prompt, str):
        head = f"User: {prompt}"
    elif isinstance(prompt, (list, tuple)):
        head = _messages_text(prompt)
    elif prompt is None:
        head = ""
    else:
        raise TypeError(f"a prompt must be a string or a list of chat messages, got {type(prompt).__name__}")
    answer = completion_text(response) if not isinstance(response, str) else response
    return f"{head}\nAssistant: {answer}" if head else f"Assistant: {answer}"


class RewardModelScorer:
    """One loaded reward model: `score(texts) -> list[float]`, batched, no gradients."""

    def __init__(self, path: str | Path, device: str = "cpu", max_length: int = 512) -> None:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        check_reward_model_folder(path)
        self.path = str(Path(path).expanduser())
        self.device = device
        self.max_length = max_length
        self.tok = AutoTokenizer.from_pretrained(self.path)
        if self.tok.pad_token_id is None:
            self.tok.pad_token = self.tok.eos_token
        # Right padding: the head reads the last non-pad token, which HF finds from the right.
        self.tok.padding_side = "right"
        self.model = AutoModelForSequenceClassification.from_pretrained(self.path, dtype=torch.float32)
        self.model.config.pad_token_id = self.tok.pad_token_id
        self.model.to(device).eval().requires_grad_(False)
        self._lock = threading.Lock()  # the rubric may call from several threads; one forward at a time

    def score(self, texts: Sequence[str], batch_size: int = 16) -> list[float]:
        import torch

        out = [0.0] * len(texts)
        # Longest first, so padding within a batch is small and the first batch shows the worst-case memory.
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        with self._lock, torch.inference_mode():
            for s in range(0, len(order), batch_size):
                idx = order[s : s + batch_size]
                enc = self.tok(
                    [texts[i] for i in idx],
                    return_tensors="pt",
                    padding=True,
                    truncation=True,
                    max_length=self.max_length,
                ).to(self.device)
                logits = self.model(**enc).logits[:, 0].float().tolist()
                for i, v in zip(idx, logits):
                    out[i] = float(v)
        return out


_SCORERS: dict[tuple[str, str], RewardModelScorer] = {}
_SCORERS_LOCK = threading.Lock()


def load_scorer(path: str | Path, device: str = "cpu", max_length: int = 512) -> RewardModelScorer:
    """The process-wide scorer for this folder and device, loaded on first use."""
    key = (str(Path(path).expanduser().resolve()), device)
    with _SCORERS_LOCK:
        if key not in _SCORERS:
            _SCORERS[key] = RewardModelScorer(path, device, max_length)
        return _SCORERS[key]


def reward_model(
    path: str | Path, batch_size: int = 16, device: str = "cpu", max_length: int = 512, name: str = "reward_model"
) -> Callable[..., list[float]]:
    """A reward function `fn(completions, prompts, **columns) -> list[float]` scoring with the reward model in
    `path`. The folder is validated now; the weights load on the first call. Scores are the model's raw outputs
    (Bradley-Terry logits: differences matter, the offset does not; GRPO's group normalization removes it)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    check_reward_model_folder(path)

    def fn(completions: list[Any], prompts: list[Any] | None = None, **kwargs: Any) -> list[float]:
        scorer = load_scorer(path, device, max_length)
        ps = prompts if prompts is not None else [None] * len(completions)
        return scorer.score([format_pair(p, c) for p, c in zip(ps, completions)], batch_size)

    fn.__name__ = name
    fn.path = str(path)
    return fn
