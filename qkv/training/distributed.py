"""Data-parallel training on PyTorch's own engine: the process group torchrun describes, the model in
``DistributedDataParallel``, and ``--nproc-per-node N``, which starts torchrun itself.

How a run is shared (the same for translation, GPT pretraining and fine-tuning):

- **One batch, cut in rows.** Every rank draws the same batch from the same seeded stream and keeps its
  own block of rows (:meth:`qkv.parallel.Ranks.rows`): the recipe's batch is the batch of the whole run,
  on any number of ranks, and the ranks of one step together train on exactly what one process would.
  A GPT's or a fine-tuning recipe's batch must divide by the ranks (its windows or pairs weigh the
  same, so every rank takes as many). A translation batch is a token budget, and one may hold fewer
  pairs than there are ranks (the longest pairs, at the end of an epoch's length order): a rank
  left without a pair computes a stand-in weighted 0, so the step is still one process's.
- **Gradients averaged as one process would.** DDP averages the ranks' gradients; each rank's loss
  is scaled so that the average is the gradient of the whole batch's loss: a translation batch's
  loss is a mean over its target tokens, and the ranks hold different numbers of them, so each rank
  backpropagates ``sum of its token losses / tokens of the whole batch * world_size``.
- **Accumulation.** The inner micro-batches run under ``no_sync`` (:func:`synced`); only the last
  all-reduces.
- **Writes.** Rank 0 alone writes metrics, checkpoints, exports and plots, after preparing the run
  directory while the others wait (``Ranks.main_first``); every rank resumes from the same checkpoint,
  with its own random state (dropout differs by rank).
- **Validation: sharded and reduced.** Each rank scores every ``world_size``-th validation batch (and
  translates every ``world_size``-th sentence for BLEU); the sums are added over the ranks. It is
  N times faster than scoring on rank 0, and every rank gets the same numbers, so every rank makes
  the same decision about the best checkpoint and early stopping, which keeps them in step.
- **Failures.** Collectives time out after ``QKV_COLLECTIVE_TIMEOUT`` seconds (600 by default): a rank
  that dies or hangs stops the others with a message instead of leaving them waiting forever.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from contextlib import nullcontext
from datetime import timedelta
from typing import Any, ContextManager, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from qkv.errors import DeviceError
from qkv.parallel import RankError

TIMEOUT_ENV = "QKV_COLLECTIVE_TIMEOUT"
TIMEOUT_SECONDS = 600
LAUNCHER_OPTION = "--nproc-per-node"


def launched() -> bool:
    """Whether torchrun (or another launcher of its kind) started this process: it sets ``WORLD_SIZE`` and ``RANK``."""
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


def local_device(device: torch.device) -> torch.device:
    """A launched process's own GPU (``cuda:LOCAL_RANK``) when ``device`` is CUDA without an index."""
    if device.type == "cuda" and device.index is None and launched():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return device


def collective_timeout() -> timedelta:
    raw = os.environ.get(TIMEOUT_ENV, str(TIMEOUT_SECONDS))
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if seconds <= 0:
        raise ValueError(f"{TIMEOUT_ENV}={raw!r}: give the collective timeout in seconds, a number > 0")
    return timedelta(seconds=seconds)


def join(device: torch.device) -> Any:
    """The process group of a launched run (created once per process), or None for a process on its own.

    gloo on CPUs, nccl on CUDA; collectives time out after :func:`collective_timeout`.

    Raises:
        DeviceError: the backend the device needs is not in this build of torch.
    """
    if not launched():
        return None
    if dist.is_initialized():
        return dist.group.WORLD
    backend = "nccl" if device.type == "cuda" else "gloo"
    if not dist.is_available() or not dist.is_backend_available(backend):
        raise DeviceError(f"torch.distributed's {backend} backend is not in this build of torch, which {device} "
                          "needs for data-parallel training; install a torch build with it, or run one process")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=collective_timeout(),
                            device_id=device if device.type == "cuda" else None)
    watch_launcher()
    return dist.group.WORLD


LAUNCHER_POLL_SECONDS = 1.0


