"""LoRA: low-rank adapters on a frozen model (Hu et al., 2021), and merging them into the weights for export.

A frozen linear map W (out, in) gets a trainable low-rank update: h = W x + (alpha / r) B A x, with
A (r, in) and B (out, r). A starts random and B at zero, so at the start the adapted model computes
exactly what the base model does; only r * (in + out) numbers per adapted matrix are trained. Because
the base weights never move, what the base model knew is kept, which makes LoRA a cure for
catastrophic forgetting (docs/EXPERIMENTS.md) as well as a cheap way to fine-tune. After training,
W' = W + (alpha / r) B A is a plain matrix: :func:`merge_lora` folds the adapters in and gives back an
ordinary model that loads and runs with no LoRA code.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# Every projection of a qkv layer: self-attention's stacked [W^Q; W^K; W^V] (``in_proj``), cross-attention's
# W^Q and [W^K; W^V] (``q_proj``, ``kv_proj``; the encoder-decoder only), W^O, and the feed-forward
# network's matrices (``w_3``: SwiGLU's gate).
DEFAULT_TARGETS: tuple[str, ...] = ("in_proj", "q_proj", "kv_proj", "out_proj", "w_1", "w_2", "w_3")


class LoRALinear(nn.Module):
    """A frozen ``nn.Linear`` plus a trainable rank-``r`` update scaled by ``alpha / r``.

    Args:
        base: The linear layer to adapt; its parameters are frozen (``requires_grad=False``).
        rank: r, the rank of the update (> 0).
        alpha: Scale numerator; the update is multiplied by ``alpha / rank`` (LoRA's convention, so that
            changing the rank does not change the effective learning rate much).
        dropout: Dropout on the adapter's input (LoRA's paper uses 0.05-0.1 on large models).
    """

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float = 0.0) -> None:
        super().__init__()
        if not isinstance(base, nn.Linear):
            raise TypeError(f"LoRALinear adapts an nn.Linear, got {type(base).__name__}")
        if rank < 1:
            raise ValueError(f"LoRA rank must be >= 1, got {rank}")
        self.base = base
        for p in base.parameters():
            p.requires_grad_(False)
        self.rank, self.alpha = rank, float(alpha)
        self.scaling = self.alpha / rank
        dev, dt = base.weight.device, base.weight.dtype
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features, device=dev, dtype=dt))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, device=dev, dtype=dt))
        # A like a default nn.Linear (Kaiming uniform), B zero: the update starts at exactly zero.
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    @property
    def bias(self) -> Tensor | None:
        return self.base.bias

    def forward(self, x: Tensor) -> Tensor:
        """(..., in) -> (..., out). The update goes through the rank-r bottleneck: never forms B A."""
        return self.base(x) + F.linear(F.linear(self.dropout(x), self.lora_A), self.lora_B) * self.scaling

    @torch.no_grad()
    def merged(self) -> nn.Linear:
        """A plain linear layer with W + (alpha / r) B A folded in (requires_grad restored to True)."""
        out = nn.Linear(self.in_features, self.out_features, bias=self.base.bias is not None,
                        device=self.base.weight.device, dtype=self.base.weight.dtype)
        out.weight.copy_(self.base.weight + self.scaling * (self.lora_B @ self.lora_A))
        if self.base.bias is not None:
            out.bias.copy_(self.base.bias)
        return out

    def extra_repr(self) -> str:
        return f"rank={self.rank}, alpha={self.alpha:g}"


def _matches(name: str, targets: Sequence[str]) -> bool:
    """A module named ``layers.0.self_attn.in_proj`` matches target ``in_proj`` (or ``self_attn.in_proj``)."""
    return any(name == t or name.endswith("." + t) for t in targets)


def apply_lora(
    model: nn.Module,
    rank: int,
    alpha: float | None = None,
    targets: Sequence[str] = DEFAULT_TARGETS,
    dropout: float = 0.0,
) -> list[str]:
    """Freeze every parameter of ``model`` and wrap each targeted ``nn.Linear`` in a :class:`LoRALinear`.

    Args:
        model: Modified in place.
        rank: r.
        alpha: Scale numerator; ``2 * rank`` when None (a scaling of 2, a common choice).
        targets: Module names (or name suffixes after a dot) to adapt; the output projection
            ``lm_head`` is not a default target since it is tied to the embedding.
        dropout: Dropout on each adapter's input.

    Returns:
        The names of the adapted modules.

    Raises:
        ValueError: If no module matches ``targets`` (a typo would otherwise train nothing), or if the
            model already has adapters.
    """
    if any(isinstance(m, LoRALinear) for m in model.modules()):
        raise ValueError("the model already has LoRA adapters; merge or remove them first")
    alpha = 2.0 * rank if alpha is None else float(alpha)
    for p in model.parameters():
        p.requires_grad_(False)
    chosen = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear) and _matches(n, targets)]
    if not chosen:
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear)})
        raise ValueError(f"LoRA targets {list(targets)} match no nn.Linear in {type(model).__name__}; "
                         f"its linear layers are named {linear}")
    for name, module in chosen:
        _set_submodule(model, name, LoRALinear(module, rank, alpha, dropout))
    return [n for n, _ in chosen]


def _set_submodule(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)


def merge_lora(model: nn.Module) -> nn.Module:
    """Replace every :class:`LoRALinear` by its merged ``nn.Linear`` and unfreeze all parameters (in place).

    The result is a plain model whose state dict has the original names, so it saves and loads like
    the base model; its outputs equal the adapted model's up to float rounding.
    """
    for name, module in list(model.named_modules()):
        if isinstance(module, LoRALinear):
            _set_submodule(model, name, module.merged())
    for p in model.parameters():
        p.requires_grad_(True)
    return model


def lora_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """``(name, parameter)`` of every adapter matrix (``lora_A``, ``lora_B``)."""
    return [(n, p) for n, p in model.named_parameters() if n.endswith(("lora_A", "lora_B"))]


def lora_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """Only the adapter matrices: a few hundred KB to ship next to a base model."""
    return {n: p.detach().clone() for n, p in lora_parameters(model)}
