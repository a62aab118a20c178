"""``qkv experiment table3|search|forgetting``: the paper's Table 3 at small scale (qkv.experiments.table3), the
search for the best translator a recipe's budget trains (qkv.experiments.search), and catastrophic forgetting
with its three cures (qkv.experiments.forgetting); resumable, side by side."""

from __future__ import annotations

import argparse
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any, Sequence

from qkv.cli.common import positive_int
from qkv.experiments import forgetting, search, table3
from qkv.experiments.grid import SIDE_BY_SIDE, Variant, check_results, read_results, run_grid, time_left
from qkv.errors import DataError
from qkv.files import write_text

RESULTS_DEFAULT = Path("docs") / "results" / "table3"
FORGETTING_RESULTS = Path("docs") / "results" / "forgetting"
SEARCH_RESULTS = Path("docs") / "results" / "search"


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``experiment`` with its ``table3`` kind to the ``qkv`` command line."""
    group = subparsers.add_parser("experiment", help="the experiments: table3 (the paper's variations on the "
                                                     "Transformer), search (the best translator of a recipe's "
                                                     "budget), forgetting (fine-tuning and its cures)")
    sub = group.add_subparsers(dest="experiment", metavar="NAME", required=True)
    p = sub.add_parser("table3", help="Table 3 of the paper at small scale: heads, key size, size, regularization, "
                                      "positions, every variant the same steps (docs/EXPERIMENTS.md)")
    p.add_argument("--out", default="runs/table3", help="the variants' run directories (default runs/table3)")
    p.add_argument("--results", default=str(RESULTS_DEFAULT),
                   help=f"each variant's JSON result, the table and the plot (default {RESULTS_DEFAULT})")
    p.add_argument("--steps", type=positive_int, default=table3.STEPS,
                   help=f"training steps of every variant (default {table3.STEPS})")
    p.add_argument("--rows", help="only these rows or single changes, e.g. base,A,E or base,D_P_drop00 "
                                   "(default: all)")
    p.add_argument("--seeds", type=positive_int, help="at most this many seeds per variant (default: 3 where the "
                                                      "paper's differences are small, else 1)")
    p.add_argument("--jobs", type=positive_int, default=1, help="variants trained side by side, one process "
                                                                "and one thread each (default 1)")
    p.add_argument("--report", action="store_true", help="only write the table and plot from the results there are")
    p.add_argument("--against", metavar="RESULTS", help="also compare with the grid in this results folder (another "
                                                         "budget): each change's difference from the base in both, "
                                                         "seed for seed, written to RESULTS/against_NAME.md")
    p.add_argument("--recipe", default=table3.BASE_RECIPE, help=f"the base recipe (default {table3.BASE_RECIPE})")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="changes to the base of every variant "
                                                                     "(before the variant's own)")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_table3)

    p = sub.add_parser("search", help="the best translator a recipe's budget trains: one knob at a time, short "
                                      "runs first, chosen on the validation split (docs/EXPERIMENTS.md)")
    p.add_argument("--recipe", default="multi30k_de_en", help=f"the recipe searched around, one of "
                                                              f"{', '.join(search.BUDGETS)} (default multi30k_de_en)")
    p.add_argument("--steps", type=positive_int, help=f"training steps of every variant (default: 1/{search.SHORT} "
                                                      "of the recipe's budget, at least twice its warmup; the budget "
                                                      "itself for the runs at full length)")
    p.add_argument("--knobs", help="only these knobs or variants, e.g. model.dropout,norm-pre, or variants "
                                   "combined, e.g. dropout-0.2+peak_lr-0.002 (default: all)")
    p.add_argument("--seeds", type=positive_int, default=1, help="seeds per variant (default 1)")
    p.add_argument("--out", help="the variants' run directories (default runs/search/ and the name of the "
                                 "--results folder, RECIPE-STEPS)")
    p.add_argument("--results", help=f"each variant's JSON result, the table and the plot (default "
                                     f"{SEARCH_RESULTS}/RECIPE-STEPS)")
    p.add_argument("--jobs", type=positive_int, default=1, help="variants trained side by side, one process "
                                                                "and one thread each (default 1)")
    p.add_argument("--report", action="store_true", help="only write the table and plot from the results there are")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="changes to the recipe for every variant "
                                                                     "(before the variant's own)")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_search)

    p = sub.add_parser("forgetting", help="catastrophic forgetting: a Shakespeare GPT fine-tuned on the demo "
                                          "translations, plain and with three cures, three seeds each")
    p.add_argument("--out", default="runs/forgetting", help="the base and the variants' runs (default runs/forgetting)")
    p.add_argument("--results", default=str(FORGETTING_RESULTS),
                   help=f"each variant's JSON result, the table and the plot (default {FORGETTING_RESULTS})")
    p.add_argument("--steps", type=positive_int, default=forgetting.FINETUNE["steps"],
                   help=f"fine-tuning steps of every variant (default {forgetting.FINETUNE['steps']})")
    p.add_argument("--base-steps", type=positive_int, default=forgetting.BASE_STEPS,
                   help=f"pretraining steps of the base (default {forgetting.BASE_STEPS})")
    p.add_argument("--seeds", type=positive_int, help=f"at most this many seeds per variant (default "
                                                      f"{len(forgetting.SEEDS)})")
    p.add_argument("--jobs", type=positive_int, default=1, help="variants trained side by side, one process "
                                                                "and one thread each (default 1)")
    p.add_argument("--report", action="store_true", help="only write the table and plot from the results there are")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_forgetting)


def cmd_table3(args: argparse.Namespace) -> int:
    rows = [r.strip() for r in args.rows.split(",")] if args.rows else None
    known = {row for row, *_ in table3.ROWS}
    changes = {table3.stem(row, label) for row, label, *_ in table3.ROWS} - known
    if rows and not set(rows) <= known | changes:
        raise ValueError(f"--rows: unknown {sorted(set(rows) - known - changes)}; the rows are {sorted(known)}, "
                         f"single changes {sorted(changes)}")
    grid = table3.variants(rows, args.seeds)
    # A report shows whatever grid is there, as long as it is one; training adds to the grid asked for.
    check_results(args.results, grid, {"steps": None, "base_changes": None} if args.report else
                  {"steps": args.steps, "base_changes": list(args.overrides)})
    if not args.report:
        if grid:  # the overrides checked before any training (a typo fails now, not in an hour)
            table3.recipe_of(grid[0], args.steps, args.recipe, args.overrides)
        if args.jobs > 1:
            code = _workers(args)
            if code:
                return code
        else:
            run_grid(grid, args.out, args.results,
                     partial(table3.train_and_score, steps=args.steps, base=args.recipe, extra=args.overrides),
                     _log("table3", args.quiet))
    results = read_results(args.results, grid)
    if args.report:
        nothing_to_report(args.results, results, "table3")
    for path in table3.write_report(results, grid, args.results):
        print(path)
    if args.against:
        other = check_results(args.against, grid, {"steps": None, "base_changes": None})
        print(write_text(Path(args.results) / f"against_{Path(args.against).resolve().name}.md",
                         table3.against(results, other, grid)))
    print(f"{len(results)} of {len(grid)} variants scored", file=sys.stderr)
    _say_time_left(results, grid, args.jobs)
    return 0


def cmd_search(args: argparse.Namespace) -> int:
    steps = args.steps or search.short_steps(args.recipe)
    knobs = [k.strip() for k in args.knobs.split(",")] if args.knobs else None
    labels = {v.label for v in search.variants()}  # "base" among them
    unknown = sorted({k for k in knobs or () if search.COMBINED not in k} - {*search.KNOBS, *labels})
    if unknown:
        raise ValueError(f"--knobs: unknown {unknown}; the knobs are {list(search.KNOBS)}, the variants "
                         f"{sorted(labels - {'base'})}, or variants joined by {search.COMBINED!r}")
    name = f"{Path(args.recipe).stem}-{steps}"
    # The runs follow the results' folder: a grid given its own --results (another base) never resumes another's runs.
    results = Path(args.results or SEARCH_RESULTS / name)
    out = Path(args.out or Path("runs") / "search" / results.name)
    # A report draws the base its results record (the recipe may have changed since); training, today's.
    base = (search.recorded_base(read_results(results, search.variants(knobs, args.seeds)), args.recipe,
                                 args.overrides) if args.report else search.base_knobs(args.recipe, args.overrides))
    grid = search.variants(knobs, args.seeds, base)
    asked, one = {part for k in knobs or () for part in k.split(search.COMBINED)}, search.singles()
    for stem in search.same_as_base(base):
        if not knobs or stem in asked or one[stem][0] in asked:
            print(f"search: {stem} is the base's own value; the base's runs stand for it", file=sys.stderr)
    check_results(results, grid, {"steps": None, "recipe": None, "base_changes": None, "base_knobs": None}
                  if args.report else {"steps": steps, "recipe": str(args.recipe),
                                       "base_changes": list(args.overrides), "base_knobs": base})
    if not args.report:
        search.recipe_of(grid[0], args.recipe, steps, args.overrides)  # checked before any training
        if args.jobs > 1:
            code = _workers(args)
            if code:
                return code
        else:
            run_grid(grid, out, results, partial(search.train_and_score, recipe=args.recipe, steps=steps,
                                                 extra=args.overrides), _log("search", args.quiet))
        search.add_averages(grid, out, results, _log("search", args.quiet))  # runs that kept their checkpoints
    found = read_results(results, grid)
    if args.report:
        nothing_to_report(results, found, "search")
    for path in search.write_report(found, grid, args.recipe, results, args.overrides):
        print(path)
    print(f"{len(found)} of {len(grid)} variants scored", file=sys.stderr)
    _say_time_left(found, grid, args.jobs)
    return 0


def nothing_to_report(folder: str | Path, results: dict[str, Any], experiment: str) -> None:
    """``--report`` on a folder without one result of its grid is an error, not an empty table written there
    (a mistyped ``--results``, or the grid not run yet)."""
    if not results:
        raise DataError(f"{folder}: no results of this grid to report; `qkv experiment {experiment}` trains "
                        "them, and --results names the folder they are in")


def _say_time_left(results: dict[str, dict[str, Any]], grid: Sequence[Variant], jobs: int) -> None:
    """For a grid filled across sittings: what the rest would take here."""
    left = time_left(results, grid, jobs)
    if left:
        seconds, measured = left
        print(f"the {len(grid) - len(results)} left: about {seconds / 3600:.1f} h with --jobs {jobs} on this CPU "
              f"(the mean of the {measured} variant{'s' * (measured > 1)} trained here)", file=sys.stderr)


def cmd_forgetting(args: argparse.Namespace) -> int:
    grid = forgetting.variants(args.seeds)
    out, results = Path(args.out), Path(args.results)
    check_results(results, grid, {"steps": None if args.report else args.steps})
    if not args.report:
        # The base first, in this process with every thread: the workers all fine-tune it.
        base = forgetting.prepare_base(out, args.base_steps, quiet=args.quiet)
        forgetting.score_base(base, results)
        if args.jobs > 1:
            code = _workers(args)
            if code:
                return code
        else:
            run_grid(grid, out, results, partial(forgetting.train_and_score, base=base, steps=args.steps),
                     _log("forgetting", args.quiet))
    found = read_results(results, grid)
    if args.report:
        nothing_to_report(results, found, "forgetting")
    for path in forgetting.write_report(results, grid):
        print(path)
    print(f"{len(found)} of {len(grid)} variants scored", file=sys.stderr)
    _say_time_left(found, grid, args.jobs)
    return 0


def _log(name: str, quiet: bool):
    return (lambda m: None) if quiet else (lambda m: print(f"{name}: {m}", file=sys.stderr))


def _workers(args: argparse.Namespace) -> int:
    """Run ``args.jobs`` workers of this same command (``--jobs 1``); the grid's claims keep them apart."""
    if not SIDE_BY_SIDE:
        print(f"qkv experiment: error: --jobs {args.jobs}: workers side by side need POSIX file locks, which this "
              "system lacks; run with --jobs 1", file=sys.stderr)
        return 2
    argv = [*args.argv, "--jobs", "1"]  # argparse keeps the last --jobs
    workers = [subprocess.Popen([sys.executable, "-m", "qkv", *argv]) for _ in range(args.jobs)]
    codes = [w.wait() for w in workers]
    if any(codes):
        print(f"qkv experiment: error: a worker failed (exit codes {codes})", file=sys.stderr)
        return 1
    return 0

