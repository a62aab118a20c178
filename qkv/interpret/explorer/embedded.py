"""What the package carries for the explorer, so that its figures are live for a reader who has trained nothing.

- ``vendor/demo_model/``: a small translator trained by the demo recipe (``qkv/recipes/mt/demo.yaml``, seed 1:
  2+2 layers, d_model 128, 4 heads, 0.7M parameters): its run files (``config.json``,
  ``tokenizer.json``, ``model.safetensors``), which ``qkv explore`` serves when given no ``--run``,
  and ``onnx/``, its graphs (``qkv export onnx --form fp16``), which the exported page and the site run
  when given no ``--run``. Made again, on any machine, by::

      make demo-model

  (``qkv train mt --recipe demo --run build/demo-model``, then ``qkv export onnx`` of it into
  ``vendor/demo_model/onnx`` and its three run files copied beside, then ``--record-demo`` writes their
  sha256 into its ``VENDOR.json``, which ``demo_model()`` checks before the model is used; its LICENSE
  is qkv's own; the Makefile has the lines).
- ``static/practice.js``: figure 10's recorded example, ``practice_trace`` of a small character-level
  GPT pretrained on the Chinese side of cmn-eng's training set, on the second article's practice
  sentence; a page whose model is a GPT computes the figure live instead. Written by::

      qkv train lm --recipe baby --run runs/zh-gpt data.path=DATA/cmn-eng/train.zh train.steps=6000 train.decay_steps=6000
      python -m qkv.interpret.explorer.embedded --lm runs/zh-gpt

  (DATA: the folder ``qkv data list`` finds the corpora in.)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from qkv.interpret.explorer.constants import CONSTANTS, load_constants
from qkv.interpret.explorer.vendored import checked_files, record_files
from qkv.interpret.traces import make_trace_provider
from qkv.files import write_text

HERE = Path(__file__).resolve().parent
DEMO_MODEL = HERE / "vendor" / "demo_model"
DEMO_ONNX = DEMO_MODEL / "onnx"
PRACTICE_FILE = HERE / "static" / "practice.js"
HEADER = """/*
 * practice.js: what a small character-level GPT did on the second article's practice sentence, so that
 * GPT's practice problems (figure 10) show real numbers in a page whose model is a translator (a GPT
 * run's page computes them live). Written by qkv/interpret/explorer/embedded.py (its docstring has the
 * commands); strict JSON below.
 */
"""


def demo_model() -> Path:
    """The packaged demo model's folder, its files checked against their recorded sha256 (a changed file is refused)."""
    checked_files(DEMO_MODEL, "reinstall qkv, or make it again (make demo-model)")
    return DEMO_MODEL


def record_demo_model() -> Path:
    """Record the sha256 of the demo model's files, after ``make demo-model`` wrote them."""
    return record_files(DEMO_MODEL, {"what": "the demo recipe's translator, seed 1", "license": "MIT (qkv's own)",
                                     "made_by": "make demo-model"})


def build(lm_run: str | Path) -> dict:
    """The GPT run's practice problems on the second article's sentence."""
    practice, _ = make_trace_provider(lm_run)
    return practice(CONSTANTS["PRACTICE_TEXT"])


def write(example: dict, path: Path = PRACTICE_FILE) -> Path:
    """``example`` as ``globalThis.QKVPracticeExample`` in ``path``."""
    body = json.dumps(example, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return write_text(path, HEADER + "globalThis.QKVPracticeExample = " + body + ";\n")


def load(path: Path = PRACTICE_FILE) -> dict:
    """The practice example the page carries."""
    return load_constants(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write what the explorer page carries: the practice example, or the "
                                                 "demo model's checksums.")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--lm", help="a GPT run that reads Simplified Chinese characters: write practice.js from it")
    which.add_argument("--record-demo", action="store_true", help="record the sha256 of vendor/demo_model's files")
    args = parser.parse_args(argv)
    print(record_demo_model() if args.record_demo else write(build(args.lm)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
