"""Beam search against CTranslate2, part by part: is the gap in the products' kernels or around them?

bench/beam_mt.py's search (beam 4 over 16 sources, 30 steps, the small encoder-decoder: 64 hypotheses a
step), three ways, each in fresh processes alternating for ``--repeats`` rounds:

- ``gemm``: the decoder step's 19 weight products alone (64 rows, in the step's order, on the model's
  own weights, no bias), on each kernel PyTorch offers qkv (``aten``: ``F.linear``'s MKL GEMM;
  ``transposed``: the same on (in, out) memory; ``mkl`` and ``onednn``: packed weights,
  qkv.accel.kernels) and on CTranslate2's own: ``primitives<CPU>::gemm<float, float>``, the
  function its dense layers call, taken from its library (exported there) and called on the same
  memory (CTranslate2 chooses its backend for the CPU on first use; ``CT2_VERBOSE=1`` says which). Per shape
  and summed over a step, with qkv's choice for each shape (``kernels.choose``) summed beside them;
  also the pair of products that d_ff 2,048 brings (``ms_wide_ff_pair``), for the next measurement.
- ``search@D``: whole searches of both engines as the model is (d_ff 1,024) and with feed-forward
  layers twice as wide (d_ff 2,048), which adds only products (7.1 GFLOP a search, counted with
  ``FlopCounterMode``) and a wider ReLU: the added time over the added FLOP is each engine's rate on
  products where they run, between its other work (CTranslate2 cannot be timed inside).
- ``inside``: qkv's search with each part timed where it runs (a clock around the decoder step, the
  encoder, the step's linear maps, its attention calls, the log-softmax, the choice of continuations
  and the cache reorder; ~1,200 clock reads a search, the search's own time beside it untimed).

    python bench/probes/beam_products.py [--repeats 5] [--out bench/results/beam_products.json]
"""

from __future__ import annotations

import ctypes
import glob
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # the probes beside it, and bench/'s common and peers
from beam_mt import BEAM, NEW, SOURCES, model_of, searches, sources  # noqa: E402
from common import decoding_bench_args, median_of, run_alternating, time_steps, write_result  # noqa: E402

WIDTHS = (1024, 2048)  # d_ff: the small model's, and twice it
ENGINES = ("qkv", "ct2")
KERNELS = ("ct2", "aten", "transposed", "mkl", "onednn")
ROWS = SOURCES * BEAM  # a step's hypotheses
STEPS = NEW + 1  # a search's decoder steps: 30 tokens and the end
# CTranslate2 4.8.5's primitives<Device::CPU>::gemm<float, float>(a_is_packed, b_is_packed, transpose_a,
# transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, a_shift_compensation), as its library exports it.
CT2_GEMM = "_ZN11ctranslate210primitivesILNS_6DeviceE0EE4gemmIffEEvbbbblllfPKT_lS6_lfPT0_lPKS7_"


def ct2_gemm():
    """CTranslate2's fp32 GEMM as a function of (x (m, k), w (n, k), out (m, n)): out = x w^T."""
    import ctranslate2

    folder = os.path.dirname(ctranslate2.__file__) + ".libs"
    libs = glob.glob(os.path.join(folder, "libctranslate2*.so*"))
    if not libs:
        sys.exit(f"no libctranslate2 in {folder}: this benchmark reads the wheel of ctranslate2==4.8.5")
    try:
        gemm = getattr(ctypes.CDLL(libs[0]), CT2_GEMM)
    except AttributeError:
        sys.exit(f"{libs[0]} exports no {CT2_GEMM}: another CTranslate2 than 4.8.5?")
    long, ptr = ctypes.c_long, ctypes.c_void_p
    gemm.argtypes = [ctypes.c_bool] * 4 + [long, long, long, ctypes.c_float, ptr, long, ptr, long,
                                           ctypes.c_float, ptr, long, ptr]
    gemm.restype = None

    def product(x, w, out):
        (m, k), n = x.shape, w.shape[0]
        gemm(False, False, False, True, m, n, k, 1.0, x.data_ptr(), k, w.data_ptr(), k, 0.0, out.data_ptr(), n, None)
    return product


