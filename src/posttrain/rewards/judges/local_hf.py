"""A judge backend on a local HF model (the built-in default, tiny-random for tests, any HF folder).

Pointwise questions read the next-token distribution instead of parsing a free-form answer: the judge's
verdict is P(Yes) / (P(Yes) + P(No)) over the first answer token (every vocabulary token that is "yes" or "no"
up to case, a leading space and punctuation). A 135M model rarely writes a well-formed "score: 7/10", but its
Yes-vs-No preference on a concrete question is informative, and the probability is a graded reward.

The model loads on first use, so building a task that holds a judge is cheap. Calls are serialized by a lock
(one model, one forward at a time) and batched (`max_batch` prompts per forward, left-padded).
"""

from __future__ import annotations

import math
import threading
from typing import Any

from posttrain.rewards.judges.errors import JudgeBadOutput


class LocalHFBackend:
    def __init__(
        self,
        model: str = "default",
        device: str = "auto",
        dtype: str = "float32",
        max_batch: int = 16,
        seed: int = 0,
        model_obj: Any = None,
        tokenizer: Any = None,
    ):
        """`model`: 'default', 'tiny-random', an HF folder (models/load.py). Pass `model_obj` and `tokenizer` to
        judge with a model already in memory (then `model` only names it in cache keys). `device`: auto is cuda
        when a GPU is visible, else cpu."""
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.model_name, self.device, self.dtype, self.max_batch, self.seed = model, device, dtype, max_batch, seed
        self.judge_id = f"hf:{model}{_fingerprint(model)}"
        self._model, self._tok = model_obj, tokenizer
        self._yes_no: tuple[list[int], list[int]] | None = None
        self._lock = threading.Lock()

    def _load(self) -> tuple[Any, Any]:
        if self._model is None:
            from posttrain.models.load import ensure_pad_token, load_model

            model, tok = load_model(self.model_name, self.dtype, seed=self.seed, log=lambda s: None)
            ensure_pad_token(tok)
            import torch

            dev = ("cuda" if torch.cuda.is_available() else "cpu") if self.device == "auto" else self.device
            self._model, self._tok = model.to(dev).eval(), tok
        if self._yes_no is None:
            self._yes_no = yes_no_ids(self._tok)
        return self._model, self._tok

    def room(self, frame: str, new_tokens: int) -> int:
        """Tokens left in the judge model's context for quoted text, once the question `frame` (the prompt with the
        quoted parts left empty) is rendered with the chat template and `new_tokens` are kept for the answer."""
        from posttrain.sampling.context import budget_for, text_config

        with self._lock:
            model, tok = self._load()
            budget = budget_for(text_config(model))
            return max(0, budget.room(len(self._render(tok, frame))) - new_tokens)

    def cut(self, text: str, tokens: int) -> str:
        """`text` cut to its first `tokens` tokens of the judge's tokenizer (unchanged when it is shorter)."""
        with self._lock:
            _, tok = self._load()
        ids = tok.encode(text, add_special_tokens=False)
        return text if len(ids) <= tokens else tok.decode(ids[: max(0, tokens)], skip_special_tokens=True)

    def _render(self, tok: Any, prompt: str) -> list[int]:
        from posttrain.models.chat import render_prompt

        return render_prompt(tok, [{"role": "user", "content": prompt}])

    def yes_prob(self, prompts: list[str]) -> list[float | Exception]:
        import torch

        from posttrain.sampling.padding import left_pad

        with self._lock:
            model, tok = self._load()
            assert self._yes_no is not None  # _load sets it
            yes_ids, no_ids = self._yes_no
            out: list[float | Exception] = []
            pad = tok.pad_token_id if tok.pad_token_id is not None else 0
            rendered = self._fitted(model, tok, prompts, 1)
            for i in range(0, len(prompts), self.max_batch):
                chunk = rendered[i : i + self.max_batch]
                rows = [r for r in chunk if not isinstance(r, Exception)]
                if not rows:
                    out.extend(r for r in chunk if isinstance(r, Exception))  # all of them: no prompt fit
                    continue
                ids, mask, pos = left_pad(rows, pad, max(len(r) for r in rows), next(model.parameters()).device)
                with torch.inference_mode():
                    logits = (
                        model(input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=1)
                        .logits[:, -1]
                        .float()
                    )
                probs = logits.softmax(-1)
                p_yes = probs[:, yes_ids].sum(-1)
                p_no = probs[:, no_ids].sum(-1)
                shares = iter([_yes_share(y, n) for y, n in zip(p_yes.tolist(), p_no.tolist())])
                out.extend(r if isinstance(r, Exception) else next(shares) for r in chunk)
            return out

    def generate(self, prompts: list[str], max_tokens: int) -> list[str | Exception]:
        from posttrain.models.load import stop_token_ids
        from posttrain.sampling.hf_sampler import HFSampler
        from posttrain.types import SampleParams

        with self._lock:
            model, tok = self._load()
            sampler = HFSampler(model, tok, stop_token_ids(model, tok), seed=self.seed, max_batch=self.max_batch)
            rendered = self._fitted(model, tok, prompts, max_tokens)
            rows = [r for r in rendered if not isinstance(r, Exception)]
            outs = iter(
                sampler.sample_sync(rows, SampleParams(max_tokens=max_tokens, temperature=0.0), n=1) if rows else []
            )
            return [r if isinstance(r, Exception) else next(outs)[0].text for r in rendered]

    def _fitted(self, model: Any, tok: Any, prompts: list[str], new_tokens: int) -> list[list[int] | Exception]:
        """Each prompt rendered, or the failure of that prompt alone when it and its `new_tokens` do not fit the
        judge model's context (a long completion quoted in a judge prompt; one such prompt failed the batch)."""
        from posttrain.sampling.context import ContextOverflow, budget_for, text_config

        budget = budget_for(text_config(model))
        out: list[list[int] | Exception] = []
        for p in prompts:
            ids = self._render(tok, p)
            try:
                budget.fit(len(ids), new_tokens)
                out.append(ids)
            except ContextOverflow as e:
                out.append(JudgeBadOutput(f"the judge prompt does not fit the judge model: {e}"))
        return out


