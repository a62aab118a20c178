"""Linear maps y = x W^T + b; in decoding steps on a CPU, computed by oneDNN on packed weights.

Every projection of the Transformer (W^Q, W^K, W^V, W^O, the feed-forward network's W_1 and W_2,
the pre-softmax projection) is a linear map. A decoding step multiplies a few rows by every weight,
so most of its time is spent in matrix-vector products. PyTorch's ``F.linear`` sends fp32 to MKL.
On the AMD EPYC this project is measured on, MKL runs these products at half the speed of oneDNN,
the other library the same PyTorch build carries.

So ``Linear.pack(rows)`` lays each weight out in oneDNN's blocked format for products with ``rows``
rows, the batch of a step, once per generation (``setup_cache`` calls it for the weights a step
uses, ``clear_cache`` frees them). Products of exactly that many rows with a packed weight, without
autograd, run on oneDNN. Their results are
``F.linear``'s up to fp32 rounding (another summation order). A packed weight is a second copy, used
only while the weight is unchanged (its version counter is checked on every call).

Everything else takes ``F.linear``:
- Products of another row count than the packing's: a prompt's prefill, and the steps after some
  sentences of a beam search have finished (see ``Linear.pack``).
- Training, where oneDNN builds a kernel for every new row count and batches of real tokens change
  it at every step. That made translation training slower and 40% larger in memory
  (docs/BENCHMARKS.md).
- Anything that is not fp32 on a CPU (GPUs, bf16, autocast), a PyTorch without oneDNN, and
  ``QKV_LINEAR=aten`` in the environment.
"""

from __future__ import annotations

import os
from typing import Iterable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

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
    """The backend fp32 CPU linear maps use now: ``"onednn"`` or ``"aten"``."""
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


def _use_onednn(x: Tensor, weight: Tensor) -> bool:
    return x.dtype == weight.dtype and x.device == weight.device and x.numel() > 0 and _onednn_takes(weight)


def _needs_grad(x: Tensor, weight: Tensor, bias: Tensor | None) -> bool:
    return torch.is_grad_enabled() and (
        x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad))


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, packed: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)``: (..., in) -> (..., out), on oneDNN when ``weight`` comes ``packed``.

    Args:
        packed: ``weight`` in oneDNN's blocked layout (from :meth:`Linear.pack`); used when no
            gradient is needed.
    """
    if packed is None or _needs_grad(x, weight, bias) or not _use_onednn(x, weight):
        return F.linear(x, weight, bias)
    return _onednn_linear(x, packed, bias, "none", [], "")


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


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, same state dict) computed by :func:`linear`."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # (the weight's version when packed, the row count, the output features it is packed for, the
        # packed weight); the version is None for an inference tensor (made under
        # torch.inference_mode), which keeps none.
        self._packed: tuple[int | None, int, int, Tensor] | None = None
        # The output features a decoding step uses, which ``pack`` lays out (None: all of them).
        self.step_outputs: int | None = None

    def pack(self, rows: int, outputs: int | None = None) -> None:
        """Lay the weight out for products with exactly ``rows`` rows; other row counts take ``F.linear``.

        oneDNN builds a kernel for each row count it sees and keeps it. When a beam search's batch
        shrinks as sentences finish, every new count cost time and memory: translating a test set
        grew the process by 300 MB. One row count per generation keeps that to one kernel per weight.

        Args:
            outputs: pack only the first ``outputs`` output features, for :meth:`first_outputs`
                (default: ``step_outputs``, else all). Cross-attention's stacked [W^Q; W^K; W^V] sets
                ``step_outputs`` to W^Q's, the only block a decoding step uses (``F.linear`` on that
                slice of the weight took 4x oneDNN's time).
        """
        if _onednn_takes(self.weight):
            outputs = outputs or self.step_outputs or self.out_features
            w = self.weight.detach()
            version = None if w.is_inference() else w._version
            packed = torch.ops.mkldnn._reorder_linear_weight(w[:outputs].contiguous(), rows)
            self._packed = (version, rows, outputs, packed)

    def unpack(self) -> None:
        self._packed = None

    def _packed_for(self, x: Tensor, outputs: int) -> Tensor | None:
        """The packed weight if it fits products of ``x`` onto the first ``outputs`` features, else None."""
        if self._packed is None:
            return None
        version, rows, packed_outputs, packed = self._packed
        if version is not None and version != self.weight._version:  # trained or loaded since: stale
            self._packed = None
            return None
        return packed if packed_outputs == outputs and x.numel() == rows * x.shape[-1] else None

    def forward(self, x: Tensor) -> Tensor:
        if torch.compiler.is_compiling():
            return compiled_linear(x, self.weight, self.bias)
        return linear(x, self.weight, self.bias, self._packed_for(x, self.out_features))

    def first_outputs(self, x: Tensor, n: int) -> Tensor:
        """x W[:n]^T + b[:n]: (..., in) -> (..., n), the first ``n`` output features only."""
        weight, bias = self.weight[:n], None if self.bias is None else self.bias[:n]
        if torch.compiler.is_compiling():
            return compiled_linear(x, weight, bias)
        return linear(x, weight, bias, self._packed_for(x, n))


def pack_linears(layers: Iterable[Linear], rows: int) -> None:
    """Pack each of ``layers`` for ``rows``-row products (decoding)."""
    for m in layers:
        m.pack(rows)


def unpack_linears(layers: Iterable[Linear]) -> None:
    """Free the packed weights."""
    for m in layers:
        m.unpack()
