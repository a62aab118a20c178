"""Encoder and decoder layers (Section 3.1, Figure 1), their position-wise feed-forward network (Section 3.3),
and the positions a model gives its tokens (Section 3.5).

"We employ a residual connection around each of the two sub-layers, followed by layer normalization.
That is, the output of each sub-layer is LayerNorm(x + Sublayer(x))" (post-norm, the paper). Pre-norm,
x + Sublayer(LayerNorm(x)), trains deeper stacks without warmup tricks and is what GPT-2 uses.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv.config import ModelConfig
from qkv.modules.attention import CrossAttention, KVCache, SelfAttention, StaticKV
from qkv.modules.packing import UNPACKED, Layout


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
        self_cache: KVCache | None = None,
        cross_cache: StaticKV | None = None,
    ) -> Tensor:
        """x: (B, T, D), or (N, D) in a packed ``layout``; memory: (B, S, D), or (N_s, D) in a packed
        ``memory_layout``; self_mask: key padding (B, 1, 1, L) or None (causality is always applied);
        memory_mask: source padding (B, 1, 1, S); self_cache, cross_cache: the attentions' caches when their
        owner passes them (default: the attentions' own). Returns x's shape."""
        x = self.self_attn_sublayer(x, lambda h: self.self_attn(
            h, mask=self_mask, is_causal=True, positions=positions, layout=layout, cache=self_cache)[0])
        if self.cross_attn is not None:
            x = self.cross_attn_sublayer(x, lambda h: self.cross_attn(
                h, memory, mask=memory_mask, layout=layout, memory_layout=memory_layout, cache=cross_cache)[0])
        return self.ff_sublayer(x, self.feed_forward)


# Positions (Section 3.5): sinusoidal (the paper), learned (GPT-2), and rotary (RoPE).
#
# Self-attention alone is permutation-equivariant: shuffle the tokens and the outputs are shuffled the
# same way. "Since our model contains no recurrence and no convolution, in order for the model to make
# use of the order of the sequence, we must inject some information about the relative or absolute
# position of the tokens" (Section 3.5).


def sinusoidal_table(max_len: int, d_model: int) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model)).

    Returns:
        (max_len, d_model) float32.
    """
    if d_model % 2:
        raise ValueError(f"sinusoidal encoding needs an even d_model, got {d_model}")
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]  # (max_len, 1)
    inv_freq = torch.exp(-math.log(10000.0) * torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # (D/2,)
    angles = pos * inv_freq  # (max_len, D/2)
    pe = torch.empty(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles)
    return pe.float()


# Explicit (B, T) positions (left-padded prompts) come from the decoding functions, which keep them
# inside the table; only the offset form is checked here, with plain integers.
def _check_length(name: str, offset: int, t: int, max_len: int) -> None:
    if offset + t > max_len:
        raise ValueError(
            f"{name}: sequence of {t} positions starting at {offset} is longer than the positional "
            f"table (max_len={max_len}); raise max_len in the model config or shorten the input"
        )


def _table_rows(name: str, table: Tensor, t: int, offset: int, positions: Tensor | None) -> Tensor:
    """Rows of a (max_len, D) table of positions: offset .. offset+t-1 -> (t, D), or explicit (B, T) positions
    -> (B, T, D)."""
    if positions is not None:
        return table[positions]
    _check_length(name, offset, t, table.shape[0])
    return table[offset:offset + t]


class SinusoidalPositionalEncoding(nn.Module):
    """The fixed table of Section 3.5, added to the (scaled) embeddings."""

    def __init__(self, d_model: int, max_len: int) -> None:
        super().__init__()
        self.max_len = max_len
        self.register_buffer("pe", sinusoidal_table(max_len, d_model), persistent=False)

    def forward(self, t: int, offset: int = 0, positions: Tensor | None = None) -> Tensor:
        """Encodings for positions offset .. offset+t-1 -> (t, D), or for explicit (B, T) positions -> (B, T, D)."""
        return _table_rows("positional encoding", self.pe, t, offset, positions)


class LearnedPositionalEmbedding(nn.Module):
    """A trained vector per position (GPT-2); the paper found it "nearly identical" to sinusoids (Table 3, row E)."""

    def __init__(self, d_model: int, max_len: int) -> None:
        super().__init__()
        self.max_len = max_len
        self.weight = nn.Parameter(torch.empty(max_len, d_model))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, t: int, offset: int = 0, positions: Tensor | None = None) -> Tensor:
        """As :class:`SinusoidalPositionalEncoding`, from the trained table."""
        return _table_rows("learned positional embedding", self.weight, t, offset, positions)


class RotaryEmbedding(nn.Module):
    """RoPE (Su et al., 2021): rotate each (even, odd) pair of q and k by an angle proportional to the
    position, so that q·k depends only on the relative offset. Applied inside attention, not added to
    the embeddings.
    """

    def __init__(self, d_k: int, max_len: int, base: float = 10000.0) -> None:
        super().__init__()
        self.max_len = max_len
        inv_freq = 1.0 / (base ** (torch.arange(0, d_k, 2, dtype=torch.float64) / d_k))  # (d_k/2,)
        angles = torch.arange(max_len, dtype=torch.float64)[:, None] * inv_freq  # (max_len, d_k/2)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, x: Tensor, offset: int = 0, positions: Tensor | None = None) -> Tensor:
        """Rotate x: (B, H, T, d_k) at positions offset.. (or explicit (B, T) positions)."""
        t = x.shape[-2]
        if positions is not None:
            cos, sin = self.cos[positions][:, None], self.sin[positions][:, None]  # (B, 1, T, d_k/2)
        else:
            _check_length("rotary embedding", offset, t, self.max_len)
            cos, sin = self.cos[offset:offset + t], self.sin[offset:offset + t]  # (T, d_k/2)
        x1, x2 = x[..., 0::2], x[..., 1::2]  # (B, H, T, d_k/2) each
        out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)  # (B, H, T, d_k/2, 2)
        return out.flatten(-2).type_as(x)  # (B, H, T, d_k)


def build_positional(positional: str, d_model: int, d_k: int, max_len: int, rope_base: float = 10000.0):
    """The positional scheme of a config: (module added to the embeddings or None, rotary or None)."""
    if positional == "sinusoidal":
        return SinusoidalPositionalEncoding(d_model, max_len), None
    if positional == "learned":
        return LearnedPositionalEmbedding(d_model, max_len), None
    if positional == "rope":
        return None, RotaryEmbedding(d_k, max_len, rope_base)
    if positional == "none":
        return None, None
    raise ValueError(f"unknown positional encoding {positional!r}; expected sinusoidal, learned, rope or none")
