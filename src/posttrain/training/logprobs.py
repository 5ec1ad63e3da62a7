"""Per-token log-probs of completions under a model, with each group's prompt computed once.

Prefix sharing: for a group of G completions of one prompt, run the prompt once (keeping the graph), copy its
KV cache to the G rows (index_select is differentiable, so the prompt receives the summed gradient of all G),
then run the completions on top. Equivalent to G full forwards (tested), at a fraction of the compute when
prompts are longer than completions. `shared=False` runs plain padded full sequences instead.

Both passes use caches whose `update` gives the same answer however often it is called (`_RecordLayer`,
`_PrefixLayer`, marked `replay_safe`), so a decoder layer may be re-run in backward: that is what activation
checkpointing (training/checkpointing.py) does, and with transformers' own DynamicCache the replay would append
the prompt's keys a second time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch
from torch.utils.checkpoint import checkpoint
from transformers.cache_utils import Cache, DynamicLayer

from posttrain.sampling.kv_cache import cache_arg_name
from posttrain.training.batching import GroupSlice


@dataclass
class MicroBatchTensors:
    logp_BT: torch.Tensor  # log-prob of each completion token (0 on padding)
    mask_BT: torch.Tensor  # loss mask (1 on policy tokens)
    entropy_BT: torch.Tensor | None  # per-token entropy of the policy, detached


def token_logprobs(
    logits_BTV: torch.Tensor, targets_BT: torch.Tensor, temperature: float = 1.0, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax(logits / T)[target], computed as logit[target] - logsumexp(logits) to skip a V-sized copy."""
    logits = logits_BTV.float()
    if temperature != 1.0:
        logits = logits / temperature
    lse_BT = torch.logsumexp(logits, dim=-1)
    logp_BT = logits.gather(-1, targets_BT.unsqueeze(-1)).squeeze(-1) - lse_BT
    entropy = None
    if with_entropy:
        with torch.no_grad():
            p = torch.softmax(logits.detach(), dim=-1)
            entropy = lse_BT.detach() - (p * logits.detach()).sum(-1)
    return logp_BT, entropy


