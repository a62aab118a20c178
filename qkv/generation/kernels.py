"""CPU speed-ups of decoding, applied around the model by the decoding functions that use them.

The model files are the paper: plain ``nn.Linear`` maps, one attention formula. Decoding runs the
same model one position at a time, and on a CPU a step is bound by its matrix-vector products, so
the functions that decode (greedy and beam search, ``generate``, the Completer) transform the model
from outside for the time they decode, and put it back after (gpt-fast's rule):

- :func:`decoding`: the caches, and the weights of the products every step runs laid out for oneDNN.
  PyTorch's ``F.linear`` sends fp32 to MKL; on the AMD EPYC this project is measured on, oneDNN runs
  these products at twice MKL's speed. ``pack_weights`` replaces the ``forward`` of each linear map a
  step runs (:func:`step_linears`) by a :class:`PackedLinear`: products of exactly the rows it was
  packed for, without autograd, go to oneDNN; every other call (a prompt's prefill, the steps after
  some sentences of a beam search have finished, a weight changed since) goes to ``F.linear``. The
  results are ``F.linear``'s up to fp32 rounding (another summation order).
- :func:`compiled_linear`: what a linear map becomes inside a compiled decoding step
  (qkv.generation.compiled).

Where oneDNN does not run: training (it builds a kernel for every new row count, and batches of real
tokens change it at every step: translation training got slower and 40% larger in memory,
docs/BENCHMARKS.md), anything that is not fp32 on a CPU (GPUs, bf16, autocast), a PyTorch without
oneDNN, and ``QKV_LINEAR=aten`` in the environment.
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv.models import GPT, Transformer

# oneDNN's fused linear, the op torch.compile's CPU backend emits for frozen linear layers. It is a
# private op of the pinned torch; ``available()`` checks it once and everything falls back without it.
_onednn_linear = getattr(torch.ops.mkldnn, "_linear_pointwise", None)
_BACKENDS = ("onednn", "aten")
_backend = os.environ.get("QKV_LINEAR", "onednn")
if _backend not in _BACKENDS:
    raise ValueError(f"QKV_LINEAR={_backend!r}: expected one of {', '.join(_BACKENDS)}")


def set_backend(name: str) -> None:
    """``"onednn"`` (the default where it exists) or ``"aten"`` (``F.linear`` everywhere), e.g. to compare them."""
    global _backend
    if name not in _BACKENDS:
        raise ValueError(f"unknown linear backend {name!r}; expected one of {', '.join(_BACKENDS)}")
    _backend = name


def backend() -> str:
    """The backend fp32 CPU products of decoding use now: ``"onednn"`` or ``"aten"``."""
    return "onednn" if _backend == "onednn" and available() else "aten"


_available: bool | None = None


def available() -> bool:
    """Whether this torch can run oneDNN's linear (an x86 or ARM build with mkldnn)."""
    global _available
    if _available is None:
        _available = False
        if _onednn_linear is not None and torch.backends.mkldnn.is_available():
            try:
                x, w = torch.ones(2, 3), torch.ones(4, 3)
                _available = bool(torch.equal(_onednn_linear(x, w, None, "none", [], ""), F.linear(x, w)))
            except RuntimeError:
                pass
    return _available


def _onednn_takes(weight: Tensor) -> bool:
    """Whether products with this weight go to oneDNN: fp32 on a CPU, no autocast, the backend chosen."""
    return (
        _backend == "onednn"
        and weight.dtype == torch.float32 and weight.device.type == "cpu"
        and not torch.is_autocast_enabled("cpu")
        and available()
    )


