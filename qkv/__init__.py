"""qkv: the Transformer of "Attention Is All You Need", complete, correct and fast.

    from qkv import Transformer, GPT, ModelConfig

The names below are imported on first use (PEP 562), so that ``import qkv`` itself imports no torch
(a script that reads ``qkv.__version__`` or ``qkv.data``'s corpus registry starts at once; the ``qkv``
command imports torch with its parser). Their reference, generated from these docstrings by pdoc, is
docs/api/ (``make api``).

- Models: ``Transformer`` (encoder-decoder), ``GPT`` (decoder-only), ``ModelConfig``, ``preset``,
  ``build_model``, ``count_parameters``.
- Decoding: ``generate`` (a GPT: greedy, sampling, KV cache), ``beam_search`` (translation),
  ``Translator`` and ``Completer`` (text in, text out).
- Runs: ``Run`` (a run directory), ``load_model`` (its model and tokenizer).
- Seeing attention: ``capture_attention``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

_EXPORTS = {
    "ModelConfig": "qkv.config",
    "preset": "qkv.config",
    "GPT": "qkv.models",
    "Transformer": "qkv.models",
    "build_model": "qkv.models",
    "count_parameters": "qkv.models",
    "generate": "qkv.generation",
    "beam_search": "qkv.generation.beam",
    "Translator": "qkv.generation.api",
    "Completer": "qkv.generation.completer",
    "capture_attention": "qkv.interpret.capture",
    "load_model": "qkv.runs",
    "Run": "qkv.runs",
}

__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'qkv' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:
    from qkv.config import ModelConfig, preset
    from qkv.generation import generate
    from qkv.generation.api import Translator
    from qkv.generation.beam import beam_search
    from qkv.generation.completer import Completer
    from qkv.interpret.capture import capture_attention
    from qkv.models import GPT, Transformer, build_model, count_parameters
    from qkv.runs import Run, load_model