def watch_launcher(poll: float = LAUNCHER_POLL_SECONDS) -> threading.Thread:
    """Stop this rank, in one line, when the process that launched it is gone.

    A launcher killed alone (SIGKILL reaches no child) left its ranks training to the last step and
    writing the run with no one to report to. A rank's parent is its launcher; when the launcher dies
    the rank is handed to another parent (init, or a subreaper), so a changed parent id is the
    launcher's death, noticed within ``poll`` seconds. The rank then ends at once (``os._exit``): what it
    wrote is whole (every write is atomic), and the next ``--resume`` continues from its last checkpoint.
    """
    launcher = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(poll)
            if os.getppid() != launcher:
                print(f"rank {os.environ.get('RANK', '?')}: its launcher (pid {launcher}) is gone; stopping (resume "
                      "the run with --resume)", file=sys.stderr, flush=True)
                os._exit(1)

    thread = threading.Thread(target=watch, name="qkv-launcher-watch", daemon=True)
    thread.start()
    return thread


# How the backends word a lost peer: gloo raises a plain RuntimeError from inside a collective.
_LOST = ("gloo/transport", "Connection reset by peer", "Connection closed by peer", "Timed out waiting",
         "NCCL communicator was aborted", "ProcessGroupNCCL")


def lost_contact(error: BaseException) -> bool:
    """Whether ``error`` says that a collective lost its peers (one died, or stopped past the timeout)."""
    return isinstance(error, dist.DistError) or (
        isinstance(error, RuntimeError) and launched() and any(mark in str(error) for mark in _LOST))


def leave() -> None:
    """Destroy this process's group (the end of a launched run)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def wrap(model: nn.Module, group: Any, device: torch.device) -> nn.Module:
    """``model`` in ``DistributedDataParallel`` over ``group`` (``model`` itself when there is none).

    DDP copies rank 0's weights (and buffers) to every rank as it wraps; buffers are not synced at every forward:
    the models' buffers are constants (no batch statistics).
    """
    if group is None:
        return model
    return DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None,
                                   process_group=group, forward_sync_buffers=False)


def synced(model: nn.Module, last: bool) -> ContextManager[Any]:
    """The context of one micro-batch's backward: ``no_sync`` unless it is the ``last`` of the step."""
    if isinstance(model, DistributedDataParallel) and not last:
        return model.no_sync()
    return nullcontext()


# ----------------------------------------------------------------------------------------------
# The launcher: `qkv train mt --nproc-per-node N ...` (as torchtune's `tune run --nproc_per_node`).


def add_launcher(parser: argparse.ArgumentParser) -> None:
    """``--nproc-per-node N``: start N processes of this command on this machine, with torchrun."""
    parser.add_argument(LAUNCHER_OPTION, dest="nproc_per_node", type=int, default=0, metavar="N",
                        help="train on N processes of this machine (torchrun, data parallel: gloo on CPU, nccl on "
                             "GPUs); the recipe's batch is shared by them")


def without_launcher(argv: Sequence[str]) -> list[str]:
    """``argv`` without ``--nproc-per-node N``: what each launched process runs."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == LAUNCHER_OPTION:
            skip = True
        elif not arg.startswith(LAUNCHER_OPTION + "="):
            out.append(arg)
    return out


def launch(qkv_argv: Sequence[str], nproc: int) -> int:
    """Run ``python -m qkv QKV_ARGV`` on ``nproc`` processes with torchrun (``--standalone``); its exit code.

    torchrun's own parser is given only its options, and the command's arguments are handed over as
    they are: torchrun reads ``--run`` as an abbreviation of its ``--run-path``, so they never pass
    through it.
    """
    # torchrun's own machinery, imported by the launcher alone (every other command starts without it)
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    if nproc < 1:
        raise ValueError(f"{LAUNCHER_OPTION} must be >= 1, got {nproc}")
    if launched():
        raise ValueError(f"{LAUNCHER_OPTION} inside a process torchrun started: give the number of processes to "
                         "torchrun, or run qkv without torchrun")
    # One thread per process unless told otherwise: N processes of all the cores each would fight.
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    args = get_args_parser().parse_args(["--standalone", f"--nproc-per-node={nproc}", "--max-restarts=0",
                                         "-m", "qkv"])
    args.training_script_args = list(qkv_argv)
    try:
        run(args)
    except ChildFailedError as e:
        first = min(e.failures.items(), key=lambda kv: kv[1].timestamp)
        rank, failure = first
        raise RankError(f"rank {rank} failed first (exit code {failure.exitcode}); the ranks' messages are above") \
            from None
    return 0


__all__ = ["launched", "local_device", "join", "watch_launcher", "lost_contact", "leave", "wrap", "synced", "add_launcher", "without_launcher",
           "launch", "collective_timeout", "TIMEOUT_ENV", "TIMEOUT_SECONDS"]
