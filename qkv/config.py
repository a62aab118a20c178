"""The model's configuration with the paper's names, its presets, and the decoding defaults of every command.

Defaults live once, in the dataclass fields. A preset is built through :func:`qkv.settings.from_dict`, as a
YAML file and a ``key=value`` on the command line are, so every way of building a config checks alike.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence

from qkv.errors import ConfigError, did_you_mean
from qkv.settings import from_dict

POSITIONAL = ("sinusoidal", "learned", "rope", "none")
ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "swiglu")
NORMS = ("post", "pre")
ARCHS = ("transformer", "gpt")


# Decoding as the paper's Section 6.1 does it, written once for every command and function: beam 4,
# length penalty alpha = 0.6, outputs at most 50 tokens longer than their source; and the token
# budget of one decoding batch (sources sorted by length and cut under it).
BEAM = 4
ALPHA = 0.6
EXTRA = 50
MAX_TOKENS = 4000
# Sampling a GPT, written once for `qkv generate`, the Completer and qkv.generate: 200 new tokens at
# temperature 0.8, as nanoGPT's sample.py, so that the same seed continues a prompt alike in all three.
NEW_TOKENS = 200
TEMPERATURE = 0.8


@dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of a Transformer (encoder-decoder) or a GPT (decoder-only).

    Names follow "Attention Is All You Need" (Table 3): ``d_model``, ``n_heads`` (h), ``d_ff``,
    ``n_layers`` (N), ``dropout`` (P_drop). ``n_layers`` is the depth of each stack; set
    ``n_decoder_layers`` for an asymmetric encoder-decoder.
    """

    arch: str = "transformer"
    vocab_size: int = 37000
    d_model: int = 512
    n_heads: int = 8
    d_ff: int = 2048
    n_layers: int = 6
    n_decoder_layers: int | None = None
    # d_k, the size of each head's queries and keys; None: d_model / h. Table 3 row (B) shrinks it alone,
    # the values keeping d_v = d_model / h.
    d_k: int | None = None
    dropout: float = 0.1
    # Dropout on the attention weights (the paper only drops sublayer outputs and embeddings, and
    # attention dropout inside SDPA costs ~30% on CPU); off unless asked for.
    attn_dropout: float = 0.0
    max_len: int = 1024
    positional: str = "sinusoidal"
    norm: str = "post"
    # A LayerNorm after the last layer of each stack. None = only for pre-norm (where the residual
    # stream is otherwise never normalized); the paper's post-norm model has none.
    final_norm: bool | None = None
    activation: str = "relu"
    bias: bool = True
    tie_embeddings: bool = True
    layer_norm_eps: float = 1e-5
    rope_base: float = 10000.0
    pad_id: int = 0

    def __post_init__(self) -> None:
        _check_choice("arch", self.arch, ARCHS)
        _check_choice("positional", self.positional, POSITIONAL)
        _check_choice("norm", self.norm, NORMS)
        _check_choice("activation", self.activation, ACTIVATIONS)
        for name in ("vocab_size", "d_model", "n_heads", "d_ff", "n_layers", "max_len"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"ModelConfig.{name} must be positive, got {getattr(self, name)}")
        if self.d_model % self.n_heads:
            raise ConfigError(
                f"ModelConfig: d_model={self.d_model} is not divisible by n_heads={self.n_heads} "
                "(each head has d_k = d_model / h dimensions)"
            )
        if self.d_k is not None and self.d_k <= 0:
            raise ConfigError(f"ModelConfig.d_k must be positive (or null: d_model / n_heads), got {self.d_k}")
        d_k, _ = self.head_sizes
        if self.positional == "rope" and d_k % 2:
            raise ConfigError(f"ModelConfig: RoPE needs an even key dimension d_k, got {d_k}")
        for name in ("dropout", "attn_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"ModelConfig.{name} must be in [0, 1), got {getattr(self, name)}")

    @property
    def head_sizes(self) -> tuple[int, int]:
        """(d_k, d_v): the size of each head's queries and keys (``d_k``, else d_model / h) and of its values,
        d_model / h (Section 3.2.2)."""
        d_v = self.d_model // self.n_heads
        return self.d_k or d_v, d_v

    @property
    def decoder_layers(self) -> int:
        return self.n_decoder_layers if self.n_decoder_layers is not None else self.n_layers

    @property
    def use_final_norm(self) -> bool:
        return self.final_norm if self.final_norm is not None else self.norm == "pre"


def _check_choice(name: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ConfigError(f"ModelConfig.{name}={value!r} is not one of {list(choices)}{did_you_mean(value, choices)}")


# Presets. The paper's sizes (Table 3) assume one shared source/target vocabulary of about 37,000
# BPE tokens; with exactly 37,000, biases, tied embeddings and post-norm, base has 63,082,496
# parameters and big 214,245,376 (the paper reports 65M and 213M).
PRESETS: dict[str, ModelConfig] = {
    "transformer-base": ModelConfig(
        arch="transformer", vocab_size=37000, d_model=512, n_heads=8, d_ff=2048, n_layers=6, dropout=0.1
    ),
    "transformer-big": ModelConfig(
        arch="transformer", vocab_size=37000, d_model=1024, n_heads=16, d_ff=4096, n_layers=6, dropout=0.3
    ),
    "gpt2-small": ModelConfig(
        arch="gpt", vocab_size=50257, d_model=768, n_heads=12, d_ff=3072, n_layers=12, dropout=0.1,
        max_len=1024, positional="learned", norm="pre", activation="gelu_tanh", bias=True,
    ),
    # nanoGPT's config/train_shakespeare_char.py (bias=False is nanoGPT's train.py default).
    "nanogpt-shakespeare-char": ModelConfig(
        arch="gpt", vocab_size=65, d_model=384, n_heads=6, d_ff=1536, n_layers=6, dropout=0.2,
        max_len=256, positional="learned", norm="pre", activation="gelu", bias=False,
    ),
    "tiny-transformer": ModelConfig(
        arch="transformer", vocab_size=64, d_model=32, n_heads=4, d_ff=64, n_layers=2, dropout=0.0, max_len=64
    ),
    "tiny-gpt": ModelConfig(
        arch="gpt", vocab_size=64, d_model=32, n_heads=4, d_ff=64, n_layers=2, dropout=0.0, max_len=64,
        positional="learned", norm="pre", activation="gelu_tanh",
    ),
}

# The figure the paper's Table 3 prints for each preset that reproduces it.
PAPER_PARAMS = {"transformer-base": "65M", "transformer-big": "213M", "gpt2-small": "124M"}


def preset(name: str, **overrides: Any) -> ModelConfig:
    """A named preset, optionally with some fields replaced (``preset("tiny-gpt", vocab_size=100)``)."""
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}{did_you_mean(name, PRESETS)}; known: {sorted(PRESETS)}")
    return from_dict(ModelConfig, {**dataclasses.asdict(PRESETS[name]), **overrides}, where=f"preset {name}")


__all__ = ["POSITIONAL", "ACTIVATIONS", "NORMS", "ARCHS", "BEAM", "ALPHA", "EXTRA", "MAX_TOKENS", "ModelConfig",
           "PRESETS", "PAPER_PARAMS", "preset"]
