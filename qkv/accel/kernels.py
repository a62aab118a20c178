"""CPU speed-ups of decoding, applied around the model by the decoding functions that use them.

The model files are the paper: plain ``nn.Linear`` maps, one attention formula. Decoding runs the
same model one position at a time, and on a CPU a step is bound by its matrix-vector products, so
the functions that decode (greedy and beam search, ``generate``, the Completer) transform the model
from outside for the time they decode, and put it back after (gpt-fast's rule):

- :func:`decoding`: the caches, and the weights of the products every step runs laid out for the
  kernel that is fastest for them on this CPU. PyTorch's ``F.linear`` sends fp32 to MKL (or OpenBLAS)
  with the weight as ``nn.Linear`` keeps it, (out, in). Three other layouts can beat it: the weight's
  memory laid out (in, out) (:func:`transpose_weight`, "transposed": faster than the default for
  some shapes of one-row products on an AMD EPYC, slower for others); oneDNN's packed weights
  (:class:`PackedLinear`), which ran batch-1 products faster than MKL on one AMD EPYC and slower on an
  Intel Xeon; and MKL's own packed weights (``cblas_sgemm_pack``, the GEMM CTranslate2 runs on Intel
  CPUs, which PyTorch reaches as ``torch.ops.mkl._mkl_linear``), which won the 8-row products of a GPT
  step on that Xeon (the figures: docs/BENCHMARKS.md, "The figures behind the decoding rules"). So no
  kernel is assumed: :func:`choose` times the step's own linear maps on each kernel the first time a
  shape (rows, in, out) is needed on a machine, and keeps each shape's winner in the user
  cache (``kernels.json``, keyed by the CPU, torch version and thread count). ``pack_weights`` then
  lays out each linear map a step runs (:func:`step_linears`) where another kernel than the default
  won: its weight's memory transposed, or its ``forward`` replaced by a packed kernel's (which takes
  ``F.linear`` for products it does not hold for: a prompt's prefill, other row counts, autograd, a
  weight changed since). The results are ``F.linear``'s up to fp32 rounding (another summation
  order), whichever is chosen.
- :func:`compiled_linear`: what a linear map becomes inside a compiled decoding step
  (qkv.accel.compiled).

Where no weight is laid out anew: training (oneDNN builds a kernel for every new row count, and
batches of real tokens change it at every step: translation training got slower and larger in
memory; and a copy of a weight is stale after every optimizer step), anything that
is not fp32 on a CPU (GPUs, bf16, autocast), and ``QKV_LINEAR=aten`` in the environment.
``QKV_LINEAR=transposed``, ``mkl`` or ``onednn`` lays every step's weights out for that kernel without
measuring (a packed kernel only where this PyTorch has it); the default, ``auto``, measures.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import statistics
import time
from pathlib import Path
from typing import Callable, Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

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
PACKED = ("mkl", "onednn")  # the kernels that replace a linear map's forward with a PackedLinear
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
    and on the same values laid out (in, out) in memory ("transposed", :func:`transpose_weight`), and
    oneDNN's and MKL's packed weights.

    Timed as a decoding step runs them: ``linears`` are the step's own linear maps (:func:`step_linears`),
    laid out for one kernel at a time (:func:`lay_out`) and called in turn on random inputs, each call
    timed; a shape's time is the sum over its maps, so a step's share of each is what decides. The
    step's own weights, in the step's order, are what a step streams through the caches: timings of
    one shape alone, on copies of random weights, chose kernels that made the steps of an Intel Xeon
    slower (docs/BENCHMARKS.md, "GPT generation"). The kernels
    alternate for :data:`ROUNDS` rounds, each of about :data:`ROUND_SECONDS` after an untimed pass
    (the step finds its weights where the last one left them); medians. The rounds are long because
    short ones mislead: the transposed and packed kernels reach their speed only after milliseconds
    of running (timed for a couple of milliseconds, that Xeon's 8-row products chose ``F.linear``, which
    those beat by far). The maps are left as they were.
    """
    g = torch.Generator().manual_seed(0)
    xs = {n: torch.empty(rows, 1, n).uniform_(-1, 1, generator=g) for n in {m.in_features for m in linears}}
    shapes = [f"{m.in_features},{m.out_features}" for m in linears]
    times: dict[str, dict[str, list[float]]] = {kernel: {shape: [] for shape in shapes} for kernel in _kernels()}

    def sweep(total: dict[str, float]) -> None:
        for m, shape in zip(linears, shapes):
            t0 = time.perf_counter()
            m(xs[m.in_features])
            total[shape] += time.perf_counter() - t0

    with torch.no_grad():
        for _ in range(ROUNDS):
            for kernel, by_shape in times.items():
                for m in linears:
                    lay_out(m, kernel, rows)
                try:
                    t0 = time.perf_counter()
                    sweep(dict.fromkeys(shapes, 0.0))  # untimed (and oneDNN builds its kernels)
                    reps = max(1, int(ROUND_SECONDS / max(time.perf_counter() - t0, 1e-7)))
                    total = dict.fromkeys(shapes, 0.0)
                    for _ in range(reps):
                        sweep(total)
                finally:
                    for m in linears:
                        restore(m)
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


