"""Loss and perplexity of a language model on a token array: a full pass, or nanoGPT's random-window estimate.

Perplexity is exp(mean next-token negative log-likelihood, in nats). Two estimators:

- :func:`evaluate_tokens`: every token of the array once, in consecutive non-overlapping windows of the
  context length (deterministic; what the benchmark tables quote as "full").
- :func:`estimate_loss`: the mean over ``iters`` batches of random windows drawn with a fixed seed, as
  nanoGPT's ``estimate_loss`` does; cheap enough to run during training, and with the seed fixed every
  call sees the same windows, so successive values are comparable.

Both predict each token from the tokens before it inside its window, so they agree in expectation.
Given the ranks of a data-parallel run (``ranks``), each rank scores every ``world_size``-th window or
batch and the sums are added over the ranks: every rank returns the value one process would.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from qkv.data.lm import windows_at
from qkv.io import autocast, evaluating, model_device
from qkv.parallel import SINGLE, Ranks


def evaluate_tokens(
    model: nn.Module,
    tokens: np.ndarray,
    context: int,
    batch_size: int = 32,
    max_windows: int | None = None,
    autocast_dtype: torch.dtype | None = None,
    ranks: Ranks = SINGLE,
) -> dict[str, Any]:
    """Mean next-token NLL over ``tokens`` in non-overlapping windows of ``context`` predictions.

    Args:
        model: Maps (B, T) ids to (B, T, V) logits.
        tokens: (N,) ids (e.g. the validation split).
        context: Predictions per window (the model reads ``context`` tokens).
        batch_size: Windows per forward pass.
        max_windows: Stop after this many windows (None: the whole array).
        autocast_dtype: bf16 on CUDA, None for fp32.
        ranks: The ranks that share the windows (each scores every ``world_size``-th).

    Returns:
        ``{"loss": nats per token, "ppl": exp(loss), "tokens": tokens scored}``.
    """
    if len(tokens) < 2:
        raise ValueError(f"need at least 2 tokens to score, got {len(tokens)}")
    device = model_device(model)
    starts = list(range(0, len(tokens) - 1, context))
    if max_windows is not None:
        starts = starts[:max_windows]
    starts = [starts[i] for i in ranks.share(len(starts))]
    total, count = 0.0, 0
    with evaluating(model):
        # Full windows in batches; the last, shorter window (if any) on its own.
        full = [s for s in starts if s + context + 1 <= len(tokens)]
        tail = [s for s in starts if s + context + 1 > len(tokens)]
        for i in range(0, len(full), batch_size):
            x, y = windows_at(tokens, torch.tensor(full[i:i + batch_size]), context)  # (B, T) each
            with autocast(device, autocast_dtype):
                logits = model(x.to(device))
            total += F.cross_entropy(logits.float().flatten(0, 1), y.to(device).flatten(), reduction="sum").item()
            count += y.numel()
        for s in tail:
            n = len(tokens) - 1 - s
            x, y = windows_at(tokens, torch.tensor([s]), n)
            with autocast(device, autocast_dtype):
                logits = model(x.to(device))
            total += F.cross_entropy(logits.float().flatten(0, 1), y.to(device).flatten(), reduction="sum").item()
            count += y.numel()
    total, count = ranks.add(total, count, device=device)
    loss = total / count
    return {"loss": loss, "ppl": math.exp(min(loss, 700.0)), "tokens": int(count)}


def estimate_loss(
    model: nn.Module,
    tokens: np.ndarray,
    context: int,
    batch_size: int,
    iters: int,
    seed: int = 0,
    autocast_dtype: torch.dtype | None = None,
    ranks: Ranks = SINGLE,
) -> float:
    """nanoGPT's estimate: the mean loss of ``iters`` batches of random windows, drawn with ``seed``.

    The windows come from a private generator, so calling this never moves the training sampler or the
    global RNG (a run evaluated more or less often still trains on the same batches). With ``ranks``,
    every rank draws all ``iters`` batches' windows and scores every ``world_size``-th batch.
    """
    if iters < 1:
        raise ValueError(f"iters must be >= 1, got {iters}")
    high = len(tokens) - context
    if high < 1:
        raise ValueError(f"{len(tokens)} tokens hold no window of context {context} + 1")
    device = model_device(model)
    gen = torch.Generator().manual_seed(seed)
    mine = set(ranks.share(iters))
    total = 0.0
    with evaluating(model):
        for i in range(iters):
            starts = torch.randint(high, (batch_size,), generator=gen)  # (B,): drawn by every rank, in order
            if i not in mine:
                continue
            x, y = windows_at(tokens, starts, context)
            with autocast(device, autocast_dtype):
                logits = model(x.to(device))
            total += F.cross_entropy(logits.float().flatten(0, 1), y.to(device).flatten()).item()
    return ranks.mean_of(total, len(mine), device)
