"""Token-level training losses: label-smoothed cross-entropy (translation), NLL (GPT), response-only NLL (SFT).

Every loss is a mean over the tokens that count (not padding, not prompt), returned with the plain
negative log-likelihood (for perplexity, which label smoothing would distort) and the token count
(to weight means across batches or ranks).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

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
    ``loss = (1 - eps) * nll + eps * mean_v(-log p_v)``. One softmax serves both the smoothed loss
    and the plain NLL (two ``F.cross_entropy`` calls would run it over the vocabulary twice), and its
    gradient is written out rather than traced (:class:`_SmoothedCrossEntropy`).

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
    flat = targets.reshape(-1)  # (N,)
    keep = flat != ignore_index  # (N,)
    n_tokens = keep.sum()
    denom = n_tokens.clamp_min(1)
    loss_sum, nll_sum = _SmoothedCrossEntropy.apply(logits.reshape(-1, vocab).float(), flat, keep, smoothing)
    return TokenLoss(loss_sum / denom, nll_sum / denom, n_tokens)


class _SmoothedCrossEntropy(torch.autograd.Function):
    """Sums over the kept rows of the smoothed cross-entropy and of the plain NLL, with the gradient written out.

    The gradient of the smoothed loss with respect to the scores is ``p - q`` (the softmax minus the
    smoothed target), so the forward pass keeps ``p`` and the backward pass is a subtraction. Autograd
    through ``log_softmax`` exponentiates the whole (N, V) score matrix a second time instead, which
    made the loss of a Multi30K batch much slower (docs/BENCHMARKS.md, "The loss's gradient").
    """

    @staticmethod
    def forward(ctx, scores: torch.Tensor, targets: torch.Tensor, keep: torch.Tensor, smoothing: float):
        # scores (N, V) float32; targets (N,); keep (N,) bool.
        top = scores.amax(dim=-1, keepdim=True)  # (N, 1): subtracted so exp cannot overflow
        p = (scores - top).exp_()  # (N, V), normalised below
        total = p.sum(dim=-1, keepdim=True)  # (N, 1)
        p.div_(total)
        log_z = (top + total.log()).squeeze(1)  # (N,): log of the softmax's normaliser
        gold = targets.masked_fill(~keep, 0)  # an ignored row's target may be any id: read row 0's
        nll = torch.where(keep, log_z - scores.gather(1, gold.unsqueeze(1)).squeeze(1), 0.0)  # (N,) -log p_gold
        loss = nll
        if smoothing > 0.0:
            uniform = torch.where(keep, log_z - scores.mean(dim=-1), 0.0)  # (N,) mean_v(-log p_v)
            loss = (1.0 - smoothing) * nll + smoothing * uniform
        ctx.save_for_backward(p, gold, keep)
        ctx.smoothing = smoothing
        nll_sum = nll.sum()
        ctx.mark_non_differentiable(nll_sum)
        return loss.sum(), nll_sum

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_loss: torch.Tensor, grad_nll: torch.Tensor):
        p, gold, keep = ctx.saved_tensors
        eps = ctx.smoothing
        q_gold = torch.full_like(gold, 1.0 - eps, dtype=p.dtype).unsqueeze(1)  # (N, 1)
        # p - q, where q = eps / V everywhere plus 1 - eps on the gold token; a new tensor, so that a
        # second backward (retain_graph) finds p unchanged.
        grad = (p - eps / p.size(1)).scatter_add_(1, gold.unsqueeze(1), -q_gold)  # (N, V)
        # An ignored row's gradient is zero, whatever its scores (a product with 0 would keep a NaN). On
        # a CPU by index, since ignored rows are few and a mask over (N, V) costs a pass; on a GPU the
        # pass costs less than the host sync that finding the rows takes.
        grad.mul_(grad_loss)
        if grad.is_cuda:
            return grad.masked_fill_(~keep.unsqueeze(1), 0.0), None, None, None
        return grad.index_fill_(0, (~keep).nonzero().squeeze(1), 0.0), None, None, None


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
