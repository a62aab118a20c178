"""Capture attention maps: per layer and kind, the (B, H, T_query, T_key) weights whose rows sum to 1.

    with capture_attention(model) as maps:
        model(src, tgt)
    maps["cross"][layer]          # (B, H, T, S)

While the context is open, every attention module computes its weights on the explicit path and hands
them here (through ``qkv.modules.attention.attention_observer``); outside it nothing is computed or
stored, and the fused path runs as usual. Nothing is kept on the modules themselves.

The kind and layer of a map come from where its module sits in the model, by the models' part names:
``encoder_layers.i.self_attn`` is layer i's encoder self-attention, ``decoder_layers.i.self_attn`` and
``decoder_layers.i.cross_attn`` the decoder's masked self-attention and its cross-attention, and a
GPT's ``layers.i.self_attn`` its (masked) self-attention.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from typing import Iterator

import torch
from torch import Tensor, nn

from qkv.modules.attention import Attention, attention_observer

_KIND_OF_PART = {("encoder_layers", "self_attn"): "encoder_self", ("decoder_layers", "self_attn"): "decoder_self",
                 ("decoder_layers", "cross_attn"): "cross", ("layers", "self_attn"): "self"}
KINDS: tuple[str, ...] = tuple(dict.fromkeys(_KIND_OF_PART.values()))  # encoder_self, decoder_self, cross, self
_PART = re.compile(r"(?:^|\.)(encoder_layers|decoder_layers|layers)\.(\d+)\.(self_attn|cross_attn)$")


def attention_modules(model: nn.Module) -> dict[int, tuple[str, int]]:
    """``id(module) -> (kind, layer)`` for every attention module of ``model``, from its place in the model.

    Raises:
        ValueError: an attention module whose place names no kind (a model built another way).
    """
    found = {}
    for name, module in model.named_modules():
        if not isinstance(module, Attention):
            continue
        m = _PART.search(name)
        if m is None:
            raise ValueError(f"attention module {name!r} is not at a place capture_attention knows "
                             "(encoder_layers.i / decoder_layers.i / layers.i, then self_attn or cross_attn)")
        stack, layer, part = m.groups()
        found[id(module)] = (_KIND_OF_PART[stack, part], int(layer))
    return found


class AttentionMaps(dict):
    """``{kind: [weights of layer 0, layer 1, ...]}``; with a KV cache, one step's maps are appended
    along the query axis, so a whole generation reads as one (B, H, T, L) map per layer (keys padded
    with zeros to the final length)."""

    def layers(self, kind: str) -> list[Tensor]:
        return self.get(kind, [])


@contextmanager
def capture_attention(model: nn.Module, detach: bool = True) -> Iterator[AttentionMaps]:
    """Record the attention weights of ``model`` while open."""
    maps = AttentionMaps()
    # A layer is known by its W^O: a generation decodes on a copy of the model's modules (qkv.accel.swap),
    # other objects that share the model's Parameters.
    found = attention_modules(model)
    places = {id(m.out_proj.weight): found[id(m)] for m in model.modules() if id(m) in found}
    steps: dict[tuple[str, int], list[Tensor]] = {}

    def observe(module: nn.Module, weights: Tensor) -> None:
        place = places.get(id(getattr(module.out_proj, "weight", None)))
        if place is not None:
            steps.setdefault(place, []).append(weights.detach() if detach else weights)

    token = attention_observer.set(observe)
    try:
        yield maps
    finally:
        attention_observer.reset(token)
        for (kind, layer), chunks in sorted(steps.items()):
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
