"""Catastrophic forgetting, with a fine-tuning task the model learns, and three cures side by side.

The base is a character-level GPT pretrained on tinyshakespeare (the ``baby`` recipe at context 128,
``BASE_STEPS`` steps), its vocabulary covering the task's characters. The task is the demo corpus of
:mod:`qkv.data.synthetic` as instructions ("Chinese: 小明累了。\\nEnglish:" -> " Xiaoming is tired."):
learnable in a few hundred steps, unlike cmn-eng at this size, and scored on its test split, whose
sentences are all combinations never seen in training. Each variant fine-tunes the same base
(``FINETUNE``) with ``SEEDS`` fine-tuning seeds (batch order, LoRA initialization):

- ``sft``: plain fine-tuning (lambda = 0);
- ``mix``: L_task + lambda * L_pretrain, lambda in ``LAMBDAS``;
- ``kl``: L_task + beta * KL(p_base || p) on the same pretraining windows, beta in ``BETAS``;
- ``lora``: rank-8 adapters on every projection of a frozen base (a higher learning rate, as LoRA wants);
- ``control``: no task at all, the base trained on as many extra pretraining windows as a mixed run
  sees, at the same learning rate: what the mixed runs gain on Shakespeare from pretraining more,
  not from curing anything.

Every run is scored alike (:func:`score`): exact match and BLEU of greedy completions on the test
split, the task loss on the valid split, the Shakespeare validation loss (a full pass) against the
base's, trainable parameters and wall time. Runs live in ``OUT/NAME``, results in ``RESULTS/NAME.json``
(``qkv.experiments.grid``: resumable, several workers side by side).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Sequence

from qkv.settings import apply_overrides, load_recipe
from qkv.data.sft import encode_pairs, load_pairs
from qkv.data.synthetic import DEMO
from qkv.evaluation.bleu import corpus_bleu
from qkv.evaluation.validation import evaluate_tokens, response_loss
from qkv.experiments.grid import Variant, machine, read_results, spread
from qkv.generation.completer import Completer
from qkv.files import read_json, write_json, write_text
from qkv.runs import RESULTS_FILE, Run, load_model
from qkv.training.finetune import FinetuneConfig, FinetuneData, FinetuneRecipe, finetune, pretraining_data
from qkv.recipes import LMRecipe
from qkv.training.lm_run import load_run_recipe
from qkv.training.train_lm import train_lm

BASE_RECIPE = "baby"
BASE_STEPS = 2000
BASE_OVERRIDES = ("model.max_len=128", "train.context=128", "train.eval_every=500")
FINETUNE = dict(steps=300, batch_size=16, pretrain_batch_size=8, lr=1e-3, min_lr=1e-4,
                eval_every=100, eval_iters=10, eval_pairs=200, truncate=False, threads=1)
LORA = dict(lora_rank=8, lora_targets=["in_proj", "out_proj", "w_1", "w_2"], lr=3e-3, min_lr=3e-4)
LAMBDAS = (0.1, 0.3, 1.0)
BETAS = (0.1, 0.3, 1.0)
SEEDS = (1, 2, 3)
TASK_TRAIN, TASK_VALID, TASK_TEST = f"{DEMO}:train", f"{DEMO}:valid", f"{DEMO}:test"
MAX_NEW_TOKENS = 80
BASE_DIR = "base"


def variants(max_seeds: int | None = None) -> list[Variant]:
    """Every variant, seed by seed (all of seed 1 first, so that one pass gives the whole table)."""
    kinds: list[tuple[str, str, dict[str, Any], str]] = [("sft", "sft", {}, "plain SFT (λ = 0)")]
    kinds += [(f"mix{lam:g}", "mix", {"mix": lam}, f"mixed, λ = {lam:g}") for lam in LAMBDAS]
    kinds += [(f"kl{beta:g}", "kl", {"kl": beta}, f"KL to the base, β = {beta:g}") for beta in BETAS]
    kinds += [("lora8", "lora", LORA, "LoRA r = 8"), ("control", "control", {}, "control: pretraining only")]
    seeds = SEEDS[:max_seeds] if max_seeds else SEEDS
    return [Variant(f"{name}_seed{seed}", row, label=label, seed=seed, tags={"settings": settings})
            for seed in seeds for name, row, settings, label in kinds]


def base_recipe(task_text: Path, steps: int = BASE_STEPS) -> LMRecipe:
    """The pretraining recipe: ``baby`` at context 128, its vocabulary covering the task's text."""
    return load_recipe(LMRecipe, "lm", BASE_RECIPE, [
        *BASE_OVERRIDES, f"train.steps={steps}", f"train.decay_steps={steps}", f"train.warmup={max(1, steps // 20)}",
        f"data.vocab_extra=['{task_text}']"])


