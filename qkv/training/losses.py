"""Token-level training losses: label-smoothed cross-entropy (translation), NLL (GPT), response-only NLL (SFT).

Every loss is a mean over the tokens that count (not padding, not prompt), returned with the plain
negative log-likelihood (for perplexity, which label smoothing would distort) and the token count
(to weight means across batches or ranks).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


class TokenLoss(NamedTuple):
    """A loss over tokens.

    Attributes:
        loss: Scalar to backpropagate: mean over counted tokens (0.0 when there are none).
        nll: Mean plain negative log-likelihood over the same tokens, detached; ``exp(nll)`` is the
            perplexity.
        n_tokens: 0-d long tensor, the number of counted tokens (kept on device: no host sync).
    """

    loss: torch.Tensor
    nll: torch.Tensor
    n_tokens: torch.Tensor


def label_smoothed_nll(
    logits: torch.Tensor,
    targets: torch.Tensor,
    smoothing: float = 0.1,
    ignore_index: int = IGNORE_INDEX,
) -> TokenLoss:
    """Cross-entropy with label smoothing (Section 5.4, epsilon_ls = 0.1), averaged over non-ignored tokens.

    The target distribution puts ``1 - smoothing`` on the gold token and spreads ``smoothing``
    uniformly over all ``V`` classes, exactly as ``F.cross_entropy(..., label_smoothing=smoothing)``:
    ``loss = (1 - eps) * nll + eps * mean_v(-log p_v)``. One log-softmax serves both the smoothed loss
    and the plain NLL (two ``F.cross_entropy`` calls would run the softmax over the vocabulary twice).

    Args:
        logits: (B, T, V) or (N, V) unnormalized scores; computed in float32 when lower precision.
        targets: (B, T) or (N,) gold token ids; ``ignore_index`` marks positions that do not count.
        smoothing: epsilon_ls in [0, 1); 0 gives the plain NLL.
        ignore_index: Target id to skip, usually the padding id.

    Returns:
        ``TokenLoss(loss, nll, n_tokens)``. Unlike ``F.cross_entropy`` (NaN), a batch with no counted
        token gives a loss of 0 and ``n_tokens == 0``.
    """
    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"label_smoothed_nll: smoothing must be in [0, 1), got {smoothing}")
    if logits.shape[:-1] != targets.shape:
        raise ValueError(
            f"label_smoothed_nll: logits {tuple(logits.shape)} do not match targets {tuple(targets.shape)}: "
            "expected logits (..., V) and targets (...)"
        )
    vocab = logits.size(-1)
    logp = F.log_softmax(logits.reshape(-1, vocab).float(), dim=-1)  # (N, V)
    flat = targets.reshape(-1)  # (N,)
    keep = flat != ignore_index  # (N,)
    n_tokens = keep.sum()
    denom = n_tokens.clamp_min(1)
    nll_sum = F.nll_loss(logp, flat, ignore_index=ignore_index, reduction="sum")
    loss_sum = nll_sum
    if smoothing > 0.0:
        # Sum over counted positions of mean_v(-log p_v): the uniform part of the smoothed target.
        uniform_sum = -(logp.sum(dim=-1) * keep).sum() / vocab
        loss_sum = (1.0 - smoothing) * nll_sum + smoothing * uniform_sum
    return TokenLoss(loss_sum / denom, nll_sum.detach() / denom, n_tokens)


def masked_nll(logits: torch.Tensor, targets: torch.Tensor, loss_mask: torch.Tensor) -> TokenLoss:
    """Mean NLL over the positions where ``loss_mask`` is True: the response-only loss of fine-tuning.

    In supervised fine-tuning the model reads the prompt but is only trained to produce the
    response, so prompt (and padding) positions are masked out.

    Args:
        logits: (B, T, V) scores for the next token at each position.
        targets: (B, T) next-token ids.
        loss_mask: (B, T) bool, True where the position counts.

    Returns:
        ``TokenLoss(loss, nll, n_tokens)`` with ``loss == nll`` (no smoothing).
    """
    if loss_mask.shape != targets.shape:
        raise ValueError(
            f"masked_nll: loss_mask {tuple(loss_mask.shape)} does not match targets {tuple(targets.shape)}"
        )
    if loss_mask.dtype != torch.bool:
        raise TypeError(f"masked_nll: loss_mask must be a bool tensor, got {loss_mask.dtype}")
    return label_smoothed_nll(logits, targets.masked_fill(~loss_mask, IGNORE_INDEX), 0.0, IGNORE_INDEX)
