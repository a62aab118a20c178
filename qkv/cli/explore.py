"""The ``qkv explore`` command: serve the attention explorer, or export it as one HTML file.

    qkv explore                                  the figures on http://127.0.0.1:8765/ (Chinese or English,
                                                 as the browser prefers; a button switches)
    qkv explore --lang en                        ... in English for a reader who has not chosen
    qkv explore --run runs/demo --text "小明累了，他想睡觉。"
                                                 plus the run's own attention maps, its encoder-decoder
                                                 sizes and its step-by-step translation (a GPT run: its
                                                 practice problems)
    qkv explore --export page.html               one self-contained file that runs the model itself
                                                 (works from file://, offline: share the file)
    qkv explore --run runs/demo --export page.html
                                                 ... running your model (needs qkv[onnx]); --form int8
                                                 makes a large model's file a quarter the size
    qkv explore --run runs/demo --site site/     a folder any static host serves (index.html, the
                                                 model, the runtime)

With no --run, the model is the small translator the package carries (the demo recipe's; see
qkv/interpret/explorer/embedded.py for the command that makes it again).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from qkv.data.synthetic import SEED_SENTENCE
from qkv.errors import QkvError
from qkv.interop.onnx import FORMS, export_onnx
from qkv.interpret import model_maps, traces
from qkv.interpret.explorer.constants import CONSTANTS
from qkv.interpret.explorer.embedded import DEMO_ONNX, demo_model
from qkv.interpret.explorer.export import LiveModel, export_page, export_site
from qkv.interpret.explorer.language import LANGS
from qkv.interpret.explorer.server import MAX_TEXT_CHARS, serve
from qkv.runs import Run

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
        "--site", metavar="FOLDER", help="write a folder for a static host instead of serving (index.html, the model, "
        "the runtime)"
    )
    p.add_argument(
        "--form", choices=FORMS, default=FORMS[0], help="the exported model's weights (--export, --site): fp32 "
        "(default), fp16 or int8 (a half or a quarter of the size)"
    )
    p.add_argument("--text", help="the sentence the model figures start with")
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


def _default_text(run: Run, text: str | None, head: dict | None) -> str:
    """The sentence the page starts on: --text, else the one `qkv explain` saw the pronoun ``head`` at work
    on, else the first article's (a translator) or the second's practice sentence (a GPT)."""
    if text:
        return text
    if head and head.get("sentence"):
        return head["sentence"]
    return SEED_SENTENCE[0] if run.arch == "transformer" else CONSTANTS["PRACTICE_TEXT"]


def _write_live(args: argparse.Namespace) -> Path:
    """The live page (--export) or site (--site) of --run, or of the packaged demo model."""
    run = Run(args.run or demo_model())
    with tempfile.TemporaryDirectory() as tmp:
        folder = DEMO_ONNX
        if args.run or args.form != FORMS[0]:
            _checked_run(str(run.path))
            folder = export_onnx(run.path, Path(tmp) / "onnx", form=args.form)
        head = model_maps.pronoun_head(run)
        live = LiveModel.from_folder(folder, model_name=str(args.run) if args.run else "qkv demo",
                                     default_text=_default_text(run, args.text, head), pronoun_head=head)
        if args.site:
            return export_site(args.site, live, lang=args.lang)
        return export_page(args.export, lang=args.lang, live=live)


def cmd_explore(args: argparse.Namespace) -> int:
    """Serve or export the explorer. Returns the process exit code."""
    if args.text is not None and len(args.text) > MAX_TEXT_CHARS:
        return _error(f"--text is {len(args.text)} characters; the limit is {MAX_TEXT_CHARS}")
    if not 0 <= args.port <= 65535:
        return _error(f"--port must be in 0..65535, got {args.port}")
    if args.export and args.site:
        return _error("give --export PAGE.html or --site FOLDER, not both")
    if args.export or args.site:
        try:
            print(_write_live(args))
        except (LookupError, OSError, QkvError) as err:
            return _error(str(err))
        return 0

    try:
        run_dir = args.run or str(demo_model())
        views = _load_views(run_dir)
    except (LookupError, QkvError) as err:
        return _error(str(err))
    try:
        return serve(
            args.host,
            args.port,
            default_text=_default_text(Run(run_dir), args.text, views.get("pronoun_head")),
            model_name=str(args.run) if args.run else "qkv demo",
            default_lang=args.lang,
            **views,
        )
    except OSError as err:
        hint = " (pass --port 0 to pick a free port)" if args.port else ""
        return _error(f"cannot listen on {args.host}:{args.port}: {err.strerror or err}{hint}")
