"""A grid of variants of one recipe, trained and scored one by one, resumable, several side by side.

Each variant is a name and ``section.key=value`` overrides of a base recipe. Its run directory is
``OUT/NAME``; its result, once scored, is ``RESULTS/NAME.json``. A variant whose result exists is
skipped (the results there must be made as the grid asks, the same step budget: :func:`check_results`);
one with a checkpoint and no result is resumed exactly (``--resume``); the others start. So a grid
fills across sittings, and several workers (one process each, one thread each) can share it:
each *claims* a variant before it trains it by locking ``OUT/NAME.claim`` (:func:`claim`), a lock that
the operating system releases when its process ends, however it ends.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch

from qkv import locks
from qkv.devices import cpu_identity
from qkv.errors import QkvError
from qkv.files import read_json, write_json
from qkv.runs import Run

SIDE_BY_SIDE = locks.LOCKS  # whether workers can share a grid here (POSIX file locks keep them apart)


@dataclass(frozen=True)
class Variant:
    """One cell of a grid: its ``name`` (a file name), its ``row`` (a group: the paper's (A), (B)...), the
    overrides that make it from the base recipe, and what the table shows of it (``label``)."""

    name: str
    row: str
    overrides: tuple[str, ...] = ()
    label: str = ""
    seed: int = 1
    tags: dict[str, Any] = field(default_factory=dict)


def machine() -> str:
    """Where a result was measured: the CPU (:func:`~qkv.devices.cpu_identity`), its cores and torch. Wall times
    differ by 3.5x between machines that all report 2 cores, so a time means nothing without the CPU."""
    return f"{cpu_identity()}, {os.cpu_count()} cores, torch {torch.__version__}"


def spread(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation over seeds (0 for one seed)."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def by_change(variants: Sequence[Variant]) -> dict[tuple[str, str], list[Variant]]:
    """The variants by (row, label): a change and its seeds, in the grid's order."""
    groups: dict[tuple[str, str], list[Variant]] = {}
    for v in variants:
        groups.setdefault((v.row, v.label), []).append(v)
    return groups


def result_path(results: Path, variant: Variant) -> Path:
    return results / f"{variant.name}.json"


def read_results(results: str | Path, variants: Sequence[Variant]) -> dict[str, dict[str, Any]]:
    """The results that exist, by variant name."""
    results = Path(results)
    return {v.name: read_json(result_path(results, v), "grid result") for v in variants
            if result_path(results, v).is_file()}


class GridError(QkvError, ValueError):
    """A results folder whose results were made differently from the grid asked for (another step budget,
    other changes to the base): skipping them as finished would mix two grids in one table."""


def check_results(results: str | Path, variants: Sequence[Variant],
                  made_with: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every result already in ``results`` was made as ``made_with`` says (``{"steps": 430}``), else a
    :class:`GridError` that names the file. A value of None is taken from the first result that records
    the key (a report of what is there: its results must agree among themselves); a key that a result
    does not record (written before it was) is not checked. Returns the results read (:func:`read_results`)."""
    made_with, first = dict(made_with), {}
    found_all = read_results(results, variants)
    for variant in (v for v in variants if v.name in found_all):  # in the grid's order
        found, path = found_all[variant.name], result_path(Path(results), variant)
        for key, want in made_with.items():
            if key not in found:
                continue
            if want is None:
                made_with[key], first[key] = found[key], path.name
            elif found[key] != want:
                made, wanted = _differing(found[key], want)
                asked = f"{first[key]} with {wanted!r}" if key in first else f"this grid asks for {wanted!r}"
                raise GridError(f"{path}: made with {key} {made!r}, {asked}; a results folder holds one grid: "
                                f"give this one its own --results")
    return found_all


def _differing(made: Any, want: Any) -> tuple[Any, Any]:
    """Of two dicts, the entries in which they differ (so that one changed value of many stands out)."""
    if not (isinstance(made, dict) and isinstance(want, dict)):
        return made, want
    keys = [k for k in {**made, **want} if made.get(k) != want.get(k)]
    return {k: made.get(k) for k in keys}, {k: want.get(k) for k in keys}


@contextlib.contextmanager
def claim(out: Path, variant: Variant) -> Iterator[bool]:
    """Yield whether this process holds ``variant`` (released on exit): one worker trains a variant.

    The claim is an exclusive ``flock`` on ``OUT/NAME.claim``, which also holds the holder's process id,
    for people to read. A lock, not the file or the id in it, decides. Claims decided by the id made two
    workers train one variant: a claim's file exists before its creator has written its id, and another
    worker that read it then took it for a dead worker's. The system releases a lock when its process
    ends, so a killed worker's claim is free at once, with no id to check (a reused one looks alive).
    Without POSIX locks (Windows) every claim holds (:mod:`qkv.locks`): one worker at a time.
    """
    path = out / f"{variant.name}.claim"
    out.mkdir(parents=True, exist_ok=True)
    while True:
        fd = locks.try_lock(path)
        if fd is None:  # another worker holds it
            yield False
            return
        try:
            here = os.stat(path)
        except FileNotFoundError:
            here = None
        mine = os.fstat(fd)
        if here is not None and (here.st_ino, here.st_dev) == (mine.st_ino, mine.st_dev):
            break
        # The holder removed the file and let go between this open and this lock: this lock is on a file
        # no longer there, which a third worker may be creating anew. Claim what is there now.
        locks.release(fd)
    try:
        locks.describe(fd, str(os.getpid()))
        yield True
    finally:
        path.unlink(missing_ok=True)  # before the lock goes: a waiting worker then finds the file gone
        locks.release(fd)


def run_grid(variants: Sequence[Variant], out: str | Path, results: str | Path,
             train_and_score: Callable[[Variant, Path, bool], dict[str, Any]],
             log: Callable[[str], None] = print) -> list[str]:
    """Train and score every variant that has no result yet; return the names this call finished.

    Args:
        variants: In the order they are taken.
        out: The run directories' parent.
        results: Where each variant's JSON result goes (may be inside the repository: small files).
        train_and_score: ``(variant, run_dir, resume) -> result``; ``resume`` when the run has a checkpoint.
    """
    out, results = Path(out), Path(results)
    done = []
    for variant in variants:
        if result_path(results, variant).is_file():
            continue
        with claim(out, variant) as mine:
            if not mine or result_path(results, variant).is_file():  # another worker has it, or just did it
                continue
            run = out / variant.name
            resume = Run(run).has_checkpoint
            log(f"{variant.name}: {'resuming' if resume else 'training'} ({' '.join(variant.overrides) or 'base'})")
            start = time.perf_counter()
            result = train_and_score(variant, run, resume)
            # wall_seconds: training and scoring, as this sitting saw them (a resumed variant's last part).
            write_json(result_path(results, variant), {"variant": variant.name, "row": variant.row,
                                                       "label": variant.label, "seed": variant.seed,
                                                       "overrides": list(variant.overrides), **result,
                                                       "wall_seconds": round(time.perf_counter() - start, 1),
                                                       "resumed": resume, "date": time.strftime("%Y-%m-%d"),
                                                       "machine": machine()})
            done.append(variant.name)
    return done


def time_left(results: dict[str, dict[str, Any]], variants: Sequence[Variant], jobs: int) -> tuple[float, int] | None:
    """Seconds that the variants without a result would take with ``jobs`` workers on this CPU, from the mean
    wall time of the variants trained here from the start (none measured here: None), and how many
    that mean is of. An estimate: a grid's variants differ in cost (d_model 384 takes twice the base)."""
    this = machine()
    here = [r["wall_seconds"] for r in results.values()
            if r.get("machine") == this and "wall_seconds" in r and not r.get("resumed")]
    left = sum(v.name not in results for v in variants)
    if not here or not left:
        return None
    return statistics.fmean(here) * left / jobs, len(here)


__all__ = ["SIDE_BY_SIDE", "Variant", "by_change", "GridError", "run_grid", "check_results", "time_left", "read_results",
           "result_path", "claim", "spread"]
