"""The ``qkv explore`` command: serve the attention explorer, or export it as one HTML file.

    qkv explore                                  the figures on http://127.0.0.1:8765/ (Chinese or English,
                                                 as the browser prefers; a button switches)
    qkv explore --lang en                        ... in English for a reader who has not chosen
    qkv explore --run runs/demo --text "小明累了，他想睡觉。"
                                                 plus the run's own attention maps, its encoder-decoder
                                                 sizes and its step-by-step translation (a GPT run: its
                                                 practice problems)
    qkv explore --export page.html               one self-contained file (works from file://)
    qkv explore --run runs/demo --text "小明累了，他想睡觉。" --export page.html
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from qkv.interpret import model_maps, traces
from qkv.interpret.explorer.export import export_page
from qkv.interpret.explorer.language import LANGS
from qkv.interpret.explorer.payload import AttentionDataError
from qkv.interpret.explorer.server import MAX_TEXT_CHARS, serve

DEFAULT_PORT = 8765


def register(subparsers) -> None:
    """Add the ``explore`` subcommand to an argparse subparsers object."""
    p = subparsers.add_parser(
        "explore",
        help="interactive attention figures (and your model's attention maps) in the browser",
        description="Serve the attention explorer on a local web server, or export it as one HTML file.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n", 1)[1],
    )
    p.add_argument(
        "--run", "--run-dir", metavar="DIR", help="run directory of a trained model: adds figure 6, its attention maps"
    )
    p.add_argument(
        "--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1: this machine only)"
    )
    p.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 picks a free one)"
    )
    p.add_argument(
        "--export", metavar="PAGE.html", help="write one self-contained HTML file instead of serving"
    )
    p.add_argument(
        "--text", help="text the model figures start with; with --run --export, the text whose maps are embedded"
    )
    p.add_argument(
        "--lang", choices=LANGS, help="the page's language for a reader who has not chosen one "
        "(default: the browser's; the page's button switches and remembers)"
    )
    p.set_defaults(func=cmd_explore)


def _error(message: str) -> int:
    print(f"qkv explore: error: {message}", file=sys.stderr)
    return 2


def _checked_run(run_dir: str) -> None:
    if not Path(run_dir).is_dir():
        raise LookupError(f"--run {run_dir}: no such directory")


def _load_provider(run_dir: str):
    """The run's ``text -> attention maps`` function (qkv.interpret.model_maps), for an export."""
    _checked_run(run_dir)
    try:
        return model_maps.make_attention_provider(run_dir)
    except (FileNotFoundError, ValueError) as err:
        raise LookupError(f"--run {run_dir}: {err}") from None


def _load_views(run_dir: str) -> dict:
    """What the server shows of a run, from one load of its model: the attention maps, the trace (and
    its kind), the sizes and the head `qkv explain` found."""
    _checked_run(run_dir)
    try:
        loaded = model_maps.load_run(run_dir)
        trace_provider, trace_kind = traces.make_trace_provider(run_dir, loaded=loaded)
        views = {"attention_provider": model_maps.make_attention_provider(run_dir, loaded=loaded),
                 "trace_provider": trace_provider, "trace_kind": trace_kind,
                 "model_sizes": traces.model_sizes(run_dir)}
    except (FileNotFoundError, ValueError) as err:
        raise LookupError(f"--run {run_dir}: {err}") from None
    views["pronoun_head"] = model_maps.pronoun_head(run_dir)
    return views


def cmd_explore(args: argparse.Namespace) -> int:
    """Serve or export the explorer. Returns the process exit code."""
    if args.text is not None and len(args.text) > MAX_TEXT_CHARS:
        return _error(f"--text is {len(args.text)} characters; the limit is {MAX_TEXT_CHARS}")
    if not 0 <= args.port <= 65535:
        return _error(f"--port must be in 0..65535, got {args.port}")
    if args.export:
        data = None
        if args.run:
            try:
                provider = _load_provider(args.run)
            except LookupError as err:
                return _error(str(err))
            if not args.text:
                return _error("--export with --run needs --text: the text whose attention is embedded")
            try:
                data = provider(args.text)
            except ValueError as err:
                return _error(f"the model could not read --text: {err}")
        try:
            out = export_page(args.export, data, lang=args.lang)
        except (OSError, AttentionDataError) as err:
            return _error(str(err))
        print(out)
        return 0

    views: dict = {"attention_provider": None}
    if args.run:
        try:
            views = _load_views(args.run)
        except LookupError as err:
            return _error(str(err))
    try:
        return serve(
            args.host,
            args.port,
            default_text=args.text or (views.get("pronoun_head") or {}).get("sentence") or "",
            model_name=str(args.run) if args.run else None,
            default_lang=args.lang,
            **views,
        )
    except OSError as err:
        hint = " (pass --port 0 to pick a free port)" if args.port else ""
        return _error(f"cannot listen on {args.host}:{args.port}: {err.strerror or err}{hint}")
