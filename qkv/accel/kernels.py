"""CPU speed-ups of decoding, swapped into the decoding model by the functions that decode.

The model files are the paper: plain ``nn.Linear`` maps, one attention formula. Decoding runs the
same model one position at a time, and on a CPU a step is bound by its matrix-vector products, so
the functions that decode (greedy and beam search, ``generate``, the Completer) decode on a copy of
the model's modules made for the generation (:func:`~qkv.accel.swap.decoding_copy`: every weight is
the model's own) in which the step's linear maps are swapped for faster ones; the model itself is
never changed (gpt-fast's rule):

- :func:`decoding_model`: the decoding copy, its caches, and the linear maps every step runs swapped for
  modules of the kernel that is fastest for them on this CPU. PyTorch's ``F.linear`` sends fp32 to MKL
  (or OpenBLAS) with the weight as ``nn.Linear`` keeps it, (out, in). Three other layouts can beat it:
  the weight's values laid out (in, out) in memory (:class:`TransposedLinear`, "transposed": faster
  than the default for some shapes of one-row products on an AMD EPYC, slower for others); oneDNN's
  packed weights (:class:`PackedLinear`), which ran batch-1 products faster than MKL on one AMD EPYC
  and slower on an Intel Xeon; and MKL's own packed weights (``cblas_sgemm_pack``, the GEMM
  CTranslate2 runs on Intel CPUs, which PyTorch reaches as ``torch.ops.mkl._mkl_linear``), which won
  the 8-row products of a GPT step on that Xeon (the figures: docs/BENCHMARKS.md, "The figures behind
  the decoding rules"). So no kernel is assumed: :func:`choose` times the step's own linear maps on
  each kernel the first time a shape (rows, in, out) is needed on a machine, and keeps each shape's
  winner in the user cache (``kernels.json``, keyed by the CPU, torch version and thread count).
  :func:`pack_weights` then swaps each linear map a step runs (:func:`step_linears`) where another
  kernel than the default won (:func:`lay_out`). A packed kernel serves its row count and takes
  ``F.linear`` for other products (a prompt's prefill, other row counts). The results are
  ``F.linear``'s up to fp32 rounding (another summation order), whichever is chosen.
- :func:`compiled_linear`: what a linear map computes inside a compiled decoding step
  (qkv.accel.compiled).

Where no weight is laid out anew: training (oneDNN builds a kernel for every new row count, and
batches of real tokens change it at every step: translation training got slower and larger in
memory; and a copy of a weight is stale after every optimizer step), anything that
is not fp32 on a CPU (GPUs, bf16, autocast), and ``QKV_LINEAR=aten`` in the environment.
``QKV_LINEAR=transposed``, ``mkl`` or ``onednn`` lays every step's weights out for that kernel without
measuring (a packed kernel only where this PyTorch has it); the default, ``auto``, measures.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import time
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv.accel.swap import decoding_copy, rebuilt, swap_modules
from qkv.devices import cpu_identity
from qkv.files import user_cache, write_json
from qkv.models.kinds import kind_of

# The packed kernels are the ops torch.compile's CPU backend emits for frozen linear layers: oneDNN's
# fused linear, and MKL's GEMM on a weight packed by cblas_sgemm_pack. They are private ops of the
# pinned torch; ``available(kernel)`` checks each once and everything falls back without them.
_onednn_linear = getattr(torch.ops.mkldnn, "_linear_pointwise", None)
_mkl_linear = getattr(torch.ops.mkl, "_mkl_linear", None)
_mkl_pack = getattr(torch.ops.mkl, "_mkl_reorder_linear_weight", None)
# F.linear on (out, in) memory, on (in, out) memory, MKL packed, oneDNN packed: the order of preference
# where timings are close (see CLOSE)
KERNELS = ("aten", "transposed", "mkl", "onednn")
PACKED = ("mkl", "onednn")  # the kernels of a PackedLinear
_BACKENDS = ("auto", *KERNELS)
_backend = os.environ.get("QKV_LINEAR", "auto")
if _backend not in _BACKENDS:
    raise ValueError(f"QKV_LINEAR={_backend!r}: expected one of {', '.join(_BACKENDS)}")


def set_backend(name: str) -> None:
    """``"auto"`` (the default: the fastest kernel for each shape, measured), or one of :data:`KERNELS`
    everywhere (a packed kernel wherever this PyTorch runs it), e.g. to compare them."""
    global _backend
    if name not in _BACKENDS:
        raise ValueError(f"unknown linear backend {name!r}; expected one of {', '.join(_BACKENDS)}")
    _backend = name


def backend() -> str:
    """How fp32 CPU products of decoding choose their kernel now: ``"auto"`` or one of :data:`KERNELS`."""
    return "aten" if _backend in PACKED and not available(_backend) else _backend


@functools.cache
def available(kernel: str) -> bool:
    """Whether this torch runs a packed kernel: ``"onednn"`` (a build with mkldnn, x86 or ARM) or
    ``"mkl"`` (an x86 build with MKL). Checked once, on a product whose result is known."""
    if kernel == "onednn" and not (_onednn_linear is not None and torch.backends.mkldnn.is_available()):
        return False
    if kernel == "mkl" and not (_mkl_linear is not None and _mkl_pack is not None
                                and torch.backends.mkl.is_available()):
        return False
    try:
        x, w = torch.ones(2, 3), torch.ones(4, 3)
        return bool(torch.equal(_packed_product(kernel, w, 2)(x, None), F.linear(x, w)))
    except RuntimeError:
        return False


def _packed_product(kernel: str, weight: Tensor, rows: int) -> Callable[[Tensor, Tensor | None], Tensor]:
    """``f(x, bias)``: the product of ``rows``-row inputs with ``weight`` (out, in), packed for ``kernel``.

    oneDNN's op runs any row count on its packing; MKL's runs the packed GEMM for ``rows`` rows and
    ``F.linear`` on the weight it is given for any other."""
    if kernel == "onednn":
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, rows)
        return lambda x, bias: _onednn_linear(x, packed, bias, "none", [], "")
    packed = _mkl_pack(weight, rows)
    return lambda x, bias: _mkl_linear(x, packed, weight, bias, rows)


def _lays_out(weight: Tensor) -> bool:
    """Whether products with this weight may run on a weight laid out anew: fp32 on a CPU, no autocast,
    a backend other than ``aten``."""
    return (
        _backend != "aten"
        and weight.dtype == torch.float32 and weight.device.type == "cpu"
        and not torch.is_autocast_enabled("cpu")
    )


def _kernels() -> tuple[str, ...]:
    """The kernels this PyTorch can run: :data:`KERNELS`, less the packed ones it lacks."""
    return tuple(k for k in KERNELS if k not in PACKED or available(k))


# ----------------------------------------------------------------------------------------------
# The kernel of each product, measured on the machine at hand.

CACHE_ENV = "QKV_KERNEL_CACHE"  # the file of measured choices, instead of the user cache's
ROUNDS = 5  # alternating timings of the kernels; the median decides
ROUND_SECONDS = 25e-3  # each timing repeats the step's products for about this long
# Another kernel than F.linear is chosen where it takes at most this fraction of F.linear's time. Laying
# a weight out anew costs what the timing does not see (a copy made for every generation, a second copy
# in memory), and on a shared machine timings of a few percent apart swap places from one measurement
# to the next: a kernel within 10% of F.linear is not worth its copy.
MARGIN = 0.9
# Of kernels timed within this fraction of the fastest, the first in KERNELS' order is chosen. Timings
# of a step's products alone flatter oneDNN: on an Intel Xeon it timed a few percent behind MKL's packed
# GEMM on three of the four 8-row shapes of a GPT step, and ran the whole step slower than it
# (docs/BENCHMARKS.md, "The figures behind the decoding rules").
CLOSE = 0.05

_choices: dict[str, dict[str, str]] = {}  # machine() -> "rows,in,out" -> one of KERNELS, read or measured


def cache_path() -> Path:
    """The file the measured choices are kept in: ``$QKV_KERNEL_CACHE``, else ``kernels.json`` in the user cache."""
    return Path(os.environ[CACHE_ENV]) if os.environ.get(CACHE_ENV) else user_cache("kernels.json")


def machine() -> str:
    """What a choice holds for: the CPU (:func:`cpu_identity`), the torch version, the thread count and the
    kernels it was chosen among (a choice made before a kernel was added is measured again)."""
    return f"{cpu_identity()} | torch {torch.__version__} | {torch.get_num_threads()} threads | {' '.join(_kernels())}"


def _read_cache() -> dict:
    try:
        data = json.loads(cache_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):  # none yet, or unreadable: measure again and write it anew
        return {}
    return data if isinstance(data, dict) else {}


def _machine_choices(key: str) -> dict[str, str]:
    if key not in _choices:
        found = _read_cache().get(key, {})
        _choices[key] = {k: v for k, v in found.items() if v in _kernels()} if isinstance(found, dict) else {}
    return _choices[key]


def measure(linears: Sequence[nn.Linear], rows: int) -> dict[str, dict[str, float]]:
    """Seconds per ``rows``-row product of each shape among ``linears`` (``"in,out"``), for each kernel
    this PyTorch runs (:func:`_kernels`): ``F.linear`` on the weight as ``nn.Linear`` keeps it ("aten")
    and on the same values laid out (in, out) in memory ("transposed", :class:`TransposedLinear`), and
    oneDNN's and MKL's packed weights.

    Timed as a decoding step runs them: ``linears`` are the step's own linear maps (:func:`step_linears`),
    laid out for one kernel at a time (:func:`lay_out`'s modules) and called in turn on random inputs, each call
    timed; a shape's time is the sum over its maps, so a step's share of each is what decides. The
    step's own weights, in the step's order, are what a step streams through the caches: timings of
    one shape alone, on copies of random weights, chose kernels that made the steps of an Intel Xeon
    slower (docs/BENCHMARKS.md, "GPT generation"). The kernels
    alternate for :data:`ROUNDS` rounds, each of about :data:`ROUND_SECONDS` after an untimed pass
    (the step finds its weights where the last one left them); medians. The rounds are long because
    short ones mislead: the transposed and packed kernels reach their speed only after milliseconds
    of running (timed for a couple of milliseconds, that Xeon's 8-row products chose ``F.linear``, which
    those beat by far). ``linears`` are left as they are.
    """
    g = torch.Generator().manual_seed(0)
    xs = {n: torch.empty(rows, 1, n).uniform_(-1, 1, generator=g) for n in {m.in_features for m in linears}}
    shapes = [f"{m.in_features},{m.out_features}" for m in linears]
    times: dict[str, dict[str, list[float]]] = {kernel: {shape: [] for shape in shapes} for kernel in _kernels()}

    def sweep(maps: list[nn.Module], total: dict[str, float]) -> None:
        for m, shape in zip(maps, shapes):
            t0 = time.perf_counter()
            m(xs[m.in_features])
            total[shape] += time.perf_counter() - t0

    with torch.no_grad():
        for _ in range(ROUNDS):
            for kernel, by_shape in times.items():
                maps = [lay_out(m, kernel, rows) for m in linears]
                t0 = time.perf_counter()
                sweep(maps, dict.fromkeys(shapes, 0.0))  # untimed (and oneDNN builds its kernels)
                reps = max(1, int(ROUND_SECONDS / max(time.perf_counter() - t0, 1e-7)))
                total = dict.fromkeys(shapes, 0.0)
                for _ in range(reps):
                    sweep(maps, total)
                for shape, seconds in total.items():
                    by_shape[shape].append(seconds / reps)
    return {shape: {kernel: statistics.median(by_shape[shape]) for kernel, by_shape in times.items()}
            for shape in dict.fromkeys(shapes)}


def choose(linears: Sequence[nn.Linear], rows: int) -> list[str]:
    """The kernel of each of ``linears``' fp32 ``rows``-row products on this machine, each one of :data:`KERNELS`.

    ``QKV_LINEAR`` (:func:`set_backend`) can force one; by default the first time a shape is needed
    they are measured (:func:`measure`, all of ``linears`` together, about a second once per machine; the
    row count rounded up to a power of two, so that a test
    set's batches of every size need a few measurements) and the choice is kept for each shape, in memory and in
    :func:`cache_path`, for every later process on the same CPU (:func:`cpu_identity`), torch and
    thread count. Another kernel than ``F.linear`` is chosen only where it takes at most
    :data:`MARGIN` of its time, and of kernels :data:`CLOSE` to the fastest the first in the order of
    :data:`KERNELS` (see there).
    """
    if _backend != "auto":
        return [backend()] * len(linears)
    here, bucket = machine(), 1 << max(0, rows - 1).bit_length()  # rows rounded up to a power of two
    choices = _machine_choices(here)
    keys = [f"{bucket},{m.in_features},{m.out_features}" for m in linears]
    if any(key not in choices for key in keys):
        for shape, seconds in measure(linears, bucket).items():  # the whole step: its working set
            fastest = min(seconds.values())
            kernel = next(k for k in KERNELS if k in seconds and seconds[k] <= (1 + CLOSE) * fastest)
            choices.setdefault(f"{bucket},{shape}", kernel if seconds[kernel] <= MARGIN * seconds["aten"] else "aten")
        data = _read_cache()  # another process may have added choices since
        kept = data.get(here)
        data[here] = {**(kept if isinstance(kept, dict) else {}), **choices}
        try:
            cache_path().parent.mkdir(parents=True, exist_ok=True)
            write_json(cache_path(), data)
        except OSError:  # a read-only home: the choice holds for this process
            pass
    return [choices[key] for key in keys]


def forget_choices() -> None:
    """Drop the choices held in memory (the next :func:`choose` reads the cache file again)."""
    _choices.clear()


class PackedLinear(nn.Linear):
    """A linear map of a decoding copy whose weight is also packed for a packed kernel (:data:`PACKED`) and
    ``rows``-row products: :meth:`of` an ``nn.Linear``, which it stands for.

    oneDNN builds a kernel for each row count it sees and keeps it. When a beam search's batch shrinks
    as sentences finish, every new count cost time and memory: translating a test set grew the process
    by hundreds of MB. One row count per generation keeps that to one kernel per weight; other counts take
    ``F.linear`` (MKL's packing holds for its row count only), as do autograd and autocast. The packed
    weight is a second copy, made for the generation the copy serves, while the weight does not change.
    """

    rows: int
    kernel: str

    @classmethod
    def of(cls, linear: nn.Linear, rows: int, kernel: str = "onednn") -> PackedLinear:
        new = rebuilt(linear, cls)
        new.rows, new.kernel = rows, kernel
        new.product = _packed_product(kernel, linear.weight.detach().contiguous(), rows)
        return new

    def forward(self, x: Tensor) -> Tensor:
        weight, bias = self.weight, self.bias
        if x.numel() == self.rows * x.shape[-1] and x.dtype == weight.dtype and x.device == weight.device \
                and _lays_out(weight) and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)):
            return self.product(x, bias)
        return F.linear(x, weight, bias)


class TransposedLinear(nn.Linear):
    """A linear map of a decoding copy that multiplies by its weight's values laid out (in, out) in memory:
    the same values and shape, other strides (:meth:`of` an ``nn.Linear``, whose weight it keeps too).

    ``F.linear`` multiplies by the weight's transpose, which is then a contiguous (in, out) matrix, the
    layout MKL streams faster for some shapes (:func:`measure`). Its forward is ``nn.Linear``'s with the
    other memory, for every row count; autograd takes the weight itself, so that a gradient reaches it. The
    values are a copy, made for the generation the decoding copy serves, while the weight does not change.
    """

    @classmethod
    def of(cls, linear: nn.Linear) -> TransposedLinear:
        new = rebuilt(linear, cls)
        new.weight_in_out = linear.weight.detach().t().contiguous().t()  # (out, in) values, (in, out) memory
        return new

    def forward(self, x: Tensor) -> Tensor:
        if torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad):
            return F.linear(x, self.weight, self.bias)
        return F.linear(x, self.weight_in_out, self.bias)


def step_linears(model: nn.Module) -> list[nn.Linear]:
    """The linear maps every decoding step of ``model`` runs: the decoder's and the output projection.

    The encoder runs once per source, and so does cross-attention's [W^K; W^V] (``kv_proj``): a step
    reads the keys and values of its cache.
    """
    return [m for part in kind_of(model).step_parts(model) for name, m in part.named_modules()
            if isinstance(m, nn.Linear) and not name.endswith("kv_proj")]


def lay_out(linear: nn.Linear, kernel: str, rows: int) -> nn.Linear:
    """The module that computes ``linear`` on ``kernel`` (one of :data:`KERNELS`) for ``rows``-row products: a
    :class:`PackedLinear` or a :class:`TransposedLinear`; ``linear`` itself for ``"aten"``."""
    if kernel in PACKED:
        return PackedLinear.of(linear, rows, kernel)
    if kernel == "transposed":
        return TransposedLinear.of(linear)
    return linear


def pack_weights(model: nn.Module, rows: int) -> nn.Module:
    """Swap the linear maps of ``model``'s decoding steps (``model``: a decoding copy) for modules laid out for
    ``rows``-row products, where another kernel runs them faster than ``F.linear`` (:func:`choose`). Returns
    ``model``."""
    linears = [m for m in step_linears(model) if _lays_out(m.weight)]
    laid_out = {id(m): lay_out(m, kernel, rows) for m, kernel in zip(linears, choose(linears, rows))}
    return swap_modules(model, lambda m: laid_out.get(id(m)))


def decoding_model(model: nn.Module, rows: int | None = None, max_len: int | None = None,
                   packed: bool = True) -> nn.Module:
    """The model a generation of ``model`` decodes on: a :func:`~qkv.accel.swap.decoding_copy` (eval mode, every
    tensor ``model``'s own), with caches for ``rows`` rows of up to ``max_len`` positions (none where ``rows`` is
    None: a generation that recomputes every prefix) and (``packed``) its step's linear maps laid out for
    ``rows``-row products (:func:`pack_weights`). ``model`` is not changed; the caches go with the copy."""
    twin = decoding_copy(model)
    if rows is None:
        return twin
    twin.setup_cache(rows, max_len)
    return pack_weights(twin, rows) if packed else twin


def compiled_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """What a linear map becomes inside ``torch.compile`` (a compiled decoding step).

    A single row is written as multiply-and-sum, which inductor turns into a vectorized loop over the
    rows of W: faster than MKL's matrix-vector product, which ``F.linear`` lowers to, and than oneDNN's
    packed weights (bench/probes/gemv.py; docs/BENCHMARKS.md, "GPT generation").
    """
    if x.numel() != x.shape[-1]:
        return F.linear(x, weight, bias)
    y = (x.unsqueeze(-2) * weight).sum(-1)  # (..., 1, in) * (out, in) -> (..., out)
    return y if bias is None else y + bias


__all__ = ["KERNELS", "PACKED", "MARGIN", "CLOSE", "set_backend", "backend", "available", "cache_path",
           "machine", "measure", "choose", "forget_choices", "PackedLinear", "TransposedLinear", "step_linears",
           "lay_out", "pack_weights", "decoding_model", "compiled_linear"]
