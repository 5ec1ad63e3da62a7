"""`posttrain rm train`: fit a Bradley-Terry reward model to chosen/rejected pairs and save it as a HF folder.

The model is `AutoModelForSequenceClassification` with one output on top of a causal LM (the default model,
tiny-random, a HF folder): r(prompt, response) is the head's value at the last token of
`format_pair(prompt, response)` (rewards/reward_model.py; the scorer uses the same text). The loss is
Bradley-Terry's, -log sigmoid(r(chosen) - r(rejected)), averaged over pairs (`bradley_terry_loss`); the held-out
measure is pair accuracy, the share of held-out pairs where r(chosen) > r(rejected) (`pair_accuracy`).

Cost on a CPU: every pair is two forward and backward passes of the trunk. `layers` keeps only the first N
decoder layers (the rest are dropped, the saved folder is an N-layer model), and the token embeddings stay
frozen unless `train_embeddings` (their dense gradient and Adam state are a fifth of SmolLM2's 135M
parameters). Both trade capacity for speed; docs/reward_models.md has the measured numbers.

Data (`load_pairs`, training/preference_data.py): a built-in generator name (`product-blurb`), a JSONL/JSON
file of rows with `prompt`, `chosen` and `rejected`, a `datasets` folder saved with `save_to_disk`, or
`hf:<name>[:<split>]` for a hub dataset (needs the hub). `chosen`/`rejected` may be strings or chat-message lists
(the last message is the response; then a missing `prompt` is the messages before it).
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from posttrain.models.save import save_hf_folder
from posttrain.rewards.reward_model import RM_META
from posttrain.training.preference_data import PreferenceDataError, PreferencePair, load_pairs, split_pairs

# ---------------------------------------------------------------------------------------------- the math


def bradley_terry_loss(chosen_B: Any, rejected_B: Any, margin_B: Any = None) -> Any:
    """Mean over pairs of -log sigmoid(r_chosen - r_rejected [- margin]). logsigmoid, not log(sigmoid(.)):
    a confident wrong pair (difference -50) gives loss 50, not inf."""
    import torch.nn.functional as F

    diff = chosen_B - rejected_B
    if margin_B is not None:
        diff = diff - margin_B
    return -F.logsigmoid(diff).mean()


def pair_accuracy(chosen: list[float], rejected: list[float]) -> float:
    """Share of pairs the model orders right (a tie counts as wrong: an untrained constant model scores 0)."""
    if len(chosen) != len(rejected):
        raise ValueError(f"{len(chosen)} chosen scores but {len(rejected)} rejected")
    if not chosen:
        return float("nan")
    return sum(c > r for c, r in zip(chosen, rejected)) / len(chosen)


# ---------------------------------------------------------------------------------------------- the model


@dataclass
class RMTrainConfig:
    data: Any = "product-blurb"
    eval_data: Any = None  # held-out pairs; default: the source's own split, else eval_frac of the data
    model: str = "default"
    out: str | None = None  # default: $POSTTRAIN_CACHE/reward_models/<data name>
    layers: int | None = None  # keep only the first N decoder layers (None: all)
    train_embeddings: bool = False
    train_layers: int | None = None  # train only the top N decoder layers (+ final norm and head); None: all
    lora: bool = False
    lora_r: int = 16
    epochs: int = 1
    lr: float = 5e-5
    batch_size: int = 8  # pairs per step (2x sequences)
    max_length: int = 256
    max_train_pairs: int | None = None
    max_eval_pairs: int | None = 400
    eval_frac: float = 0.1
    seed: int = 0
    device: str = "cpu"
    threads: int | None = None
    time_budget_s: float | None = None  # stop training after this many seconds of it (evals not counted)
    log_every: int = 10  # steps between progress lines


@dataclass
class RMTrainResult:
    out: str
    eval_accuracy: float
    eval_margin: float
    eval_accuracy_before: float
    n_train: int
    n_eval: int
    steps: int
    seconds: float
    epochs: list[dict[str, float]] = field(default_factory=list)


def build_reward_model(name: str, layers: int | None = None, seed: int = 0) -> tuple[Any, Any]:
    """(a one-output sequence classifier on the model `name`, its tokenizer). The head is new (random)."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from posttrain.models.load import ensure_pad_token, resolve_model_path

    if name == "tiny-random":
        from posttrain.models.tiny import tiny_random_model

        causal, tok = tiny_random_model(seed=seed)
        cfg = causal.config
        cfg.num_labels = 1
        if layers:
            cfg.num_hidden_layers = min(layers, cfg.num_hidden_layers)
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            model = AutoModelForSequenceClassification.from_config(cfg)
        model.model.load_state_dict(causal.model.state_dict(), strict=False)  # extra layers of a cut trunk: dropped
    else:
        path = resolve_model_path(name)
        kw: dict[str, Any] = {"num_labels": 1, "dtype": torch.float32}
        if layers:
            kw["num_hidden_layers"] = layers
        tok = AutoTokenizer.from_pretrained(path)
        with torch.random.fork_rng(), _quiet_load():
            torch.manual_seed(seed)
            # The head is new and a cut trunk leaves layers unused: transformers' load report would list them all.
            model = AutoModelForSequenceClassification.from_pretrained(path, **kw)
        if layers and getattr(model.config, "layer_types", None):
            model.config.layer_types = model.config.layer_types[:layers]
    ensure_pad_token(tok)
    tok.padding_side = "right"
    model.config.pad_token_id = tok.pad_token_id
    return model, tok


