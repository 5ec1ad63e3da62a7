"""Supervised fine-tuning on (prompt, completion) rows: `posttrain sft`, and SFTL;DR from a run's insights.

    rows  = read_sft_rows(path, target)    JSONL of {"prompt", "completion"}, or a run's insights.jsonl
    model = sft(rows, model_name, ...)     next-token NLL on the completion tokens, then an atomic HF folder

SFTL;DR (the RLTL;DR post): a run with `algorithm.insights` logs every insight it wrote to RUN_DIR/insights.jsonl;
training on those (task, insight) pairs with no rollouts at all is the compacted version of the method.
`target="insight"` reads them as prompt -> insight; `target="answer"` takes the completions that passed with
insights in context and trains the plain prompt -> that completion (context distillation of the insights).

The loss is the trainer's own: REINFORCE with advantage 1 at temperature 1 is the mean NLL of the target tokens
(as in the warm start, loop/warm_start.py), so the prompt is rendered and masked exactly as RL renders it.
"""

from __future__ import annotations

import json
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from posttrain.envs.tool_env import turn_end_text
from posttrain.errors import PosttrainError
from posttrain.types import Batch, Sequence

TARGETS = ("insight", "answer")


class SFTDataError(PosttrainError, ValueError):
    """The rows cannot be trained on: unreadable, empty, or missing a prompt or completion."""


def read_sft_rows(path: str | Path, target: str = "insight") -> list[dict[str, Any]]:
    """{"prompt", "completion"} rows from a JSONL file: plain rows as they are; a run's insights.jsonl (rows with a
    `kind`) as (task, insight) pairs (`target="insight"`) or as insight-conditioned successes (`"answer"`)."""
    if target not in TARGETS:
        raise SFTDataError(f"target must be one of {TARGETS}, got {target!r}")
    p = Path(path)
    if p.is_dir():
        p = p / "insights.jsonl"
    try:
        lines = [x for x in p.read_text().splitlines() if x.strip()]
    except OSError as e:
        raise SFTDataError(f"cannot read {p}: {e}") from None
    rows: list[dict[str, Any]] = []
    for i, line in enumerate(lines, 1):
        try:
            r = json.loads(line)
        except ValueError as e:
            raise SFTDataError(f"{p}:{i}: not JSON ({e})") from None
        if not isinstance(r, dict):
            raise SFTDataError(f"{p}:{i}: expected an object, got {type(r).__name__}")
        if "kind" in r:  # a run's insights.jsonl
            if target == "insight" and r["kind"] == "insight":
                rows.append({"prompt": r.get("prompt"), "completion": r.get("insight")})
            elif target == "answer" and r["kind"] == "success":
                rows.append({"prompt": r.get("prompt"), "completion": r.get("completion")})
            continue
        rows.append({"prompt": r.get("prompt"), "completion": r.get("completion")})
    for i, r in enumerate(rows):
        ok_prompt = isinstance(r["prompt"], str) or (
            isinstance(r["prompt"], list) and r["prompt"] and all(isinstance(m, dict) for m in r["prompt"])
        )
        if not ok_prompt or not isinstance(r["completion"], str) or not r["completion"].strip():
            raise SFTDataError(
                f"{p}: row {i} needs a prompt (text or chat messages) and a non-empty completion, got {str(r)[:200]}"
            )
    if not rows:
        what = {"insight": "insight rows", "answer": "success rows (conditioned rollouts that passed)"}[target]
        raise SFTDataError(f"{p}: no {what} to train on" if any('"kind"' in x for x in lines) else f"{p} is empty")
    return rows


def reply_end_token(tok: Any) -> int:
    """The id that closes an assistant reply when the model stops on its own (ChatML: <|im_end|>), else eos."""
    end = turn_end_text(tok).strip()
    if end:
        ids = tok(end, add_special_tokens=False)["input_ids"]
        if len(ids) == 1:
            return int(ids[0])
    return int(tok.eos_token_id)


def batches(n: int, batch_size: int, steps: int, seed: int) -> list[list[int]]:
    """`steps` batches of indices into n demonstrations: shuffled epochs, a fresh order each epoch."""
    rng = random.Random(f"warm-start:{seed}")
    out: list[list[int]] = []
    order: list[int] = []
    for _ in range(steps):
        b: list[int] = []
        while len(b) < min(batch_size, n):
            if not order:
                order = list(range(n))
                rng.shuffle(order)
            b.append(order.pop())
        out.append(b)
    return out


def sft_sequences(rows: list[dict[str, Any]], tok: Any) -> list[Sequence]:
    """Each row as a Sequence: the rendered prompt, the completion's tokens and the reply's end token, advantage 1."""
    from posttrain.models.chat import render_prompt

    end = reply_end_token(tok)
    out = []
    for i, r in enumerate(rows):
        ids = list(tok(r["completion"], add_special_tokens=False)["input_ids"]) + [end]
        out.append(
            Sequence(
                prompt_ids=render_prompt(tok, r["prompt"]),
                completion_ids=ids,
                loss_mask=[1] * len(ids),
                sampler_logprobs=[0.0] * len(ids),
                advantage=1.0,
                group_id=i,
            )
        )
    return out


def sft(
    rows: list[dict[str, Any]],
    model_name: str,
    out: str | Path,
    steps: int = 100,
    lr: float = 1e-5,
    batch_size: int = 8,
    seed: int = 0,
    log: Callable[[str], None] = print,
) -> dict[str, float]:
    """Train `model_name` on `rows` for `steps` batches and save it to `out`. Returns the NLL before/after."""
    import torch

    from posttrain.algos.losses import LossParams, reinforce_loss
    from posttrain.models.load import ensure_pad_token, load_model
    from posttrain.models.save import save_hf_folder
    from posttrain.training.trainer import Trainer

    if steps < 1 or batch_size < 1 or lr <= 0:
        raise SFTDataError(f"need steps >= 1, batch_size >= 1 and lr > 0, got {steps}, {batch_size}, {lr}")
    torch.manual_seed(seed)
    model, tok = load_model(model_name, seed=seed, log=log)
    ensure_pad_token(tok)
    seqs = sft_sequences(rows, tok)
    trainer = Trainer(model, pad_id=tok.pad_token_id, lr=lr, temperature=1.0)
    params = LossParams(aggregation="token-mean")
    t0, losses = time.perf_counter(), []
    log(f"sft: {len(seqs)} rows, {steps} steps x {min(batch_size, len(seqs))} at lr {lr:g}")
    for k, idx in enumerate(batches(len(seqs), batch_size, steps, seed)):
        m = trainer.forward_backward(Batch([seqs[i] for i in idx]), reinforce_loss, params).metrics
        m.update(trainer.optim_step())
        losses.append(m["train/loss"])
        if (k + 1) % max(1, steps // 10) == 0 or k + 1 == steps:
            log(f"sft {k + 1}/{steps}: nll/token={m['train/loss']:.3f} [{time.perf_counter() - t0:.0f}s]")
    save_hf_folder(model, tok, out)
    log(f"sft: saved {out}")
    random.seed(seed)
    return {
        "nll_first": losses[0],
        "nll_last": statistics.fmean(losses[-3:]),
        "rows": float(len(seqs)),
        "seconds": time.perf_counter() - t0,
    }
