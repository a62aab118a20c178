"""Capture attention maps: per layer and kind, the (B, H, T_query, T_key) weights whose rows sum to 1.

    with capture_attention(model) as maps:
        model(src, tgt)
    maps["cross"][layer]          # (B, H, T, S)

While the context is open, every attention module computes its weights on the explicit path and hands
them here (through ``qkv.modules.attention.attention_observer``); outside it nothing is computed or
stored, and the fused path runs as usual. Nothing is kept on the modules themselves.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from torch import Tensor, nn

from qkv.modules.attention import MultiHeadAttention, attention_observer

KINDS = ("encoder_self", "decoder_self", "cross", "self")


class AttentionMaps(dict):
    """``{kind: [weights of layer 0, layer 1, ...]}``; with a KV cache, one step's maps are appended
    along the query axis, so a whole generation reads as one (B, H, T, L) map per layer (keys padded
    with zeros to the final length)."""

    def layers(self, kind: str) -> list[Tensor]:
        return self.get(kind, [])


@contextmanager
def capture_attention(model: nn.Module | None = None, detach: bool = True) -> Iterator[AttentionMaps]:
    """Record the attention weights of ``model`` (or of every attention module, if None) while open."""
    maps = AttentionMaps()
    owned = None if model is None else {id(m) for m in model.modules() if isinstance(m, MultiHeadAttention)}
    steps: dict[tuple[str, int], list[Tensor]] = {}

    def observe(module: MultiHeadAttention, weights: Tensor) -> None:
        if owned is not None and id(module) not in owned:
            return
        steps.setdefault((module.kind, module.layer), []).append(weights.detach() if detach else weights)

    token = attention_observer.set(observe)
    try:
        yield maps
    finally:
        attention_observer.reset(token)
        for (kind, layer), chunks in sorted(steps.items(), key=lambda kv: (kv[0][0], kv[0][1])):
            per_kind = maps.setdefault(kind, [])
            while len(per_kind) <= layer:
                per_kind.append(None)
            per_kind[layer] = _concat_steps(chunks)


def _concat_steps(chunks: list[Tensor]) -> Tensor:
    """Join the maps of successive decoding steps along the query axis (keys grow with the cache)."""
    if len(chunks) == 1:
        return chunks[0]
    length = max(c.shape[-1] for c in chunks)
    padded = [torch.nn.functional.pad(c, (0, length - c.shape[-1])) for c in chunks]
    return torch.cat(padded, dim=-2)  # (B, H, sum T, L)
