"""Optimizer builders: the paper's Adam, and AdamW with weight decay on matrices only (GPT practice).

Only trainable parameters (``requires_grad``) are given to the optimizer, so a frozen base with
LoRA adapters trains the adapters alone. Tied parameters (a shared embedding / output projection)
appear once: ``named_parameters`` skips the second name of a shared tensor.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def trainable_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """``(name, parameter)`` for every trainable parameter, each tensor once (tied weights under their first name)."""
    seen: set[int] = set()
    out = []
    for name, p in model.named_parameters():  # remove_duplicate=True by default
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            out.append((name, p))
    if not out:
        raise ValueError(f"{type(model).__name__} has no trainable parameters (all have requires_grad=False)")
    return out


def _fused_supported(params: list[torch.Tensor]) -> bool:
    """Whether torch's fused Adam/AdamW kernel runs on these parameters' devices and dtypes."""
    try:
        from torch.optim.optimizer import _get_fused_kernels_supported_devices

        devices = set(_get_fused_kernels_supported_devices())
    except ImportError:  # private helper moved: be conservative
        devices = {"cuda"}
    return all(p.device.type in devices and p.is_floating_point() for p in params)


def _impl_kwargs(params: list[torch.Tensor], fused: bool | None) -> dict[str, Any]:
    # The fused kernel updates all parameters in one pass: far faster than foreach on a CPU
    # (docs/BENCHMARKS.md, "The figures behind the decoding rules", beside decoding), and the fastest on CUDA too.
    if fused is None:
        fused = _fused_supported(params)
    return {"fused": True} if fused else {"foreach": None}


def build_adam(
    model: nn.Module,
    lr: float,
    betas: tuple[float, float] = (0.9, 0.98),
    eps: float = 1e-9,
    weight_decay: float = 0.0,
    fused: bool | None = None,
) -> torch.optim.Adam:
    """The paper's optimizer (Section 5.3): Adam with beta1 = 0.9, beta2 = 0.98, epsilon = 1e-9.

    The learning rate is normally driven by a schedule (``schedules.noam_lr``) through
    ``schedules.set_lr``; ``lr`` is only the initial value.

    Args:
        model: The module whose trainable parameters are optimized.
        lr: Initial learning rate.
        betas: Adam's (beta1, beta2).
        eps: Adam's epsilon.
        weight_decay: L2 penalty added to the gradient (the paper uses none).
        fused: Use the fused kernel; None picks it when the device and dtype support it.

    Returns:
        A ``torch.optim.Adam`` over each trainable parameter once.
    """
    params = [p for _, p in trainable_parameters(model)]
    return torch.optim.Adam(
        params,
        lr=lr,
        betas=(float(betas[0]), float(betas[1])),
        eps=eps,
        weight_decay=weight_decay,
        **_impl_kwargs(params, fused),
    )


def decay_param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Two parameter groups: matrices and embeddings (dim >= 2) decayed, biases and norm gains (dim < 2) not.

    This is GPT-2 / nanoGPT practice: decaying a LayerNorm gain or a bias pulls it toward zero for
    no regularizing benefit. :func:`decay_param_names` lists which names fall in each group. Empty
    groups are left out.
    """
    decay, no_decay = [], []
    for _, p in trainable_parameters(model):
        (decay if p.dim() >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def decay_param_names(model: nn.Module) -> tuple[list[str], list[str]]:
    """Names of the trainable parameters that :func:`decay_param_groups` decays, and of those it does not."""
    decay, no_decay = [], []
    for name, p in trainable_parameters(model):
        (decay if p.dim() >= 2 else no_decay).append(name)
    return decay, no_decay


def build_adamw(
    model: nn.Module,
    lr: float,
    betas: tuple[float, float] = (0.9, 0.95),
    weight_decay: float = 0.1,
    eps: float = 1e-8,
    fused: bool | None = None,
) -> torch.optim.AdamW:
    """AdamW as GPT-2 / nanoGPT train: decoupled weight decay on matrices and embeddings only.

    Args:
        model: The module whose trainable parameters are optimized.
        lr: Initial (or peak) learning rate; a schedule sets it each step.
        betas: Adam's (beta1, beta2); 0.95 for beta2 is the usual GPT choice.
        weight_decay: Decay for parameters with dim >= 2; biases and LayerNorm gains get none.
        eps: Adam's epsilon.
        fused: Use the fused kernel; None picks it when the device and dtype support it.

    Returns:
        A ``torch.optim.AdamW`` with up to two parameter groups (decayed first).
    """
    groups = decay_param_groups(model, weight_decay)
    params = [p for g in groups for p in g["params"]]
    return torch.optim.AdamW(
        groups, lr=lr, betas=(float(betas[0]), float(betas[1])), eps=eps, **_impl_kwargs(params, fused)
    )
