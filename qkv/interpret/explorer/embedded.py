"""The model traces the page carries (``static/traces.js``), so that its training-and-generating figure
and GPT's practice problems work with no model loaded and in an exported page.

``teacher``: ``qkv.interpret.traces.translation_trace`` of the model ``qkv demo`` trains, on the seed
sentence. ``practice``: ``practice_trace`` of a small character-level GPT pretrained on the Chinese
side of cmn-eng's training set, on the second article's practice sentence. Written by::

    qkv demo --run runs/demo
    qkv train lm --recipe baby --run runs/zh-gpt data.path=DATA/cmn-eng/train.zh train.steps=6000 train.decay_steps=6000
    python -m qkv.interpret.explorer.embedded --mt runs/demo --lm runs/zh-gpt

(DATA: the folder ``qkv data list`` finds the corpora in.)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from qkv.interpret.explorer.constants import CONSTANTS, load_constants
from qkv.interpret.traces import make_trace_provider
from qkv.files import write_text

TRACES_FILE = Path(__file__).resolve().parent / "static" / "traces.js"
SEED_TEXT = "小明累了，他想睡觉。"  # the first article's sentence
HEADER = """/*
 * traces.js: what two trained models did, embedded so that the training-and-generating figure and
 * GPT's practice problems work with no model loaded and in an exported page (article.js draws them).
 * Written by qkv/interpret/explorer/embedded.py (its docstring has the commands); strict JSON below.
 */
"""


def build(mt_run: str | Path, lm_run: str | Path) -> dict:
    """The two traces: the translation run's on the seed sentence, the GPT run's on the practice text."""
    teacher, _ = make_trace_provider(mt_run)
    practice, _ = make_trace_provider(lm_run)
    return {"teacher": teacher(SEED_TEXT), "practice": practice(CONSTANTS["PRACTICE_TEXT"])}


def write(traces: dict, path: Path = TRACES_FILE) -> Path:
    """``traces`` as ``globalThis.QKVTraces`` in ``path``."""
    body = json.dumps(traces, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return write_text(path, HEADER + "globalThis.QKVTraces = " + body + ";\n")


def load(path: Path = TRACES_FILE) -> dict:
    """The traces the page embeds."""
    return load_constants(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write the model traces the explorer page embeds.")
    parser.add_argument("--mt", required=True, help="a translation run (qkv demo's)")
    parser.add_argument("--lm", required=True, help="a GPT run that reads Simplified Chinese characters")
    args = parser.parse_args(argv)
    print(write(build(args.mt, args.lm)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
