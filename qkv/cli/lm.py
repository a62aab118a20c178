"""The GPT commands: ``qkv train lm``, ``qkv generate``, ``qkv finetune``, ``qkv eval lm``.

Results go to stdout, progress and logs to stderr. ``train`` and ``eval`` are command groups shared
with the translation commands (``qkv train mt``): :func:`register` adds ``lm`` to them whether or not
another module created the group first.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import numpy as np

from qkv.cli.common import (
    add_device, add_quantize, add_training_run, add_weights, command_group, directory, finite_float, positive_int, seed,
)
from qkv.cli.pipe import answer_each
from qkv.training.distributed import add_launcher
from qkv.config import NEW_TOKENS, TEMPERATURE
from qkv.settings import recipe_names
from qkv.data.lm import load_splits
from qkv.evaluation.validation import evaluate_tokens
from qkv.generation.completer import Completer
from qkv.generation.policy import COMPILE_AFTER, PRECOMPILED_AFTER, Step
from qkv.devices import keep_freed_memory
from qkv.files import read_text_file
from qkv.runs import Run, load_model, require_arch
from qkv.training import recipes
from qkv.training.finetune import FinetuneData, finetune
from qkv.training.lm_run import convert_gpt2_run, load_run_recipe
from qkv.training.train_lm import train_lm


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``train lm``, ``generate``, ``finetune`` and ``eval lm`` to the ``qkv`` command line."""
    train = command_group(subparsers, "train", "train a model (lm: a GPT on raw text; mt: a translator)")
    p = train.add_parser("lm", help="pretrain a GPT on raw text (next-token prediction)",
                         description="Pretrain a GPT. The recipe's header shows an example; section.key=value "
                                     "overrides any setting (train.steps=100, model.d_model=256).")
    add_training_run(p, "lm")
    p.add_argument("--init-from", metavar="RUN", help="start from another run's weights and tokenizer, fresh optimizer")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="override a recipe setting")
    p.set_defaults(func=cmd_train_lm)

    p = subparsers.add_parser("generate", help="continue text with a trained GPT (prompt argument or stdin lines)",
                              description="Continue a prompt, streaming tokens to stdout. Without a prompt, reads "
                                          "stdin line by line and writes one line per input, a newline in it written "
                                          "as \\n (a tab as \\t, a backslash as \\\\). The prompt, the input "
                                          "lines and --stop take the same escapes, so '\\n' is a newline in any "
                                          "shell (--no-escape: as written).")
    p.add_argument("--run", "--run-dir", required=True, help="run directory of `qkv train lm` or `qkv finetune`")
    p.add_argument("prompt", nargs="?", help="text to continue ('' starts from the start token)")
    p.add_argument("-n", "--max-new-tokens", type=positive_int, default=NEW_TOKENS)
    p.add_argument("--temperature", type=finite_float, default=TEMPERATURE, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=None, help="sample among the k most likely tokens")
    p.add_argument("--top-p", type=finite_float, default=None, help="nucleus sampling mass, in (0, 1]")
    p.add_argument("--seed", type=seed, default=None, help="makes sampling reproducible")
    p.add_argument("--stop", action="append", default=[],
                   help="end the completion before this text (repeatable; escapes as the prompt: '\\n\\n' stops at a "
                        "blank line)")
    p.add_argument("--sliding-window", action="store_true", help="allow prompts/outputs longer than the context")
    p.add_argument("--no-escape", dest="escape", action="store_false",
                   help="take the prompt, the stop strings and the stdin lines as written: \\n is a backslash and "
                        "an n")
    p.add_argument("--batch-size", type=positive_int, default=16, help="stdin lines completed together")
    add_weights(p)
    add_device(p)
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help=f"compile the one-prompt decoding step with torch.compile: faster steps on a CPU, after "
                        f"seconds of compiling (needs a C++ compiler); by default from {COMPILE_AFTER} new tokens on, "
                        "where that repays it; --no-compile: never")
    p.add_argument("--precompile", action="store_true",
                   help="compile the decoding step ahead of time for this model, machine and batch size (one "
                        "prompt, or --batch-size lines of stdin; tens of seconds, once; needs a C++ "
                        "compiler) and keep it in the user cache: from then on every generation of "
                        f"{PRECOMPILED_AFTER} or more tokens with as many prompts loads it at once. Without it, the "
                        "first such generation starts this build in the background, at low priority "
                        "(QKV_BACKGROUND_PRECOMPILE=0: it does not)")
    add_quantize(p)
    p.set_defaults(func=cmd_generate)

    p = subparsers.add_parser("finetune", help="supervised fine-tuning of a GPT run, optionally mixed or LoRA",
                              description="Fine-tune the weights of --run (fresh optimizer) on (prompt, response) "
                                          "pairs, the loss on response tokens only.")
    p.add_argument("--run", "--run-dir", "--init-from", dest="base", required=True, metavar="BASE",
                   help="the pretrained run")
    p.add_argument("--data", required=True, help="JSONL of {prompt, response}, or CORPUS:SPLIT (e.g. cmn-eng:train)")
    p.add_argument("--valid", help="held-out pairs for the task loss (JSONL or CORPUS:SPLIT)")
    p.add_argument("--out", required=True, help="the new run directory")
    p.add_argument("--recipe", "--config", dest="recipe", metavar="FILE",
                   help="YAML with a train: section (or a finetune: section holding one)")
    cure = p.add_mutually_exclusive_group()
    cure.add_argument("--mix", type=finite_float, metavar="LAMBDA", help="L = L_task + LAMBDA * L_pretrain")
    cure.add_argument("--lora", type=positive_int, metavar="RANK", help="train LoRA adapters of this rank on a frozen base")
    cure.add_argument("--kl", type=finite_float, metavar="BETA",
                      help="L = L_task + BETA * KL(p_base || p) on pretraining windows (distillation from the base)")
    p.add_argument("--pretrain-text", metavar="FILE|CORPUS",
                   help="pretraining text to mix in and measure forgetting on (default: the base run's tokens.bin)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted fine-tuning run exactly")
    p.add_argument("--overwrite", action="store_true", help="replace a run that --out already holds")
    p.add_argument("--quiet", action="store_true")
    add_launcher(p)
    p.add_argument("overrides", nargs="*", metavar="key=value", help="override a setting (train.steps=200, train.lr=1e-4)")
    p.set_defaults(func=cmd_finetune)

    ev = command_group(subparsers, "eval", "evaluate a model (lm: loss and perplexity)")
    p = ev.add_parser("lm", help="loss and perplexity of a GPT run on its validation split or a text file")
    p.add_argument("--run", "--run-dir", required=True)
    p.add_argument("--split", default="valid", choices=["valid", "train"],
                   help="split of the run's corpus (cut as the run cut it: data.split)")
    p.add_argument("--text", help="score this UTF-8 text file instead")
    p.add_argument("--batch-size", type=positive_int, default=32)
    p.add_argument("--max-windows", type=positive_int, default=None, help="score only the first N context windows")
    add_weights(p)
    add_device(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_eval_lm)

    conv = command_group(subparsers, "convert", "bring a model from another library into a qkv run")
    p = conv.add_parser("gpt2", help="a Hugging Face GPT-2 and GPT-2's tokenizer as a qkv GPT run",
                        description="Write a run directory that qkv generate and qkv eval lm --text use like "
                                    "any other (needs qkv[hf,gpt2]).")
    p.add_argument("--from", dest="source", required=True,
                   help="a model name to download (gpt2, gpt2-medium, ...) or a save_pretrained folder")
    p.add_argument("--tokenizer", type=directory, default=None,
                   help="a folder with GPT-2's merges.txt and vocab.json (default: beside the weights, else tiktoken's)")
    p.add_argument("--run", "--run-dir", required=True, help="the new run directory")
    p.set_defaults(func=cmd_convert_gpt2)


