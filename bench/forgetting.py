"""The forgetting experiment in one command: pretrain on Shakespeare, fine-tune on cmn-eng, measure what is lost.

    python bench/forgetting.py --config bench/forgetting.yaml --out runs/forgetting [section.key=value ...]

1. Pretrain a character-level GPT on tinyshakespeare, its vocabulary also covering the cmn-eng text
   (``pretrain`` section of the config; skipped if ``OUT/base`` is already finished).
2. Fine-tune the base on cmn-eng as instructions ("Chinese: 我累了。\\nEnglish:" -> " I'm tired."), once
   per variant: L = L_task + lambda * L_pretrain for each lambda, and LoRA adapters on a frozen base for
   each rank (``finetune`` section; a finished variant is skipped, so the command can be re-run).
3. Evaluate each: the Shakespeare validation loss (a full pass) before and after, the task loss on
   cmn-eng valid (response tokens only) and BLEU of greedy translations of cmn-eng valid (sacreBLEU).

Writes ``OUT/results.json``, ``OUT/table.md`` and ``OUT/forgetting.png``; ``--doc FILE`` also writes
a Markdown report with the command, date, machine and budgets.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import shlex
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from qkv.config import apply_overrides, from_dict  # noqa: E402
from qkv.data.sft import load_pairs  # noqa: E402
from qkv.training.finetune import FinetuneConfig, FinetuneRecipe, finetune  # noqa: E402
from qkv.runs import MODEL_WEIGHTS_NAME  # noqa: E402
from qkv.training.lm_run import LMRecipe, load_run_recipe  # noqa: E402
from qkv.training.train_lm import train_lm  # noqa: E402


@dataclass(frozen=True)
class ExperimentConfig:
    """The ``experiment`` section: which variants, and how the task is scored."""

    task: str = "cmn-eng"
    lambdas: list[float] = field(default_factory=lambda: [0.0, 0.1, 0.3, 1.0])
    lora_ranks: list[int] = field(default_factory=lambda: [8])
    lora_lr: float = 3e-3
    bleu_pairs: int = 1000
    max_new_tokens: int = 120
    threads: int = 0


@dataclass(frozen=True)
class ForgettingConfig:
    pretrain: LMRecipe = field(default_factory=LMRecipe)
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)
    experiment: ExperimentConfig = field(default_factory=ExperimentConfig)


def load_config(path: str, overrides: list[str]) -> ForgettingConfig:
    import yaml

    data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    cfg = ForgettingConfig(
        pretrain=from_dict(LMRecipe, data.get("pretrain", {}), where=f"{path} (pretrain)"),
        finetune=from_dict(FinetuneRecipe, data.get("finetune", {}), where=f"{path} (finetune)").train,
        experiment=from_dict(ExperimentConfig, data.get("experiment", {}), where=f"{path} (experiment)"),
    )
    unknown = set(data) - {"pretrain", "finetune", "experiment"}
    if unknown:
        raise ValueError(f"{path}: unknown sections {sorted(unknown)}; expected pretrain, finetune, experiment")
    return apply_overrides(cfg, overrides) if overrides else cfg


def machine() -> str:
    """CPU model, core count and torch threads, for the report."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} CPUs, torch {torch.__version__}, {torch.get_num_threads()} threads"


def bleu(run_dir: Path, pairs, max_new_tokens: int) -> tuple[float, list[str]]:
    """Corpus BLEU of greedy completions of the prompts against the responses, and the first few completions."""
    from qkv.evaluation.bleu import corpus_bleu
    from qkv.generation.completer import Completer

    completer = Completer.from_run(run_dir, device="cpu")
    hyps = []
    for i in range(0, len(pairs), 64):
        batch = pairs[i:i + 64]
        longest = max(len(completer.tokenizer.encode(p.prompt)) for p in batch)
        n = min(max_new_tokens, completer.context - longest)
        hyps += completer.complete_batch([p.prompt for p in batch], max_new_tokens=n, temperature=0, stop=["\n"])
    refs = [p.response.strip() for p in pairs]
    return corpus_bleu([h.strip() for h in hyps], refs), hyps[:5]


