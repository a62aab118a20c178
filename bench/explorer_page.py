"""The live explorer page's budgets (issue: the explainer runs in the browser), in headless Chromium.

For a run (default: the demo model the package carries), writes the self-contained page (``qkv explore
--export``) and the site (``--site``) and measures, medians of ``--repeats`` fresh page loads:

- ``first_ms``: page opened -> the first translation on the page (the model figure's, which the page
  starts on; read from the page's own clock, performance.now());
- ``greedy_ms``, ``beam4_ms``: one translation of the seed sentence (a real corpus: its first test
  sentence), greedy and beam 4 (after one warm-up);
- ``file_mb``, ``site_mb``: the single file and the site folder;
- ``agree``: the share of the corpus's test sentences (``--sentences``) the page translates greedily
  exactly as ``qkv translate --beam 1`` does (PyTorch, the run's weights);
- ``webgpu``: the same translations with the page switched to WebGPU, in a Chromium started with
  WebGPU on (``--enable-unsafe-webgpu``; on a machine without a graphics card its adapter is
  SwiftShader, a GPU emulated on the CPU, which the record names): the switch (the model loaded there
  and its first answer, shaders compiled), then greedy and beam 4, and whether the answers agree.

    python bench/explorer_page.py [--run DIR] [--form fp32|fp16|int8] [--repeats 5] [--sentences 500]
                                  [--out bench/results/explorer_page.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from qkv.data.synthetic import SEED_SENTENCE
from qkv.data.translation import DataConfig, load_split
from qkv.generation.api import Translator
from qkv.interpret.explorer.embedded import DEMO_MODEL
from qkv.runs import Run

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]


def offline(page) -> list[str]:
    """Refuse every request that leaves the page (the file itself and data: URLs aside); the list of refused."""
    refused: list[str] = []

    def route(r):
        if r.request.url.startswith(("file://", "data:", "blob:")):
            r.continue_()
        else:
            refused.append(r.request.url)
            r.abort()
    page.route("**/*", route)
    return refused


def folder_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 1e6


def measure(page_file: Path, repeats: int, sentences: list[str], timed: str) -> dict:
    from playwright.sync_api import sync_playwright

    first, greedy, beam, translations = [], [], [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        for i in range(repeats):
            page = browser.new_page()
            refused = offline(page)
            page.goto(page_file.as_uri())
            out = page.wait_for_selector("#fig6-output[data-first-ms]", state="attached", timeout=60_000)
            first.append(float(out.get_attribute("data-first-ms")))
            timing = page.evaluate(TIMED, timed)
            result_out = timing["out1"], timing["out4"]
            greedy.append(timing["1"])
            beam.append(timing["4"])
            if i == 0 and sentences:
                translations = page.evaluate("""async (texts) => {
                    const a = globalThis.QKVExplorer.answers, out = [];
                    for (const t of texts) out.push(await a.translate(t, 1));
                    return out;
                }""", sentences)
            if refused:
                raise SystemExit(f"the page asked the network for {refused[:3]}")
            page.close()
        browser.close()
    return {"first_ms": first, "greedy_ms": greedy, "beam4_ms": beam, "translations": translations,
            "timed_translation": result_out[0], "timed_translation_beam4": result_out[1]}


TIMED = """async (text) => {
    const a = globalThis.QKVExplorer.answers, times = {};
    for (const beam of [1, 4]) {
        await a.translate(text, beam);  // warm-up
        const t0 = performance.now();
        times["out" + beam] = await a.translate(text, beam);
        times[beam] = performance.now() - t0;
    }
    return times;
}"""


def measure_webgpu(page_file: Path, repeats: int, timed: str) -> dict:
    """The page switched to WebGPU: the switch, then greedy and beam 4 (medians of ``repeats``)."""
    from playwright.sync_api import sync_playwright

    args = [a for a in ARGS if a != "--disable-gpu"] + ["--enable-unsafe-webgpu"]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=args)
        page = browser.new_page()
        refused = offline(page)
        page.goto(page_file.as_uri())
        page.wait_for_selector("#fig6-backend[data-checked]", state="attached", timeout=60_000)
        adapter = page.evaluate("""async () => { const a = await navigator.gpu.requestAdapter();
            return a ? [a.info.vendor, a.info.architecture, a.info.description].filter(Boolean).join(" / ") : null; }""")
        if adapter is None:
            browser.close()
            return {"adapter": None}
        out = page.locator("#fig6-output")
        before = out.get_attribute("data-done")
        t0 = time.perf_counter()
        page.locator("#fig6-backend").select_option("webgpu")
        page.wait_for_selector(f"#fig6-output[data-done]:not([data-done='{before}'])", state="attached", timeout=600_000)
        switch_ms = (time.perf_counter() - t0) * 1000
        backend = page.locator("#fig6-backend").input_value()
        greedy, beam, outs = [], [], None
        for _ in range(repeats):
            timing = page.evaluate(TIMED, timed)
            greedy.append(timing["1"])
            beam.append(timing["4"])
            outs = [timing["out1"], timing["out4"]]
        browser.close()
    if refused:
        raise SystemExit(f"the page asked the network for {refused[:3]}")
    return {"adapter": adapter, "backend": backend, "switch_ms": round(switch_ms), "greedy_ms_median": statistics.median(greedy),
            "beam4_ms_median": statistics.median(beam), "outputs": outs, "samples": {"greedy_ms": greedy, "beam4_ms": beam}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", default=None, help="a translation run (default: the packaged demo model)")
    ap.add_argument("--form", default="fp32", help="the exported weights (with --run)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--sentences", type=int, default=500, help="test sentences whose translations are compared")
    ap.add_argument("--out", default="bench/results/explorer_page.json")
    ap.add_argument("--webgpu", action=argparse.BooleanOptionalAction, default=True,
                    help="also time the page switched to WebGPU (--no-webgpu: not)")
    args = ap.parse_args(argv)
    run = Run(args.run or DEMO_MODEL)
    with tempfile.TemporaryDirectory() as tmp:
        page, site = Path(tmp) / "page.html", Path(tmp) / "site"
        common = [sys.executable, "-m", "qkv", "explore"] + (["--run", str(run.path), "--form", args.form] if args.run else [])
        subprocess.run(common + ["--export", str(page)], check=True, stdout=subprocess.DEVNULL)
        subprocess.run(common + ["--site", str(site)], check=True, stdout=subprocess.DEVNULL)
        data = DataConfig(**{k: v for k, v in run.config["data"].items() if k in DataConfig.__dataclass_fields__})
        all_sources, _ = load_split(data, data.test)
        sources = all_sources[:args.sentences]
        # The demo's seed sentence, or a real corpus's first test sentence.
        timed = SEED_SENTENCE[0] if data.corpus == "demo" else all_sources[0]
        t0 = time.perf_counter()
        result = measure(page, args.repeats, sources, timed)
        wall = time.perf_counter() - t0
        webgpu = measure_webgpu(page, args.repeats, timed) if args.webgpu else None
        file_mb, site_mb = page.stat().st_size / 1e6, folder_mb(site)
    reference = Translator.from_run(run, device="cpu").translate(sources, beam=1)
    same = sum(a == b for a, b in zip(result.pop("translations"), reference))
    summary = {
        "run": args.run or "the packaged demo model", "form": args.form if args.run else "fp16 (packaged)",
        "repeats": args.repeats, "first_ms_median": statistics.median(result["first_ms"]),
        "greedy_ms_median": statistics.median(result["greedy_ms"]), "beam4_ms_median": statistics.median(result["beam4_ms"]),
        "file_mb": round(file_mb, 2), "site_mb": round(site_mb, 2),
        "agree": f"{same}/{len(sources)}", "agree_share": same / max(1, len(sources)),
        "timed_sentence": timed, "timed_translation": result.pop("timed_translation"),
        "timed_translation_beam4": result.pop("timed_translation_beam4"), "samples": result, "wall_s": round(wall, 1), "cpu": os.cpu_count(),
    }
    if webgpu is not None:
        if webgpu.get("outputs") is not None:
            webgpu["agrees_with_wasm"] = webgpu.pop("outputs") == [summary["timed_translation"], summary["timed_translation_beam4"]]
        summary["webgpu"] = webgpu
    print(json.dumps({k: v for k, v in summary.items() if k != "samples"}, indent=1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
