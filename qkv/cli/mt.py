"""The translation commands: ``qkv train mt``, ``qkv translate``, ``qkv eval mt`` and ``qkv demo``.

Results go to stdout (translations, scores), logs and progress to stderr, so every command works in
a pipe: ``cat news.zh | qkv translate --run runs/demo > news.en``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import BinaryIO, Iterator, TextIO

from qkv.cli.common import add_device, add_quantize, add_training_run, add_weights, command_group, directory, finite_float, positive_int, seed
from qkv.cli.pipe import answer_each
from qkv.config import ALPHA, BEAM
from qkv.settings import recipe_names
from qkv.data.translation import load_split
from qkv.demo import run_demo
from qkv.evaluation.bleu import score
from qkv.generation.api import InputError, InputTooLongError, Translator
from qkv.files import read_lines, write_text
from qkv.runs import Run, require_arch
from qkv.training import recipes
from qkv.training.train_mt import train


def register(subparsers) -> None:
    """Add ``train mt``, ``translate``, ``eval mt`` and ``demo`` to the ``qkv`` command line."""
    train = command_group(subparsers, "train", "train a model (mt: a translator; lm: a GPT)")
    p = train.add_parser("mt", help="train an encoder-decoder translation model",
                         description="Train a translation Transformer with the paper's recipe. Example: "
                                     "qkv train mt --recipe demo --run runs/demo train.steps=2000")
    add_training_run(p, "mt")
    p.add_argument("--data-dir", type=directory, help="data root searched first for the corpus")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="recipe overrides, e.g. model.d_model=256 train.lr_factor=2")
    p.set_defaults(func=cmd_train_mt)

    p = subparsers.add_parser("translate", help="translate text with a trained run (stdin to stdout)",
                              description="Translate stdin (or --input) line by line: one output line per input "
                                          "line, an empty line for an empty line.")
    p.add_argument("--run", "--run-dir", required=True, help="run directory written by `qkv train mt` or `qkv demo`")
    p.add_argument("--beam", type=positive_int, default=BEAM,
                   help=f"beam size (1: greedy; default {BEAM}, as the paper)")
    p.add_argument("--alpha", type=finite_float, default=ALPHA, help=f"length penalty (default {ALPHA}, as the paper)")
    p.add_argument("--nbest", type=positive_int, default=1,
                   help="print the N best translations, tab-separated with scores")
    p.add_argument("--input", "-i", help="read this file instead of stdin")
    p.add_argument("--output", "-o", help="write this file instead of stdout")
    p.add_argument("--truncate", action="store_true",
                   help="cut inputs longer than the model's positions (default: stop with an error)")
    p.add_argument("--batch-size", type=positive_int, default=64, help="lines translated together (default 64)")
    add_device(p)
    add_weights(p)
    add_quantize(p)
    p.set_defaults(func=cmd_translate)

    ev = command_group(subparsers, "eval", "evaluate a model (mt: BLEU and chrF; lm: perplexity)")
    p = ev.add_parser("mt", help="BLEU and chrF (sacreBLEU) of a run on a split, or of any two files",
                      description="Score translations with sacreBLEU (cased, 13a) and chrF. Either --run DIR "
                                  "--split test, or --run DIR --src FILE --ref FILE, or --hyp FILE --ref FILE.")
    p.add_argument("--run", "--run-dir", help="run directory to translate with")
    p.add_argument("--split", help="train, valid or test (the run's own splits), or any split of its corpus "
                                   "(e.g. test2016); default: test")
    p.add_argument("--src", help="a source file to translate and score (with --run and --ref)")
    p.add_argument("--hyp", help="a file of translations to score (with --ref)")
    p.add_argument("--ref", help="the reference translations, line-aligned")
    p.add_argument("--beam", type=positive_int, default=BEAM)
    p.add_argument("--alpha", type=finite_float, default=ALPHA)
    p.add_argument("--output", "-o", help="also write the translations here")
    p.add_argument("--data-dir", type=directory, help="data root searched first for the corpus")
    add_weights(p)
    add_device(p)
    add_quantize(p)
    p.add_argument("--json", action="store_true", help="print the scores as JSON")
    p.set_defaults(func=cmd_eval_mt)

    p = subparsers.add_parser("demo", help="train a small zh->en translator in ~2 minutes and show it working",
                              description="Train on the embedded Chinese-English demo corpus (no files, no network), "
                                          "print the test BLEU, translate unseen sentences and draw the "
                                          "cross-attention of the seed sentence.")
    p.add_argument("--run", "--run-dir", default="runs/demo",
                   help="run directory (default runs/demo; replaced if it exists)")
    p.add_argument("--seed", type=seed, default=None, help="training seed (default: the demo config's)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="demo recipe overrides, e.g. train.steps=200")
    p.set_defaults(func=cmd_demo)


# ----------------------------------------------------------------------------------------------
# qkv train mt


def cmd_train_mt(args: argparse.Namespace) -> int:
    if not args.recipe and not args.resume:
        raise ValueError(f"give --recipe NAME ({', '.join(recipe_names('mt'))}) or FILE, or --run DIR --resume")
    if args.resume and not args.run:
        raise ValueError("--resume needs --run DIR (the run to continue)")
    run_dir = Path(args.run) if args.run else Path("runs") / Path(args.recipe).stem
    if args.resume:
        require_arch(Run(run_dir), "transformer", "qkv train mt --resume", instead="qkv train lm --resume")
    cfg = recipes.load("mt", args.recipe, args.overrides, run_dir, args.resume)
    if args.data_dir:
        cfg = replace(cfg, data=replace(cfg.data, data_dir=args.data_dir))
    summary = train(cfg, run_dir, resume=args.resume, overwrite=args.overwrite, quiet=args.quiet).summary
    print(json.dumps(summary, indent=2))
    return 0


# ----------------------------------------------------------------------------------------------
# qkv translate


def _decode_line(raw: bytes) -> str:
    # Bad bytes become U+FFFD (then <unk>) instead of stopping the pipe.
    return raw.decode("utf-8", errors="replace").rstrip("\r")


def line_groups(source: BinaryIO | TextIO, size: int) -> Iterator[list[str]]:
    """Lines of ``source`` in groups of up to ``size``: every line already available, but never waiting for more.

    Reading the file descriptor directly (not through Python's buffered readline) tells exactly which
    lines have arrived: a producer that sends one line and waits for its translation gets it at
    once, and ``cat big.txt |`` is still translated in full batches. A stream without a file
    descriptor (a test's StringIO) is read line by line.
    """
    try:
        fd = source.fileno()
    except (OSError, ValueError, AttributeError):
        fd = None
    if fd is None:
        group: list[str] = []
        for line in source:
            group.append(line.decode("utf-8", errors="replace") if isinstance(line, bytes) else line)
            group[-1] = group[-1].rstrip("\n").rstrip("\r")
            if len(group) >= size:
                yield group
                group = []
        if group:
            yield group
        return
    pending: list[str] = []
    buffer = b""
    while True:
        if pending:
            yield pending[:size]
            pending = pending[size:]
            continue
        chunk = os.read(fd, 1 << 16)  # blocks only when no complete line is waiting
        if not chunk:
            if buffer:  # a last line without a final newline
                yield [_decode_line(buffer)]
            return
        *lines, buffer = (buffer + chunk).split(b"\n")
        pending = [_decode_line(line) for line in lines]


def cmd_translate(args: argparse.Namespace) -> int:
    if args.beam < 1 or args.nbest < 1 or args.nbest > args.beam:
        raise ValueError(f"need 1 <= --nbest <= --beam, got --nbest {args.nbest}, --beam {args.beam}")
    if args.input and not Path(args.input).is_file():
        raise FileNotFoundError(f"input file not found: {args.input}")
    translator = Translator.from_run(args.run, weights=args.weights, device=args.device, quantize=args.quantize)
    source = open(args.input, "rb") if args.input else sys.stdin
    out = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout

    def answer(group: list[str]) -> list[str]:
        results = translator.translate_nbest(group, beam=args.beam, n_best=args.nbest, alpha=args.alpha,
                                             truncate=args.truncate)
        if args.nbest == 1:
            return [hyps[0][0] for hyps in results]
        return ["\t".join(f"{text}\t{score:.4f}" for text, score in hyps) for hyps in results]

    def too_long(e: InputError) -> str:
        if not isinstance(e, InputTooLongError):
            return str(e)
        return (f"{e.n_tokens} tokens (with <eos>), but the model reads at most {e.limit}; split the line, or pass "
                "--truncate to keep its first tokens")

    try:
        return answer_each(line_groups(source, max(args.batch_size, 1)), answer, out, "translate",
                           args.input or "stdin", too_long)
    finally:
        if args.input:
            source.close()
        if args.output:
            out.close()


# ----------------------------------------------------------------------------------------------
# qkv eval mt


def cmd_eval_mt(args: argparse.Namespace) -> int:
    if args.hyp:
        if not args.ref:
            raise ValueError("--hyp needs --ref (the reference translations)")
        hyps, refs, what = read_lines(args.hyp), read_lines(args.ref), f"{args.hyp} vs {args.ref}"
        if len(hyps) != len(refs):
            raise ValueError(f"{args.hyp} has {len(hyps)} lines but {args.ref} has {len(refs)}: "
                             "they must be line-aligned")
    else:
        if not args.run:
            raise ValueError("give --run DIR with --split NAME or --src/--ref FILES, or --hyp FILE --ref FILE")
        run = Run(args.run)
        translator = Translator.from_run(run, weights=args.weights, device=args.device, quantize=args.quantize)
        if args.src:
            if not args.ref:
                raise ValueError("--src needs --ref")
            src, refs = read_lines(args.src), read_lines(args.ref)
            if len(src) != len(refs):
                raise ValueError(f"{args.src} has {len(src)} lines but {args.ref} has {len(refs)}")
            what = f"{args.src} -> {args.ref}"
        else:
            data = run.recipe.data
            if args.data_dir:
                data = replace(data, data_dir=args.data_dir)
            # --split names a split of the corpus, or a role: train/valid/test mean the run's own
            # (multi30k's test is test2016, its valid is val).
            split = getattr(data, args.split) if args.split in ("train", "valid", "test") else (args.split or data.test)
            src, refs = load_split(data, split)
            what = f"{data.corpus} {split} ({data.src_lang}->{data.tgt_lang})"
        print(f"translating {len(src)} sentences (beam {args.beam})...", file=sys.stderr)
        hyps = translator.translate(src, beam=args.beam, alpha=args.alpha, truncate=True)
    if args.output:
        write_text(args.output, "\n".join(hyps) + "\n")
    result = score(hyps, refs)
    if args.json:
        print(json.dumps({"what": what, **result}, indent=2))
    else:
        print(f"{what}: BLEU {result['bleu']:.2f}  chrF {result['chrf']:.2f}  exact {result['exact']:.1%}  "
              f"length ratio {result['length_ratio']:.3f}  ({result['sentences']} sentences)")
        print(f"  {result['bleu_signature']}")
    return 0


# ----------------------------------------------------------------------------------------------
# qkv demo


def cmd_demo(args: argparse.Namespace) -> int:
    return run_demo(args.run, seed=args.seed, overrides=args.overrides)


__all__ = ["register", "cmd_train_mt", "cmd_translate", "cmd_eval_mt", "cmd_demo"]
