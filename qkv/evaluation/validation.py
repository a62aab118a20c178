"""Validation losses, every model's in one place: a GPT's on a token array, a translator's on held-out pairs,
a fine-tuned GPT's on the responses of held-out instructions.

Perplexity is exp(mean next-token negative log-likelihood, in nats). A GPT's has two estimators:

- :func:`evaluate_tokens`: every token of the array once, in consecutive non-overlapping windows of the
  context length (deterministic; what the benchmark tables quote as "full").
- :func:`estimate_loss`: the mean over ``iters`` batches of random windows drawn with a fixed seed, as
  nanoGPT's ``estimate_loss`` does; cheap enough to run during training, and with the seed fixed every
  call sees the same windows, so successive values are comparable.

Both predict each token from the tokens before it inside its window, so they agree in expectation.
:func:`translation_loss` teacher-forces every validation pair (label-smoothed loss and plain NLL per target
token), :func:`response_loss` scores only the responses of instruction pairs. Given the ranks of a data-parallel run (``ranks``), each rank scores every ``world_size``-th window or
batch and the sums are added over the ranks: every rank returns the value one process would.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from qkv.data.translation import eval_batches
from qkv.data.lm import windows_at
from qkv.data.sft import SFTExample, collate
from qkv.evaluation.losses import label_smoothed_nll, masked_nll
from qkv.devices import autocast, evaluating, model_device
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


def translation_loss(model: nn.Module, examples, max_tokens: int, tok, smoothing: float, device: torch.device,
                     ranks: Ranks = SINGLE, amp: torch.dtype | None = None) -> dict[str, float]:
    """Label-smoothed loss and plain NLL per target token over every validation pair (teacher forcing);
    with ``ranks``, each rank scores every ``world_size``-th batch and the sums are added."""
    loss_sum = nll_sum = 0.0
    n = 0
    batches = eval_batches(examples, max_tokens, tok.pad_id, tok.bos_id, tok.eos_id)
    with evaluating(model):
        for batch in itertools.islice(batches, ranks.rank, None, ranks.world_size):  # this rank's share
            batch = batch.to(device)
            keep = batch.tgt_out != tok.pad_id  # (B, T): only real target positions are scored
            with autocast(device, amp):
                logits = model(batch.src, batch.tgt_in, keep=keep)  # (N, V)
            out = label_smoothed_nll(logits.float(), batch.tgt_out[keep], smoothing, ignore_index=tok.pad_id)
            k = int(out.n_tokens)
            loss_sum += float(out.loss) * k
            nll_sum += float(out.nll) * k
            n += k
    loss_sum, nll_sum, n = ranks.add(loss_sum, nll_sum, n, device=device)
    return {"loss": loss_sum / max(n, 1), "nll": nll_sum / max(n, 1), "ppl": math.exp(min(nll_sum / max(n, 1), 50.0))}


def response_loss(model: nn.Module, examples: Sequence[SFTExample], pad_id: int, batch_size: int = 32,
                  amp: torch.dtype | None = None, ranks: Ranks = SINGLE) -> dict[str, float]:
    """Response-only NLL over every example (token-weighted mean) and its perplexity; with ``ranks``, each
    rank scores every ``world_size``-th batch and the sums are added."""
    device = model_device(model)
    total, count = 0.0, 0
    with evaluating(model):
        # Sorted by length so each batch pads little.
        order = sorted(range(len(examples)), key=lambda i: len(examples[i].ids))
        starts = range(0, len(order), batch_size)
        for i in (starts[k] for k in ranks.share(len(starts))):
            x, y, mask = (t.to(device) for t in collate([examples[j] for j in order[i:i + batch_size]], pad_id))
            with autocast(device, amp):
                logits = model(x)
            out = masked_nll(logits.float(), y, mask)
            total += out.nll.item() * int(out.n_tokens)
            count += int(out.n_tokens)
    total, count = ranks.add(total, count, device=device)
    loss = total / max(count, 1)
    return {"loss": loss, "ppl": math.exp(min(loss, 700.0)), "tokens": int(count)}


__all__ = ["evaluate_tokens", "estimate_loss", "translation_loss", "response_loss"]