def prepare_base(out: Path, steps: int = BASE_STEPS, quiet: bool = True) -> Path:
    """Pretrain the base in ``OUT/base`` (resumed if interrupted, skipped if done); return its directory."""
    base = out / BASE_DIR
    if Run(base).exists:
        return base
    task_text = out / "task_text.txt"
    pairs = load_pairs(TASK_TRAIN) + load_pairs(TASK_VALID) + load_pairs(TASK_TEST)
    write_text(task_text, "".join(p.prompt + p.response + "\n" for p in pairs))
    resume = Run(base).has_checkpoint
    recipe = load_run_recipe(base) if resume else base_recipe(task_text, steps)
    train_lm(recipe, base, resume=resume, overwrite=not resume, quiet=quiet)
    return base


def finetune_config(variant: Variant, steps: int) -> FinetuneConfig:
    # Warmup a tenth of the steps (the base: a twentieth, baby's 100 of 2,000).
    return FinetuneConfig(**{**FINETUNE, "steps": steps, "warmup": max(1, steps // 10), "seed": variant.seed,
                             **variant.tags["settings"]})


def score(run: Path, base: Path) -> dict[str, float]:
    """The task (exact match and BLEU on test, task loss on valid) and the Shakespeare valid loss of a run."""
    # Eager: each run is scored once, on weights of its own, so no step built for them would be run again.
    completer = Completer.from_run(run, device="cpu", compile=False)
    test = load_pairs(TASK_TEST)
    hyps: list[str] = []
    for i in range(0, len(test), 100):
        batch = test[i:i + 100]
        hyps += completer.complete_batch([p.prompt for p in batch], max_new_tokens=MAX_NEW_TOKENS, temperature=0,
                                         stop=["\n"])
    refs = [p.response.strip() for p in test]
    hyps = [h.strip() for h in hyps]
    model, tokenizer = completer.model, completer.tokenizer
    recipe = load_run_recipe(base)
    context = recipe.context
    valid = encode_pairs(load_pairs(TASK_VALID), tokenizer, context)
    pad = tokenizer.pad_id if tokenizer.pad_id is not None else 0
    shakespeare = pretraining_data(Run(base), FinetuneConfig(), tokenizer, recipe.data)
    return {"exact_match": 100.0 * sum(h == r for h, r in zip(hyps, refs)) / len(refs),
            "bleu": corpus_bleu(hyps, refs), "task_loss": response_loss(model, valid, pad)["loss"],
            "pretrain_loss": evaluate_tokens(model, shakespeare.valid, context, 32)["loss"],
            "examples": [{"prompt": p.prompt, "output": h} for p, h in zip(test[:3], hyps[:3])]}


def train_and_score(variant: Variant, run: Path, resume: bool, base: Path, steps: int = FINETUNE["steps"],
                    quiet: bool = True) -> dict[str, Any]:
    """Fine-tune (or, for the control, pretrain on) the variant from ``base``, then :func:`score` it."""
    cfg = finetune_config(variant, steps)
    if variant.row == "control":  # the mixed runs' extra pretraining windows, without the task
        recipe = apply_overrides(load_run_recipe(base), [
            f"train.steps={cfg.steps}", f"train.decay_steps={cfg.steps}", f"train.warmup={cfg.warmup}",
            f"train.batch_size={cfg.pretrain_batch_size}", f"train.lr={cfg.lr}", f"train.min_lr={cfg.min_lr}",
            f"train.seed={cfg.seed}", f"train.eval_every={cfg.steps}", f"train.threads={cfg.threads}"])
        result = train_lm(recipe, run, resume=resume, overwrite=not resume, init_from=None if resume else base,
                          quiet=quiet, plot=False)
        seconds, trainable = result.train_seconds, sum(p.numel() for p in load_model(base, device="cpu")[0].parameters())
    else:
        recipe = FinetuneRecipe(FinetuneData(str(base), TASK_TRAIN, TASK_VALID), cfg)
        finetune(recipe, run, resume=resume, overwrite=not resume, quiet=quiet, plot=False)
        saved = read_json(run / RESULTS_FILE, "fine-tuning results")
        seconds, trainable = saved["train_seconds"], saved["trainable_parameters"]
    return {"steps": cfg.steps, "train_seconds": seconds, "trainable_parameters": trainable, **score(run, base)}


METRICS = ("exact_match", "bleu", "task_loss", "pretrain_loss", "train_seconds")


def table(results: dict[str, dict[str, Any]], grid: Sequence[Variant], base: dict[str, float]) -> list[dict[str, Any]]:
    """One row per variant kind: each metric's mean and spread over the seeds scored so far."""
    rows: dict[str, dict[str, Any]] = {}
    for v in grid:
        if v.name not in results:
            continue
        kind = v.name.rsplit("_seed", 1)[0]
        row = rows.setdefault(kind, {"variant": kind, "label": v.label, "group": v.row, "seeds": [],
                                     "trainable_parameters": results[v.name]["trainable_parameters"]})
        row["seeds"].append(results[v.name])
    out = []
    for row in rows.values():
        scored = row.pop("seeds")
        row["n_seeds"] = len(scored)
        for m in METRICS:
            row[m], row[f"{m}_sd"] = spread([r[m] for r in scored])
        row["forgetting"] = row["pretrain_loss"] - base["pretrain_loss"]
        out.append(row)
    return out


def markdown(rows: list[dict[str, Any]], base: dict[str, float]) -> str:
    lines = ["| variant | seeds | trainable | test exact match % | test BLEU | valid task loss | "
             "Shakespeare valid loss (base " f"{base['pretrain_loss']:.3f}) | change | s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['label']} | {r['n_seeds']} | {r['trainable_parameters']:,} | "
                     f"{r['exact_match']:.1f} ± {r['exact_match_sd']:.1f} | {r['bleu']:.1f} ± {r['bleu_sd']:.1f} | "
                     f"{r['task_loss']:.3f} ± {r['task_loss_sd']:.3f} | {r['pretrain_loss']:.3f} ± "
                     f"{r['pretrain_loss_sd']:.3f} | {r['forgetting']:+.3f} | {r['train_seconds']:.0f} |")
    lines.append(f"| base (no fine-tuning) | | | {base['exact_match']:.1f} | {base['bleu']:.1f} | "
                 f"{base['task_loss']:.3f} | {base['pretrain_loss']:.3f} | | |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], base: dict[str, float], out_png: Path) -> Path:
    """The trade-off: task BLEU against the Shakespeare loss kept, one point per variant with its spread (BLEU,
    not exact match: on sentences that are all unseen combinations nearly every variant gets a word wrong)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    colors = {"sft": "tab:red", "mix": "tab:blue", "kl": "tab:green", "lora": "tab:purple", "control": "tab:gray"}
    for r in rows:
        ax.errorbar(r["pretrain_loss"], r["bleu"], xerr=r["pretrain_loss_sd"], yerr=r["bleu_sd"],
                    fmt="o", color=colors[r["group"]], capsize=3)
        ax.annotate(r["variant"], (r["pretrain_loss"], r["bleu"]), textcoords="offset points",
                    xytext=(5, 4), fontsize=8)
    ax.axvline(base["pretrain_loss"], color="k", linestyle="--", linewidth=1, label="the base's Shakespeare loss")
    ax.set_xlabel("Shakespeare validation loss after (nats per character; left is better)")
    ax.set_ylabel("task: BLEU on unseen test sentences")
    ax.set_title("forgetting against learning")
    ax.legend(fontsize="small", loc="best")
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=110)
    return out_png


def write_report(results_dir: Path, grid: Sequence[Variant]) -> list[Path]:
    """``RESULTS/forgetting.md`` and ``.png`` from the results there are (and the base's own scores)."""
    base_file = results_dir / "base.json"
    if not base_file.is_file():
        return []
    base = read_json(base_file, "the base's scores")
    rows = table(read_results(results_dir, grid), grid, base)
    md = results_dir / "forgetting.md"
    write_text(md, markdown(rows, base))
    return [md, plot(rows, base, results_dir / "forgetting.png")] if rows else [md]


def score_base(base: Path, results_dir: Path) -> dict[str, Any]:
    """The base's own scores, the row every variant is compared with (``RESULTS/base.json``, written once)."""
    path = results_dir / "base.json"
    if not path.is_file():
        scores = score(base, base)
        write_json(path, {**scores, "steps": load_run_recipe(base).train.steps,
                          "perplexity": math.exp(scores["pretrain_loss"]), "date": time.strftime("%Y-%m-%d"),
                          "machine": machine()})
    return read_json(path, "the base's scores")


__all__ = ["variants", "prepare_base", "train_and_score", "score", "score_base", "write_report", "table"]
