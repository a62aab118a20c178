"""The decoding model: a copy of a trained model's tree of modules that shares every tensor, made once for a
generation, in which the speed-ups of decoding are swapped in as modules.

A generation never changes the model it is given (gpt-fast's rule: a model is put into its decoding form once
and never undone). :func:`decoding_copy` copies the modules (their structure, configuration, caches and hooks),
not the weights: every parameter and buffer of the copy is the model's own tensor, so the copy costs little
time and no memory (docs/BENCHMARKS.md, "Decoding on a copy of the model"), sees a weight changed since, and
whatever stops a generation leaves nothing to put back. :func:`swap_modules` then replaces submodules of the
copy by setattr on their parent, as ``qkv.modules.lora`` swaps its adapters in: packed linear maps
(qkv.accel.kernels), the modules of a compiled step (qkv.accel.compiled), int8 ones (qkv.accel.quantize).

What the copy keeps for the tools that look at a generation: the model's hooks, on the copy's modules, and
on a module swapped in those of the one it replaces (``qkv.interpret.ablation.heads_off`` turns heads off by a
hook on W^O, the linear map that decoding swaps for a packed one); and the Parameters, by which
``qkv.interpret.capture_attention`` knows a copy's attention layer as the model's.
"""

from __future__ import annotations

from typing import Callable

from torch import nn

# The hook tables of an nn.Module that a module swapped in takes over from the one it replaces.
_HOOKS = ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks", "_forward_hooks_with_kwargs",
          "_forward_hooks_always_called")


def decoding_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model``'s modules, in eval mode, that shares every parameter, buffer and KV cache of
    ``model`` (nothing is copied but the modules themselves) and keeps its hooks; ``model`` is left as it is."""
    return _copy_tree(model, {})


def _copy_tree(module: nn.Module, copies: dict[int, nn.Module]) -> nn.Module:
    """``module`` as a new object in eval mode (:func:`rebuilt`) whose submodules are copied the same way (a
    module at two places stays one, ``copies``): copy.deepcopy would also copy every attribute's value, for
    nothing, in a few times the time."""
    if id(module) in copies:
        return copies[id(module)]
    new = copies[id(module)] = rebuilt(module, type(module))
    new.__dict__["training"] = False  # eval mode, as .eval() sets it (no module of qkv overrides train())
    new._modules = {name: None if child is None else _copy_tree(child, copies)
                    for name, child in module._modules.items()}
    return new


def rebuilt(module: nn.Module, cls: type[nn.Module]) -> nn.Module:
    """A ``cls`` (``module``'s class or a subclass) that holds ``module``'s state: its attributes (configuration,
    caches), Parameters, buffers, submodules and hooks are ``module``'s own objects, in tables of its own, so
    that a swap or a hook in one stays there. How a module is copied, and how a module swapped in takes over
    from the one it replaces, without running ``cls.__init__`` (nothing allocated), as unpickling builds one."""
    new = cls.__new__(cls)
    new.__dict__.update(module.__dict__)
    for name, value in module.__dict__.items():
        if isinstance(value, (dict, set)):  # _parameters, _buffers, _modules, the hook tables, ...
            new.__dict__[name] = type(value)(value)
    return new


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


__all__ = ["decoding_copy", "rebuilt", "swap_modules"]
