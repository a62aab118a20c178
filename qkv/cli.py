"""The ``qkv`` command line: one subcommand per job; results to stdout, logs and progress to stderr.

Each feature area registers its own subcommands through a ``register(subparsers)`` function, so this
file only lists them.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys

# Modules that add subcommands, in the order --help lists them. A module that is missing (an optional
# part not installed) is skipped.
COMMAND_MODULES = [
    "qkv.mt_commands",
    "qkv.lm_commands",
    "qkv.data.commands",
    "qkv.interpret.commands",
    "qkv.interpret.explorer.commands",
]


def command_group(subparsers, name: str, help: str) -> argparse._SubParsersAction:
    """The sub-subcommands of ``qkv NAME`` (``qkv train mt``, ``qkv train lm``...), created on first use.

    Several modules add kinds to the same group (translation adds ``train mt``, the GPT part adds
    ``train lm``), so a second call finds the parser the first one created instead of replacing it.
    """
    parser = subparsers.choices.get(name)
    if parser is None:
        parser = subparsers.add_parser(name, help=help, description=help)
        parser.set_defaults(func=lambda args, p=parser: (p.print_help(sys.stderr), 2)[1])
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    return parser.add_subparsers(dest=f"{name}_kind", metavar="KIND")


def _info(args: argparse.Namespace) -> int:
    import platform

    import torch

    import qkv
    from qkv.config import PAPER_PARAMS, PRESETS, preset
    from qkv.models import build_model, count_parameters, flops_per_token

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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="qkv",
        description="The Transformer of 'Attention Is All You Need': translate, pretrain and fine-tune a GPT, "
                    "decode with a KV cache and beam search, and see attention.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser("info", help="version, torch, threads, device; a preset's size and FLOPs")
    p.add_argument("--preset", help="a model preset, e.g. transformer-base")
    p.add_argument("--vocab", type=int, help="vocabulary size to use with the preset")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_info)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name and name.startswith(e.name):  # the optional part itself is absent
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError) as e:
        if getattr(args, "debug", False):
            raise
        print(f"qkv {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
