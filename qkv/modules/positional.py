"""Positional information: sinusoidal (the paper), learned (GPT-2), and rotary (RoPE).

Self-attention alone is permutation-equivariant: shuffle the tokens and the outputs are shuffled the
same way. "Since our model contains no recurrence and no convolution, in order for the model to make
use of the order of the sequence, we must inject some information about the relative or absolute
position of the tokens" (Section 3.5).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


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


class SinusoidalPositionalEncoding(nn.Module):
    """The fixed table of Section 3.5, added to the (scaled) embeddings."""

    def __init__(self, d_model: int, max_len: int) -> None:
        super().__init__()
        self.max_len = max_len
        self.register_buffer("pe", sinusoidal_table(max_len, d_model), persistent=False)

    def forward(self, t: int, offset: int = 0, positions: Tensor | None = None) -> Tensor:
        """Encodings for positions offset .. offset+t-1 -> (t, D), or for explicit (B, T) positions -> (B, T, D)."""
        if positions is not None:
            return self.pe[positions]
        _check_length("positional encoding", offset, t, self.max_len)
        return self.pe[offset:offset + t]


class LearnedPositionalEmbedding(nn.Module):
    """A trained vector per position (GPT-2); the paper found it "nearly identical" to sinusoids (Table 3, row E)."""

    def __init__(self, d_model: int, max_len: int) -> None:
        super().__init__()
        self.max_len = max_len
        self.weight = nn.Parameter(torch.empty(max_len, d_model))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, t: int, offset: int = 0, positions: Tensor | None = None) -> Tensor:
        if positions is not None:
            return self.weight[positions]
        _check_length("learned positional embedding", offset, t, self.max_len)
        return self.weight[offset:offset + t]


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
