"""What every training recipe shares: its ``train:`` knobs, named once, and the start of a run.

Translation (:mod:`qkv.training.train_mt`), GPT pretraining (:mod:`qkv.training.train_lm`) and
fine-tuning (:mod:`qkv.training.finetune`) each read a recipe of the same shape (``model:``, ``data:``,
``train:``), and their ``train:`` sections extend :class:`LoopConfig`, so a knob has one name and one
meaning in every job: ``steps``, ``warmup``, ``accumulate``, ``clip_norm``, ``eval_every``,
``log_every``, ``seed``, ``device``, ``dtype``, ``threads``, ``max_minutes``. A job changes a default
only where its recipe differs (a GPT warms up for 100 steps, the paper's Transformer for 4,000).

:func:`start` is the first thing every trainer does: threads, seeds, the device and the precision,
from the same knobs, with the same errors.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from qkv.config import ConfigError
from qkv.io import DEVICE_DEFAULT, DTYPES, autocast_dtype, resolve_device


@dataclass(frozen=True)
class LoopConfig:
    """The knobs of a training loop that every recipe has (its ``train:`` section).

    Attributes:
        steps: Optimizer updates (the paper: 100,000 for the base model).
        max_minutes: Also stop once this much training time has gone by, with the same final
            evaluation and export as at ``steps`` (None: no limit).
        warmup: Steps of linear warmup of the learning rate (the paper: 4,000).
        accumulate: Batches whose gradients are summed into one update (a bigger effective batch).
        clip_norm: Clip the gradient's global norm to this (0: no clipping).
        eval_every: Validate (and checkpoint) every this many steps, and at the end.
        log_every: Write a training line to metrics.jsonl every this many steps.
        seed: Seeds the initial weights, dropout and the order of the data.
        device: ``auto`` (CUDA when present, else the CPU), ``cpu``, ``cuda`` or ``cuda:N``.
        dtype: ``auto`` (bf16 autocast on CUDA, fp32 on CPU), ``fp32`` or ``bf16`` (CUDA only).
        threads: CPU threads for torch (0: torch's default). On a shared machine 1 can be faster than
            2: a busy core stalls every multi-threaded operation.
    """

    steps: int = 20000
    max_minutes: float | None = None
    warmup: int = 4000
    accumulate: int = 1
    clip_norm: float = 1.0
    eval_every: int = 1000
    log_every: int = 100
    seed: int = 1
    device: str = DEVICE_DEFAULT
    dtype: str = "auto"
    threads: int = 0

    def __post_init__(self) -> None:
        for name in ("steps", "accumulate", "eval_every", "log_every"):
            if getattr(self, name) < 1:
                raise ConfigError(f"train.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("warmup", "threads", "clip_norm"):
            if getattr(self, name) < 0:
                raise ConfigError(f"train.{name} must be >= 0, got {getattr(self, name)}")
        if self.max_minutes is not None and self.max_minutes <= 0:
            raise ConfigError(f"train.max_minutes must be > 0 (or null), got {self.max_minutes}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"train.dtype must be one of {list(DTYPES)}, got {self.dtype!r}")


class Start(NamedTuple):
    """Where a run computes: its device, and the autocast dtype there (None: fp32)."""

    device: torch.device
    amp: torch.dtype | None


def start(cfg: LoopConfig) -> Start:
    """Set the threads and seed every generator (torch, Python, NumPy) from ``cfg``; resolve device and precision.

    Raises:
        DeviceError: ``cfg.device`` is not there (``cuda`` on a machine without CUDA).
        ValueError: bf16 asked for on a CPU.
    """
    device = resolve_device(cfg.device)
    amp = autocast_dtype(cfg.dtype, device)
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed % 2**32)
    return Start(device, amp)


__all__ = ["LoopConfig", "Start", "start"]
