"""Train a translation Transformer: the paper's recipe (Section 5), as one linear function that reads top to bottom.

    qkv train mt --recipe demo --run runs/demo
    qkv train mt --run runs/demo --resume train.steps=3000     # continue after an interruption

The recipe: a joint BPE vocabulary (5.1); token-budget batches of similar lengths (5.1); Adam with
beta1 = 0.9, beta2 = 0.98, epsilon = 1e-9 and a learning rate that rises linearly for ``warmup`` steps
then decays with the inverse square root of the step (5.3); dropout on sub-layer outputs and
embedding sums, and label smoothing 0.1 (5.4); plus what practice adds: gradient clipping and
accumulation, periodic validation (loss, and BLEU on a sample), best and last checkpoints, the
average of the last K checkpoints (6.1: "averaging the last 5 checkpoints"), early stopping, and an
exact resume.

Everything a run produces is in its directory (:mod:`qkv.runs`): ``config.json`` (the resolved recipe),
``tokenizer.json``,
``model.safetensors`` (the weights to use), ``last.*`` (the full trainer state), ``best.safetensors``,
``step_N.safetensors`` (the last K, for averaging), ``metrics.jsonl``, ``curves.png`` and
``results.json`` (test scores).
"""

from __future__ import annotations

import math
import random
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from qkv.config import ALPHA, MAX_TOKENS
from qkv.errors import ConfigError
from qkv.settings import load_json, save_json, to_dict
from qkv.data.translation import (
    BatchStream, encode_pairs, filter_by_length, load_split, train_joint_bpe,
)
from qkv.evaluation.bleu import score
from qkv.evaluation.validation import translation_loss
from qkv.generation.api import Translator
from qkv.devices import autocast, evaluating, model_device
from qkv.files import write_json, write_text
from qkv.parallel import SINGLE, Ranks
from qkv.recipes import MTRecipe
from qkv.models.transformer import Transformer
from qkv.runs import (
    AVERAGE_WEIGHTS_NAME, BEST_WEIGHTS_NAME, CONFIG_FILE, CURVES_FILE, METRICS_FILE, MODEL_WEIGHTS_NAME, RESULTS_FILE, STEP_PREFIX, Run,
    one_writer,
)
from qkv.tokenizers import load_tokenizer
from qkv.weights import average_checkpoints, load_state_dict_into, load_weights, save_weights
from qkv.training.logging import MetricsLogger, Progress
from qkv.training.loop import (
    Cadence, LoopState, TrainResult, accumulate, check_same_run, compiled, export,
    fixed_settings, rank_share, resume_state, save_state, start, update,
)
from qkv.evaluation.losses import label_smoothed_nll
from qkv.training.optim import build_adam
from qkv.training.plots import plot_curves
from qkv.training.schedules import inverse_sqrt_lr, noam_lr, set_lr


def learning_rate(cfg: MTRecipe, step: int) -> float:
    """The schedule: linear warmup, then inverse square root of the step (Section 5.3, equation 3)."""
    tc = cfg.train
    if tc.peak_lr is not None:
        return inverse_sqrt_lr(step, tc.warmup, tc.peak_lr)
    return noam_lr(step, cfg.model.d_model, tc.warmup, tc.lr_factor)


def translate_and_score(model, tok, src: list[str], ref: list[str], beam: int, alpha: float = ALPHA,
                        max_tokens: int = MAX_TOKENS, ranks: Ranks = SINGLE,
                        amp: torch.dtype | None = None) -> tuple[dict[str, Any], list[str]]:
    """Translate ``src`` and score it against ``ref`` with sacreBLEU; the model's train/eval mode is kept.

    With ``ranks``, each rank translates every ``world_size``-th sentence and every rank scores them all.
    With ``amp``, the search runs under the run's autocast, as its training and validation loss do.
    """
    mine = [src[i] for i in ranks.share(len(src))]
    with evaluating(model), autocast(model_device(model), amp):
        hyps = Translator(model, tok, max_tokens=max_tokens).translate(mine, beam=beam, alpha=alpha, truncate=True)
    hyps = ranks.collect(hyps, len(src))
    return score(hyps, ref), hyps


