"""Choosing the next token from logits: greedy, temperature, top-k, top-p (nucleus) sampling."""

from __future__ import annotations

import torch
from torch import Tensor

from qkv.errors import ConfigError


def check_sampling_args(temperature: float, top_k: int | None, top_p: float | None) -> None:
    """Clear errors for settings that have no meaning."""
    if not temperature >= 0 or temperature == float("inf"):  # NaN fails every comparison
        raise ConfigError(f"temperature must be a finite number >= 0 (0 = greedy), got {temperature}")
    if top_k is not None and top_k < 0:
        raise ConfigError(f"top_k must be >= 0 (0 = off), got {top_k}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ConfigError(f"top_p must be in (0, 1], got {top_p}")


def filter_logits(logits: Tensor, top_k: int | None = None, top_p: float | None = None) -> Tensor:
    """Set to -inf every logit outside the top k, and outside the smallest set whose probability
    reaches top_p (always keeping the most likely token).

    Args:
        logits: (B, V).
    """
    if top_k:
        k = min(top_k, logits.shape[-1])
        kth = torch.topk(logits, k, dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # (B, V)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        # Drop a token when the tokens before it already reach top_p.
        drop_sorted = (cum - torch.softmax(sorted_logits, dim=-1)) >= top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)  # back to vocabulary order
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def next_token(logits: Tensor, temperature: float, top_k: int | None = None, top_p: float | None = None,
               generator: torch.Generator | None = None) -> Tensor:
    """Pick one token per row: (B, V) logits -> (B,) ids. Temperature 0 is greedy (argmax)."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = filter_logits(logits.float() / temperature, top_k, top_p)
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
