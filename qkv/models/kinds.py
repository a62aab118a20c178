"""The kinds of model a run can hold, in one place: what builds each, which commands write its runs, and the
parts every decoding step runs. Adding a kind is its file in ``models/`` and an entry here, its name in
``config.ARCHS`` (which a recipe's ``model.arch`` is checked against; tests hold the two equal).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from torch import nn

from qkv.config import ModelConfig
from qkv.errors import ConfigError
from qkv.models.gpt import GPT
from qkv.models.transformer import Transformer


@dataclass(frozen=True)
class ModelKind:
    """One kind of model.

    Attributes:
        model: Its class, built from a :class:`~qkv.config.ModelConfig`.
        made_by: The commands that write runs of it (named where a run of another kind is refused).
        step_parts: The parts a decoding step runs, given a model: its decoder's layers and its output
            projection (the encoder runs once per source).
    """

    model: type[nn.Module]
    made_by: str
    step_parts: Callable[[nn.Module], list[nn.Module]]


KINDS: dict[str, ModelKind] = {
    "transformer": ModelKind(Transformer, "`qkv train mt` or `qkv demo`", lambda m: [*m.decoder_layers, m.lm_head]),
    "gpt": ModelKind(GPT, "`qkv train lm`, `qkv finetune` or `qkv convert gpt2`", lambda m: [*m.layers, m.lm_head]),
}


def kind_of(model: nn.Module) -> ModelKind:
    """The kind ``model`` is (by its configuration's ``arch``)."""
    cfg = getattr(model, "cfg", None)
    if not isinstance(cfg, ModelConfig) or cfg.arch not in KINDS or not isinstance(model, KINDS[cfg.arch].model):
        raise ConfigError(f"{type(model).__name__} is not a model qkv knows: one of "
                          f"{', '.join(k.model.__name__ for k in KINDS.values())}")
    return KINDS[cfg.arch]


def build_model(cfg: ModelConfig) -> nn.Module:
    """The model a config describes (``cfg.arch`` picks its kind)."""
    return KINDS[cfg.arch].model(cfg)


__all__ = ["ModelKind", "KINDS", "kind_of", "build_model"]
