"""Switching attention heads off: the test of what a head does, beyond where it looks.

A head that puts its weight on 小明 when it reads 他 may or may not be what makes the model write "he";
switching it off and translating again says which. Off, a head's output is zeroed before W^O, so its
columns of W^O drop out of the sum (Section 3.2.2: MultiHead = Concat(head_1, ..., head_h) W^O); the
other heads, the residual path and every weight stay as they are.

    with heads_off(model, [("cross", 1, 0)]):
        translator.translate("小明累了，他想睡觉。")

It works from outside the paper's modules: a forward pre-hook on each chosen layer's W^O, removed when
the context closes, so the model afterwards is the model before.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterable, Iterator

from torch import Tensor, nn

from qkv.interpret.capture import KINDS, attention_modules
from qkv.modules.attention import Attention

Head = tuple[str, int, int]  # (kind, layer, head): ("cross", 1, 0) is layer 1's cross-attention, head 0


def parse_heads(text: str) -> list[Head]:
    """``"cross:1:0,encoder_self:0:3"`` -> ``[("cross", 1, 0), ("encoder_self", 0, 3)]`` (empty text: none)."""
    heads = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        fields = item.split(":")
        if len(fields) != 3 or not fields[1].isdigit() or not fields[2].isdigit():
            raise ValueError(f"head {item!r}: write KIND:LAYER:HEAD, e.g. cross:1:0")
        heads.append((fields[0], int(fields[1]), int(fields[2])))
    return heads


def _modules_by_place(model: nn.Module) -> dict[tuple[str, int], Attention]:
    by_id = {id(m): m for m in model.modules() if isinstance(m, Attention)}
    return {place: by_id[i] for i, place in attention_modules(model).items()}


@contextmanager
def heads_off(model: nn.Module, heads: Iterable[Head]) -> Iterator[nn.Module]:
    """While open, each of ``heads`` contributes nothing: its slice of the heads' concatenation is zero
    when it reaches W^O.

    Raises:
        ValueError: a kind, layer or head the model does not have (the message names what it has).
    """
    places = _modules_by_place(model)
    chosen: dict[tuple[str, int], set[int]] = {}
    for kind, layer, head in heads:
        module = places.get((kind, layer))
        if module is None:
            have = sorted(f"{k}:{n}" for k, n in places)
            raise ValueError(f"no attention {kind}:{layer} in this model (kinds {list(KINDS)}; it has {have})")
        if not 0 <= head < module.n_heads:
            raise ValueError(f"{kind}:{layer} has heads 0..{module.n_heads - 1}, not {head}")
        chosen.setdefault((kind, layer), set()).add(head)

    handles = []
    for place, off in chosen.items():
        module = places[place]

        def zero_heads(_out_proj: nn.Module, args: tuple[Tensor, ...], off=sorted(off), width=module.d_v):
            x = args[0].clone()  # (B, T, H * d_v) or (N, H * d_v) packed: the heads side by side on the last axis
            for h in off:
                x[..., h * width:(h + 1) * width] = 0
            return (x,) + args[1:]

        handles.append(module.out_proj.register_forward_pre_hook(zero_heads))
    try:
        yield model
    finally:
        for handle in handles:
            handle.remove()


__all__ = ["Head", "heads_off", "parse_heads"]
