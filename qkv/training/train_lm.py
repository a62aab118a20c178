"""Pretrain a GPT on raw text by next-token prediction: the whole recipe as one loop that reads top to bottom.

    qkv train lm --recipe baby --run runs/baby [section.key=value ...]
    qkv train lm --run runs/baby --resume            # continue exactly where the last checkpoint was

The steps, in order: build (or reload) the tokenizer; tokenize the corpus once into a memory-mapped
array, split into training and validation tokens (by position: the first 90% train, the last 10%
validate; or by document, ``data.split=documents``); build the GPT and AdamW (weight decay
on matrices only); then for each step: set the cosine learning rate, accumulate gradients over
micro-batches of random windows, clip the gradient norm, update. Every ``eval_every`` steps the
train and valid losses are estimated, the best weights kept and a checkpoint written; everything
is logged to ``metrics.jsonl`` and drawn in ``curves.png``.

``--resume`` restores everything (weights, optimizer moments, step, the window sampler, the RNGs), so
an interrupted run continues with the very losses the uninterrupted one would have had. ``--init-from
RUN`` is different: only the weights of another run, with a fresh optimizer and schedule.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence, TextIO

import torch
import torch.nn.functional as F

from qkv.errors import ConfigError, DataError
from qkv.settings import save_json, to_dict
from qkv.data.corpora import get_corpus, read_parallel, read_text
from qkv.data.lm import TOKENS_FILE, LMData, split_text, tokenize_to_file
from qkv.evaluation.validation import estimate_loss, evaluate_tokens
from qkv.devices import autocast, to_device
from qkv.files import read_text_file
from qkv.models.gpt import GPT
from qkv.runs import BEST_WEIGHTS_NAME, CONFIG_FILE, CURVES_FILE, METRICS_FILE, Run, one_writer
from qkv.tokenizers import TOKENIZER_FILE, BPETokenizer, CharTokenizer, load_tokenizer
from qkv.tokenizers.gpt2 import GPT2Tokenizer
from qkv.recipes import LMDataConfig, LMRecipe
from qkv.training.lm_run import load_run_recipe
from qkv.training.logging import MetricsLogger, Progress
from qkv.training.loop import (
    Cadence, LoopState, TrainResult, accumulate, check_same_run, compiled, export, fixed_settings, rank_share,
    resume_state, save_state, start, update,
)
from qkv.training.optim import build_adamw
from qkv.training.plots import plot_curves
from qkv.training.schedules import cosine_lr, set_lr
from qkv.weights import load_weights, save_weights

# ----------------------------------------------------------------------------------------------
# Text and tokenizer.


def read_corpus(cfg: LMDataConfig) -> str:
    """The training text: ``cfg.path`` if set, else the registered corpus ``cfg.corpus``."""
    if cfg.path:
        text = read_text_file(cfg.path)
        if not text.strip():
            raise DataError(f"{cfg.path}: no text to train on (data.path); give a file with the training text")
        return text
    return read_text(cfg.corpus, cfg.data_dir or None)


def vocabulary_texts(cfg: LMDataConfig) -> list[str]:
    """The extra texts (``data.vocab_extra``) the vocabulary must cover besides the training text."""
    texts = []
    for entry in cfg.vocab_extra:
        name, _, split = entry.partition(":")
        if Path(entry).is_file():
            texts.append(read_text_file(entry))
        elif split:
            corpus = get_corpus(name)
            src, tgt = read_parallel(name, split, corpus.languages[0], corpus.languages[1], cfg.data_dir or None)
            texts += ["\n".join(src), "\n".join(tgt)]
        else:
            texts.append(read_text(name, cfg.data_dir or None))
    return texts


def build_tokenizer(cfg: LMDataConfig, texts: Sequence[str]) -> Any:
    """A character or byte-level BPE tokenizer over ``texts``, with ``<pad> <bos> <eos> <unk>`` at 0-3,
    or GPT-2's own (``gpt2``: nothing to learn, and GPT-2's ids)."""
    if cfg.tokenizer == "gpt2":
        return GPT2Tokenizer.from_tiktoken()
    if cfg.tokenizer == "char":
        return CharTokenizer.train(texts, specials=True)
    if cfg.vocab_size < 260:
        raise ConfigError(f"data.vocab_size must be set (>= 260) for a byte-level BPE, got {cfg.vocab_size}")
    return BPETokenizer.train(texts, vocab_size=cfg.vocab_size, kind="bytelevel")


def _tokenizer_id(run_dir: Path) -> str:
    return (run_dir / TOKENIZER_FILE).read_text(encoding="utf-8")


# ----------------------------------------------------------------------------------------------
# The loop.


@one_writer("run_dir")
def train_lm(
    recipe: LMRecipe,
    run_dir: str | Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    quiet: bool = False,
    init_from: str | Path | None = None,
    stop_at: int | None = None,
    stream: TextIO | None = None,
    plot: bool = True,
) -> TrainResult:
    """Pretrain (or continue) a GPT as ``recipe`` says, in ``run_dir``.

    Args:
        recipe: Model, data and training settings (``vocab_size`` is replaced by the tokenizer's).
        run_dir: Where everything is written (see :mod:`qkv.runs`).
        resume: Continue from ``run_dir/last``: weights, optimizer, step, sampler and RNG states.
        overwrite: Replace a run that ``run_dir`` already holds.
        quiet: No progress output.
        init_from: Start from another run's weights (and tokenizer) with a fresh optimizer.
        stop_at: Stop after this step as if interrupted (the schedule still ends at ``steps``).
        stream: Where progress goes (stderr by default).
        plot: Draw ``curves.png`` at the end (matplotlib takes a few seconds to import).

    Returns:
        A :class:`~qkv.training.loop.TrainResult`: ``valid`` the last estimate (``loss``, ``train_estimate``),
        ``final`` the full pass over the validation split (``loss``, ``ppl``, ``tokens``).
    """
    run_dir = Path(run_dir)
    tc = recipe.train
    runtime = start(tc)
    device, amp, ranks = runtime.device, runtime.amp, runtime.ranks
    context = recipe.context
    if tc.batch_size % ranks.world_size:
        raise ConfigError(f"train.batch_size={tc.batch_size} does not divide over {ranks.world_size} ranks (every "
                          "rank takes as many windows): make it a multiple of the number of processes")
    if tc.decay_end <= tc.warmup:
        raise ConfigError(f"train: the cosine decay must end after warmup (train.decay_steps or train.steps "
                          f"{tc.decay_end} <= warmup {tc.warmup})")
    if resume and init_from:
        raise ValueError("--resume continues this run; --init-from starts a new one from other weights: pick one")
    if init_from and Path(init_from).resolve() == run_dir.resolve():
        raise ValueError(f"--init-from {init_from} is the run this one would replace: copy it elsewhere and start from "
                         "the copy, or choose another --run")

    # 1. Tokenizer: reloaded when resuming, taken from the source run with --init-from, else built;
    # 2. data: tokenized once into RUN/tokens.bin (reused while text and tokenizer are unchanged).
    # The main rank writes the run directory while any others wait; then every rank reads it.
    def prepare() -> None:
        with Run(run_dir).starting(resume, overwrite):
            text = read_corpus(recipe.data)  # once: the tokenizer is built on it and the corpus tokenized
            if not resume:
                tokenizer = Run(init_from).tokenizer() if init_from else build_tokenizer(
                    recipe.data, [text] + vocabulary_texts(recipe.data))
                tokenizer.save(run_dir)
            tokenizer = load_tokenizer(run_dir)
            resolved = replace(recipe, model=replace(recipe.model, vocab_size=tokenizer.vocab_size))
            if resume:  # its config.json is written once the checkpoint is loaded (resume_state)
                check_same_run(fixed_settings(load_run_recipe(run_dir)), fixed_settings(resolved))
            else:
                save_json(resolved, run_dir / CONFIG_FILE)
            train_text, valid_text = split_text(text, recipe.data.split, recipe.data.valid_fraction)
            tokenize_to_file(train_text, tokenizer, run_dir / TOKENS_FILE, _tokenizer_id(run_dir), valid_text)

    ranks.main_first(prepare)
    tokenizer = load_tokenizer(run_dir)
    recipe = replace(recipe, model=replace(recipe.model, vocab_size=tokenizer.vocab_size))
    data = LMData.from_file(run_dir / TOKENS_FILE, recipe.data.valid_fraction, seed=tc.seed)
    data.check_context(context)

    # 3. Model and optimizer. The seed (set by start) fixes the initial weights and the dropout masks.
    model = GPT(recipe.model).to(device)
    if init_from:
        load_weights(Run(init_from).weights_path(), model)
    optimizer = build_adamw(model, lr=tc.lr, betas=(tc.beta1, tc.beta2), weight_decay=tc.weight_decay)
    wrapped = runtime.wrap(model)  # DDP over the ranks, or the model itself
    state = LoopState()
    metrics = MetricsLogger(run_dir, enabled=runtime.is_main, logger=tc.logger)
    if resume:
        resume_state(run_dir, model, optimizer, state, runtime, metrics, {CONFIG_FILE: to_dict(recipe)}, data=data)
    forward = compiled(wrapped, tc)

    cadence = Cadence(tc, state)
    progress = Progress(total=tc.steps, desc="train lm", log_every=tc.eval_every, start_step=state.step,
                        seconds_left=None if tc.max_minutes is None else tc.max_minutes * 60 - state.seconds,
                        stream=stream, enabled=not quiet and runtime.is_main)
    if not quiet:
        n_params = sum(p.numel() for p in model.parameters())
        progress.write(f"run {run_dir}: {n_params / 1e6:.2f}M parameters, vocab {tokenizer.vocab_size}, "
                       f"{len(data.train):,} train / {len(data.valid):,} valid tokens (by {recipe.data.split}), "
                       f"context {context}, device {device}{' bf16' if amp else ' fp32'}"
                       + (f", {ranks.world_size} ranks" if ranks.world_size > 1 else "")
                       + (f", resuming at step {state.step}" if resume else ""))
    result = TrainResult(run_dir, state.step, best=state.best)
    tokens_per_step = tc.batch_size * context * tc.accumulate

    def evaluate() -> dict[str, float]:
        # Fixed seeds: every evaluation scores the same windows, so the curve is not sampling noise.
        return {split: estimate_loss(model, data.split(split), context, tc.batch_size, tc.eval_iters,
                                     seed=1000 + i, autocast_dtype=amp, ranks=ranks)
                for i, split in enumerate(("train", "valid"))}

    model.train()
    try:
        while cadence.running(stop_at):
            step = cadence.begin_step()
            lr = cosine_lr(step, tc.lr, tc.min_lr, tc.warmup, tc.decay_end)
            set_lr(optimizer, lr)

            # Forward and backward over `accumulate` micro-batches. Each rank trains on its block of every
            # batch's windows, all of which weigh the same: the step's loss is their mean.
            rows = ranks.rows(tc.batch_size)
            share = rank_share(rows.stop - rows.start, tc.batch_size * tc.accumulate, ranks)
            loss_sum = torch.zeros((), device=device)

            def loss_of(i: int) -> torch.Tensor:
                nonlocal loss_sum
                x, y = data.get_batch("train", tc.batch_size, context)  # (B, T) each
                x, y = to_device(x[rows], device), to_device(y[rows], device)  # (B / ranks, T) each
                with autocast(device, amp):
                    logits = forward(x)  # (B / ranks, T, V)
                loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten()) * share
                loss_sum += loss.detach()
                return loss

            accumulate(wrapped, runtime, tc.accumulate, loss_of)
            loss_sum = ranks.sum(loss_sum) / ranks.world_size  # the whole batch's loss, on every rank
            loss_value = update(tc, state, runtime, optimizer, loss_sum, model.parameters(), metrics)
            cadence.end_step()
            if loss_value is not None:  # None: the batch was skipped (train.on_nonfinite: skip)
                result.losses.append(loss_value)
                if cadence.log_due:
                    metrics.log(step, "train", loss=loss_value, lr=lr)
                progress.update(step, loss=loss_value, lr=lr, tokens=tokens_per_step)

            if cadence.eval_due:
                losses = evaluate()
                result.valid = {"loss": losses["valid"], "train_estimate": losses["train"]}
                metrics.log(step, "valid", loss=losses["valid"], train_estimate=losses["train"])
                progress.write(f"step {step}: train loss {losses['train']:.4f}, valid loss {losses['valid']:.4f}")
                if state.improve(losses["valid"]) and runtime.is_main:
                    save_weights(run_dir / BEST_WEIGHTS_NAME, model,
                                 metadata={"step": str(step), "valid_loss": f"{state.best:.6f}"})
                save_state(run_dir, model, optimizer, state, runtime, metrics=metrics, data=data)
            elif (tc.checkpoint_every and step % tc.checkpoint_every == 0) or step == stop_at:
                save_state(run_dir, model, optimizer, state, runtime, metrics=metrics, data=data)
    finally:
        progress.close()
        result.step, result.best, result.train_seconds = state.step, state.best, state.seconds

    step = state.step
    if cadence.last:
        # The export: the best weights (or the last), and a full pass over the validation split.
        ranks.barrier()  # the main rank's best.safetensors is complete before any rank reads it
        if tc.keep_best and (run_dir / BEST_WEIGHTS_NAME).is_file():
            load_weights(run_dir / BEST_WEIGHTS_NAME, model)
        export(run_dir, model, runtime, step=step)
        result.final = evaluate_tokens(model, data.valid, context, batch_size=tc.batch_size, autocast_dtype=amp,
                                       ranks=ranks)
        metrics.log(step, "valid_full", loss=result.final["loss"], ppl=result.final["ppl"],
                    train_seconds=result.train_seconds)
        if not quiet:
            progress.write(f"done: {step} steps in {result.train_seconds:.0f} s; valid loss (full pass) "
                           f"{result.final['loss']:.4f}, perplexity {result.final['ppl']:.2f}")
    result.summary = {"run": str(run_dir), "step": result.step, "train_seconds": round(result.train_seconds, 1),
                      "valid_loss_estimate": result.valid.get("loss"),
                      "best_valid_estimate": result.best if math.isfinite(result.best) else None,
                      "valid_loss_full": result.final.get("loss")}
    metrics.close()
    if not runtime.is_main:
        return result
    if plot:
        try:
            plot_curves(run_dir / METRICS_FILE, run_dir / CURVES_FILE)
        except (ValueError, ImportError):  # nothing logged yet, or no matplotlib: the curves are optional
            pass
    if cadence.last:  # not a run stopped before its end (stop_at)
        Run(run_dir).finish(step)
    return result
