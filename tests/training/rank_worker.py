"""One rank of a data-parallel test run, started by tests/training/test_distributed.py as torchrun would start it.

    python rank_worker.py FAULT -- QKV ARGS...

The environment holds what torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR on 127.0.0.1,
MASTER_PORT); the command is qkv's own command line (``qkv.cli.main``), so its error messages are the
ones a user sees. FAULT injects a failure into this rank: ``none``, or ``exit@STEP`` (the process dies
before updating at STEP) or ``hang@STEP`` (it stops responding there).
"""

from __future__ import annotations

import os
import sys
import time

from qkv.cli import main
from qkv.training import loop


def inject(fault: str) -> None:
    if fault == "none":
        return
    how, _, at = fault.partition("@")
    real = loop.optimizer_step

    def faulty(optimizer, loss, step, *args, **kwargs):
        if step == int(at):
            if how == "exit":
                os._exit(3)
            time.sleep(3600)
        return real(optimizer, loss, step, *args, **kwargs)

    loop.optimizer_step = faulty  # every trainer updates through it


if __name__ == "__main__":
    fault, sep, *argv = sys.argv[1:]
    assert sep == "--", sys.argv
    inject(fault)
    sys.exit(main(argv))
