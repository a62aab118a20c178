"""Encoder and decoder layers (Section 3.1, Figure 1) and their position-wise feed-forward network (Section 3.3).

"We employ a residual connection around each of the two sub-layers, followed by layer normalization.
That is, the output of each sub-layer is LayerNorm(x + Sublayer(x))" (post-norm, the paper). Pre-norm,
x + Sublayer(LayerNorm(x)), trains deeper stacks without warmup tricks and is what GPT-2 uses.
"""

from __future__ import annotations

from typing import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from qkv.config import ModelConfig
from qkv.modules.attention import CrossAttention, SelfAttention
from qkv.modules.packing import UNPACKED, Layout
from qkv.modules.positional import RotaryEmbedding


class FeedForward(nn.Module):
    """Position-wise feed-forward network (Section 3.3): FFN(x) = max(0, x W1 + b1) W2 + b2.

    "Applied to each position separately and identically": two linear maps d_model -> d_ff -> d_model
    with an activation between. ReLU as in the paper; GELU (BERT), GPT-2's tanh GELU, and SwiGLU
    (Shazeer, 2020) as options.
    """

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu", bias: bool = True,
                 dropout: float = 0.0) -> None:
        super().__init__()
        self.activation = activation
        self.w_1 = nn.Linear(d_model, d_ff, bias=bias)
        if activation == "swiglu":
            # The gate of the gated linear unit: FFN(x) = (swish(x W1) * x W3) W2.
            self.w_3 = nn.Linear(d_model, d_ff, bias=bias)
        elif activation not in ("relu", "gelu", "gelu_tanh"):
            raise ValueError(f"unknown activation {activation!r}; expected relu, gelu, gelu_tanh or swiglu")
        self.w_2 = nn.Linear(d_ff, d_model, bias=bias)
        # Dropout after the activation is not in the paper (it drops sublayer outputs, Section 5.4) and
        # costs ~30% on CPU; kept as an option, off by default.
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        """(B, T, D) -> (B, T, D)."""
        h = self.w_1(x)  # (B, T, d_ff)
        if self.activation == "relu":
            h = F.relu(h)
        elif self.activation == "gelu":
            h = F.gelu(h)
        elif self.activation == "gelu_tanh":
            # GPT-2's approximation, fused in PyTorch (a hand-written formula costs 1.5x memory).
            h = F.gelu(h, approximate="tanh")
        else:
            h = F.silu(h) * self.w_3(x)
        return self.w_2(self.dropout(h))


class Sublayer(nn.Module):
    """The residual connection and LayerNorm around one sub-layer, in post- or pre-norm order.

    "We apply dropout to the output of each sub-layer, before it is added to the sub-layer input and
    normalized" (Section 5.4).
    """

    def __init__(self, d_model: int, dropout: float, pre_norm: bool, eps: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.pre_norm = pre_norm

    def forward(self, x: Tensor, fn: Callable[[Tensor], Tensor]) -> Tensor:
        if self.pre_norm:
            return x + self.dropout(fn(self.norm(x)))
        return self.norm(x + self.dropout(fn(x)))


class EncoderLayer(nn.Module):
    """Self-attention over the whole source, then the position-wise feed-forward network."""

    def __init__(self, cfg: ModelConfig, rope: RotaryEmbedding | None = None) -> None:
        super().__init__()
        pre = cfg.norm == "pre"
        self.self_attn = SelfAttention(cfg.d_model, cfg.n_heads, cfg.bias, cfg.attn_dropout, rope, cfg.d_k)
        self.self_attn_sublayer = Sublayer(cfg.d_model, cfg.dropout, pre, cfg.layer_norm_eps)
        self.feed_forward = FeedForward(cfg.d_model, cfg.d_ff, cfg.activation, cfg.bias)
        self.ff_sublayer = Sublayer(cfg.d_model, cfg.dropout, pre, cfg.layer_norm_eps)

    def forward(self, x: Tensor, mask: Tensor | None = None, layout: Layout = UNPACKED) -> Tensor:
        """x: (B, S, D), or (N, D) in a packed ``layout``; mask: source padding, (B, 1, 1, S). Returns x's shape."""
        x = self.self_attn_sublayer(x, lambda h: self.self_attn(h, mask=mask, layout=layout)[0])
        return self.ff_sublayer(x, self.feed_forward)


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention to the encoder output (if any), feed-forward.

    Without cross-attention this is the GPT block.
    """

    def __init__(self, cfg: ModelConfig, cross_attention: bool = True, rope: RotaryEmbedding | None = None) -> None:
        super().__init__()
        pre = cfg.norm == "pre"
        self.self_attn = SelfAttention(cfg.d_model, cfg.n_heads, cfg.bias, cfg.attn_dropout, rope, cfg.d_k)
        self.self_attn_sublayer = Sublayer(cfg.d_model, cfg.dropout, pre, cfg.layer_norm_eps)
        if cross_attention:
            self.cross_attn = CrossAttention(cfg.d_model, cfg.n_heads, cfg.bias, cfg.attn_dropout, cfg.d_k)
            self.cross_attn_sublayer = Sublayer(cfg.d_model, cfg.dropout, pre, cfg.layer_norm_eps)
        else:
            self.cross_attn = None
        self.feed_forward = FeedForward(cfg.d_model, cfg.d_ff, cfg.activation, cfg.bias)
        self.ff_sublayer = Sublayer(cfg.d_model, cfg.dropout, pre, cfg.layer_norm_eps)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        self_mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        positions: Tensor | None = None,
        layout: Layout = UNPACKED,
        memory_layout: Layout = UNPACKED,
    ) -> Tensor:
        """x: (B, T, D), or (N, D) in a packed ``layout``; memory: (B, S, D), or (N_s, D) in a packed
        ``memory_layout``; self_mask: key padding (B, 1, 1, L) or None (causality is always applied);
        memory_mask: source padding (B, 1, 1, S). Returns x's shape."""
        x = self.self_attn_sublayer(
            x, lambda h: self.self_attn(h, mask=self_mask, is_causal=True, positions=positions, layout=layout)[0]
        )
        if self.cross_attn is not None:
            x = self.cross_attn_sublayer(x, lambda h: self.cross_attn(
                h, memory, mask=memory_mask, layout=layout, memory_layout=memory_layout)[0])
        return self.ff_sublayer(x, self.feed_forward)
