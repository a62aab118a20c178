"""Markdown tables of the benchmark results in bench/results/*.json, for docs/BENCHMARKS.md.

    python bench/report.py [bench/results]
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def _header(r: dict) -> str:
    return f"`{r['command']}` — {r['date']}, {r['machine']}"


def train_gpt(r: dict) -> str:
    s, ratio = r["summary"], r.get("ratios_qkv_over_hf", {})
    rows = ["| | tokens/s (median) | peak RSS | RSS added by training | model FLOP/s | of matmul peak |",
            "|---|---:|---:|---:|---:|---:|"]
    for impl, v in s.items():
        rows.append(f"| {impl} | {v['tokens_per_s_median']:,.0f} | {v['peak_rss_mb_median']:,.0f} MB | "
                    f"{v['training_rss_mb_median']:,.0f} MB | {v['model_gflops_per_s']:.0f} GFLOP/s | "
                    f"{100 * v['fraction_of_matmul_peak']:.0f}% |")
    if ratio:
        rows.append(f"| **qkv / HF** | **{ratio['tokens_per_s']:.2f}x** | **{ratio['peak_rss']:.2f}x** | "
                    f"{ratio['training_rss']:.2f}x | | |")
    return "\n".join([_header(r), "", *rows, "", f"fp32 matmul peak in the same run: {r['matmul_peak_gflops']:.0f} GFLOP/s."])


def train_mt(r: dict) -> str:
    rows = ["| | target tokens/s (median) | peak RSS |", "|---|---:|---:|"]
    for impl, v in r["summary"].items():
        rows.append(f"| {impl} | {v['tokens_per_s_median']:,.0f} | {v['peak_rss_mb_median']:,.0f} MB |")
    if "ratio_tokens_per_s_qkv_over_marian" in r:
        rows.append(f"| **qkv / Marian** | **{r['ratio_tokens_per_s_qkv_over_marian']:.2f}x** | |")
    lengths = r.get("sentence_lengths", [8, 32])
    note = (f"Sentence lengths {lengths[0]}-{lengths[1]} tokens; padding {100 * r.get('padding_fraction', 0):.0f}% "
            "of the batch cells.")
    return "\n".join([_header(r), "", *rows, "", note])


def _ratios(r: dict) -> list[str]:
    """Every ``ratio_A_over_B`` of a result, as "A / B: 1.23x" lines."""
    return [f"- {k[len('ratio_'):].replace('_over_', ' / ').replace('_', '-')}: **{v:.2f}x**"
            for k, v in r.items() if k.startswith("ratio_")]


def beam_mt(r: dict) -> str:
    rows = ["| | sentences/s (median) | ms a search (median) |", "|---|---:|---:|"]
    for impl, v in r["summary"].items():
        seconds = [run["seconds"] for run in r.get("runs", {}).get(impl, []) if "seconds" in run]
        ms = f"{1000 * statistics.median(seconds):.1f}" if seconds else ""
        rows.append(f"| {impl} | {v['sentences_per_s_median']:.1f} | {ms} |")
    size = next(iter(r["size"].items()), None) if "size" in r else None
    dims = [f"Size {size[0]}: {size[1]}.", ""] if size else []
    return "\n".join([_header(r), "", *dims, *rows, "", *_ratios(r)])


def generate_gpt(r: dict) -> str:
    batches = list(r["by_batch"])
    impls = list(dict.fromkeys(k for s in r["by_batch"].values() for k, v in s.items() if isinstance(v, dict)))
    rows = ["| | " + " | ".join(f"batch {b}" for b in batches) + " |", "|---|" + "---:|" * len(batches)]
    for impl in impls:
        cells = []
        for b in batches:
            v = r["by_batch"][b].get(impl)
            cells.append(f"{v['tokens_per_s_median']:,.0f} tok/s ({v['ms_per_step_median']:.1f} ms/step)" if v else "-")
        rows.append(f"| {impl} | " + " | ".join(cells) + " |")
    ratios = [f"- batch {b}: " + ", ".join(f"{k[len('ratio_'):].replace('_over_', ' / ').replace('_', '-')} "
                                           f"**{v:.2f}x**" for k, v in s.items() if k.startswith("ratio_"))
              for b, s in r["by_batch"].items()]
    firsts = [f"{impl} {s[impl]['first_call_s_median']:.1f} s (batch {b})" for b, s in r["by_batch"].items()
              for impl in ("qkv-compile", "hf-compile") if "first_call_s_median" in s.get(impl, {})]
    notes = ["", f"First generation of a process, compiling included (inductor's disk cache warm), median: {', '.join(firsts)}."]
    return "\n".join([_header(r), "", *rows, "", *ratios, *(notes if firsts else [])])


def int8_quality(r: dict) -> str:
    rows = ["| | BLEU | seconds | sentences/s |", "|---|---:|---:|---:|"]
    for name, v in r["rows"].items():
        rows.append(f"| {name} | {v['bleu']:.2f} | {v['seconds']:.1f} | {v['sentences_per_s']:.1f} |")
    cost = (f"BLEU of int8 against fp32: {r['bleu_change_qkv_int8']:+.2f} in qkv ({r['speedup_qkv_int8']:.2f}x faster), "
            f"{r['bleu_change_ct2_int8']:+.2f} in CTranslate2 ({r['speedup_ct2_int8']:.2f}x faster).")
    return "\n".join([_header(r), "", f"{r['benchmark']}, run {r['run']}.", "", *rows, "", cost])


def step_profile(r: dict) -> str:
    rows = ["| step | ms/step | ops/step | weight products | other ops | outside any op |", "|---|---:|---:|---:|---:|---:|"]
    for name, v in r["rows"].items():
        rows.append(f"| {name} | {v['ms_per_step']:.2f} | {v['ops_per_step']:.0f} | {v['products_ms']:.2f} ms | "
                    f"{v['other_ops_ms']:.2f} ms | {v['outside_ops_ms']:.2f} ms |")
    return "\n".join([_header(r), "", *rows])


def gemv(r: dict) -> str:
    rows = ["| kernel | ms per step (median) | GB/s of weights |", "|---|---:|---:|"]
    for kernel, v in r["summary"].items():
        rows.append(f"| {kernel} | {v['ms_median']:.2f} | {v['gb_per_s']:.1f} |")
    return "\n".join([_header(r), "", *rows])


def quality_mt(r: dict) -> str:
    c = r["cost"]
    rows = [f"{r['corpus']} {r['direction']}: {c['parameters']:,} parameters, {c['train_seconds'] / 60:.0f} min of "
            f"training ({c['steps']:,} steps, {c['epochs']} epochs, median {c['tokens_per_s_median']:,.0f} tokens/s), "
            f"final weights: {c['final_weights']}", "",
            "| test set | weights | decoding | BLEU | chrF | decoding time |", "|---|---|---|---:|---:|---:|"]
    for s in r["scores"]:
        decoding = "greedy" if s["beam"] == 1 else f"beam {s['beam']}, alpha {r['alpha']}"
        rows.append(f"| {s['set']} | {s['weights']} | {decoding} | {s['bleu']:.2f} | {s['chrf']:.2f} | {s['seconds']:.0f} s |")
    return "\n".join([_header(r), "", *rows])


RENDER = {"train_gpt": train_gpt, "train_mt": train_mt, "train_mt_nopad": train_mt, "generate_gpt": generate_gpt,
          "generate_gpt_2threads": generate_gpt, "gemv": gemv, "int8_quality": int8_quality,
          "step_profile": step_profile}


def main() -> None:
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "bench/results")
    for path in sorted(folder.glob("*.json")):
        render = RENDER.get(path.stem) or (quality_mt if path.stem.startswith("quality_") else
                                           beam_mt if path.stem.startswith("beam_mt") else None)
        if render:
            print(f"### {path.stem}\n\n{render(json.loads(path.read_text()))}\n")


if __name__ == "__main__":
    main()
