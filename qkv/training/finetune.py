"""Supervised fine-tuning of a pretrained GPT, with the two cures for catastrophic forgetting.

    qkv finetune --run runs/base --data pairs.jsonl --out runs/sft                # plain SFT
    qkv finetune --run runs/base --data cmn-eng:train --out runs/mix --mix 0.3    # mixed loss
    qkv finetune --run runs/base --data cmn-eng:train --out runs/lora --lora 8    # LoRA adapters

Fine-tuning starts from the base run's weights only, with a fresh optimizer and schedule (this is
``--init-from``, not ``--resume``; ``--resume`` continues an interrupted fine-tuning run exactly). The
task loss is the next-token NLL on the response tokens only (:mod:`qkv.data.sft`).

Training on the task alone moves every weight toward the task and away from what pretraining taught:
the pretraining loss climbs back up (catastrophic forgetting). Three cures (docs/EXPERIMENTS.md):

- the mixed loss L = L_task + lambda * L_pretrain, where each step also takes a batch of random windows
  of the pretraining corpus, so the weights are pulled to fit both; lambda = 0 is plain fine-tuning;
- a KL term, L = L_task + beta * KL(p_base || p), on the same windows: the fine-tuned model's
  next-token distributions are held to the frozen base model's (distillation from the base), which
  asks for what the base predicted, all of it, rather than for the corpus's next tokens;
- LoRA: the base weights are frozen and only low-rank adapters train (:mod:`qkv.modules.lora`); they
  are merged into the weights at the end, so the exported model is a plain GPT.

The run directory has the layout of a pretraining run (so ``qkv generate --run`` works on it) plus
``finetune.json`` (settings) and ``results.json`` (task and pretraining losses before and after).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, TextIO

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import Tensor, nn

from qkv.errors import ConfigError, DataError
from qkv.settings import save_json, to_dict
from qkv.data.corpora import list_corpora, read_text
from qkv.data.lm import TOKENS_FILE, LMData, split_text, token_dtype
from qkv.data.sft import PairSampler, encode_pairs, fingerprint, load_pairs
from qkv.evaluation.validation import estimate_loss, evaluate_tokens, response_loss
from qkv.devices import autocast, to_device
from qkv.files import atomic_path, read_json, read_text_file, write_json
from qkv.models.gpt import GPT
from qkv.modules.lora import DEFAULT_TARGETS, apply_lora, lora_state_dict, merge_lora
from qkv.runs import (
    ADAPTER_FILE, CONFIG_FILE, CURVES_FILE, FINETUNE_FILE, METRICS_FILE, RESULTS_FILE, Run, one_writer, require_arch,
)
from qkv.recipes import LMDataConfig, LoopConfig, check_adam, check_rates
from qkv.training.lm_run import load_run_recipe
from qkv.training.logging import MetricsLogger, Progress
from qkv.training.loop import (
    Cadence, LoopState, TrainResult, accumulate, check_same_run, compiled,
    export, rank_share, resume_state, save_state, start, update,
)
from qkv.evaluation.losses import masked_nll
from qkv.training.optim import build_adamw
from qkv.training.plots import plot_curves
from qkv.training.schedules import cosine_lr, set_lr
from qkv.weights import load_weights


@dataclass(frozen=True)
class FinetuneConfig(LoopConfig):
    """Fine-tuning settings: :class:`~qkv.recipes.LoopConfig`'s knobs plus these (the ``train:`` section of
    a fine-tuning recipe, or the ``train:`` of a ``finetune:`` section of a larger YAML file).

    Attributes:
        batch_size: Task examples per micro-batch.
        lr, min_lr: The cosine schedule's peak and final rate (it ends at ``steps``).
        weight_decay: AdamW decay on matrices (it pulls toward zero, not toward the base weights).
        beta1, beta2: AdamW betas.
        mix: lambda in L = L_task + lambda * L_pretrain (0: plain fine-tuning).
        kl: beta in L = L_task + beta * KL(p_base || p) on pretraining windows (0: none); keeps a frozen
            copy of the base model.
        pretrain_text: The pretraining text to mix in and to measure forgetting on: a UTF-8 file or a
            registered corpus name (tokenized with the base run's tokenizer). Empty: the base run's
            tokens.bin; a run without one (a converted GPT-2) then fine-tunes without mixing and
            without a pretraining loss.
        pretrain_batch_size: Windows per pretraining batch (0: ``batch_size``).
        lora_rank: Rank of the LoRA adapters (0: full fine-tuning).
        lora_alpha: LoRA scale numerator (0: 2 * rank).
        lora_targets: Linear layers that get adapters.
        lora_dropout: Dropout on the adapters' input.
        truncate: Cut examples longer than the context instead of refusing them.
        eval_iters: Batches of the pretraining valid estimate during training.
        eval_pairs: Valid pairs scored during training (0: all); the final evaluation uses all.
    """

    steps: int = 500
    warmup: int = 50
    eval_every: int = 100
    log_every: int = 10
    seed: int = 1234
    batch_size: int = 16
    lr: float = 3e-4
    min_lr: float = 3e-5
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.99
    mix: float = 0.0
    kl: float = 0.0
    pretrain_text: str = ""
    pretrain_batch_size: int = 0
    lora_rank: int = 0
    lora_alpha: float = 0.0
    lora_targets: list[str] = field(default_factory=lambda: list(DEFAULT_TARGETS))
    lora_dropout: float = 0.0
    truncate: bool = False
    eval_iters: int = 20
    eval_pairs: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("batch_size", "eval_iters"):
            if getattr(self, name) < 1:
                raise ConfigError(f"train.{name} must be >= 1, got {getattr(self, name)}")
        if self.mix < 0:
            raise ConfigError(f"train.mix (lambda) must be >= 0, got {self.mix}")
        if self.kl < 0:
            raise ConfigError(f"train.kl (beta) must be >= 0, got {self.kl}")
        if self.lora_rank < 0:
            raise ConfigError(f"train.lora_rank must be >= 0 (0: no LoRA), got {self.lora_rank}")
        check_rates(self.lr, self.min_lr)
        if self.steps <= self.warmup:
            raise ConfigError(f"train: steps {self.steps} must exceed warmup {self.warmup}")
        check_adam(self.weight_decay, (self.beta1, self.beta2))


@dataclass(frozen=True)
class FinetuneData:
    """What a fine-tuning run learns from: its base run (the model, its tokenizer and its pretraining corpus)
    and the task pairs, each a JSONL file of ``{prompt, response}`` or ``CORPUS:SPLIT``
    (:func:`qkv.data.sft.load_pairs`). On the command line: ``--run``, ``--data`` and ``--valid``.

    Attributes:
        base_run: The pretrained run directory.
        train: The task pairs trained on.
        valid: Held-out pairs for the task loss ("": none measured).
    """

    base_run: str = ""
    train: str = ""
    valid: str = ""


@dataclass(frozen=True)
class FinetuneRecipe:
    """A fine-tuning recipe: ``data:`` (the base run and the task pairs) and ``train:``; no ``model:``, since the
    model is the base run's. A recipe file usually holds only ``train:``, the command line naming the data."""

    data: FinetuneData = field(default_factory=FinetuneData)
    train: FinetuneConfig = field(default_factory=FinetuneConfig)


class Losses(NamedTuple):
    """One micro-batch's losses: ``total`` is what is backpropagated."""

    total: Tensor
    task: Tensor
    pretrain: Tensor | None
    kl: Tensor | None


def distillation_kl(logits: Tensor, base_logits: Tensor) -> Tensor:
    """KL(p_base || p), the mean over positions: zero exactly when the two next-token distributions agree.

    Args:
        logits: (B, T, V) of the model being fine-tuned.
        base_logits: (B, T, V) of the frozen base model on the same windows.
    """
    log_p = F.log_softmax(logits.float().flatten(0, 1), dim=-1)  # (B T, V)
    log_base = F.log_softmax(base_logits.float().flatten(0, 1), dim=-1)  # (B T, V)
    return F.kl_div(log_p, log_base, log_target=True, reduction="batchmean")


def finetune_loss(
    model: nn.Module,
    task_batch: tuple[Tensor, Tensor, Tensor],
    pretrain_batch: tuple[Tensor, Tensor] | None,
    mix: float,
    amp: torch.dtype | None = None,
    task_share: float = 1.0,
    kl: float = 0.0,
    base: nn.Module | None = None,
) -> Losses:
    """L = L_task + lambda * L_pretrain + beta * KL(p_base || p).

    Args:
        model: The GPT.
        task_batch: ``(x, y, mask)`` from :func:`qkv.data.sft.collate`; only masked targets count.
        pretrain_batch: ``(x, y)`` windows of the pretraining corpus, or None when ``mix`` and ``kl`` are 0.
        mix: lambda.
        amp: Autocast dtype (bf16 on CUDA) or None.
        task_share: The weight of the task loss in ``total``: a data-parallel rank's share of the
            batch's response tokens, times the number of ranks (1 for one process).
        kl: beta; needs ``base``, the frozen base model.

    Returns:
        :class:`Losses`; ``pretrain`` (``kl``) is None when no pretraining batch was given or ``mix``
        (``kl``) is 0, and with neither ``total`` is exactly ``task``.
    """
    device = next(model.parameters()).device
    x, y, mask = (to_device(t, device) for t in task_batch)
    with autocast(device, amp):
        logits = model(x)  # (B, T, V)
    task = masked_nll(logits.float(), y, mask).loss
    total, pretrain, divergence = task * task_share, None, None
    if pretrain_batch is None or (mix == 0 and kl == 0):
        return Losses(total, task, None, None)
    px, py = (to_device(t, device) for t in pretrain_batch)
    with autocast(device, amp):
        plogits = model(px)  # (B, T, V)
    if mix > 0:
        pretrain = F.cross_entropy(plogits.float().flatten(0, 1), py.flatten())
        total = total + mix * pretrain
    if kl > 0:
        if base is None:
            raise ValueError("finetune_loss: kl > 0 needs the frozen base model")
        with torch.no_grad(), autocast(device, amp):
            base_logits = base(px)  # (B, T, V)
        divergence = distillation_kl(plogits, base_logits)
        total = total + kl * divergence
    return Losses(total, task, pretrain, divergence)


def pretraining_data(base: Run, cfg: FinetuneConfig, tokenizer, data: LMDataConfig) -> LMData | None:
    """The pretraining text for the mixed loss and for measuring forgetting (``cfg.pretrain_text``, else
    the base run's tokens.bin), split as the base run's recipe (``data``) splits its corpus; None if there is
    none."""
    if cfg.pretrain_text:
        path = Path(cfg.pretrain_text)
        if not path.is_file() and cfg.pretrain_text not in {c.name for c in list_corpora()}:
            raise DataError(f"train.pretrain_text={cfg.pretrain_text!r} is neither a file nor a registered corpus "
                            "(qkv data list)")
        text = read_text_file(path) if path.is_file() else read_text(cfg.pretrain_text)
        train_text, valid_text = split_text(text, data.split, data.valid_fraction)

        def encode(part: str) -> np.ndarray:
            return np.asarray(tokenizer.encode(part), dtype=token_dtype(tokenizer.vocab_size))

        if valid_text is None:
            return LMData.from_tokens(encode(text), data.valid_fraction, seed=cfg.seed + 1)
        return LMData(encode(train_text), encode(valid_text), seed=cfg.seed + 1)
    if base.tokens_path is not None:
        return LMData.from_file(base.tokens_path, data.valid_fraction, seed=cfg.seed + 1)
    return None


def _fixed(record: dict[str, Any]) -> dict[str, Any]:
    """What a fine-tuning run's checkpoint fixes, from its ``finetune.json``: the base run, the task data
    (the samplers' saved positions count in it: its path, and its examples' fingerprint, which a file
    edited in place changes) and the adapters' shape and scale."""
    def where(path: str) -> str:
        return str(Path(path).resolve()) if path and Path(path).exists() else path

    tuning = record.get("finetune", {})
    examples = {"--data's examples (sha256)": record["data_sha256"]} if "data_sha256" in record else {}
    return {"--run": where(record.get("base_run", "")), "--data": where(record.get("data", "")), **examples,
            **{f"train.{key}": tuning[key] for key in ("lora_rank", "lora_alpha", "lora_targets") if key in tuning}}


@one_writer("run_dir")
def finetune(
    recipe: FinetuneRecipe,
    run_dir: str | Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    quiet: bool = False,
    stop_at: int | None = None,
    stream: TextIO | None = None,
    plot: bool = True,
) -> TrainResult:
    """Fine-tune the GPT of ``recipe.data.base_run`` on ``recipe.data.train`` into ``run_dir``.

    Args:
        recipe: The base run, the task pairs and the settings (``train.mix`` for the mixed loss,
            ``train.kl`` for distillation, ``train.lora_rank`` for LoRA).
        run_dir: The new run directory.
        resume: Continue ``run_dir/last`` exactly (weights, optimizer, samplers, RNGs).
        overwrite: Replace a run that ``run_dir`` already holds.
        quiet: No progress output.
        stop_at: Stop after this step as if interrupted.
        stream: Where progress goes (stderr by default).
        plot: Draw ``curves.png`` at the end.

    Returns:
        A :class:`~qkv.training.loop.TrainResult`: ``final`` the ``task_loss`` and ``pretrain_loss`` after (the
        latter a full pass over the pretraining corpus's validation split), ``summary`` results.json, whose
        ``before`` holds the same before the first step.
    """
    data, cfg = recipe.data, recipe.train
    if not data.base_run or not data.train:
        raise ConfigError("fine-tuning needs a base run and task pairs: data.base_run (--run) and data.train (--data)")
    base_run, out_dir = Path(data.base_run), Path(run_dir)
    train_pairs = load_pairs(data.train)
    valid_pairs = load_pairs(data.valid) if data.valid else None
    runtime = start(cfg)
    device, amp, ranks = runtime.device, runtime.amp, runtime.ranks
    require_arch(Run(base_run), "gpt", "qkv finetune")
    recipe = load_run_recipe(base_run)
    context = recipe.context
    if out_dir.resolve() == base_run.resolve():
        raise ValueError("--out must differ from the base --run (the base weights would be overwritten)")
    base = Run(base_run)
    tokenizer = base.tokenizer()
    pretrain_bs = cfg.pretrain_batch_size or cfg.batch_size
    for name, size in (("batch_size", cfg.batch_size), ("pretrain_batch_size", pretrain_bs)):
        if size % ranks.world_size:
            raise ConfigError(f"train.{name}={size} does not divide over {ranks.world_size} ranks: make it a "
                              "multiple of the number of processes")

    # The pretraining text, for the mixed loss and for measuring forgetting: read before anything is
    # written, so that a run asked to mix with nothing to mix leaves no directory behind.
    pretrain = pretraining_data(base, cfg, tokenizer, recipe.data)
    if pretrain is None and (cfg.mix > 0 or cfg.kl > 0):
        cure = f"train.mix={cfg.mix:g}" if cfg.mix > 0 else f"train.kl={cfg.kl:g}"
        raise ConfigError(f"{cure} needs pretraining text, and {base_run} has no {TOKENS_FILE} "
                          "(a converted GPT-2 has none): pass --pretrain-text FILE or a corpus name")
    if pretrain is not None:
        pretrain.check_context(context)

    # Data: the task examples (too long ones refused here, unless train.truncate).
    pad_id = tokenizer.pad_id if tokenizer.pad_id is not None else 0
    train_examples = encode_pairs(train_pairs, tokenizer, context, cfg.truncate)
    valid_examples = encode_pairs(valid_pairs, tokenizer, context, cfg.truncate) if valid_pairs else []
    eval_examples = valid_examples[: cfg.eval_pairs] if cfg.eval_pairs else valid_examples
    sampler = PairSampler(train_examples, cfg.batch_size, pad_id, seed=cfg.seed)

    # Model: the base weights only (a fresh optimizer and schedule), then adapters if LoRA. The seed
    # is set again here so that the adapters' initialization does not depend on what was read before.
    torch.manual_seed(cfg.seed)
    model = GPT(recipe.model).to(device)
    load_weights(base.weights_path(), model)

    # Everything read and checked (the base run, its weights, the data): only now is the run written.
    record = {"base_run": str(base_run), "data": data.train, "data_sha256": fingerprint(train_pairs),
              "finetune": to_dict(cfg)}

    def prepare() -> None:  # the main rank writes the run directory; any others wait
        with Run(out_dir).starting(resume, overwrite):
            if resume:  # its records are written once its checkpoint is loaded (resume_state)
                check_same_run(_fixed(read_json(out_dir / FINETUNE_FILE, "fine-tuning record")), _fixed(record))
                return
            tokenizer.save(out_dir)
            save_json(recipe, out_dir / CONFIG_FILE)
            write_json(out_dir / FINETUNE_FILE, record)

    ranks.main_first(prepare)
    if cfg.lora_rank:
        apply_lora(model, cfg.lora_rank, cfg.lora_alpha or None, cfg.lora_targets, cfg.lora_dropout)
    optimizer = build_adamw(model, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), weight_decay=cfg.weight_decay)
    wrapped = runtime.wrap(model)  # DDP over the ranks, or the model itself
    forward = compiled(wrapped, cfg)
    frozen = None  # the base model as it was, for the KL cure: never trained, never saved
    if cfg.kl > 0:
        frozen = GPT(recipe.model).to(device).eval().requires_grad_(False)
        load_weights(base.weights_path(), frozen)

    def evaluate(full: bool) -> dict[str, float]:
        out: dict[str, float] = {}
        examples = valid_examples if full else eval_examples
        if examples:
            out["task_loss"] = response_loss(model, examples, pad_id, cfg.batch_size * 2, amp, ranks)["loss"]
        if pretrain is None:
            return out  # nothing to measure forgetting on
        if full:
            out["pretrain_loss"] = evaluate_tokens(model, pretrain.valid, context, 32, autocast_dtype=amp,
                                                   ranks=ranks)["loss"]
        else:
            out["pretrain_loss"] = estimate_loss(model, pretrain.valid, context, pretrain_bs, cfg.eval_iters,
                                                 seed=1001, autocast_dtype=amp, ranks=ranks)
        return out

    state = LoopState()
    streams = {"task_data": sampler, **({"pretrain_data": pretrain} if pretrain is not None else {})}
    metrics = MetricsLogger(out_dir, enabled=runtime.is_main, logger=cfg.logger)
    if resume:
        saved = resume_state(out_dir, model, optimizer, state, runtime, metrics,
                             {CONFIG_FILE: to_dict(recipe), FINETUNE_FILE: record}, **streams)
        before = {k: float(v) for k, v in saved["before"].items()}
    else:
        before = evaluate(full=True)
        metrics.log(0, "valid", loss=before.get("task_loss"), pretrain_loss=before.get("pretrain_loss"))

    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    cadence = Cadence(cfg, state)
    progress = Progress(total=cfg.steps, desc="finetune", log_every=cfg.eval_every, start_step=state.step,
                        stream=stream, enabled=not quiet and runtime.is_main)
    progress.write(f"finetune {base_run} -> {out_dir}: {len(train_examples):,} examples, "
                   f"{n_train / 1e6:.3f}M trainable parameters"
                   + (f", LoRA rank {cfg.lora_rank}" if cfg.lora_rank else "") + f", lambda {cfg.mix:g}"
                   + (f", KL beta {cfg.kl:g}" if cfg.kl else "") + "; before: "
                   + ", ".join(f"{k} {v:.4f}" for k, v in before.items()))
    result = TrainResult(out_dir, state.step, summary={"before": before})

    def checkpoint() -> None:
        save_state(out_dir, model, optimizer, state, runtime, extra={"before": before}, metrics=metrics, **streams)

    model.train()
    try:
        while cadence.running(stop_at):
            step = cadence.begin_step()
            lr = cosine_lr(step, cfg.lr, cfg.min_lr, cfg.warmup, cfg.steps)
            set_lr(optimizer, lr)
            # Each rank trains on its block of every batch's rows. Its task loss is weighted by its share
            # of the batch's response tokens (times the ranks: DDP averages), so the update is the one
            # one process makes on the whole batch; pretraining windows all weigh the same.
            sums = torch.zeros(3, device=device)  # task, pretrain, KL: this rank's part of the step's means

            def loss_of(i: int) -> Tensor:
                nonlocal sums
                x, y, mask = sampler.next()  # (B, T) each, the whole batch on every rank
                rows = ranks.rows(len(x))
                share = rank_share(float(mask[rows].sum()), float(mask.sum()), ranks)
                pre_batch = None
                if cfg.mix > 0 or cfg.kl > 0:
                    px, py = pretrain.get_batch("train", pretrain_bs, context)
                    pre_rows = ranks.rows(pretrain_bs)
                    pre_batch = (px[pre_rows], py[pre_rows])
                losses = finetune_loss(forward, (x[rows], y[rows], mask[rows]), pre_batch, cfg.mix, amp,
                                       task_share=share, kl=cfg.kl, base=frozen)
                parts = [losses.task.detach() * share] + [
                    torch.zeros((), device=device) if t is None else t.detach() for t in (losses.pretrain, losses.kl)]
                sums += torch.stack(parts) / (cfg.accumulate * ranks.world_size)
                return losses.total / cfg.accumulate

            accumulate(wrapped, runtime, cfg.accumulate, loss_of)
            task_sum, pre_sum, kl_sum = ranks.sum(sums)  # the whole step's task, pretraining and KL losses
            loss_value = update(cfg, state, runtime, optimizer, task_sum + cfg.mix * pre_sum + cfg.kl * kl_sum,
                                (p for p in model.parameters() if p.requires_grad), metrics)
            cadence.end_step()
            if loss_value is not None:  # None: the batch was skipped (train.on_nonfinite: skip)
                task_value, pre_value = task_sum.item(), pre_sum.item()
                result.losses.append(loss_value)
                if cadence.log_due:
                    extra = {"pretrain_loss": pre_value} if cfg.mix > 0 else {}
                    extra.update({"kl": kl_sum.item()} if cfg.kl > 0 else {})
                    metrics.log(step, "train", loss=task_value, total_loss=loss_value, lr=lr, **extra)
                progress.update(step, loss=loss_value, lr=lr)
            if cadence.last:
                checkpoint()  # the final evaluation, a full pass, follows the loop
            elif cadence.eval_due:
                ev = result.valid = evaluate(full=False)
                metrics.log(step, "valid", loss=ev.get("task_loss"), pretrain_loss=ev.get("pretrain_loss"))
                progress.write(f"step {step}: " + ", ".join(f"{k} {v:.4f}" for k, v in ev.items()))
                checkpoint()
            elif step == stop_at:
                checkpoint()
    finally:
        progress.close()
        result.step, result.train_seconds, result.best = state.step, state.seconds, state.best

    step = state.step
    if cadence.last:
        if cfg.lora_rank and runtime.is_main:
            with atomic_path(out_dir / ADAPTER_FILE) as tmp:
                save_file({k: v.contiguous().cpu() for k, v in lora_state_dict(model).items()}, str(tmp))
        if cfg.lora_rank:
            merge_lora(model)  # the export is a plain GPT
        export(out_dir, model, runtime, step=step, base_run=base_run)
        after = result.final = evaluate(full=True)
        metrics.log(step, "valid", loss=after.get("task_loss"), pretrain_loss=after.get("pretrain_loss"))
        result.summary = {"before": before, "after": after, "steps": step, "train_seconds": result.train_seconds,
                          "mix": cfg.mix, "kl": cfg.kl, "lora_rank": cfg.lora_rank, "trainable_parameters": n_train}
        if runtime.is_main:
            write_json(out_dir / RESULTS_FILE, result.summary)
        progress.write("after: " + ", ".join(f"{k} {v:.4f}" for k, v in after.items())
                       + f" ({result.train_seconds:.0f} s)")
    metrics.close()
    if plot and runtime.is_main:
        try:
            plot_curves(out_dir / METRICS_FILE, out_dir / CURVES_FILE)
        except (ValueError, ImportError):
            pass
    if cadence.last and runtime.is_main:  # not a run stopped before its end (stop_at)
        Run(out_dir).finish(step)
    return result
