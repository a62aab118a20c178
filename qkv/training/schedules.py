"""Learning-rate schedules as pure functions of the step, and a helper that applies a rate to an optimizer.

Steps are counted from 1: ``step`` is the number of the optimizer update about to be taken, so the
first update uses ``lr(1)``. A trainer calls ``set_lr(optimizer, schedule(step))`` before each
``optimizer.step()``; nothing here holds state, so resuming only needs the step number.
"""

from __future__ import annotations

import math

import torch


def _check_step(step: int, where: str) -> None:
    if step < 1:
        raise ValueError(f"{where}: step is counted from 1 (the first update is step 1), got {step}")


def noam_lr(step: int, d_model: int, warmup: int, factor: float = 1.0) -> float:
    """The paper's schedule (Section 5.3, equation 3).

    ``lrate = factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)``: linear increase for the
    first ``warmup`` steps, then decrease proportional to the inverse square root of the step. The
    maximum, ``factor * (d_model * warmup)^-0.5``, is reached at ``step == warmup``.

    Args:
        step: Update number, counted from 1.
        d_model: Model width (the paper's base model: 512).
        warmup: Warmup steps (the paper: 4000).
        factor: Multiplier on the whole curve (1.0 in the paper).

    Returns:
        The learning rate for this step.
    """
    _check_step(step, "noam_lr")
    if warmup < 1 or d_model < 1:
        raise ValueError(f"noam_lr: warmup and d_model must be >= 1, got warmup={warmup}, d_model={d_model}")
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def noam_peak_lr(d_model: int, warmup: int, factor: float = 1.0) -> float:
    """The maximum of :func:`noam_lr`, reached at ``step == warmup``: ``factor * (d_model * warmup)^-0.5``."""
    return factor * (d_model * warmup) ** -0.5


def inverse_sqrt_lr(step: int, warmup: int, peak_lr: float) -> float:
    """The paper's schedule rescaled so that its maximum (at ``step == warmup``) equals ``peak_lr``.

    The same curve as :func:`noam_lr` (linear warmup, then ``peak_lr * sqrt(warmup / step)``), set by
    the peak rate rather than by ``d_model`` and a factor, which is easier to tune on small models.

    Args:
        step: Update number, counted from 1.
        warmup: Warmup steps.
        peak_lr: The learning rate at ``step == warmup``.

    Returns:
        The learning rate for this step.
    """
    _check_step(step, "inverse_sqrt_lr")
    if warmup < 1:
        raise ValueError(f"inverse_sqrt_lr: warmup must be >= 1, got {warmup}")
    # noam_lr / noam_peak_lr = min(step^-0.5, step * warmup^-1.5) * warmup^0.5
    return peak_lr * min((warmup / step) ** 0.5, step / warmup)


def cosine_lr(step: int, max_lr: float, min_lr: float, warmup: int, total: int) -> float:
    """Linear warmup to ``max_lr``, then cosine decay to ``min_lr`` at ``total``, constant after (as nanoGPT).

    Args:
        step: Update number, counted from 1.
        max_lr: Rate reached at ``step == warmup``.
        min_lr: Rate at ``step == total`` and after.
        warmup: Warmup steps (0 for none: the decay starts at ``max_lr``).
        total: Step at which the decay ends; must be > ``warmup``.

    Returns:
        The learning rate for this step.
    """
    _check_step(step, "cosine_lr")
    if warmup < 0 or total <= warmup:
        raise ValueError(f"cosine_lr: need 0 <= warmup < total, got warmup={warmup}, total={total}")
    if step <= warmup:
        return max_lr * step / warmup
    if step >= total:
        return min_lr
    progress = (step - warmup) / (total - warmup)  # in (0, 1)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (max_lr - min_lr)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set the learning rate of every parameter group of ``optimizer`` to ``lr``.

    A group may carry an ``lr_scale`` entry (e.g. a different rate for adapters); its rate is then
    ``lr * lr_scale``.
    """
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