# ----------------------------------------------------------------------------------------------


def cmd_train_lm(args: argparse.Namespace) -> int:
    if args.resume:
        if not args.run:
            raise ValueError("--resume needs --run DIR")
        require_arch(Run(args.run), "gpt", "qkv train lm --resume", instead="qkv train mt --resume")
        run = args.run
    else:
        if not args.recipe:
            raise ValueError(f"give --recipe NAME ({', '.join(recipe_names('lm'))}) or FILE, or --resume --run DIR")
        run = args.run or str(Path("runs") / Path(args.recipe).stem)
    recipe = recipes.load("lm", args.recipe, args.overrides, run, args.resume)
    if args.init_from:
        require_arch(Run(args.init_from), "gpt", "--init-from")
    result = train_lm(recipe, run, resume=args.resume, overwrite=args.overwrite, quiet=args.quiet,
                      init_from=args.init_from)
    print(json.dumps(result.summary))
    return 0


_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\t": "\\t"}  # a character of text, and how a line of input or output writes it
_UNESCAPES = {written: char for char, written in _ESCAPES.items()}


def _escape(text: str) -> str:
    """Text as one line: newlines, tabs and backslashes written as in :data:`_ESCAPES`."""
    return re.sub(r"[\\\n\t]", lambda m: _ESCAPES[m.group()], text)


