"""What several commands share: sub-command groups, and the --device and --weights options, spelled once."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from qkv.settings import recipe_names
from qkv.accel.quantize import KINDS
from qkv.devices import DEVICE_DEFAULT
from qkv.runs import WEIGHT_NAMES
from qkv.training.distributed import add_launcher

WEIGHTS_HELP = (f"which weights of the run: {', '.join(WEIGHT_NAMES)} (default: model, the trainer's final choice; "
                "else best, else last), or a .safetensors file")


def _integer(text: str, low: int, high: int | None, need: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {need}, got {text!r}") from None
    if value < low or (high is not None and value >= high):
        raise argparse.ArgumentTypeError(f"must be {need}, got {value}")
    return value


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1 (batch sizes, beams, token counts), refused as the arguments are read."""
    return _integer(text, 1, None, "an integer >= 1")


def finite_float(text: str) -> float:
    """An argparse type: a finite number (NaN and infinity are refused as the arguments are read)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def seed(text: str) -> int:
    """An argparse type: a seed in [0, 2^63)."""
    return _integer(text, 0, 2**63, "in [0, 2^63)")


def directory(text: str) -> str:
    """An argparse type: a directory that is there (``--data-dir``: a typo would otherwise search on quietly)."""
    if not Path(text).expanduser().is_dir():
        raise argparse.ArgumentTypeError(f"no such directory: {text}")
    return text


def command_group(subparsers: argparse._SubParsersAction, name: str, help: str) -> argparse._SubParsersAction:
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


def add_device(parser: argparse.ArgumentParser) -> None:
    """``--device``: the same option, with the same default, on every command that runs a model."""
    parser.add_argument("--device", default=DEVICE_DEFAULT,
                        help="auto (CUDA when present, else CPU; the default), cpu, cuda or cuda:N")


def add_quantize(parser: argparse.ArgumentParser) -> None:
    """``--quantize int8``: decode with int8 linear maps on a CPU (qkv.accel.quantize)."""
    parser.add_argument("--quantize", choices=KINDS, default=None,
                        help="int8: the linear maps in int8, quantized once at load (CPU only; its BLEU cost "
                             "is in docs/BENCHMARKS.md)")


def add_weights(parser: argparse.ArgumentParser) -> None:
    """``--weights``: one vocabulary for every command that loads a run (see qkv.runs)."""
    parser.add_argument("--weights", default=None, metavar="NAME|FILE", help=WEIGHTS_HELP)


def add_training_run(parser: argparse.ArgumentParser, kind: str) -> None:
    """What every ``qkv train KIND`` takes: ``--recipe NAME|FILE`` (``--config`` is the same; a recipe shipped in
    qkv/recipes/KIND, or a YAML file), ``--run``, ``--resume`` and ``--overwrite``."""
    parser.add_argument("--recipe", "--config", dest="recipe", metavar="NAME|FILE",
                        help=f"a shipped recipe ({', '.join(recipe_names(kind))}) or a YAML file with model:, data: "
                             "and train: sections; not needed with --resume")
    parser.add_argument("--run", "--run-dir", help="run directory (default: runs/<recipe name>)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in --run exactly from its last checkpoint")
    parser.add_argument("--overwrite", action="store_true", help="replace a run that --run already holds")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    add_launcher(parser)
