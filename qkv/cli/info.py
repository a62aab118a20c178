"""``qkv info``: versions, threads and device; a preset's size and FLOPs per token."""

from __future__ import annotations

import argparse
import json
import platform

import torch

import qkv
from qkv.cli.common import positive_int
from qkv.config import PAPER_PARAMS, PRESETS, preset
from qkv.models import build_model, count_parameters, flops_per_token


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``info`` to the ``qkv`` command line."""
    p = subparsers.add_parser("info", help="version, torch, threads, device; a preset's size and FLOPs")
    p.add_argument("--preset", help="a model preset, e.g. transformer-base")
    p.add_argument("--vocab", type=positive_int, help="vocabulary size to use with the preset")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_info)


def cmd_info(args: argparse.Namespace) -> int:
    info: dict = {
        "qkv": qkv.__version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "device": "cuda" if torch.cuda.is_available() else ("mps" if torch.backends.mps.is_available() else "cpu"),
    }
    if args.preset:
        overrides = {"vocab_size": args.vocab} if args.vocab else {}
        cfg = preset(args.preset, **overrides)
        with torch.device("meta"):  # count without allocating or initializing anything
            n = count_parameters(build_model(cfg))
        flops = flops_per_token(cfg)
        info["preset"] = {
            "name": args.preset,
            "config": {k: getattr(cfg, k) for k in cfg.__dataclass_fields__},
            "parameters": n,
            "paper_parameters": PAPER_PARAMS.get(args.preset),
            "forward_flops_per_token": flops["forward"],
            "training_flops_per_token": flops["training"],
            "flops_context": flops["seq_len"],
        }
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    for key in ("qkv", "python", "torch", "threads", "device"):
        print(f"{key:>8}: {info[key]}")
    if args.preset:
        p = info["preset"]
        print(f"\npreset {p['name']}:")
        for k, v in p["config"].items():
            print(f"  {k:>18}: {v}")
        paper = f" (the paper: {p['paper_parameters']})" if p["paper_parameters"] else ""
        print(f"  {'parameters':>18}: {p['parameters']:,}{paper}")
        print(f"  {'FLOPs/token':>18}: {p['forward_flops_per_token'] / 1e6:,.1f} M forward, "
              f"{p['training_flops_per_token'] / 1e6:,.1f} M training (context {p['flops_context']})")
    else:
        print(f"\npresets: {', '.join(PRESETS)}  (qkv info --preset NAME)")
    return 0