class PackedLinear:
    """The ``forward`` of an ``nn.Linear`` while it is packed: oneDNN on its weight laid out for ``rows``-row products.

    oneDNN builds a kernel for each row count it sees and keeps it. When a beam search's batch shrinks
    as sentences finish, every new count cost time and memory: translating a test set grew the process
    by 300 MB. One row count per generation keeps that to one kernel per weight; other counts take
    ``F.linear``. The packed weight is a second copy, used only while the weight is unchanged (its
    version counter is checked on every call; an inference tensor, made under
    ``torch.inference_mode``, keeps none).
    """

    def __init__(self, module: nn.Linear, rows: int) -> None:
        self.module, self.rows = module, rows
        w = module.weight.detach()
        self.version = None if w.is_inference() else w._version
        self.packed = torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), rows)

    def __call__(self, x: Tensor) -> Tensor:
        m = self.module
        weight, bias = m.weight, m.bias
        if (self.version is None or self.version == weight._version) and x.numel() == self.rows * x.shape[-1] \
                and x.dtype == weight.dtype and x.device == weight.device and _onednn_takes(weight) \
                and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)):
            return _onednn_linear(x, self.packed, bias, "none", [], "")
        return F.linear(x, weight, bias)


def step_linears(model: nn.Module) -> list[nn.Linear]:
    """The linear maps every decoding step of ``model`` runs: the decoder's and the output projection.

    The encoder runs once per source, and so does cross-attention's [W^K; W^V] (``kv_proj``): a step
    reads the keys and values of its cache.
    """
    if isinstance(model, Transformer):
        parts: list[nn.Module] = [*model.decoder_layers, model.generator]
    elif isinstance(model, GPT):
        parts = [*model.layers, model.lm_head]
    else:
        raise TypeError(f"step_linears: a Transformer or a GPT, got {type(model).__name__}")
    return [m for part in parts for name, m in part.named_modules()
            if type(m) is nn.Linear and not name.endswith("kv_proj")]


def pack_weights(model: nn.Module, rows: int) -> None:
    """Lay the weights of ``model``'s decoding steps out for ``rows``-row products (where oneDNN runs them)."""
    for m in step_linears(model):
        if _onednn_takes(m.weight):
            m.forward = PackedLinear(m, rows)


def unpack_weights(model: nn.Module) -> None:
    """Free the packed weights: every linear map is ``nn.Linear``'s own again."""
    for m in model.modules():
        if isinstance(m.__dict__.get("forward"), PackedLinear):
            del m.forward


def start_decoding(model: nn.Module, rows: int, max_len: int, packed: bool = True) -> None:
    """Caches for ``rows`` rows of up to ``max_len`` positions and (``packed``) the step's weights laid out
    for ``rows``-row products; :func:`end_decoding` removes both."""
    model.setup_cache(rows, max_len)
    if packed:
        pack_weights(model, rows)


def end_decoding(model: nn.Module) -> None:
    """The model as it was before :func:`start_decoding`: no caches, its own linear maps."""
    model.clear_cache()
    unpack_weights(model)


@contextlib.contextmanager
def decoding(model: nn.Module, rows: int, max_len: int, packed: bool = True) -> Iterator[nn.Module]:
    """:func:`start_decoding` for the time of the block, :func:`end_decoding` after it."""
    start_decoding(model, rows, max_len, packed)
    try:
        yield model
    finally:
        end_decoding(model)


def compiled_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """What a linear map becomes inside ``torch.compile`` (a compiled decoding step).

    A single row is written as multiply-and-sum, which inductor turns into a vectorized loop over the
    rows of W: 1.3 ms for a GPT step's 24 products at the nanoGPT config, where ``F.linear`` lowers
    to MKL's matrix-vector product (4.2 ms) and oneDNN's packed weights take 2.7 ms (bench/gemv.py).
    """
    if x.numel() != x.shape[-1]:
        return F.linear(x, weight, bias)
    y = (x.unsqueeze(-2) * weight).sum(-1)  # (..., 1, in) * (out, in) -> (..., out)
    return y if bias is None else y + bias


__all__ = ["set_backend", "backend", "available", "PackedLinear", "step_linears", "pack_weights", "unpack_weights",
           "start_decoding", "end_decoding", "decoding", "compiled_linear"]
