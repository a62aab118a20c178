"""``qkv plot attention --run DIR "text"`` (a head grid per layer and kind) and ``qkv plot curves --run DIR``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from qkv.cli.common import positive_int
from qkv.interpret.model_maps import make_attention_provider
from qkv.interpret.plots import plot_attention
from qkv.runs import CURVES_FILE, METRICS_FILE, Run
from qkv.training.plots import plot_curves


def register(subparsers) -> None:
    plot = subparsers.add_parser("plot", help="PNG figures: attention heads of a trained model, training curves")
    sub = plot.add_subparsers(dest="plot_command", metavar="WHAT", required=True)
    p = sub.add_parser("attention", help="every head of every layer on a text (encoder self, decoder self, cross)")
    p.add_argument("--run", "--run-dir", required=True, help="a run directory (qkv train mt|lm, qkv demo)")
    p.add_argument("text", help="a source sentence (translation) or a prompt (GPT)")
    p.add_argument("--out", help="output folder (default RUN/attention)")
    p.add_argument("--beam", type=positive_int, default=1, help="beam size for the translation whose maps are drawn")
    p.set_defaults(func=cmd_plot_attention)
    p = sub.add_parser("curves", help="loss (and lr, BLEU) against step, from RUN/metrics.jsonl")
    p.add_argument("--run", "--run-dir", required=True)
    p.add_argument("--out", help="output PNG (default RUN/curves.png)")
    p.set_defaults(func=cmd_plot_curves)


def cmd_plot_attention(args: argparse.Namespace) -> int:
    payload = make_attention_provider(args.run, beam=args.beam)(args.text)
    out_dir = Path(args.out or Path(args.run) / "attention")
    if payload.get("output"):
        print(f"output: {payload['output']}", file=sys.stderr)
    for m in payload["maps"]:
        path = out_dir / f"{m['kind']}_layer{m['layer']}.png"
        plot_attention(m["weights"], m["query_tokens"], m["key_tokens"], path, title=m["name"])
        print(path)
    return 0


def cmd_plot_curves(args: argparse.Namespace) -> int:
    run = Run(args.run)
    if not run.file(METRICS_FILE).is_file():
        raise FileNotFoundError(f"{args.run}: no {METRICS_FILE} (written while `qkv train` runs)")
    print(plot_curves(run.file(METRICS_FILE), Path(args.out or run.file(CURVES_FILE))))
    return 0