def _yes_share(y: float, n: float) -> float | Exception:
    """P(Yes) / (P(Yes) + P(No)), or the failure of that prompt when the model's logits were NaN or infinite (an
    fp16 overflow): NaN compares false, so without the check it would read as "no preference" below."""
    if not (math.isfinite(y) and math.isfinite(n)):
        return JudgeBadOutput(f"the judge model's P(Yes) {y!r} and P(No) {n!r} are not finite (NaN or infinite logits)")
    # Neither word is likely (a random model): no preference, 0.5, rather than 0/0.
    return y / (y + n) if y + n > 1e-12 else 0.5


def yes_no_ids(tok: Any) -> tuple[list[int], list[int]]:
    """First-token ids of "yes" / "no" spellings (any case, optional leading space). A token counts for a word
    when its text (stripped, lower-cased) is a prefix of that word and not of the other: the whole word in a
    subword vocabulary ("Yes"), its first letter in a character-level one ("Y", as in tiny-random).
    finetune.py trains on the same ids."""
    yes, no = set(), set()
    for word in ("Yes", "yes", "YES", "No", "no", "NO"):
        for text in (word, " " + word):
            ids = tok.encode(text, add_special_tokens=False)
            if not ids:
                continue
            piece = tok.decode(ids[:1]).strip().lower()
            if piece and "yes".startswith(piece) and not "no".startswith(piece):
                yes.add(ids[0])
            elif piece and "no".startswith(piece) and not "yes".startswith(piece):
                no.add(ids[0])
    if not yes or not no:
        raise ValueError("the judge tokenizer has no first token that tells 'Yes' from 'No'; use the score mode")
    return sorted(yes), sorted(no)


def _fingerprint(model: str) -> str:
    """For a folder, '@' and a short hash of its files' names, sizes and modification times: the judge cache keys
    on the judge id, so a judge fine-tuned again into the same folder must not get the old verdicts back."""
    import hashlib
    from pathlib import Path

    p = Path(model)
    if not p.is_dir():
        return ""
    h = hashlib.sha256()
    for f in sorted(p.iterdir()):
        if f.is_file():
            st = f.stat()
            h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns};".encode())
    return "@" + h.hexdigest()[:12]
