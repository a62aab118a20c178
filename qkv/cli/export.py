"""``qkv export hf|ctranslate2|onnx --run DIR --out FOLDER``: a run as another library's model folder (see
``qkv.interop.export`` and ``qkv.interop.onnx``)."""

from __future__ import annotations

import argparse
import json

from qkv.cli.common import add_weights, command_group
from qkv.interop.export import CT2_QUANTIZATIONS, export_ctranslate2, export_hf
from qkv.interop.onnx import FORMS, export_onnx


def register(subparsers: argparse._SubParsersAction) -> None:
    export = command_group(subparsers, "export", "take a qkv run to another library")
    p = export.add_parser("hf", help="a run as a Hugging Face folder: GPT2LMHeadModel or MarianMTModel, and its tokenizer",
                          description="Write a folder that transformers' from_pretrained and AutoTokenizer load "
                                      "(needs qkv[hf]). A GPT run becomes a GPT2LMHeadModel, a translation run a "
                                      "MarianMTModel; a model option the architecture cannot express is named.")
    _common(p)
    p.set_defaults(func=cmd_export_hf)

    p = export.add_parser("ctranslate2", help="a run as a CTranslate2 folder: a Translator or Generator model",
                          description="Write a folder that ctranslate2.Translator (a translation run) or "
                                      "ctranslate2.Generator (a GPT run) loads (needs qkv[ctranslate2]); its vocabulary "
                                      "is the run's tokens, and the run's tokenizer.json goes with it.")
    _common(p)
    p.add_argument("--quantization", choices=CT2_QUANTIZATIONS, default=None,
                   help="store the weights so (default: fp32); CTranslate2 can also quantize when it loads")
    p.set_defaults(func=cmd_export_ctranslate2)

    p = export.add_parser("onnx", help="a run as ONNX graphs for onnxruntime: encoder and decoder step, or a GPT's step",
                          description="Write the run's graphs (needs qkv[onnx]): a translation run's encoder and its "
                                      "decoder step, a GPT run's step, each step taking and returning its KV cache, "
                                      "every head's attention an output and every head a switch; with manifest.json "
                                      "(what the explorer page reads) and tokenizer.json.")
    _common(p)
    p.add_argument("--form", choices=FORMS, default=FORMS[0],
                   help="fp32 (default), fp16 (weights stored in half precision: half the file, fp32 arithmetic) "
                        "or int8 (weights stored in 8 bits per output row: a quarter)")
    p.set_defaults(func=cmd_export_onnx)


def _common(p: argparse.ArgumentParser) -> None:
    """What every export takes: the run, the folder, --overwrite and --weights."""
    p.add_argument("--run", "--run-dir", required=True, help="a run directory (qkv train mt|lm, qkv finetune, qkv demo)")
    p.add_argument("--out", required=True, help="the folder to write")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it holds anything")
    add_weights(p)


def cmd_export_hf(args: argparse.Namespace) -> int:
    return _written(export_hf(args.run, args.out, weights=args.weights, overwrite=args.overwrite))


def cmd_export_ctranslate2(args: argparse.Namespace) -> int:
    return _written(export_ctranslate2(args.run, args.out, weights=args.weights, overwrite=args.overwrite,
                                       quantization=args.quantization))


def cmd_export_onnx(args: argparse.Namespace) -> int:
    return _written(export_onnx(args.run, args.out, weights=args.weights, form=args.form, overwrite=args.overwrite))


def _written(out) -> int:
    print(json.dumps({"out": str(out), "files": sorted(p.name for p in out.iterdir())}))
    return 0