@contextlib.contextmanager
def _quiet_load():
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def _scores(model: Any, tok: Any, texts: list[str], max_length: int, device: str) -> Any:
    enc = tok(texts, return_tensors="pt", padding=True, truncation=True, max_length=max_length).to(device)
    return model(**enc).logits[:, 0].float()


def evaluate_pairs(
    model: Any, tok: Any, pairs: list[PreferencePair], max_length: int, device: str, batch_size: int = 16
) -> dict[str, float]:
    """Held-out pair accuracy and mean margin r(chosen) - r(rejected)."""
    import torch

    was_training = model.training
    model.eval()
    cs: list[float] = []
    rs: list[float] = []
    with torch.inference_mode():
        for s in range(0, len(pairs), batch_size):
            chunk = pairs[s : s + batch_size]
            out = _scores(model, tok, [t for p in chunk for t in p.texts], max_length, device).tolist()
            cs += out[0::2]
            rs += out[1::2]
    model.train(was_training)
    margin = sum(c - r for c, r in zip(cs, rs)) / max(len(cs), 1)
    out = {"accuracy": pair_accuracy(cs, rs), "margin": margin}
    for kind in sorted({p.kind for p in pairs if p.kind is not None}):
        idx = [i for i, p in enumerate(pairs) if p.kind == kind]
        out[f"accuracy/{kind}"] = pair_accuracy([cs[i] for i in idx], [rs[i] for i in idx])
    return out


def _per_kind(ev: dict[str, float]) -> str:
    kinds = [f"{k.split('/', 1)[1]} {v:.0%}" for k, v in ev.items() if k.startswith("accuracy/")]
    return f"; by kind: {', '.join(kinds)}" if kinds else ""


