"""The processes of a data-parallel run, seen from one of them: which share of the work is this rank's, and
how the ranks' results become one.

A run on one process is rank 0 of 1 (:data:`SINGLE`): every method below is then the identity, so the
trainers and evaluations are written once, for any number of processes. Under ``torchrun`` the
trainers hold a :class:`Ranks` over the process group that :mod:`qkv.training.distributed` joined.

Two ways to share, for two kinds of work:

- :meth:`Ranks.rows`: a contiguous block of a batch's rows. A training batch is cut this way, so that
  the ranks of one step together hold exactly the batch one process would have trained on.
- :meth:`Ranks.share`: every ``world_size``-th item of a list (evaluation batches, windows,
  sentences), so that each rank's share is as long and as costly as the others'.

:meth:`Ranks.sum` adds a tensor over the ranks (every rank gets the total), :meth:`Ranks.add` numbers;
:meth:`Ranks.collect` puts
items computed in shares back in their original order. Both are collectives: every rank must call
them, in the same order.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Sequence, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")

from qkv.errors import QkvError


class RankError(QkvError, RuntimeError):
    """Another rank failed (its message is this one's), or the ranks lost each other."""


def launched_rank() -> int:
    """The rank torchrun gave this process (``RANK``; 0 when not launched by torchrun)."""
    return int(os.environ.get("RANK", "0"))


def block(n: int, rank: int, world_size: int) -> slice:
    """Rank ``rank``'s contiguous block of ``n`` rows out of ``world_size`` blocks (sizes differ by at most 1;
    with fewer rows than ranks, the last ranks' blocks are empty)."""
    size, extra = divmod(n, world_size)
    start = rank * size + min(rank, extra)
    return slice(start, start + size + (rank < extra))


@dataclass(frozen=True)
class Ranks:
    """This process's place among the ranks of a run.

    Args:
        group: The ``torch.distributed`` process group (None: this process alone).
    """

    group: Any = None

    @property
    def rank(self) -> int:
        return 0 if self.group is None else dist.get_rank(self.group)

    @property
    def world_size(self) -> int:
        return 1 if self.group is None else dist.get_world_size(self.group)

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that writes the run directory and prints."""
        return self.rank == 0

    def share(self, n: int) -> range:
        """This rank's items of ``n``: every ``world_size``-th, from its rank (a rank may get none)."""
        return range(self.rank, n, self.world_size)

    def rows(self, n: int) -> slice:
        """This rank's contiguous block of ``n`` rows (as ``torch.tensor_split``: sizes differ by at most 1;
        empty for the last ranks when ``n`` is smaller than the number of ranks)."""
        return block(n, self.rank, self.world_size)

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` added over the ranks (a new tensor; this rank's own when alone)."""
        if self.group is None:
            return values
        total = values.clone()
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=self.group)
        return total

    def add(self, *values: float, device: torch.device | str = "cpu") -> list[float]:
        """Each of ``values`` added over the ranks (in float64, one collective for all of them)."""
        if self.group is None:
            return [float(v) for v in values]
        return self.sum(torch.tensor(values, dtype=torch.float64, device=device)).tolist()

    def mean_of(self, total: float, count: float, device: torch.device | str = "cpu") -> float:
        """The mean of everything the ranks scored, from each rank's ``total`` and ``count`` (0 if none)."""
        total, count = self.add(total, count, device=device)
        return total / count if count > 0 else 0.0

    def collect(self, mine: Sequence[T], n: int) -> list[T]:
        """The ``n`` items computed in shares (:meth:`share`), in their original order, on every rank."""
        if self.group is None:
            return list(mine)
        parts: list[Any] = [None] * self.world_size
        dist.all_gather_object(parts, list(mine), group=self.group)
        out: list[Any] = [None] * n
        for rank, part in enumerate(parts):
            for i, item in zip(range(rank, n, self.world_size), part):
                out[i] = item
        return out

    def barrier(self) -> None:
        if self.group is not None:
            dist.barrier(group=self.group)

    def main_first(self, fn: Callable[[], T]) -> T | None:
        """Run ``fn`` on the main rank while the others wait; they raise :class:`RankError` if it failed.

        For what one process must do before the others read it (create the run directory, train the
        tokenizer). Returns ``fn()`` on the main rank, None on the others.
        """
        if self.group is None:
            return fn()
        failure: list[Any] = [None]
        result = None
        if self.is_main:
            try:
                result = fn()
            except Exception as e:  # every rank learns of it, so none waits forever
                failure = [str(e) or type(e).__name__]
                dist.broadcast_object_list(failure, src=dist.get_global_rank(self.group, 0), group=self.group)
                raise
        dist.broadcast_object_list(failure, src=dist.get_global_rank(self.group, 0), group=self.group)
        if failure[0] is not None:
            raise RankError(f"rank 0 failed: {failure[0]}")
        return result


SINGLE = Ranks()

__all__ = ["Ranks", "SINGLE", "RankError", "block", "launched_rank"]
