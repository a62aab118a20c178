"""CPU speed-ups of decoding, applied around the model by the decoding functions that use them.

The model files are the paper: plain ``nn.Linear`` maps, one attention formula. Decoding runs the
same model one position at a time, and on a CPU a step is bound by its matrix-vector products, so
the functions that decode (greedy and beam search, ``generate``, the Completer) transform the model
from outside for the time they decode, and put it back after (gpt-fast's rule):

- :func:`decoding`: the caches, and the weights of the products every step runs laid out for the
  kernel that is fastest for them on this CPU. PyTorch's ``F.linear`` sends fp32 to MKL (or OpenBLAS)
  with the weight as ``nn.Linear`` keeps it, (out, in). Two other layouts can beat it: the weight's
  memory laid out (in, out) (:func:`transpose_weight`, "transposed": 1.65x faster than the default
  for one-row products of 384 inputs to 1,536 outputs on an AMD EPYC, 0.6x for 1,536 to 384), and oneDNN's packed
  weights (:class:`PackedLinear`), which ran batch-1 products at twice MKL's speed on one AMD EPYC and
  at half of it on an Intel Xeon (docs/BENCHMARKS.md). So no kernel is assumed: :func:`choose` times
  each on each product's shape (rows, in, out) the first time it is needed on a machine, and keeps the
  winner in the user cache (``kernels.json``, keyed by CPU model, torch version and thread count).
  ``pack_weights`` then lays out each linear map a step runs (:func:`step_linears`) where another
  kernel than the default won: its weight's memory transposed, or its ``forward`` replaced by oneDNN's
  (which takes ``F.linear`` for products it does not hold for: a prompt's prefill, other row counts,
  autograd, a weight changed since). The results are
  ``F.linear``'s up to fp32 rounding (another summation order), whichever is chosen.
- :func:`compiled_linear`: what a linear map becomes inside a compiled decoding step
  (qkv.generation.compiled).

Where no weight is laid out anew: training (oneDNN builds a kernel for every new row count, and
batches of real tokens change it at every step: translation training got slower and 40% larger in
memory, docs/BENCHMARKS.md; and a copy of a weight is stale after every optimizer step), anything that
is not fp32 on a CPU (GPUs, bf16, autocast), and ``QKV_LINEAR=aten`` in the environment.
``QKV_LINEAR=transposed`` or ``onednn`` lays every step's weights out for that kernel without
measuring (``onednn`` only where this PyTorch has it); the default, ``auto``, measures.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv.io import user_cache, write_json
from qkv.models import GPT, Transformer

# oneDNN's fused linear, the op torch.compile's CPU backend emits for frozen linear layers. It is a
# private op of the pinned torch; ``available()`` checks it once and everything falls back without it.
_onednn_linear = getattr(torch.ops.mkldnn, "_linear_pointwise", None)
KERNELS = ("aten", "transposed", "onednn")  # F.linear on (out, in) memory, on (in, out) memory, oneDNN packed
_BACKENDS = ("auto", *KERNELS)
_backend = os.environ.get("QKV_LINEAR", "auto")
if _backend not in _BACKENDS:
    raise ValueError(f"QKV_LINEAR={_backend!r}: expected one of {', '.join(_BACKENDS)}")


def set_backend(name: str) -> None:
    """``"auto"`` (the default: the fastest kernel for each shape, measured), or one of :data:`KERNELS`
    everywhere (``"onednn"`` wherever oneDNN runs), e.g. to compare them."""
    global _backend
    if name not in _BACKENDS:
        raise ValueError(f"unknown linear backend {name!r}; expected one of {', '.join(_BACKENDS)}")
    _backend = name


def backend() -> str:
    """How fp32 CPU products of decoding choose their kernel now: ``"auto"`` or one of :data:`KERNELS`."""
    return "aten" if _backend == "onednn" and not available() else _backend


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


def _lays_out(weight: Tensor) -> bool:
    """Whether products with this weight may run on a weight laid out anew: fp32 on a CPU, no autocast,
    a backend other than ``aten``."""
    return (
        _backend != "aten"
        and weight.dtype == torch.float32 and weight.device.type == "cpu"
        and not torch.is_autocast_enabled("cpu")
    )


def _kernels() -> tuple[str, ...]:
    """The kernels this PyTorch can run: :data:`KERNELS`, less oneDNN where it is missing."""
    return KERNELS if available() else KERNELS[:2]


# ----------------------------------------------------------------------------------------------
# The kernel of each product, measured on the machine at hand.

CACHE_ENV = "QKV_KERNEL_CACHE"  # the file of measured choices, instead of the user cache's
ROUNDS = 3  # alternating timings of the kernels per shape; the median decides
ROUND_SECONDS = 2e-3  # each timing repeats the products for about this long
STREAM_BYTES = 24 << 20  # the weights one timing reads, more than most CPUs' caches hold

_choices: dict[str, dict[str, str]] = {}  # machine() -> "rows,in,out" -> one of KERNELS, read or measured


def cache_path() -> Path:
    """The file the measured choices are kept in: ``$QKV_KERNEL_CACHE``, else ``kernels.json`` in the user cache."""
    return Path(os.environ[CACHE_ENV]) if os.environ.get(CACHE_ENV) else user_cache("kernels.json")


@functools.cache
def _cpu_model() -> str:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    return model


def machine() -> str:
    """What a choice holds for: the CPU model, the torch version, the thread count and the kernels it was
    chosen among (a choice made before a kernel was added is measured again)."""
    return f"{_cpu_model()} | torch {torch.__version__} | {torch.get_num_threads()} threads | {' '.join(_kernels())}"


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


def _seconds_per_call(run: Callable[[], object], reps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(reps):
        run()
    return (time.perf_counter() - t0) / reps


def measure(rows: int, in_features: int, out_features: int) -> dict[str, float]:
    """Seconds per ``rows``-row product with an (out, in) fp32 weight, for each kernel this PyTorch runs
    (:func:`_kernels`): ``F.linear`` on the weight as ``nn.Linear`` keeps it ("aten") and on the same
    values laid out (in, out) in memory ("transposed", :func:`transpose_weight`), and oneDNN's packed
    weight.

    A decoding step streams every weight from memory once, so where one product is quick the timing
    cycles through copies of random weights that together outgrow the CPU's caches
    (:data:`STREAM_BYTES`) instead of multiplying one weight that stays in them. The kernels
    alternate for :data:`ROUNDS` rounds of about :data:`ROUND_SECONDS` each (or one product, if that
    is longer); medians.
    """
    g = torch.Generator().manual_seed(0)
    x = torch.empty(rows, in_features).uniform_(-1, 1, generator=g)

    def weights(n: int) -> list[Tensor]:
        return [torch.empty(out_features, in_features).uniform_(-1, 1, generator=g) for _ in range(n)]

    def layouts(w: list[Tensor]) -> dict[str, Callable[[], object]]:
        laid = {"aten": w, "transposed": [m.t().contiguous().t() for m in w]}  # (out, in) memory, (in, out) memory
        runs: dict[str, Callable[[], object]] = {"aten": lambda: [F.linear(x, m) for m in laid["aten"]],
                                                 "transposed": lambda: [F.linear(x, m) for m in laid["transposed"]]}
        if "onednn" in _kernels():
            laid["onednn"] = [torch.ops.mkldnn._reorder_linear_weight(m, rows) for m in w]
            runs["onednn"] = lambda: [_onednn_linear(x, m, None, "none", [], "") for m in laid["onednn"]]
        return runs

    with torch.inference_mode():
        w = weights(1)
        once = max(_seconds_per_call(run, 2) for run in layouts(w).values())  # warm: oneDNN builds its kernel here
        copies = max(1, min(STREAM_BYTES // (4 * in_features * out_features), int(ROUND_SECONDS / max(once, 1e-7))))
        kernels = layouts(w + weights(copies - 1))
        reps = max(1, int(ROUND_SECONDS / max(once * copies, 1e-7)))
        times: dict[str, list[float]] = {name: [] for name in kernels}
        for _ in range(ROUNDS):
            for name, run in kernels.items():
                times[name].append(_seconds_per_call(run, reps) / copies)
    return {name: statistics.median(ts) for name, ts in times.items()}


def choose(rows: int, in_features: int, out_features: int) -> str:
    """The kernel of fp32 ``rows``-row products with an (out, in) weight on this machine, one of :data:`KERNELS`.

    ``QKV_LINEAR`` (:func:`set_backend`) can force one; by default the first call for a shape measures
    them (:func:`measure`, a few tenths of a second; the row count rounded up to a power of two, so
    that a test set's batches of every size need a few measurements) and the choice is kept, in
    memory and in :func:`cache_path`, for every later process on the same CPU model, torch and
    thread count.
    """
    if _backend != "auto":
        return backend()
    here, bucket = machine(), 1 << max(0, rows - 1).bit_length()  # rows rounded up to a power of two
    choices, shape = _machine_choices(here), f"{bucket},{in_features},{out_features}"
    if shape not in choices:
        seconds = measure(bucket, in_features, out_features)
        choices[shape] = min(seconds, key=seconds.__getitem__)
        data = _read_cache()  # another process may have added choices since
        kept = data.get(here)
        data[here] = {**(kept if isinstance(kept, dict) else {}), **choices}
        try:
            cache_path().parent.mkdir(parents=True, exist_ok=True)
            write_json(cache_path(), data)
        except OSError:  # a read-only home: the choice holds for this process
            pass
    return choices[shape]


def forget_choices() -> None:
    """Drop the choices held in memory (the next :func:`choose` reads the cache file again)."""
    _choices.clear()


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
                and x.dtype == weight.dtype and x.device == weight.device and _lays_out(weight) \
                and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)):
            return _onednn_linear(x, self.packed, bias, "none", [], "")
        return F.linear(x, weight, bias)


_OUT_IN = "_qkv_out_in"  # where a transposed linear map keeps its weight's own (out, in) memory


def transpose_weight(module: nn.Linear) -> None:
    """Lay ``module.weight`` out in memory as (in, out): the same values and shape, other strides.

    ``F.linear`` multiplies by the weight's transpose, which is then a contiguous (in, out) matrix, the
    layout MKL streams faster for some shapes (:func:`measure`). Nothing wraps the module (a wrapper's
    Python, ~10 us a call, cost a GPT step as much as the layout saved): its own ``forward`` runs, for
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
    if isinstance(model, Transformer):
        parts: list[nn.Module] = [*model.decoder_layers, model.generator]
    elif isinstance(model, GPT):
        parts = [*model.layers, model.lm_head]
    else:
        raise TypeError(f"step_linears: a Transformer or a GPT, got {type(model).__name__}")
    return [m for part in parts for name, m in part.named_modules()
            if type(m) is nn.Linear and not name.endswith("kv_proj")]


def pack_weights(model: nn.Module, rows: int) -> None:
    """Lay the weights of ``model``'s decoding steps out for ``rows``-row products, where another kernel
    runs them faster than ``F.linear`` (:func:`choose`)."""
    for m in step_linears(model):
        kernel = choose(rows, m.in_features, m.out_features) if _lays_out(m.weight) else "aten"
        if kernel == "onednn":
            m.forward = PackedLinear(m, rows)
        elif kernel == "transposed":
            transpose_weight(m)


def unpack_weights(model: nn.Module) -> None:
    """Free the packed weights: every linear map is ``nn.Linear``'s own again, its weight in its own memory."""
    for m in model.modules():
        if isinstance(m.__dict__.get("forward"), PackedLinear):
            del m.forward
        restore_weight(m)


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


__all__ = ["KERNELS", "set_backend", "backend", "available", "cache_path", "machine", "measure", "choose", "forget_choices",
           "PackedLinear", "transpose_weight", "restore_weight", "step_linears", "pack_weights", "unpack_weights", "start_decoding", "end_decoding", "decoding",
           "compiled_linear"]
