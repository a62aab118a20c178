"""The decoding model: a copy of a trained model's tree of modules that shares every tensor, made once for a
generation, in which the speed-ups of decoding are swapped in as modules.

A generation never changes the model it is given (gpt-fast's rule: a model is put into its decoding form once
and never undone). :func:`decoding_copy` copies the modules (their structure, configuration, caches and hooks),
not the weights: every parameter and buffer of the copy is the model's own tensor, so the copy costs
milliseconds and no memory, sees a weight changed since, and whatever stops a generation leaves nothing to put
back. :func:`swap_modules` then replaces submodules of the copy by setattr on their parent, as
``qkv.modules.lora`` swaps its adapters in: packed linear maps (qkv.accel.kernels), the modules of a compiled
step (qkv.accel.compiled), int8 ones (qkv.accel.quantize).

What the copy keeps for the tools that look at a generation: the model's hooks, on the copy's modules, and
on a module swapped in those of the one it replaces (``qkv.interpret.ablation.heads_off`` turns heads off by a
hook on W^O, the linear map that decoding swaps for a packed one); and the Parameters, by which
``qkv.interpret.capture_attention`` knows a copy's attention layer as the model's.
"""

from __future__ import annotations

import copy
from typing import Callable

from torch import nn

# The hook tables of an nn.Module that a module swapped in takes over from the one it replaces.
_HOOKS = ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks", "_forward_hooks_with_kwargs",
          "_forward_hooks_always_called")


def decoding_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model``'s modules, in eval mode, that shares every parameter, buffer and KV cache of
    ``model`` (nothing is copied but the modules themselves) and keeps its hooks; ``model`` is left as it is."""
    shared: dict[int, object] = {id(t): t for t in (*model.parameters(), *model.buffers())}
    for m in model.modules():  # a copy of a copy decodes on the caches its original prefilled
        cache = getattr(m, "cache", None)
        if cache is not None:
            shared[id(cache)] = cache
    return copy.deepcopy(model, memo=shared).eval()  # the hook functions are shared too (deepcopy keeps functions)


def swap_modules(model: nn.Module, swap: Callable[[nn.Module], nn.Module | None]) -> nn.Module:
    """Replace each submodule ``m`` of ``model`` (a decoding copy) for which ``swap(m)`` returns a module by
    that module, in place, by setattr on its parent; the new module takes over ``m``'s hooks.
    Children are swapped before their parent, so ``swap`` sees a module whose submodules are swapped
    already. Returns ``model``."""
    for name, child in list(model.named_children()):
        swap_modules(child, swap)
        new = swap(child)
        if new is None or new is child:
            continue
        for table in _HOOKS:
            getattr(new, table).update(getattr(child, table))
        setattr(model, name, new)
    return model


__all__ = ["decoding_copy", "swap_modules"]
