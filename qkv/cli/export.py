"""``qkv export hf --run DIR --out FOLDER``: a run as a Hugging Face model folder (see ``qkv.export``)."""

from __future__ import annotations

import argparse
import json

from qkv.cli.common import add_weights, command_group
from qkv.export import export_hf


def register(subparsers: argparse._SubParsersAction) -> None:
    export = command_group(subparsers, "export", "take a qkv run to another library")
    p = export.add_parser("hf", help="a run as a Hugging Face folder: GPT2LMHeadModel or MarianMTModel, and its tokenizer",
                          description="Write a folder that transformers' from_pretrained and AutoTokenizer load "
                                      "(needs qkv[hf]). A GPT run becomes a GPT2LMHeadModel, a translation run a "
                                      "MarianMTModel; a model option the architecture cannot express is named.")
    p.add_argument("--run", "--run-dir", required=True, help="a run directory (qkv train mt|lm, qkv finetune, qkv demo)")
    p.add_argument("--out", required=True, help="the folder to write")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it holds anything")
    add_weights(p)
    p.set_defaults(func=_export_hf)


def _export_hf(args: argparse.Namespace) -> int:
    out = export_hf(args.run, args.out, weights=args.weights, overwrite=args.overwrite)
    print(json.dumps({"out": str(out), "files": sorted(p.name for p in out.iterdir())}))
    return 0
