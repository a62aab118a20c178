"""The ``qkv`` command line: one subcommand per job; results to stdout, logs and progress to stderr.

Each file of this package parses the arguments of one area's commands and calls the library:
``mt`` (train mt, translate, eval mt, demo), ``lm`` (train lm, generate, finetune, eval lm, convert),
``data``, ``plot``, ``explore``, ``export``, ``experiment`` and ``info``. This file lists them and turns every error a user can
cause into one line that names the problem, never a traceback (``--debug`` shows the traceback).
"""

from __future__ import annotations

import argparse
import os
import sys

from qkv.cli import data, experiment, explain, explore, export, info, lm, mt, plot
from qkv.errors import MissingDependencyError
from qkv.parallel import RankError, launched_rank
from qkv.training import distributed
from qkv.weights import CheckpointError

# The modules that add subcommands, in the order --help lists them.
COMMAND_MODULES = (info, mt, lm, data, plot, explore, explain, export, experiment)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="qkv",
        description="The Transformer of 'Attention Is All You Need': translate, pretrain and fine-tune a GPT, "
                    "decode with a KV cache and beam search, and see attention.",
    )
    parser.add_argument("--debug", action="store_true",
                        help="show the Python traceback of an error (as does QKV_DEBUG=1)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMAND_MODULES:
        module.register(sub)
    return parser


def _quiet_broken_pipe() -> None:
    # The reader went away (`qkv data list | head`): nothing more can be written, and Python would
    # print a BrokenPipeError while flushing stdout at exit. Point stdout at /dev/null instead.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def _run(args: argparse.Namespace, argv: list[str]) -> int:
    if getattr(args, "nproc_per_node", 0):  # --nproc-per-node N: the same command on N processes, by torchrun
        return distributed.launch(distributed.without_launcher(argv), args.nproc_per_node)
    try:
        return int(args.func(args) or 0)
    finally:
        distributed.leave()  # a launched rank's process group, if it joined one


def main(argv: list[str] | None = None) -> int:
    code = _main(argv)
    if distributed.launched():
        _end_rank(code)
    return code


def _end_rank(code: int) -> None:
    """A launched rank ends here, its results written and its process group destroyed: without the
    interpreter's teardown, where gloo's threads were seen to abort a finished rank ("terminate called
    without an active exception", exit code -6, about one run in fifteen of a 2-rank test)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    args.argv = argv  # the command as given: a command that runs itself in other processes runs this
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    rank = launched_rank()
    if rank != 0:  # under torchrun, rank 0 alone prints results
        _quiet_broken_pipe()
    try:
        code = _run(args, argv)
        sys.stdout.flush()
        return code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        _quiet_broken_pipe()
        return 0
    # Every error a user can cause, exit code 2: bad input or config (ValueError and its kinds:
    # ConfigError, DataError, RunError, DeviceError, TokenizerError), a path that is not there, an optional
    # library the command needs (MissingDependencyError: it names the extra to install). Failures
    # while running, exit code 1: unwritable files (a full disk, a read-only folder), damaged checkpoints, a loss that
    # became NaN, and under torchrun a rank that lost the others (one died, or hung past the timeout).
    except (ValueError, OSError, CheckpointError, FloatingPointError, RankError, RuntimeError,
            MissingDependencyError) as e:
        lost = distributed.lost_contact(e)
        if args.debug or os.environ.get("QKV_DEBUG") == "1" or (type(e) is RuntimeError and not lost):
            raise  # asked for, or a bug: its traceback is the report
        code = 2 if isinstance(e, (ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError,
                                   MissingDependencyError)) else 1
        if isinstance(e, RankError) and rank != 0:
            return code  # rank 0 printed the error itself
        message = str(e) if not isinstance(e, OSError) or not e.strerror else (
            f"{e.filename}: {e.strerror}" if e.filename else e.strerror)
        if lost:
            message = (f"lost contact with the other ranks ({message.strip().splitlines()[0][:200]}): a rank "
                       f"failed or stopped responding (collectives wait {distributed.collective_timeout().seconds} s, "
                       f"${distributed.TIMEOUT_ENV}); its own message says why")
        where = f"rank {rank}: " if distributed.launched() and int(os.environ["WORLD_SIZE"]) > 1 else ""
        print(f"{where}qkv {args.command}: error: {message}", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