class PackedLinear:
    """The ``forward`` of an ``nn.Linear`` while it is packed: a packed kernel (:data:`PACKED`) on its
    weight laid out for ``rows``-row products.

    oneDNN builds a kernel for each row count it sees and keeps it. When a beam search's batch shrinks
    as sentences finish, every new count cost time and memory: translating a test set grew the process
    by hundreds of MB. One row count per generation keeps that to one kernel per weight; other counts take
    ``F.linear`` (MKL's packing holds for its row count only). The packed weight is a second copy, used
    only while the weight is unchanged (its version counter is checked on every call; an inference
    tensor, made under ``torch.inference_mode``, keeps none).
    """

    def __init__(self, module: nn.Linear, rows: int, kernel: str = "onednn") -> None:
        self.module, self.rows, self.kernel = module, rows, kernel
        w = module.weight.detach()
        self.version = None if w.is_inference() else w._version
        self.product = _packed_product(kernel, w.contiguous(), rows)

    def __call__(self, x: Tensor) -> Tensor:
        m = self.module
        weight, bias = m.weight, m.bias
        if (self.version is None or self.version == weight._version) and x.numel() == self.rows * x.shape[-1] \
                and x.dtype == weight.dtype and x.device == weight.device and _lays_out(weight) \
                and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)):
            return self.product(x, bias)
        return F.linear(x, weight, bias)


_OUT_IN = "_qkv_out_in"  # where a transposed linear map keeps its weight's own (out, in) memory


def transpose_weight(module: nn.Linear) -> None:
    """Lay ``module.weight`` out in memory as (in, out): the same values and shape, other strides.

    ``F.linear`` multiplies by the weight's transpose, which is then a contiguous (in, out) matrix, the
    layout MKL streams faster for some shapes (:func:`measure`). Nothing wraps the module (a wrapper's
    Python cost a GPT step as much as the layout saved): its own ``forward`` runs, for
    every row count, with autograd as ever. :func:`restore_weight` puts the memory back.
    """
    w = module.weight
    module.__dict__[_OUT_IN] = (w.data, None if w.is_inference() else w._version)
    w.data = w.detach().t().contiguous().t()  # (out, in) values, (in, out) memory


def restore_weight(module: nn.Module) -> None:
    """The weight's own (out, in) memory again, holding any change made to it while it was transposed."""
    kept = module.__dict__.pop(_OUT_IN, None)
    if kept is not None:
        original, version = kept
        w = module.weight
        if version is None or w._version != version:
            original.copy_(w.data)
        w.data = original


def step_linears(model: nn.Module) -> list[nn.Linear]:
    """The linear maps every decoding step of ``model`` runs: the decoder's and the output projection.

    The encoder runs once per source, and so does cross-attention's [W^K; W^V] (``kv_proj``): a step
    reads the keys and values of its cache.
    """
    return [m for part in kind_of(model).step_parts(model) for name, m in part.named_modules()
            if type(m) is nn.Linear and not name.endswith("kv_proj")]


def lay_out(module: nn.Linear, kernel: str, rows: int) -> None:
    """Lay ``module``'s weight out for ``kernel`` (one of :data:`KERNELS`) and ``rows``-row products:
    its ``forward`` a :class:`PackedLinear`, or its memory transposed; ``"aten"`` leaves it as it is."""
    if kernel in PACKED:
        module.forward = PackedLinear(module, rows, kernel)
    elif kernel == "transposed":
        transpose_weight(module)


def pack_weights(model: nn.Module, rows: int) -> None:
    """Lay the weights of ``model``'s decoding steps out for ``rows``-row products, where another kernel
    runs them faster than ``F.linear`` (:func:`choose`)."""
    linears = [m for m in step_linears(model) if _lays_out(m.weight)]
    for m, kernel in zip(linears, choose(linears, rows)):
        lay_out(m, kernel, rows)


def restore(module: nn.Module) -> None:
    """``module`` as :func:`lay_out` found it: ``nn.Linear``'s own forward, its weight in its own memory."""
    if isinstance(module.__dict__.get("forward"), PackedLinear):
        del module.forward
    restore_weight(module)


def unpack_weights(model: nn.Module) -> None:
    """Free the packed weights: every linear map is ``nn.Linear``'s own again, its weight in its own memory."""
    for m in model.modules():
        restore(m)


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
    rows of W: faster than MKL's matrix-vector product, which ``F.linear`` lowers to, and than oneDNN's
    packed weights (bench/probes/gemv.py; docs/BENCHMARKS.md, "GPT generation").
    """
    if x.numel() != x.shape[-1]:
        return F.linear(x, weight, bias)
    y = (x.unsqueeze(-2) * weight).sum(-1)  # (..., 1, in) * (out, in) -> (..., out)
    return y if bias is None else y + bias


__all__ = ["KERNELS", "PACKED", "MARGIN", "CLOSE", "set_backend", "backend", "available", "cache_path",
           "machine", "measure", "choose", "forget_choices", "PackedLinear", "transpose_weight",
           "restore_weight", "step_linears", "lay_out", "restore", "pack_weights", "unpack_weights",
           "start_decoding", "end_decoding", "decoding", "compiled_linear"]