def _unescape(line: str) -> str:
    """The inverse of :func:`_escape`, in one pass (so that ``\\\\n`` is a backslash and an n)."""
    return re.sub(r"\\[\\nt]", lambda m: _UNESCAPES[m.group()], line)


def cmd_generate(args: argparse.Namespace) -> int:
    if "" in args.stop:
        raise ValueError("--stop '' would end every completion before it starts: give the text to stop at")
    completer = Completer.from_run(args.run, device=args.device, weights=args.weights, compile=args.compile,
                                   quantize=args.quantize)
    rows = 1 if args.prompt is not None or args.sliding_window else args.batch_size  # a full batch of stdin lines
    if args.precompile:
        path, seconds = completer.policy.precompile(rows)
        print(f"qkv generate: the decoding step compiled ahead of time in {seconds:.0f} s, kept in {path}"
              if seconds else f"qkv generate: the decoding step was compiled ahead of time before ({path})",
              file=sys.stderr)
    # The step of each batch size the command decodes, chosen once (a short last batch of stdin lines is another).
    steps = functools.cache(lambda n: completer.policy.choose(args.max_new_tokens, n))
    _announce(steps(rows), args)
    # The step of the first batch decoded (a batch of stdin lines may be short of --batch-size), and the exit code.
    first, code = _complete_all(completer, args, steps)
    if first is not None and first.build:  # eager, where a package would have run: build one for next time
        _precompile_later(completer, args, first)  # once the text is out (and only if it could be written)
    return code


def _announce(step: Step, args: argparse.Namespace) -> None:
    """Say on stderr which step runs where it is not the eager one, and how to decode eagerly instead."""
    if step.how == "compiled" and args.compile is None:
        print(f"qkv generate: compiling the decoding step, which {args.max_new_tokens} new tokens repay "
              "(--no-compile decodes eagerly)", file=sys.stderr)
    elif step.how == "loaded":
        print(f"qkv generate: running the decoding step compiled ahead of time ({step.package}; "
              "--no-compile decodes eagerly)", file=sys.stderr)


def _complete_all(completer: Completer, args: argparse.Namespace,
                  steps: Callable[[int], Step]) -> tuple[Step | None, int]:
    """The prompt's completion streamed to stdout, or one line for each line of stdin (qkv.cli.pipe); returns
    the step of the first batch decoded (None if stdin had no line) and the exit code."""
    read = _unescape if args.escape else str
    kw: dict[str, Any] = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                              top_p=args.top_p, seed=args.seed, stop=[read(text) for text in args.stop])
    if args.prompt is not None:
        completer.complete(read(args.prompt), stream=sys.stdout, sliding_window=args.sliding_window, echo=True,
                           step=steps(1), **kw)
        sys.stdout.write("\n")
        sys.stdout.flush()
        return steps(1), 0
    if sys.stdin.isatty():
        raise ValueError("give a prompt, or pipe prompts on stdin (one per line)")
    lines = [read(line.rstrip("\n")) for line in sys.stdin]
    size = 1 if args.sliding_window else args.batch_size

    def answer(group: list[str]) -> list[str]:
        if args.sliding_window:
            return [_escape(completer.complete(line, sliding_window=True, step=steps(1), **kw)) for line in group]
        return [_escape(text) for text in completer.complete_batch(group, step=steps(len(group)), **kw)]

    code = answer_each((lines[i:i + size] for i in range(0, len(lines), size)), answer, sys.stdout, "generate",
                       "stdin")
    return (steps(min(len(lines), size)) if lines else None), code