def train_reward_model(cfg: RMTrainConfig, log: Callable[[str], None] = print) -> RMTrainResult:
    """Fit a reward model as `cfg` says and save it: the pairs (`_pairs_for`), the model and what of it trains
    (`_trainable_model`), the held-out accuracy before, the epochs (`_fit`), the folder with its metadata."""
    import torch

    t_start = time.perf_counter()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    train, held = _pairs_for(cfg)
    out = Path(cfg.out) if cfg.out else _default_out(cfg.data)
    log(
        f"reward model: {cfg.model}{f' (first {cfg.layers} layers)' if cfg.layers else ''}, "
        f"{'LoRA' if cfg.lora else 'full'}; {len(train)} train pairs, {len(held)} held-out pairs -> {out}"
    )

    model, tok, params = _trainable_model(cfg, log)
    before = evaluate_pairs(model, tok, held, cfg.max_length, cfg.device) if held else {"accuracy": float("nan")}
    log(f"epoch 0 (untrained): held-out pair accuracy {before['accuracy']:.1%}{_per_kind(before)}")
    epochs, step = _fit(cfg, model, tok, params, train, held, t_start, log)

    if cfg.lora:
        model = model.merge_and_unload()  # a plain HF folder: loading it needs no peft
    _save(
        model,
        tok,
        out,
        {
            "kind": "bradley-terry reward model",
            "base_model": cfg.model,
            "layers": cfg.layers,
            "format": "posttrain.rewards.reward_model.format_pair",
            "data": str(cfg.data) if not isinstance(cfg.data, (str, Path)) else str(cfg.data),
            "n_train": len(train),
            "n_eval": len(held),
            "eval_accuracy": epochs[-1]["eval_accuracy"],
            "eval_accuracy_before": before["accuracy"],
            "epochs": epochs,
            "config": {k: v for k, v in asdict(cfg).items() if isinstance(v, (str, int, float, bool, type(None)))},
        },
    )
    seconds = time.perf_counter() - t_start
    log(
        f"saved {out}: held-out pair accuracy {before['accuracy']:.1%} -> {epochs[-1]['eval_accuracy']:.1%} "
        f"on {len(held)} pairs, {seconds:.0f}s"
    )
    return RMTrainResult(
        out=str(out),
        eval_accuracy=epochs[-1]["eval_accuracy"],
        eval_margin=epochs[-1]["eval_margin"],
        eval_accuracy_before=before["accuracy"],
        n_train=len(train),
        n_eval=len(held),
        steps=step,
        seconds=seconds,
        epochs=epochs,
    )


def _pairs_for(cfg: RMTrainConfig) -> tuple[list[PreferencePair], list[PreferencePair]]:
    """(train pairs, held-out pairs): `eval_data`'s, else the source's own split, else `eval_frac` of the data;
    each cut to its maximum."""
    train, held = load_pairs(cfg.data, cfg.seed)
    if cfg.eval_data is not None:
        held = load_pairs(cfg.eval_data, cfg.seed)[0]
    if held is None:
        train, held = split_pairs(train, cfg.eval_frac, cfg.seed)
    if cfg.max_train_pairs:
        train = train[: cfg.max_train_pairs]
    if cfg.max_eval_pairs:
        held = held[: cfg.max_eval_pairs]
    if not train:
        raise PreferenceDataError("no training pairs")
    return train, held


