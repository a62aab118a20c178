"""Position-wise feed-forward network (Section 3.3): FFN(x) = max(0, x W1 + b1) W2 + b2.

"Applied to each position separately and identically": two linear maps d_model -> d_ff -> d_model
with an activation between. ReLU as in the paper; GELU (BERT), GPT-2's tanh GELU, and SwiGLU
(Shazeer, 2020) as options.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn



class FeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int, activation: str = "relu", bias: bool = True, dropout: float = 0.0) -> None:
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