def plot(rows: list[dict], base_loss: float, out_png: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 3.6), layout="constrained")
    FigureCanvasAgg(fig)
    ax1, ax2 = fig.subplots(1, 2)
    names = [r["variant"] for r in rows]
    ax1.bar(names, [r["shakespeare_after"] for r in rows], color="tab:red", label="after fine-tuning")
    ax1.axhline(base_loss, color="k", linestyle="--", label=f"before ({base_loss:.3f})")
    ax1.set_ylabel("Shakespeare valid loss (nats/char)")
    ax1.set_ylim(min(base_loss, *[r["shakespeare_after"] for r in rows]) * 0.9, None)
    ax1.legend(fontsize="small")
    ax1.set_title("forgetting (lower is better)")
    ax2.bar(names, [r["task_loss_after"] for r in rows], color="tab:blue")
    ax2.set_ylabel("cmn-eng valid task loss (nats/char)")
    ax2.set_title("task (lower is better)")
    for ax in (ax1, ax2):
        ax.tick_params(axis="x", rotation=30)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="bench/forgetting.yaml")
    ap.add_argument("--out", default="runs/forgetting")
    ap.add_argument("--doc", help="also write a Markdown report here (e.g. docs/results/forgetting.md)")
    ap.add_argument("overrides", nargs="*", metavar="section.key=value")
    args = ap.parse_args()
    cfg = load_config(args.config, args.overrides)
    ex = cfg.experiment
    if ex.threads:
        import torch

        torch.set_num_threads(ex.threads)
    out = Path(args.out)
    t_start = time.perf_counter()
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")

    # 1. Pretrain (or reuse a finished base).
    base = out / "base"
    t0 = time.perf_counter()
    if not (base / MODEL_WEIGHTS_NAME).is_file():
        resume = (base / "last.pt").is_file()
        recipe = load_run_recipe(base) if resume else cfg.pretrain
        train_lm(recipe, base, resume=resume)
    pretrain_seconds = time.perf_counter() - t0
    base_metrics = [json.loads(line) for line in (base / "metrics.jsonl").read_text().splitlines()]
    base_full = [r for r in base_metrics if r["split"] == "valid_full"][-1]

    # 2. Fine-tune each variant on the same data.
    task = ex.task
    train_pairs = load_pairs(f"{task}:train")
    valid_pairs = load_pairs(f"{task}:valid")
    variants = [(f"lambda={lam:g}", replace(cfg.finetune, mix=lam)) for lam in ex.lambdas]
    variants += [(f"LoRA r={r}", replace(cfg.finetune, lora_rank=r, lr=ex.lora_lr, min_lr=ex.lora_lr / 10))
                 for r in ex.lora_ranks]
    rows = []
    before_bleu = None
    for name, ft in variants:
        run = out / name.replace("=", "").replace(" ", "_")
        results_file = run / "results.json"
        if not results_file.is_file():
            resume = (run / "last.pt").is_file()
            finetune(base, run, train_pairs, valid_pairs, ft, resume=resume, data_spec=f"{task}:train")
        res = json.loads(results_file.read_text())
        score, examples = bleu(run, valid_pairs[: ex.bleu_pairs], ex.max_new_tokens)
        if before_bleu is None:
            before_bleu, _ = bleu(base, valid_pairs[: ex.bleu_pairs], ex.max_new_tokens)
        rows.append({
            "variant": name, "mix": ft.mix, "lora_rank": ft.lora_rank, "lr": ft.lr, "steps": res["steps"],
            "trainable_parameters": res["trainable_parameters"], "train_seconds": round(res["train_seconds"], 1),
            "shakespeare_before": res["before"]["pretrain_loss"], "shakespeare_after": res["after"]["pretrain_loss"],
            "task_loss_before": res["before"]["task_loss"], "task_loss_after": res["after"]["task_loss"],
            "bleu": score, "examples": examples,
        })
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "examples"}), flush=True)

    # 3. Report.
    shakespeare_before = rows[0]["shakespeare_before"]
    summary = {
        "started": started, "command": shlex.join(["python"] + sys.argv), "machine": machine(),
        "config": dataclasses.asdict(cfg), "pretrain_seconds": round(pretrain_seconds, 1),
        "base": {"shakespeare_valid_loss": base_full["loss"], "steps": base_full["step"], "bleu": before_bleu,
                 "vocab_size": load_run_recipe(base).model.vocab_size,
                 "task_loss": rows[0]["task_loss_before"]},
        "variants": rows, "total_seconds": round(time.perf_counter() - t_start, 1),
    }
    (out / "results.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    table = [
        "| variant | trainable params | Shakespeare valid loss before -> after (change) | cmn-eng task loss before -> after | BLEU |",
        "|---|---:|---|---|---:|",
    ]
    for r in rows:
        table.append(
            f"| {r['variant']} | {r['trainable_parameters']:,} | {r['shakespeare_before']:.3f} -> "
            f"{r['shakespeare_after']:.3f} ({r['shakespeare_after'] - r['shakespeare_before']:+.3f}) | "
            f"{r['task_loss_before']:.3f} -> {r['task_loss_after']:.3f} | {r['bleu']:.1f} |"
        )
    table.append(f"| base (no fine-tuning) | | {shakespeare_before:.3f} | {rows[0]['task_loss_before']:.3f} | "
                 f"{before_bleu:.1f} |")
    (out / "table.md").write_text("\n".join(table) + "\n", encoding="utf-8")
    plot(rows, shakespeare_before, out / "forgetting.png")
    print("\n".join(table))
    if args.doc:
        write_doc(Path(args.doc), summary, table, out)
    return 0


def write_doc(path: Path, summary: dict, table: list[str], out: Path) -> None:
    import shutil

    path.parent.mkdir(parents=True, exist_ok=True)
    png = path.with_suffix(".png")
    shutil.copyfile(out / "forgetting.png", png)
    pre, ft = summary["config"]["pretrain"], summary["config"]["finetune"]
    lines = [
        "# Catastrophic forgetting and its cures (small CPU budget)",
        "",
        f"Run {summary['started']} on {summary['machine']}; total {summary['total_seconds'] / 60:.1f} min.",
        "",
        "```",
        summary["command"],
        "```",
        "",
        f"Pretraining: character-level GPT, {pre['model']['n_layers']} layers x {pre['model']['d_model']}, context "
        f"{pre['train']['context']}, vocabulary {summary['base']['vocab_size']} (tinyshakespeare + cmn-eng "
        f"train characters), {pre['train']['steps']} steps of {pre['train']['batch_size']} windows, seed "
        f"{pre['train']['seed']}; Shakespeare valid loss (full pass) {summary['base']['shakespeare_valid_loss']:.3f}.",
        f"Fine-tuning: {ft['steps']} steps of {ft['batch_size']} cmn-eng pairs (lr {ft['lr']:g}, cosine, seed "
        f"{ft['seed']}); with lambda > 0 each step adds {ft['pretrain_batch_size']} Shakespeare windows. "
        "BLEU: greedy, sacreBLEU on the first "
        f"{summary['config']['experiment']['bleu_pairs']} cmn-eng valid pairs.",
        "",
        *table,
        "",
        f"![forgetting]({png.name})",
        "",
    ]
    path.write_text("\n".join(lines), encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