def _trainable_model(cfg: RMTrainConfig, log: Callable[[str], None]) -> tuple[Any, Any, list[Any]]:
    """(the model on `cfg.device`, its tokenizer, the parameters it trains): LoRA adapters (and the head), or the
    full model less the frozen embeddings and lower layers."""
    model, tok = build_reward_model(cfg.model, cfg.layers, cfg.seed)
    if cfg.lora:
        from peft import LoraConfig, get_peft_model

        targets = sorted(
            {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
            & {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
        )
        # SEQ_CLS makes peft train and save the new head (`score`) in full next to the adapters.
        model = get_peft_model(
            model, LoraConfig(r=cfg.lora_r, lora_alpha=2 * cfg.lora_r, target_modules=targets, task_type="SEQ_CLS")
        )
    else:
        if not cfg.train_embeddings:
            model.get_input_embeddings().requires_grad_(False)
        if cfg.train_layers is not None:
            # Frozen lower layers need no backward and keep no activations: a step costs about a third of
            # their share; the top layers still see the whole sequence through attention.
            layers = model.base_model.layers
            for layer in layers[: max(len(layers) - cfg.train_layers, 0)]:
                layer.requires_grad_(False)
    model.to(cfg.device)
    params = [p for p in model.parameters() if p.requires_grad]
    log(
        f"trainable parameters: {sum(p.numel() for p in params) / 1e6:.1f}M of "
        f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M"
    )
    return model, tok, params


def _fit(
    cfg: RMTrainConfig,
    model: Any,
    tok: Any,
    params: list[Any],
    train: list[PreferencePair],
    held: list[PreferencePair],
    t_start: float,
    log: Callable[[str], None],
) -> tuple[list[dict[str, float]], int]:
    """(one record per epoch, the steps taken): AdamW with a linear warm-up and decay, the held-out pairs
    evaluated after each epoch; training stops early past `time_budget_s`."""
    import torch

    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    steps_per_epoch = math.ceil(len(train) / cfg.batch_size)
    total = steps_per_epoch * cfg.epochs
    warmup = max(1, total // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(  # linear warm-up, then linear decay to 0
        opt, lambda s: min((s + 1) / warmup, max(0.0, (total - s) / max(total - warmup, 1)))
    )
    epochs: list[dict[str, float]] = []
    step = 0
    t_train = time.perf_counter()
    stopped = False
    model.train()
    for epoch in range(1, cfg.epochs + 1):
        order = list(range(len(train)))
        random.Random(cfg.seed * 1000 + epoch).shuffle(order)
        loss_sum = acc_sum = 0.0
        n_seen = 0
        for s in range(0, len(order), cfg.batch_size):
            chunk = [train[i] for i in order[s : s + cfg.batch_size]]
            r = _scores(model, tok, [t for p in chunk for t in p.texts], cfg.max_length, cfg.device)
            loss = bradley_terry_loss(r[0::2], r[1::2])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            step += 1
            loss_sum += loss.item() * len(chunk)
            acc_sum += float((r[0::2] > r[1::2]).float().sum())
            n_seen += len(chunk)
            if step % cfg.log_every == 0:
                log(
                    f"  epoch {epoch} step {step}/{total}: loss {loss_sum / n_seen:.4f}, train pair accuracy "
                    f"{acc_sum / n_seen:.1%} ({time.perf_counter() - t_start:.0f}s)"
                )
            if cfg.time_budget_s is not None and time.perf_counter() - t_train > cfg.time_budget_s:
                stopped = True
                break
        ev = _held_out(model, tok, held, cfg)
        rec = _epoch_record(epoch, loss_sum, acc_sum, n_seen, ev)
        epochs.append(rec)
        log(
            f"epoch {epoch}: loss {rec['loss']:.4f}, train pair accuracy {rec['train_accuracy']:.1%}, held-out "
            f"pair accuracy {ev['accuracy']:.1%} (mean margin {ev['margin']:+.3f}{_per_kind(ev)}) "
            f"({time.perf_counter() - t_start:.0f}s){' [time budget reached]' if stopped else ''}"
        )
        if stopped:
            break
    return epochs, step


def _held_out(model: Any, tok: Any, held: list[PreferencePair], cfg: RMTrainConfig) -> dict[str, float]:
    """The held-out pairs' accuracy and margin now (NaN without held-out pairs)."""
    if not held:
        return {"accuracy": float("nan"), "margin": float("nan")}
    return evaluate_pairs(model, tok, held, cfg.max_length, cfg.device)


def _epoch_record(epoch: int, loss_sum: float, acc_sum: float, n_seen: int, ev: dict[str, float]) -> dict[str, float]:
    """An epoch's record: its train loss and pair accuracy over the `n_seen` pairs, and `ev`, the held-out pairs
    evaluated after it."""
    return {
        "epoch": epoch,
        "loss": loss_sum / max(n_seen, 1),
        "train_accuracy": acc_sum / max(n_seen, 1),
        "eval_accuracy": ev["accuracy"],
        "eval_margin": ev["margin"],
        "pairs_seen": n_seen,
        **{f"eval_{k}": v for k, v in ev.items() if k.startswith("accuracy/")},
    }


def _default_out(data: Any) -> Path:
    from posttrain.rewards.reward_model import default_rm_dir

    name = str(data) if isinstance(data, (str, Path)) else "custom"
    return default_rm_dir(Path(name).stem.replace(":", "_") or "custom")


def _save(model: Any, tok: Any, out: Path, meta: dict[str, Any]) -> None:
    save_hf_folder(model, tok, out, {RM_META: json.dumps(meta, indent=2, default=str)})
