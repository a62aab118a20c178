"""Small modules for the training-infrastructure tests (independent of qkv.models)."""

from __future__ import annotations

import pytest
import torch
from torch import nn


class TinyLM(nn.Module):
    """Embedding -> Linear -> LayerNorm -> dropout -> output projection, optionally tied to the embedding."""

    def __init__(self, vocab: int = 11, d: int = 8, tied: bool = True, dropout: float = 0.0) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.proj = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(d, vocab, bias=False)
        if tied:
            self.head.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T, V)
        return self.head(self.drop(self.norm(torch.relu(self.proj(self.emb(ids))))))


@pytest.fixture
def make_model():
    """Factory: ``make_model(seed=0, **TinyLM kwargs)``."""

    def make(seed: int = 0, **kwargs) -> TinyLM:
        torch.manual_seed(seed)
        return TinyLM(**kwargs)

    return make


@pytest.fixture
def crash_at(monkeypatch):
    """``crash_at(module, step)``: the trainer of ``module`` dies (KeyboardInterrupt) before its update at ``step``;
    ``monkeypatch.undo()`` ends it."""

    def install(module, step: int) -> None:
        real = module.optimizer_step

        def dies(optimizer, loss, at, *args):
            if at == step:
                raise KeyboardInterrupt
            return real(optimizer, loss, at, *args)

        monkeypatch.setattr(module, "optimizer_step", dies)

    return install