def _precompile_later(completer: Completer, args: argparse.Namespace, step: Step) -> None:
    """After an eager generation that a package of the step would have run: build it in the background."""
    # The builder is this command with --precompile and nothing to complete (stdin empty): it loads the same
    # weights, so it builds exactly the package that the next generation looks for.
    argv = [sys.executable, "-m", "qkv", "generate", "--run", str(args.run), "--device", "cpu", "--precompile",
            "--batch-size", str(step.rows), *(["--weights", str(args.weights)] if args.weights else [])]
    later = completer.policy.build_later(step, argv, off="--no-compile", here="--precompile")
    print(f"qkv generate: {later.line}", file=sys.stderr)


def cmd_finetune(args: argparse.Namespace) -> int:
    overrides = list(args.overrides)
    for option, key in ((args.mix, "mix"), (args.lora, "lora_rank"), (args.kl, "kl"),
                        (args.pretrain_text, "pretrain_text")):
        if option is not None:
            overrides.append(f"train.{key}={option}")
    recipe = recipes.load("finetune", args.recipe, overrides)
    # The base run and the task pairs, as the command names them (not through key=value: a path is no YAML).
    recipe = replace(recipe, data=FinetuneData(base_run=str(args.base), train=args.data, valid=args.valid or ""))
    result = finetune(recipe, args.out, resume=args.resume, overwrite=args.overwrite, quiet=args.quiet)
    print(json.dumps({"run": str(result.run_dir), "step": result.step, "before": result.summary.get("before"),
                      "after": result.final, "train_seconds": round(result.train_seconds, 1)}))
    return 0


def cmd_convert_gpt2(args: argparse.Namespace) -> int:
    run = convert_gpt2_run(args.source, args.run, tokenizer=args.tokenizer)
    model, tokenizer = load_model(run, device="cpu")
    print(json.dumps({"run": str(run), "parameters": sum(p.numel() for p in model.parameters()),
                      "vocab_size": tokenizer.vocab_size, "context": model.cfg.max_len}))
    return 0


def cmd_eval_lm(args: argparse.Namespace) -> int:
    run = Run(args.run)
    require_arch(run, "gpt", "qkv eval lm", instead="qkv eval mt")
    model, tokenizer = load_model(run, args.weights, args.device)
    recipe = load_run_recipe(run.path)
    if args.text:
        tokens = np.asarray(tokenizer.encode(read_text_file(args.text)), dtype=np.int64)
        what = args.text
    else:
        path = run.tokens_path  # a fine-tuned run: its base run's corpus
        if path is None:
            raise FileNotFoundError(f"{run.path}: no tokenized corpus in the run (nor in a base run); pass --text FILE")
        train, valid = load_splits(path, recipe.data.valid_fraction)
        tokens = valid if args.split == "valid" else train
        what = f"{recipe.data.path or recipe.data.corpus} ({args.split})"
    keep_freed_memory()  # batch after batch of (windows x context x vocabulary) scores, as in training
    out = evaluate_tokens(model, tokens, recipe.context, args.batch_size, args.max_windows)
    if args.json:
        print(json.dumps({"run": args.run, "data": what, **out}))
    else:
        print(f"{what}: loss {out['loss']:.4f} nats/token, perplexity {out['ppl']:.3f} over {out['tokens']:,} tokens")
    return 0
