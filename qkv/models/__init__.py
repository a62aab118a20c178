"""Models: the encoder-decoder Transformer and the decoder-only GPT (their kinds: ``kinds``); sizes."""

from __future__ import annotations

from torch import nn

from qkv.config import ModelConfig
from qkv.models.gpt import GPT
from qkv.models.kinds import KINDS, build_model
from qkv.models.transformer import Transformer


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    """Distinct parameters (tied weights counted once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def flops_per_token(cfg: ModelConfig, seq_len: int | None = None) -> dict[str, int]:
    """Approximate forward FLOPs per token (a multiply-add = 2 FLOPs), and training = 3x forward.

    Matrix multiplies dominate: 2 FLOPs per weight per token, plus attention's q k^T and weights v,
    2 * 2 * seq_len * d_model per layer (seq_len = context; the source length for cross-attention).
    Embedding lookups are free; the output projection is counted.
    """
    t = seq_len or cfg.max_len
    d, f = cfg.d_model, cfg.d_ff
    d_k, _ = cfg.head_sizes
    qk = cfg.n_heads * d_k  # the width of the queries and keys: d_model unless d_k is set
    ff = (3 if cfg.activation == "swiglu" else 2) * d * f
    attn_proj = 2 * d * qk + 2 * d * d  # W^Q, W^K; W^V, W^O
    attn_scores = t * qk + t * d  # q.k and w.v multiply-adds per query
    if cfg.arch == "gpt":
        per_layer = attn_proj + ff + attn_scores
        mac = cfg.n_layers * per_layer + d * cfg.vocab_size
    else:
        enc = cfg.n_layers * (attn_proj + ff + attn_scores)
        dec = cfg.decoder_layers * (2 * attn_proj + ff + 2 * attn_scores)
        # Per target token with a source of equal length: the encoder runs once per source token.
        mac = enc + dec + d * cfg.vocab_size
    fwd = 2 * mac
    return {"forward": fwd, "training": 3 * fwd, "seq_len": t}


__all__ = ["GPT", "Transformer", "KINDS", "build_model", "count_parameters", "flops_per_token"]
