"""The ``qkv data list|fetch|check`` command: see, download and verify the registered corpora.

Results (the table, the verdicts) go to stdout; progress goes to stderr. ``check`` and ``fetch`` exit
non-zero on any failure, with a message naming the file.
"""

from __future__ import annotations

import argparse
import sys

from qkv.cli.common import directory
from qkv.data import corpora


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} B"  # unreachable


def cmd_list(args: argparse.Namespace) -> int:
    rows = [("name", "languages", "splits (pairs or lines)", "size", "location")]
    for c in corpora.list_corpora():
        if c.kind == "parallel":
            splits = " ".join(f"{s}:{c.split_lines(s)}" for s in c.splits)
            langs = "-".join(c.languages) + (" (eval only)" if c.eval_only else "")
        else:
            splits = f"{c.files[0].path}:{c.files[0].lines}"
            langs = c.languages[0] + " (text)"
        where = corpora.locate_corpus(c.name, args.data_dir)
        rows.append((c.name, langs, splits, _size(c.total_bytes), str(where) if where else "missing"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths)) + "  " + r[-1])
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    names = args.names or [c.name for c in corpora.list_corpora()]
    explicit = bool(args.names)
    for name in names:  # an unknown name is bad input: refused before any corpus is read
        corpora.get_corpus(name)
    failed = checked = 0
    for name in names:
        report = corpora.check_corpus(name, args.data_dir, verify_sha=not args.no_sha)
        if report.directory is None:
            if explicit:  # asked for by name: missing is a failure
                print(f"{name}: FAILED\n  " + "\n  ".join(report.problems[0].splitlines()))
                failed += 1
            else:
                print(f"{name}: missing (skipped)")
            continue
        checked += 1
        if report.ok:
            what = "sizes, line counts, UTF-8" + ("" if args.no_sha else ", sha256")
            print(f"{name}: OK ({report.directory}; {what})")
        else:
            failed += 1
            print(f"{name}: FAILED ({report.directory})")
            for p in report.problems:
                print(f"  {p}")
    if not explicit and checked == 0:
        print("no corpus found; see `qkv data list` and `qkv data fetch NAME`", file=sys.stderr)
        return 1
    return 1 if failed else 0


def cmd_fetch(args: argparse.Namespace) -> int:
    for name in args.names:  # an unknown name is bad input: refused before anything is downloaded
        corpora.get_corpus(name)
    failed = 0
    for name in args.names:
        try:
            path = corpora.fetch(name, args.data_dir, force=args.force)
        except corpora.DataError as e:  # this corpus failed (a download, a checksum): the others still come
            print(f"qkv data: error: {e}", file=sys.stderr)
            failed += 1
            continue
        print(f"{name}: {path}")
    return 1 if failed else 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``data`` with its ``list``, ``check`` and ``fetch`` sub-commands to the ``qkv`` parser."""
    data = subparsers.add_parser(
        "data",
        help="list, fetch and verify the real corpora",
        description="Corpora are looked up in --data-dir, then $QKV_DATA, then ../shared/data beside "
        f"the checkout, then the user cache ({corpora.cache_root()}).",
    )
    sub = data.add_subparsers(dest="data_command", metavar="{list,check,fetch}")
    sub.required = True

    def common(p: argparse.ArgumentParser, what: str, searched: bool = True) -> None:
        # A root that is searched must be there; the one fetch writes to is created.
        p.add_argument("--data-dir", metavar="DIR", default=None, type=directory if searched else str, help=what)

    p = sub.add_parser("list", help="the registered corpora, their sizes and where they were found")
    common(p, "a data root searched first")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("check", help="verify presence, sizes, sha256, UTF-8 and alignment")
    p.add_argument("names", nargs="*", metavar="NAME", help="corpora to check (default: every one found)")
    p.add_argument("--no-sha", action="store_true", help="skip the sha256 check (sizes and lines still checked)")
    common(p, "a data root searched first")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("fetch", help="download from the canonical source and verify sha256")
    p.add_argument("names", nargs="+", metavar="NAME", help="corpora to download")
    p.add_argument("--force", action="store_true", help="download even if a verified copy is there")
    common(p, f"the data root to write to (default: {corpora.cache_root()})", searched=False)
    p.set_defaults(func=cmd_fetch)
