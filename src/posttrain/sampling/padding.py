"""Prompts of different lengths in one batch, right-aligned (the decode loops and the judges' scorers share it)."""

from __future__ import annotations

import torch


def left_pad(rows: list[list[int]], pad_id: int, mask_width: int, device) -> tuple[torch.Tensor, ...]:
    """Prompts right-aligned in one batch: ids (B, Lp) padded on the left, an attention mask (B, mask_width >= Lp:
    1 from each row's first token on, through the columns after the prompts too) and position ids (B, Lp)."""
    Lp = max(len(r) for r in rows)
    ids = torch.full((len(rows), Lp), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), mask_width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, Lp - len(r) :] = torch.tensor(r)
        mask[i, Lp - len(r) :] = 1
    ids, mask = ids.to(device), mask.to(device)
    return ids, mask, (mask[:, :Lp].cumsum(-1) - 1).clamp(min=0)