def _pad(rows: list[list[int]], value: int, left: bool = False) -> torch.Tensor:
    width = max(len(r) for r in rows)
    out = torch.full((len(rows), width), value, dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            if left:
                out[i, width - len(r) :] = torch.tensor(r)
            else:
                out[i, : len(r)] = torch.tensor(r)
    return out


def chunked_token_logprobs(
    hidden_BTH: torch.Tensor,
    head: Any,
    targets_BT: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_tokens: int = 1024,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`token_logprobs(head(hidden), ...)` without ever holding B x T x V logits (the Liger-kernel idea): the output
    projection, log-softmax and entropy run per chunk of tokens, and each chunk is checkpointed, so backward
    recomputes that chunk's logits instead of keeping them. Peak memory: one chunk of logits, not the batch's."""
    B, T, H = hidden_BTH.shape
    flat_NH, tgt_N = hidden_BTH.reshape(B * T, H), targets_BT.reshape(B * T)

    def one(h_nH, t_n):
        lp, ent = token_logprobs(head(h_nH)[None], t_n[None], temperature, with_entropy)
        return lp[0], (ent[0] if ent is not None else torch.zeros(0))

    logps, ents = [], []
    for i in range(0, B * T, chunk_tokens):
        h, t = flat_NH[i : i + chunk_tokens], tgt_N[i : i + chunk_tokens]
        lp, ent = (
            checkpoint(one, h, t, use_reentrant=False) if torch.is_grad_enabled() and h.requires_grad else one(h, t)
        )
        logps.append(lp)
        ents.append(ent.detach())
    logp_BT = torch.cat(logps).view(B, T)
    return logp_BT, (torch.cat(ents).view(B, T) if with_entropy else None)


def completion_logprobs(
    model,
    groups: list[GroupSlice],
    pad_id: int,
    temperature: float = 1.0,
    shared: bool = True,
    with_entropy: bool = False,
    chunk_tokens: int = 0,
) -> MicroBatchTensors:
    """chunk_tokens > 0: compute the output projection per chunk of that many tokens (chunked_token_logprobs)."""
    seqs = [s for g in groups for s in g.sequences]
    dev = next(model.parameters()).device
    comp_BT = _pad([s.completion_ids for s in seqs], pad_id).to(dev)
    mask_BT = _pad([s.loss_mask for s in seqs], 0).to(dev)
    valid_BT = _pad([[1] * len(s.completion_ids) for s in seqs], 0).to(dev)
    # With chunking the forward passes stop before the output projection (`hidden`), else they return logits.
    run = _HiddenModel(model) if chunk_tokens else model
    if shared:
        out = _shared_prefix_logits(run, groups, comp_BT, valid_BT, pad_id)
    else:
        out = _full_logits(run, seqs, pad_id, comp_BT.shape[1], dev)
    if chunk_tokens:
        logp_BT, ent_BT = chunked_token_logprobs(
            out, model.get_output_embeddings(), comp_BT, temperature, with_entropy, chunk_tokens
        )
    else:
        logp_BT, ent_BT = token_logprobs(out, comp_BT, temperature, with_entropy)
    logp_BT = logp_BT * valid_BT
    return MicroBatchTensors(logp_BT=logp_BT, mask_BT=mask_BT * valid_BT, entropy_BT=ent_BT)


class _HiddenModel:
    """Calls the model's decoder (no output projection) and presents its last hidden states as `.logits`, so the
    prefix-sharing and full-sequence passes below serve both paths unchanged."""

    def __init__(self, model):
        self.model, self.decoder = model, model.get_decoder()

    def __call__(self, logits_to_keep: int = 0, **kw):
        out = self.decoder(**kw)
        h = out.last_hidden_state
        return _Out(h[:, -logits_to_keep:] if logits_to_keep else h)


@dataclass
class _Out:
    logits: torch.Tensor


class _RecordLayer(DynamicLayer):
    """The prompt pass's cache layer: keeps the keys/values it is handed (replacing, not appending), so a replay of
    the layer in backward leaves it as the forward did."""

    replay_safe = True
    keys: torch.Tensor  # set by the prompt pass (DynamicLayer declares them optional: empty until then)
    values: torch.Tensor

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.keys, self.values = key_states, value_states
        return key_states, value_states


class _PrefixLayer(DynamicLayer):
    """The completion pass's cache layer: a fixed prefix. `update` returns prefix + the new keys/values without
    storing them, so its length (and the attention mask built from it) is the prefix's however often it runs."""

    replay_safe = True
    keys: torch.Tensor  # the prefix, set at construction
    values: torch.Tensor

    def __init__(self, keys: torch.Tensor, values: torch.Tensor):
        super().__init__()
        self.keys, self.values, self.device, self.is_initialized = keys, values, keys.device, True

    def update(self, key_states, value_states, *args, **kwargs):
        return torch.cat([self.keys, key_states], dim=-2), torch.cat([self.values, value_states], dim=-2)


def _shared_prefix_logits(model, groups: list[GroupSlice], comp_BT, valid_BT, pad_id: int) -> torch.Tensor:
    dev = comp_BT.device
    prompt_PL = _pad([g.prompt_ids for g in groups], pad_id, left=True).to(dev)
    pmask_PL = _pad([[1] * len(g.prompt_ids) for g in groups], 0, left=True).to(dev)
    padded = bool((pmask_PL == 0).any())
    ppos_PL = (pmask_PL.cumsum(-1) - 1).clamp(min=0)
    record = Cache(layer_class_to_replicate=_RecordLayer)
    arg = cache_arg_name(getattr(model, "model", model))
    # use_cache=False: the cache passed is used either way; True would make a checkpointed layer drop it with a warning.
    out = model(
        input_ids=prompt_PL,
        attention_mask=pmask_PL if padded else None,
        position_ids=ppos_PL,
        **{arg: record},
        use_cache=False,
        logits_to_keep=1,
    )
    row_to_prompt = torch.tensor([gi for gi, g in enumerate(groups) for _ in g.sequences], device=dev)
    cache = Cache(
        layers=[
            _PrefixLayer(lay.keys.index_select(0, row_to_prompt), lay.values.index_select(0, row_to_prompt))
            for lay in cast(list[_RecordLayer], record.layers)  # built with layer_class_to_replicate=_RecordLayer
        ]
    )
    first_BV = out.logits[:, -1][row_to_prompt]
    T = comp_BT.shape[1]
    if T == 1:
        return first_BV[:, None]
    # Feed completion tokens 0..T-2; their outputs predict tokens 1..T-1 (token 0 comes from the prompt).
    inp_BT = comp_BT[:, :-1]
    attn = torch.cat([pmask_PL[row_to_prompt], valid_BT[:, :-1]], dim=1)
    pos_BT = ppos_PL[row_to_prompt][:, -1:] + 1 + torch.arange(T - 1, device=dev)[None]
    rest = model(input_ids=inp_BT, attention_mask=attn, position_ids=pos_BT, **{arg: cache}, use_cache=False).logits
    return torch.cat([first_BV[:, None], rest], dim=1)


def _full_logits(model, seqs, pad_id: int, T: int, dev: Any = "cpu") -> torch.Tensor:
    rows = [s.prompt_ids + s.completion_ids for s in seqs]
    ids = _pad(rows, pad_id).to(dev)
    attn = _pad([[1] * len(r) for r in rows], 0).to(dev)
    logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits
    # Completion token j of row i sits at position len(prompt_i) + j and is predicted at the position before.
    idx = torch.stack([torch.arange(T) + len(s.prompt_ids) - 1 for s in seqs]).clamp(max=ids.shape[1] - 1).to(dev)
    return logits.gather(1, idx[:, :, None].expand(-1, -1, logits.shape[-1]))
