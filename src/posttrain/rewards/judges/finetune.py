"""`posttrain judge finetune`: teach a local model to answer one judge question (a small generative verifier).

    res = finetune_judge(train_rows, eval_rows, out="judges/product-blurb")   # rows: {"question", "answer"}
    LocalHFBackend("judges/product-blurb")                                     # then judge with it as usual

Why it exists: the only model this machine can load offline, SmolLM2-135M-Instruct, cannot judge. Measured on
its own samples (docs/judges.md): asked whether a reply equals a reference answer (JSON, or an integer) or
whether a text contains a given word, its P(Yes) separates right from wrong at AUC 0.36-0.68, chance or worse.
A judge you can trust must pass `posttrain judge audit` first; a big hosted judge may, this one does not. A
judge fine-tuned on a few thousand labelled answers to the exact question it will be asked is the small-model
way to get one (the verifier-model idea), and the audit says whether it worked.

Training: the question is rendered as the judge backend renders it (the chat template with the assistant's turn
opened, `LocalHFBackend`), and the loss is the cross-entropy of the first answer token, "Yes" or "No", over the
whole vocabulary. So what is trained is exactly what the backend reads: P(Yes) / (P(Yes) + P(No)) at that
position. The token embeddings stay frozen (a fifth of SmolLM2's parameters, and their Adam state). Held-out
accuracy (verdict P >= 0.5) is measured before and after, and the folder saved is a plain HF causal LM.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from posttrain.errors import MissingFileError, PosttrainError
from posttrain.rewards.rows_file import read_rows

ANSWERS = ("Yes", "No")
BUILTIN_EXAMPLES: dict[str, str] = {"product-blurb": "posttrain.tasks.product_blurb"}  # module with judge_examples()
META_FILE = "posttrain_judge.json"


class JudgeDataError(PosttrainError, ValueError):
    """The fine-tuning examples are missing or malformed."""


@dataclass
class JudgeFinetuneResult:
    out: str
    steps: int
    n_train: int
    n_eval: int
    accuracy_before: float
    accuracy_after: float
    loss_first: float
    loss_last: float
    seconds: float


def check_examples(rows: list[dict[str, Any]], where: str) -> list[dict[str, str]]:
    """Each row needs a non-empty string `question` and an `answer` of "Yes" or "No" (any case)."""
    if not rows:
        raise JudgeDataError(f"{where}: no examples")
    out = []
    for i, r in enumerate(rows):
        q, a = r.get("question") if isinstance(r, dict) else None, r.get("answer") if isinstance(r, dict) else None
        if not isinstance(q, str) or not q.strip():
            raise JudgeDataError(f"{where}: row {i} has no 'question' string")
        if not isinstance(a, str) or a.strip().capitalize() not in ANSWERS:
            raise JudgeDataError(f"{where}: row {i} 'answer' must be Yes or No, got {a!r}")
        out.append({"question": q, "answer": a.strip().capitalize()})
    return out


def load_examples(
    source: str, n_train: int = 4000, n_eval: int = 400, seed: int = 0
) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """(train, held-out) examples: a built-in name (BUILTIN_EXAMPLES: the task's own question, labelled by its
    hidden rule, held-out items unseen in training) or a JSONL/JSON file (the last 10% held out)."""
    if source in BUILTIN_EXAMPLES:
        import importlib

        train, held = importlib.import_module(BUILTIN_EXAMPLES[source]).judge_examples(n_train, n_eval, seed)
        return check_examples(train, source), check_examples(held, source)
    if not Path(source).exists():
        raise MissingFileError(
            f"judge examples {source!r}: no such file, and not a built-in set ({', '.join(BUILTIN_EXAMPLES)})"
        )
    rows = check_examples(read_rows(Path(source), JudgeDataError, "judge examples"), source)
    random.Random(seed).shuffle(rows)
    k = max(1, len(rows) // 10) if len(rows) > 1 else 0
    if k == 0:
        raise JudgeDataError(f"{source}: need at least 2 examples (one is held out)")
    return rows[k:], rows[:k]


def _encode(tok: Any, question: str, max_length: int) -> list[int]:
    from posttrain.models.chat import render_prompt

    ids = render_prompt(tok, [{"role": "user", "content": question}])
    return ids[-max_length:]  # the end holds the question's last words and the opened answer turn


def answer_ids(tok: Any) -> dict[str, int]:
    """The token each answer starts with, as the judge backend reads it ("Yes" and "No" are single tokens in
    SmolLM2's vocabulary; a character-level vocabulary gives "Y" and "N")."""
    from posttrain.rewards.judges.local_hf import yes_no_ids

    yes, no = yes_no_ids(tok)
    out = {}
    for word, allowed in (("Yes", yes), ("No", no)):
        first = tok.encode(word, add_special_tokens=False)[0]
        out[word] = first if first in allowed else allowed[0]
    return out


def accuracy(model: Any, tok: Any, rows: list[dict[str, str]], batch_size: int = 16) -> float:
    from posttrain.rewards.judges.local_hf import LocalHFBackend

    probs = LocalHFBackend("finetune", model_obj=model, tokenizer=tok, max_batch=batch_size).yes_prob(
        [r["question"] for r in rows]
    )
    scored: list[float] = []
    for p in probs:
        if isinstance(p, Exception):  # a question the judge could not score (too long for it, non-finite logits)
            raise p
        scored.append(p)
    return sum((p >= 0.5) == (r["answer"] == "Yes") for p, r in zip(scored, rows)) / len(rows)


def finetune_judge(
    train: list[dict[str, str]],
    held_out: list[dict[str, str]],
    out: str | Path,
    model: str = "default",
    steps: int = 200,
    batch_size: int = 16,
    lr: float = 3e-5,
    max_length: int = 192,
    seed: int = 0,
    threads: int | None = None,
    time_budget_s: float | None = None,
    log: Callable[[str], None] = print,
) -> JudgeFinetuneResult:
    """`time_budget_s`: stop after this many seconds of training (evaluations not counted), then evaluate and
    save; `steps` is then an upper bound."""
    import torch

    from posttrain.models.load import ensure_pad_token, load_model
    from posttrain.models.save import save_hf_folder
    from posttrain.sampling.padding import left_pad

    train, held_out = check_examples(train, "train"), check_examples(held_out, "held-out")
    if steps < 1 or batch_size < 1 or lr <= 0 or max_length < 8 or (time_budget_s is not None and time_budget_s <= 0):
        raise ValueError(
            f"need steps >= 1, batch_size >= 1, lr > 0, max_length >= 8, time_budget_s > 0; got "
            f"{steps}, {batch_size}, {lr}, {max_length}, {time_budget_s}"
        )
    if threads:
        torch.set_num_threads(threads)
    t0 = time.perf_counter()
    torch.manual_seed(seed)
    net, tok = load_model(model, "float32", seed=seed, log=lambda s: None)
    ensure_pad_token(tok)
    ids = answer_ids(tok)
    net.get_input_embeddings().weight.requires_grad_(False)
    acc0 = accuracy(net.eval(), tok, held_out)
    log(
        f"judge finetune: {len(train)} train / {len(held_out)} held-out examples; held-out accuracy before "
        f"{acc0:.1%}; {steps} steps x {batch_size} at lr {lr:g}"
    )
    opt = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    rng = random.Random(seed)
    order: list[int] = []
    losses: list[float] = []
    net.train()
    pad = tok.pad_token_id
    t_train = time.perf_counter()
    for step in range(steps):
        if time_budget_s is not None and time.perf_counter() - t_train >= time_budget_s:
            log(f"  time budget of {time_budget_s:g}s reached after {step} steps")
            break
        batch = []
        while len(batch) < min(batch_size, len(train)):
            if not order:
                order = list(range(len(train)))
                rng.shuffle(order)
            batch.append(train[order.pop()])
        rows = [_encode(tok, r["question"], max_length) for r in batch]
        x, mask, pos = left_pad(rows, pad, max(len(r) for r in rows), "cpu")
        logits = net(input_ids=x, attention_mask=mask, position_ids=pos, logits_to_keep=1).logits[:, -1].float()
        target = torch.tensor([ids[r["answer"]] for r in batch])
        loss = torch.nn.functional.cross_entropy(logits, target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if (step + 1) % max(1, steps // 10) == 0 or step + 1 == steps:
            recent = losses[-max(1, steps // 10) :]
            log(f"  step {step + 1}/{steps}: loss {sum(recent) / len(recent):.3f} [{time.perf_counter() - t0:.0f}s]")
    net.eval()
    acc1 = accuracy(net, tok, held_out)
    res = JudgeFinetuneResult(
        str(out),
        len(losses),
        len(train),
        len(held_out),
        acc0,
        acc1,
        losses[0] if losses else float("nan"),
        losses[-1] if losses else float("nan"),
        time.perf_counter() - t0,
    )
    save_hf_folder(net, tok, out, extra_files={META_FILE: json.dumps({**asdict(res), "base_model": model}, indent=2)})
    log(f"held-out accuracy {acc0:.1%} -> {acc1:.1%}; saved {out} [{res.seconds:.0f}s]")
    return res