@one_writer("run_dir")
def train(recipe: MTRecipe, run_dir: str | Path, *, resume: bool = False, overwrite: bool = False,
          quiet: bool = False, desc: str = "train") -> TrainResult:
    """Train (or resume) a translation model as ``recipe`` says, in ``run_dir``.

    Args:
        recipe: the resolved configuration (on resume: the run's own, possibly with overrides).
        run_dir: where everything is written.
        resume: continue from ``run_dir/last.*`` exactly where it stopped.
        overwrite: replace an existing run in ``run_dir``.
        quiet: no progress output (tests).
        desc: label of the progress bar.

    Returns:
        A :class:`~qkv.training.loop.TrainResult`: ``valid`` the last validation (``loss``, ``nll``, ``ppl``,
        and ``bleu``, ``chrf`` on a sample), ``final`` the test scores of the weights chosen, ``summary``
        results.json (steps, why it stopped, the weights chosen, the test).
    """
    run_dir = Path(run_dir)
    cfg = recipe
    tc = cfg.train
    runtime = start(tc)
    device, amp, ranks = runtime.device, runtime.amp, runtime.ranks
    log = (lambda *a: None) if quiet or not ranks.is_main else (lambda msg: print(msg, file=sys.stderr, flush=True))

    # 1. Data and the joint BPE vocabulary, learned on the training pairs only (Section 5.1). The main
    #    rank prepares the run directory and the tokenizer while any others wait; then all read them.
    d = cfg.data
    train_src, train_tgt = load_split(d, d.train)
    valid_src, valid_tgt = load_split(d, d.valid)
    if not valid_src:  # evaluation, best and final weights are all chosen on it
        raise ConfigError(f"data: the validation split {d.valid!r} of {d.corpus} is empty, but a translation run "
                          "evaluates on it (train.eval_every) and picks its final weights by it: give it sentences "
                          "(data.demo_valid for the demo corpus)")
    if cfg.model.max_len < max(d.max_src_len, d.max_tgt_len) + 1:
        raise ConfigError(f"model.max_len={cfg.model.max_len} is too small for data.max_src_len={d.max_src_len} / "
                          f"max_tgt_len={d.max_tgt_len} (plus <bos>/<eos>)")

    def prepare() -> None:
        with Run(run_dir).starting(resume, overwrite):
            if not resume:
                train_joint_bpe(train_src, train_tgt, d.vocab_size, d.corpus).save(run_dir)
            tok = load_tokenizer(run_dir)
            # The model's vocabulary is the tokenizer's; the config saved is the one that actually ran. A
            # resume writes it once its checkpoint is loaded (resume_state): a resume that fails changes nothing.
            resolved = replace(cfg, model=replace(cfg.model, vocab_size=tok.vocab_size, pad_id=tok.pad_id))
            if resume:
                saved = load_json(Path(run_dir) / CONFIG_FILE, MTRecipe)
                check_same_run(fixed_settings(saved), fixed_settings(resolved))
            else:
                save_json(resolved, run_dir / CONFIG_FILE)

    ranks.main_first(prepare)
    tok = load_tokenizer(run_dir)
    cfg = replace(cfg, model=replace(cfg.model, vocab_size=tok.vocab_size, pad_id=tok.pad_id))
    train_examples, dropped = filter_by_length(encode_pairs(tok, train_src, train_tgt), d.max_src_len, d.max_tgt_len)
    # Validation pairs are all kept, except those longer than the model's positions.
    valid_examples, _ = filter_by_length(encode_pairs(tok, valid_src, valid_tgt), cfg.model.max_len - 1,
                                         cfg.model.max_len - 1)
    stream = BatchStream(train_examples, d.max_tokens, tok.pad_id, tok.bos_id, tok.eos_id, seed=tc.seed)
    # A fixed sample of validation sentences for BLEU during training (the same at every evaluation).
    sample = sorted(random.Random(tc.seed).sample(range(len(valid_src)), min(tc.eval_bleu_sentences, len(valid_src))))
    log(f"data: {d.corpus} {d.src_lang}->{d.tgt_lang}: {len(train_examples)} training pairs "
        f"({len(dropped)} dropped by length), {len(valid_examples)} validation; vocabulary {tok.vocab_size}; "
        f"{stream.batches_per_epoch} batches of <= {d.max_tokens} tokens per epoch, "
        f"padding {stream.epoch_padding_fraction():.1%}")

    # 2. Model and optimizer: Adam(0.9, 0.98, 1e-9), the rate set by the schedule before every update.
    model = Transformer(cfg.model).to(device)
    optimizer = build_adam(model, lr=0.0, betas=tc.adam_betas, eps=tc.adam_eps, weight_decay=tc.weight_decay)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params:,} parameters (d_model {cfg.model.d_model}, {cfg.model.n_layers}+{cfg.model.decoder_layers} "
        f"layers, {cfg.model.n_heads} heads, d_ff {cfg.model.d_ff}) on {device}"
        + (f", {ranks.world_size} ranks sharing each batch" if ranks.world_size > 1 else ""))
    wrapped = runtime.wrap(model)  # DDP over the ranks, or the model itself
    forward = compiled(wrapped, tc)

    # 3. Resume: weights, optimizer, RNG states, data position and the bookkeeping below.
    state = LoopState()
    metrics = MetricsLogger(run_dir, enabled=runtime.is_main, logger=tc.logger)
    if resume:
        resume_state(run_dir, model, optimizer, state, runtime, metrics, {CONFIG_FILE: to_dict(cfg)}, data=stream)

    cadence = Cadence(tc, state)
    progress = Progress(tc.steps, desc=desc, log_every=tc.log_every, start_step=state.step,
                        enabled=not quiet and runtime.is_main,
                        seconds_left=None if tc.max_minutes is None else tc.max_minutes * 60 - state.seconds)
    model.train()
    stop_reason = None
    result = TrainResult(run_dir, state.step, best=state.best)
    window = {"loss": 0.0, "nll": 0.0, "tokens": 0, "steps": 0, "padding": 0.0, "t0": time.perf_counter()}

    def evaluate(step: int) -> dict[str, Any]:
        values = translation_loss(model, valid_examples, d.max_tokens, tok, tc.label_smoothing, device, ranks, amp)
        if sample:
            scores, _ = translate_and_score(model, tok, [valid_src[i] for i in sample], [valid_tgt[i] for i in sample],
                                            tc.eval_beam, tc.test_alpha, d.max_tokens, ranks, amp)
            values["bleu"], values["chrf"] = scores["bleu"], scores["chrf"]
        metrics.log(step, "valid", **values)
        return values

    # 4. The training loop.
    while cadence.running():
        step = cadence.begin_step()
        lr = learning_rate(cfg, step)
        set_lr(optimizer, lr)
        # Gradient accumulation: the update is the mean over all target tokens of the `accumulate`
        # batches. With several ranks each trains on its block of every batch's sentences, holding its own
        # number of target tokens: its mean loss weighs its share of the step's tokens (rank_share).
        batches = [next(stream) for _ in range(tc.accumulate)]
        total_tokens = sum(b.tgt_tokens for b in batches)  # of the whole step, on every rank
        step_loss = torch.zeros(2, device=device)  # loss, nll: this rank's part of the step's mean

        def loss_of(i: int) -> torch.Tensor:
            nonlocal step_loss
            whole = batches[i]
            rows = ranks.rows(whole.size)
            # A batch may hold fewer pairs than there are ranks (the last cut of an epoch's length
            # order often does). A rank left without a pair still runs forward and backward, as DDP
            # needs every rank to, on a stand-in (the batch's first pair) weighted 0: it adds nothing,
            # and the step equals one process's.
            own = rows.stop > rows.start
            batch = whole.rows(rows if own else slice(0, 1), tok.pad_id).to(device)
            # All target positions at once (teacher forcing); the vocabulary projection only for the
            # real ones, not the padding.
            keep = batch.tgt_out != tok.pad_id  # (b, T)
            with autocast(device, amp):
                logits = forward(batch.src, batch.tgt_in, keep=keep)  # (N, V)
            out = label_smoothed_nll(logits.float(), batch.tgt_out[keep], tc.label_smoothing, ignore_index=tok.pad_id)
            share = rank_share(batch.tgt_tokens if own else 0, total_tokens, ranks)
            step_loss += torch.stack([out.loss.detach(), out.nll.detach()]) * (share / ranks.world_size)
            return out.loss * share

        accumulate(wrapped, runtime, len(batches), loss_of)
        step_loss, step_nll = ranks.sum(step_loss)  # the step's mean over all its target tokens
        loss_value = update(tc, state, runtime, optimizer, step_loss, model.parameters(), metrics)
        cadence.end_step()

        if loss_value is not None:  # None: the batch was skipped (train.on_nonfinite: skip)
            result.losses.append(loss_value)
            n_tok = sum(b.src_tokens + b.tgt_tokens for b in batches)
            window["loss"] += loss_value
            window["nll"] += float(step_nll)
            window["tokens"] += n_tok
            window["steps"] += 1
            window["padding"] += sum(b.padding_fraction for b in batches) / len(batches)
            progress.update(step, loss=loss_value, lr=lr, tokens=n_tok)
        if cadence.log_due and window["steps"]:
            k = window["steps"]
            elapsed = time.perf_counter() - window["t0"]
            metrics.log(step, "train", loss=window["loss"] / k, nll=window["nll"] / k, lr=lr,
                        tokens_per_s=window["tokens"] / max(elapsed, 1e-9), padding=window["padding"] / k,
                        epoch=stream.epoch)
            window = {"loss": 0.0, "nll": 0.0, "tokens": 0, "steps": 0, "padding": 0.0, "t0": time.perf_counter()}

        if cadence.eval_due:
            values = result.valid = evaluate(step)
            improved = state.improve(values["nll"] if tc.best_metric == "loss" else -values["bleu"])
            if runtime.is_main:
                if improved:
                    save_weights(run_dir / BEST_WEIGHTS_NAME, model, metadata={"step": str(step)})
                save_weights(run_dir / f"{STEP_PREFIX}{step:07d}.safetensors", model)
                for old in Run(run_dir).step_weights()[: -max(tc.keep_checkpoints, 1)]:
                    old.unlink()
            save_state(run_dir, model, optimizer, state, runtime, metrics=metrics, data=stream)
            bleu = f", BLEU {values['bleu']:.1f}" if "bleu" in values else ""
            progress.write(f"step {step}: valid loss {values['loss']:.3f}, ppl {values['ppl']:.2f}{bleu}"
                           + ("" if improved else f" (no improvement {state.bad_evals}/{tc.patience or '-'})"))
            if tc.patience and state.bad_evals >= tc.patience:
                stop_reason = "early_stop"
                break
    progress.close()
    step, train_seconds = result.step, result.train_seconds = state.step, state.seconds
    result.best = state.best
    stop_reason = stop_reason or cadence.stop_reason
    ranks.barrier()  # the main rank's step and best weights are complete before any rank reads them

    # 5. The final weights: the average of the last K checkpoints (Section 6.1), the best, or the
    #    last, whichever has the lowest validation NLL.
    last_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    candidates = {"last": lambda: load_state_dict_into(model, last_state, source="last")}
    steps_saved = Run(run_dir).step_weights()[-tc.average_last:] if tc.average_last > 1 else []
    if len(steps_saved) > 1:
        averaged = average_checkpoints(steps_saved)
        candidates["average"] = lambda: load_state_dict_into(model, averaged, source="average")
    if (run_dir / BEST_WEIGHTS_NAME).is_file():
        candidates["best"] = lambda: load_weights(run_dir / BEST_WEIGHTS_NAME, model)
    chosen, chosen_nll = "last", math.inf
    for name, load in candidates.items():
        load()
        if name == "average" and runtime.is_main:  # kept: `--weights average` scores it beside the others
            save_weights(run_dir / AVERAGE_WEIGHTS_NAME, model,
                         metadata={"step": str(step), "averaged": str(len(steps_saved))})
        nll = translation_loss(model, valid_examples, d.max_tokens, tok, tc.label_smoothing, device, ranks, amp)["nll"]
        metrics.log(step, "select", candidate=name, nll=nll)
        if nll < chosen_nll - 1e-9:
            chosen, chosen_nll = name, nll
    candidates[chosen]()
    export(run_dir, model, runtime, step=step, chosen=chosen)
    log(f"final weights: {chosen} (validation NLL {chosen_nll:.3f}) -> {run_dir / MODEL_WEIGHTS_NAME}")

    # 6. Test: the paper's decoding (beam 4, alpha 0.6) on the held-out test split.
    summary: dict[str, Any] = {"run_dir": str(run_dir), "steps": step, "stop": stop_reason, "final": chosen,
                               "train_seconds": round(train_seconds, 1), "parameters": n_params}
    try:
        test_src, test_tgt = load_split(d, d.test)
    except (ValueError, FileNotFoundError) as e:
        log(f"no test evaluation: {e}")
        test_src = []
    if test_src:
        t0 = time.perf_counter()
        scores, hyps = translate_and_score(model, tok, test_src, test_tgt, tc.test_beam, tc.test_alpha, d.max_tokens,
                                           ranks, amp)
        if ranks.is_main:
            write_text(run_dir / f"{d.test}.hyp", "\n".join(hyps) + "\n")
        metrics.log(step, "test", bleu=scores["bleu"], chrf=scores["chrf"], exact=scores["exact"], beam=tc.test_beam)
        summary["test"] = result.final = {**scores, "split": d.test, "beam": tc.test_beam,
                                          "seconds": round(time.perf_counter() - t0, 1)}
        log(f"test ({d.test}, beam {tc.test_beam}): BLEU {scores['bleu']:.2f}, chrF {scores['chrf']:.2f}")
    metrics.close()
    result.summary = summary
    if not ranks.is_main:
        return result
    write_json(run_dir / RESULTS_FILE, summary)
    try:
        plot_curves(run_dir / METRICS_FILE, run_dir / CURVES_FILE)
    except ValueError as e:
        log(f"no curves: {e}")
    Run(run_dir).finish(step)
    return result


__all__ = ["train", "learning_rate",
           "translate_and_score"]