def gemm_worker(reps: int) -> dict:
    """Each kernel's time for each of the step's product shapes, in the step's order; microseconds."""
    import torch

    from qkv.accel import kernels

    ct2 = ct2_gemm()
    linears = kernels.step_linears(model_of("small"))
    # After the step's 19, the wider model's two feed-forward products (what search@2048 adds, 3 times).
    wide = model_of("small", {"d_ff": WIDTHS[1]}).decoder_layers[0].feed_forward
    ws = [m.weight.detach().contiguous() for m in [*linears, wide.w_1, wide.w_2]]  # (out, in)
    g = torch.Generator().manual_seed(0)
    xs = {n: torch.empty(ROWS, n).uniform_(-1, 1, generator=g) for n in {w.shape[1] for w in ws}}  # (64, in)
    outs = [torch.empty(ROWS, w.shape[0]) for w in ws]  # (64, out)
    transposed = [w.t().contiguous() for w in ws]  # (in, out)
    mkl = [torch.ops.mkl._mkl_reorder_linear_weight(w, ROWS) for w in ws]
    onednn = [torch.ops.mkldnn._reorder_linear_weight(w, ROWS) for w in ws]
    calls = {
        "ct2": lambda i: ct2(xs[ws[i].shape[1]], ws[i], outs[i]),
        "aten": lambda i: torch.mm(xs[ws[i].shape[1]], ws[i].t(), out=outs[i]),
        "transposed": lambda i: torch.mm(xs[ws[i].shape[1]], transposed[i], out=outs[i]),
        "mkl": lambda i: torch.ops.mkl._mkl_linear(xs[ws[i].shape[1]], mkl[i], ws[i], None, ROWS),
        "onednn": lambda i: torch.ops.mkldnn._linear_pointwise(xs[ws[i].shape[1]], onednn[i], None, "none", [], ""),
    }
    calls["ct2"](0)
    torch.testing.assert_close(outs[0], xs[ws[0].shape[1]] @ ws[0].t())  # the call is the product it claims
    shapes = [f"{w.shape[1]},{w.shape[0]}" for w in ws]
    us = {k: {s: [] for s in shapes} for k in KERNELS}
    with torch.no_grad():
        for _ in range(reps):
            for kernel in KERNELS:
                total = dict.fromkeys(shapes, 0.0)
                for sweep in range(21):  # the first untimed
                    for i, shape in enumerate(shapes):
                        t0 = time.perf_counter()
                        calls[kernel](i)
                        if sweep:
                            total[shape] += time.perf_counter() - t0
                for shape in shapes:
                    us[kernel][shape].append(1e6 * total[shape] / 20 / shapes.count(shape))
    per_shape = {k: {s: statistics.median(v) for s, v in by.items()} for k, by in us.items()}
    chosen = dict(zip(shapes, kernels.choose(linears, ROWS)))

    def total(step_shapes: list[str]) -> dict[str, float]:
        ms = {k: sum(by[s] for s in step_shapes) / 1000 for k, by in per_shape.items()}
        ms["best_torch"] = sum(min(per_shape[k][s] for k in KERNELS[1:]) for s in step_shapes) / 1000
        return ms
    step_shapes = shapes[:len(linears)]
    step = {**total(step_shapes), "qkv_choice": sum(per_shape[chosen[s]][s] for s in step_shapes) / 1000}
    return {"impl": "gemm", "us_per_product": per_shape, "ms_per_step": step, "qkv_choice": chosen,
            "ms_wide_ff_pair": total(shapes[len(linears):])}


