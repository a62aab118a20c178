"""Attention masks: the only place they are built.

Convention (docs/ARCHITECTURE.md, "Models, attention and caches"): boolean, True = may attend. Shapes
broadcast against the scores (B, H, T, L): a padding mask is (B, 1, 1, L), a causal mask (1, 1, T, L), their combination
(B, 1, T, L).
"""

from __future__ import annotations

import torch
from torch import Tensor


def padding_mask(tokens: Tensor, pad_id: int) -> Tensor:
    """Keys that are real tokens, not padding.

    Args:
        tokens: (B, L) token ids.
        pad_id: the padding id.

    Returns:
        (B, 1, 1, L) bool, True where the key is not padding.
    """
    if tokens.dim() != 2:
        raise ValueError(f"padding_mask: expected token ids of shape (B, L), got {tuple(tokens.shape)}")
    return (tokens != pad_id)[:, None, None, :]  # (B, 1, 1, L)


def lengths_mask(lengths: Tensor, max_len: int) -> Tensor:
    """Keys before each sequence's length: (B,) lengths -> (B, 1, 1, max_len) bool."""
    positions = torch.arange(max_len, device=lengths.device)
    return (positions[None, :] < lengths[:, None])[:, None, None, :]  # (B, 1, 1, L)


def causal_mask(t: int, l: int | None = None, offset: int = 0, device: torch.device | str | None = None) -> Tensor:
    """Each query sees only keys at or before its own position (Section 3.2.3: "prevent leftward
    information flow in the decoder").

    With a KV cache the T new queries sit at absolute positions offset .. offset+T-1 and the L keys at
    0 .. L-1, so query i may attend key j iff j <= offset + i.

    Args:
        t: number of queries T.
        l: number of keys L (default offset + t).
        offset: absolute position of the first query (the cache length before this step).

    Returns:
        (1, 1, T, L) bool.
    """
    l = offset + t if l is None else l
    q_pos = torch.arange(offset, offset + t, device=device)[:, None]  # (T, 1)
    k_pos = torch.arange(l, device=device)[None, :]  # (1, L)
    return (k_pos <= q_pos)[None, None]  # (1, 1, T, L)


def combine(*masks: Tensor | None) -> Tensor | None:
    """Logical AND of broadcastable masks, skipping None; None if all are None."""
    out = None
    for m in masks:
        if m is None:
            continue
        out = m if out is None else out & m
    return out


def check_mask(mask: Tensor, batch: int, t: int, l: int) -> None:
    """Raise a clear error unless ``mask`` is a bool tensor broadcastable to (B, H, T, L)."""
    if mask.dtype != torch.bool:
        raise TypeError(f"attention mask must be torch.bool (True = may attend), got {mask.dtype}")
    if mask.dim() != 4:
        raise ValueError(
            f"attention mask must have 4 dims broadcastable to (B, H, T, L) = ({batch}, H, {t}, {l}), "
            f"got shape {tuple(mask.shape)}"
        )
    b, _, mt, ml = mask.shape
    if b not in (1, batch) or mt not in (1, t) or ml != l:
        raise ValueError(
            f"attention mask of shape {tuple(mask.shape)} does not broadcast to (B, H, T, L) = "
            f"({batch}, H, {t}, {l}); expected (B or 1, 1 or H, T or 1, L)"
        )