def product_flop(d_ff: int) -> float:
    """GFLOP of qkv's search's weight products (encoder and every decoder step; attention's own products
    not counted), at ``d_ff``, counted on ATen's kernel so that every product is a counted matmul."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from qkv.accel import kernels

    kernels.set_backend("aten")
    run = searches("qkv", "small", {"d_ff": d_ff})
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        run()
    return sum(n for op, n in counter.get_flop_counts()["Global"].items() if "attention" not in str(op)) / 1e9


class Clocks:
    """Seconds spent in named functions, by wrapping them where the search looks them up."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def wrap(self, owner, attr: str, name: str) -> None:
        f = getattr(owner, attr)
        self.seconds[name] = 0.0

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return f(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - t0
        setattr(owner, attr, timed)

    def hook(self, modules, name: str) -> None:
        """The time in ``modules``' forward calls (pre- and post-hooks)."""
        self.seconds[name] = 0.0
        started = {}

        def pre(m, args):
            started[id(m)] = time.perf_counter()

        def post(m, args, out):
            self.seconds[name] += time.perf_counter() - started.pop(id(m))
        for m in modules:
            m.register_forward_pre_hook(pre)
            m.register_forward_hook(post)


def inside_worker(reps: int) -> dict:
    """qkv's search with its parts timed where they run; ms a step (a search's time over its 31 steps)."""
    import torch
    import torch.nn.functional as F

    import qkv.generation.beam as beam
    from qkv.accel import kernels
    from qkv.generation.beam import beam_search

    model = model_of("small")
    src = sources(model.cfg.vocab_size)

    def run():
        beam_search(model, src, bos_id=1, eos_id=2, beam_size=BEAM, alpha=0.6, limit=NEW)
    with torch.inference_mode():
        untimed = statistics.median(time_steps(run, reps, warmup=1))
        clocks = Clocks()
        for attr in ("decode", "encode", "reorder_cache"):
            clocks.wrap(model, attr, attr)
        clocks.hook(kernels.step_linears(model), "step_linears")
        clocks.wrap(F, "scaled_dot_product_attention", "attention")  # as qkv.modules.attention calls it
        clocks.wrap(beam.torch, "log_softmax", "log_softmax")  # beam.torch is torch: only the search calls it here
        clocks.wrap(beam, "_best_continuations", "choice")
        run()
        per_run = []
        for _ in range(reps):
            clocks.seconds = dict.fromkeys(clocks.seconds, 0.0)
            t0 = time.perf_counter()
            run()
            per_run.append({"search": time.perf_counter() - t0, **clocks.seconds})
    ms = {k: 1000 * statistics.median(r[k] for r in per_run) / STEPS for k in per_run[0]}
    ms["decode_other"] = ms["decode"] - ms["step_linears"] - ms["attention"]  # attention: the encoder's 3 too
    ms["search_other"] = ms["search"] - ms["decode"] - ms["encode"] - ms["reorder_cache"] - ms["log_softmax"] - ms["choice"]
    return {"impl": "inside", "ms_per_step": ms, "untimed_ms_per_step": 1000 * untimed / STEPS}


def worker(impl: str, reps: int) -> dict:
    import torch

    if impl == "gemm":
        return gemm_worker(reps)
    if impl == "inside":
        return inside_worker(reps)
    engine, d_ff = impl.split("@")
    if engine == "flop":
        return {"impl": impl, "product_gflop": product_flop(int(d_ff))}
    run = searches(engine, "small", {"d_ff": int(d_ff)})
    with torch.inference_mode():
        times = time_steps(run, reps, warmup=1)
    return {"impl": impl, "ms_per_search": 1000 * statistics.median(times)}


def main() -> None:
    args = decoding_bench_args(__doc__, "bench/results/beam_products.json", 5, lambda a: worker(a.worker, a.reps),
                               "timed searches (gemm: rounds of 20 sweeps) per process")
    gflop = {w: run_alternating(__file__, [f"flop@{w}"], 1, [])[f"flop@{w}"][0]["product_gflop"] for w in WIDTHS}
    impls = ["gemm", "inside", *(f"{e}@{w}" for e in ENGINES for w in WIDTHS)]
    runs = run_alternating(__file__, impls, args.repeats, ["--reps", str(args.reps)])
    gemm = {k: statistics.median(r["ms_per_step"][k] for r in runs["gemm"]) for k in runs["gemm"][0]["ms_per_step"]}
    wide_pair = {k: statistics.median(r["ms_wide_ff_pair"][k] for r in runs["gemm"]) for k in runs["gemm"][0]["ms_wide_ff_pair"]}
    inside = {k: statistics.median(r["ms_per_step"][k] for r in runs["inside"]) for k in runs["inside"][0]["ms_per_step"]}
    inside["untimed_search"] = median_of(runs["inside"], "untimed_ms_per_step")
    narrow, wide = WIDTHS
    summary = {"gemm_ms_per_step": gemm, "gemm_ms_wide_ff_pair": wide_pair, "inside_ms_per_step": inside, "product_gflop_per_search": gflop}
    for e in ENGINES:
        ms = {w: median_of(runs[f"{e}@{w}"], "ms_per_search") for w in WIDTHS}
        rate = (gflop[wide] - gflop[narrow]) / ((ms[wide] - ms[narrow]) / 1000)  # GFLOP/s on the added products
        summary[e] = {"ms_per_step": ms[narrow] / STEPS, "ms_per_step_wide": ms[wide] / STEPS,
                      "added_products_gflop_per_s": rate}
    summary["ratio_qkv_over_ct2"] = summary["ct2"]["ms_per_step"] / summary["qkv"]["ms_per_step"]
    summary["ratio_gemm_best_torch_over_ct2"] = gemm["ct2"] / gemm["best_torch"]
    summary["ratio_gemm_qkv_choice_over_ct2"] = gemm["ct2"] / gemm["qkv_choice"]
    write_result(args.out, {"benchmark": "beam search, beam 4, 16 sources, 30 steps, against CTranslate2: the "
                                         "products' kernels alone, the products' rate in each search (by d_ff "
                                         f"{narrow} -> {wide}), qkv's search timed part by part",
                            "summary": summary, "runs": runs})


if __name__ == "__main__":
    main()
