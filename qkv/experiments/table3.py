"""Table 3 of "Attention Is All You Need" (variations on the Transformer), at small scale, by one command.

The paper trains a base model (N 6, d_model 512, d_ff 2048, h 8, d_k = d_v 64, P_drop 0.1, label
smoothing 0.1) and changes one thing per row, every row for the same 100K steps, and scores each on
newstest2013 (per-wordpiece perplexity, and BLEU with beam 4 and no checkpoint averaging). Here the
base is the Multi30K German -> English transformer-small (``qkv/recipes/mt/multi30k_de_en.yaml``:
N 3, d_model 256, d_ff 1024, h 4, d_k = d_v 64), every variant trained for the same number of steps
(a step budget, not wall time: rows stay comparable on a shared machine) and scored on the validation
split the same way. Each row scales the paper's change to this base (half the heads, twice the
depth...), so the two tables line up row by row.

    qkv experiment table3 --out runs/table3            # trains what is missing, then writes the table
    qkv experiment table3 --out runs/table3 --jobs 2   # two variants side by side, one thread each
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

from qkv.experiments.grid import Variant, by_change, read_results, spread
from qkv.interpret.explorer.constants import STATIC_DIR
from qkv.files import as_os_error, atomic_path, write_text
from qkv.runs import METRICS_FILE
from qkv.training.logging import read_metrics
from qkv.training import recipes
from qkv.recipes import MTRecipe
from qkv.training.train_mt import train

BASE_RECIPE = "multi30k_de_en"
# The step budget of every variant: the whole grid in about 3 hours of a fast 2-core machine with two workers,
# and a base at ~25 BLEU; what it costs on each machine, and why: docs/EXPERIMENTS.md ("The budget").
STEPS = 430
SEEDS = (1, 2, 3)  # for the base and rows (A) and (E), where the paper's differences are small

# The plot's ticks: perplexities on its log axis, differences from the base on the symmetric-log ones.
PPL_TICKS = (2, 3, 4, 5, 6, 8, 10, 12, 15, 20, 30, 40, 60, 100)
DELTA_TICKS = (-100, -30, -10, -3, -1, 0, 1, 3, 10, 30, 100)  # even steps on a log scale
# The plot labels a point only beyond these of the base (BLEU points, perplexity ratio): closer ones crowd it.
NEAR_BLEU, NEAR_PPL = 1.0, 1.06


def base_overrides(steps: int) -> list[str]:
    """What turns the shipped recipe into the grid's base: a fixed step budget with no time limit (half of
    it warmup, as the 20-minute Multi30K run that reached 32 BLEU), no checkpoint averaging, the paper's
    decoding for the score (beam 4, alpha 0.6), and a checkpoint at each of four evaluations so that
    an interrupted variant resumes. The paper's base regularisation (P_drop 0.1, label smoothing 0.1) and the
    peak learning rate of the recorded grid are written here, not taken from the recipe: a recipe that adopts
    what ``qkv experiment search`` chose (dropout 0.2) leaves Table 3's base the paper's."""
    return [f"train.steps={steps}", "train.max_minutes=null", f"train.eval_every={max(steps // 4, 1)}",
            "model.dropout=0.1", "train.label_smoothing=0.1", "train.peak_lr=0.001",
            f"train.warmup={max(steps // 2, 1)}", "train.average_last=0", "train.keep_checkpoints=1",
            "train.eval_bleu_sentences=0", "train.patience=0", "train.test_beam=4", "train.test_alpha=0.6",
            "train.threads=1"]


# The paper's Table 3 (newstest2013 perplexity, BLEU, parameters x 10^6), by row and change.
PAPER = {
    "base": {"ppl": 4.92, "bleu": 25.8, "params_m": 65},
    "A h=1": {"ppl": 5.29, "bleu": 24.9}, "A h=4": {"ppl": 5.00, "bleu": 25.5},
    "A h=16": {"ppl": 4.91, "bleu": 25.8}, "A h=32": {"ppl": 5.01, "bleu": 25.4},
    "B d_k=16": {"ppl": 5.16, "bleu": 25.1, "params_m": 58}, "B d_k=32": {"ppl": 5.01, "bleu": 25.4, "params_m": 60},
    "C N=2": {"ppl": 6.11, "bleu": 23.7, "params_m": 36}, "C N=4": {"ppl": 5.19, "bleu": 25.3, "params_m": 50},
    "C N=8": {"ppl": 4.88, "bleu": 25.5, "params_m": 80},
    "C d_model=256": {"ppl": 5.75, "bleu": 24.5, "params_m": 28},
    "C d_model=1024": {"ppl": 4.66, "bleu": 26.0, "params_m": 168},
    "C d_ff=1024": {"ppl": 5.12, "bleu": 25.4, "params_m": 53},
    "C d_ff=4096": {"ppl": 4.75, "bleu": 26.2, "params_m": 90},
    "D P_drop=0.0": {"ppl": 5.77, "bleu": 24.6}, "D P_drop=0.2": {"ppl": 4.95, "bleu": 25.5},
    "D eps_ls=0.0": {"ppl": 4.67, "bleu": 25.3}, "D eps_ls=0.2": {"ppl": 5.47, "bleu": 25.7},
    "E learned": {"ppl": 4.92, "bleu": 25.7},
}

# Our rows: (row, label, overrides, the paper's row it scales, seeds). Heads at constant compute keep
# d_k = d_v = d_model / h (the model's default); row (B) shrinks d_k alone.
ROWS: list[tuple[str, str, tuple[str, ...], str | None, Sequence[int]]] = [
    ("base", "base", (), "base", SEEDS),
    ("A", "h=1", ("model.n_heads=1",), "A h=1", SEEDS),
    ("A", "h=2", ("model.n_heads=2",), "A h=4", SEEDS),
    ("A", "h=8", ("model.n_heads=8",), "A h=16", SEEDS),
    ("A", "h=16", ("model.n_heads=16",), "A h=32", SEEDS),
    ("B", "d_k=16", ("model.d_k=16",), "B d_k=16", (1,)),
    ("B", "d_k=32", ("model.d_k=32",), "B d_k=32", (1,)),
    ("C", "N=1", ("model.n_layers=1",), "C N=2", (1,)),
    ("C", "N=2", ("model.n_layers=2",), "C N=4", (1,)),
    ("C", "N=4", ("model.n_layers=4",), "C N=8", (1,)),
    ("C", "N=6", ("model.n_layers=6",), None, (1,)),
    ("C", "d_model=128", ("model.d_model=128",), "C d_model=256", (1,)),
    ("C", "d_model=384", ("model.d_model=384",), "C d_model=1024", (1,)),
    ("C", "d_ff=512", ("model.d_ff=512",), "C d_ff=1024", (1,)),
    ("C", "d_ff=2048", ("model.d_ff=2048",), "C d_ff=4096", (1,)),
    ("D", "P_drop=0.0", ("model.dropout=0.0",), "D P_drop=0.0", (1,)),
    ("D", "P_drop=0.2", ("model.dropout=0.2",), "D P_drop=0.2", (1,)),
    ("D", "P_drop=0.3", ("model.dropout=0.3",), None, (1,)),
    ("D", "eps_ls=0.0", ("train.label_smoothing=0.0",), "D eps_ls=0.0", (1,)),
    ("D", "eps_ls=0.2", ("train.label_smoothing=0.2",), "D eps_ls=0.2", (1,)),
    ("E", "learned", ("model.positional=learned",), "E learned", SEEDS),
    ("E", "RoPE", ("model.positional=rope",), None, SEEDS),
    ("E", "none", ("model.positional=none",), None, SEEDS),
]


def stem(row: str, label: str) -> str:
    """A variant's name without its seed, as its files are named: ``base``, ``A_h1``, ``D_P_drop00``."""
    return row if label == row else f"{row}_{label}".replace("=", "").replace(".", "")


def variants(rows: Sequence[str] | None = None, max_seeds: int | None = None) -> list[Variant]:
    """The grid, base first, then row by row; ``rows`` keeps some of them, whole rows or single changes by
    their names (``["base", "A", "D_P_drop00"]``)."""
    out = []
    for row, label, overrides, paper, seeds in ROWS:
        if rows and row not in rows and stem(row, label) not in rows:
            continue
        for seed in list(seeds)[:max_seeds]:
            out.append(Variant(name=f"{stem(row, label)}_seed{seed}", row=row, label=label,
                               overrides=(*overrides, f"train.seed={seed}"), seed=seed, tags={"paper": paper}))
    return out


def recipe_of(variant: Variant, steps: int, base: str | Path = BASE_RECIPE, extra: Sequence[str] = ()) -> MTRecipe:
    """The variant's recipe: the base recipe, the grid's budget, then the variant's own changes; its "test"
    is the validation split, which Table 3 reports (the paper's dev set, newstest2013)."""
    cfg = recipes.load("mt", base, [*base_overrides(steps), *extra, *variant.overrides])
    return replace(cfg, data=replace(cfg.data, test=cfg.data.valid))


def train_and_score(variant: Variant, run: Path, resume: bool, steps: int, base: str | Path = BASE_RECIPE,
                    extra: Sequence[str] = (), quiet: bool = True) -> dict[str, Any]:
    """Train (or resume) the variant, then its row of the table: validation perplexity, BLEU, parameters."""
    return {**trained_and_scored(None if resume else recipe_of(variant, steps, base, extra), run, quiet),
            "base_changes": list(extra)}  # the grid's own changes to the base (``model.norm=pre``), if any


def trained_and_scored(cfg: MTRecipe | None, run: Path, quiet: bool = True) -> dict[str, Any]:
    """Train the recipe ``cfg`` into ``run`` (None: resume the run, on its own config as it started), then what
    a grid's table shows of it: steps, time, parameters, the chosen weights' validation NLL and perplexity,
    and the scores of its "test" split (a grid's recipes make it the validation split)."""
    resume = cfg is None
    cfg = recipes.load("mt", None, [], run, resume=True) if resume else cfg
    summary = train(cfg, run, resume=resume, overwrite=not resume, quiet=quiet).summary
    chosen = summary["final"]
    select = [r for r in read_metrics(run / METRICS_FILE) if r["split"] == "select" and r["candidate"] == chosen]
    nll = select[-1]["nll"]
    return {"steps": summary["steps"], "train_seconds": summary["train_seconds"],
            "parameters": summary["parameters"], "nll": nll, "ppl": math.exp(nll),
            "bleu": summary["test"]["bleu"], "chrf": summary["test"]["chrf"], "weights": chosen,
            "bleu_signature": summary["test"].get("bleu_signature"),
            "length_ratio": summary["test"].get("length_ratio")}


def table(results: dict[str, dict[str, Any]], grid: Sequence[Variant]) -> list[dict[str, Any]]:
    """One row per (row, label): the mean and spread over its seeds, beside the paper's numbers.

    Each variant is also compared with the base seed for seed (``bleu_delta``, ``ppl_delta``: the mean and
    spread of variant minus base over the seeds both have, ``paired`` of them). A seed fixes the order
    of the training batches, which the base and the variant share, so the paired differences vary less
    than the two columns' spreads suggest: they are what tells a change from seed noise.
    """
    groups = by_change(grid)
    deltas = paired_deltas(results, grid)
    out = []
    for (row, label), seeds in groups.items():
        found = [results[v.name] for v in seeds if v.name in results]
        paper_row = seeds[0].tags.get("paper")
        entry: dict[str, Any] = {"row": row, "label": label, "seeds": len(found), "paper_row": paper_row,
                                 "paper": PAPER.get(paper_row or "")}
        if found:
            entry["ppl"], entry["ppl_sd"] = spread([r["ppl"] for r in found])
            entry["bleu"], entry["bleu_sd"] = spread([r["bleu"] for r in found])
            entry["parameters"] = found[0]["parameters"]
            entry["steps"] = found[0]["steps"]
        pairs = [deltas[v.name] for v in seeds if v.name in deltas]
        if pairs:
            entry["paired"] = len(pairs)
            for key in ("bleu", "ppl"):
                entry[f"{key}_delta"], entry[f"{key}_delta_sd"] = spread([d[key] for d in pairs])
        out.append(entry)
    return out


def paired_deltas(results: dict[str, dict[str, Any]], grid: Sequence[Variant]) -> dict[str, dict[str, float]]:
    """Each variant's BLEU and perplexity minus those of the base of its seed, by variant name, for the variants
    scored whose base is scored too (the base itself has none)."""
    base = {v.seed: results[v.name] for v in grid if v.row == "base" and v.name in results}
    return {v.name: {key: results[v.name][key] - base[v.seed][key] for key in ("bleu", "ppl")}
            for v in grid if v.row != "base" and v.name in results and v.seed in base}


def against(here: dict[str, dict[str, Any]], there: dict[str, dict[str, Any]], grid: Sequence[Variant]) -> str:
    """Two grids of the same variants (another step budget, machine or base change) side by side: each change's
    difference from the base in each (mean over the seeds paired in both), and for how many of its seeds the
    two differences have the same sign; the totals close the table. What a shorter budget keeps of a
    longer one's conclusions, read seed for seed rather than from the means."""
    a, b = paired_deltas(here, grid), paired_deltas(there, grid)
    name_a, name_b = f"{_budget(here)} steps", f"{_budget(there)} steps"
    if name_a == name_b:
        name_a, name_b = "here", "there"
    lines = ["Each change's perplexity and BLEU minus the base's of the same seed (the same batches), in two grids: "
             "the mean over the seeds scored in both, and for how many of them the two differences have the same "
             "sign. Written by `qkv experiment table3 --against`; see docs/EXPERIMENTS.md.", "",
             f"| row | change | seeds in both | PPL - base, {name_a} | PPL - base, {name_b} | same sign |"
             f" BLEU - base, {name_a} | BLEU - base, {name_b} | same sign |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    totals = {"ppl": [0, 0], "bleu": [0, 0]}
    for (row, label), seeds in by_change(grid).items():
        both = [v.name for v in seeds if v.name in a and v.name in b]
        if not both:
            continue
        cells = []
        for key, digits in (("ppl", 2), ("bleu", 1)):
            same = sum((a[n][key] > 0) == (b[n][key] > 0) for n in both)
            totals[key][0] += same
            totals[key][1] += len(both)
            cells += [f"{statistics.fmean(a[n][key] for n in both):+.{digits}f}",
                      f"{statistics.fmean(b[n][key] for n in both):+.{digits}f}", f"{same} of {len(both)}"]
        lines.append(f"| {row} | {label} | {len(both)} | " + " | ".join(cells) + " |")
    lines.append("| all | | | | | {} of {} | | | {} of {} |".format(*totals["ppl"], *totals["bleu"]))
    return "\n".join(lines) + "\n"


def _budget(results: dict[str, dict[str, Any]]) -> str:
    """The grid's step budget as its results say: ``430`` (``430 / 600`` for a folder that mixes two)."""
    return " / ".join(map(str, sorted({r["steps"] for r in results.values()}))) or "N"


def _delta(r: dict[str, Any], key: str, digits: int) -> str:
    """``+0.3 ± 0.2 (3)``: the paired difference from the base over ``(n)`` seeds, its spread where n > 1."""
    if f"{key}_delta" not in r:
        return ""
    sd = f" ± {r[f'{key}_delta_sd']:.{digits}f}" if r["paired"] > 1 else ""
    return f"{r[f'{key}_delta']:+.{digits}f}{sd} ({r['paired']})"


def markdown(rows: list[dict[str, Any]]) -> str:
    """The table in the paper's layout: ours (mean ± spread over the seeds, and the difference from the base
    seed for seed, with the number of seeds paired) beside the paper's row."""
    lines = ["| row | change | seeds | PPL (valid) | BLEU (valid) | PPL - base, same seeds | BLEU - base, same seeds |"
             " params | paper's row | paper PPL | paper BLEU | paper params |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
    for r in rows:
        paper = r.get("paper") or {}
        ours = ("| - | - | | | -" if "ppl" not in r else
                f"| {r['ppl']:.2f}" + (f" ± {r['ppl_sd']:.2f}" if r["seeds"] > 1 else "") +
                f" | {r['bleu']:.1f}" + (f" ± {r['bleu_sd']:.1f}" if r["seeds"] > 1 else "") +
                f" | {_delta(r, 'ppl', 2)} | {_delta(r, 'bleu', 1)} | {r['parameters'] / 1e6:.2f}M")
        lines.append(f"| {r['row']} | {r['label']} | {r['seeds']} {ours} | {r.get('paper_row') or '(beyond the paper)'}"
                     f" | {format(paper['ppl'], '.2f') if 'ppl' in paper else ''}"
                     f" | {format(paper['bleu'], '.1f') if 'bleu' in paper else ''} | "
                     f"{str(paper['params_m']) + 'M' if 'params_m' in paper else ''} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], out_png: str | Path) -> Path:
    """Three panels. Left: BLEU against perplexity, one point per row of ours (with its spread), the base
    marked, each labelled unless it crowds the base (:func:`_beside`). Then each variant's BLEU and
    perplexity minus the base's, seed for seed (the spread over the paired seeds), against the band of
    seed noise: two runs of the base recipe differ by about sqrt(2) times its seeds' standard deviation."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    fig = Figure(figsize=(15, 5.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax, *diffs = fig.subplots(1, 3, width_ratios=(3, 2, 2))
    colors = {"base": "black", "A": "tab:blue", "B": "tab:orange", "C": "tab:green", "D": "tab:red", "E": "tab:purple"}
    base = next((r for r in rows if r["row"] == "base" and "ppl" in r), None)
    labels: list[tuple[str, float, float]] = []  # (text, perplexity, BLEU), placed once the axes are laid out
    crowded = 0  # points left unlabelled beside the base
    for r in rows:
        if "ppl" not in r:
            continue
        ax.errorbar(r["ppl"], r["bleu"], xerr=r["ppl_sd"] or None, yerr=r["bleu_sd"] or None, fmt="o",
                    color=colors.get(r["row"], "gray"), capsize=3, markersize=6 if r["row"] == "base" else 4)
        if r is not base and base is not None and _beside(r, base):
            crowded += 1  # a dozen labels over one spot hide each other; the right panels name these
            continue
        labels.append((f"{r['row']} {r['label']}" if r is not base else "base", r["ppl"], r["bleu"]))
    if crowded:
        ax.text(0.98, 0.98, f"{crowded} unlabelled points lie within {NEAR_BLEU:g} BLEU and {NEAR_PPL - 1:.0%} "
                "perplexity\nof the base: the panels on the right name each", transform=ax.transAxes,
                ha="right", va="top", fontsize=7)
    ax.set_xscale("log")  # log perplexity is the loss: equal steps are equal ratios, and outliers stay on the page
    ppls = [r["ppl"] for r in rows if "ppl" in r]
    ax.set_xticks([t for t in PPL_TICKS if min(ppls) / 1.2 <= t <= max(ppls) * 1.2])
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("validation perplexity (per BPE token, log scale; lower is better)")
    ax.set_ylabel("validation BLEU, beam 4 (higher is better)")
    ax.set_title("Table 3 at small scale: Multi30K de->en, every variant the same steps")
    ax.grid(True, alpha=0.3)

    paired = [r for r in rows if "bleu_delta" in r][::-1]  # the first row at the top
    seeded = base if base is not None and base.get("seeds", 0) > 1 else None  # a spread to draw the noise from
    # Linear within +-1 (where the seed noise and the small changes lie), logarithmic beyond, so that one
    # variant far off (row (C)'s N=6 loses 19 BLEU) does not flatten the others against zero.
    for diff, key, name, digits in zip(diffs, ("bleu", "ppl"), ("BLEU", "perplexity"), (1, 2)):
        title = f"{name}, each change against the base"
        if seeded is not None:  # named in the title: a legend in the panel covered points
            noise = math.sqrt(2) * seeded[f"{key}_sd"]
            diff.axvspan(-noise, noise, color="gray", alpha=0.2)
            title += f"\n(gray: seed noise, ±{noise:.{digits}f})"
        diff.axvline(0, color="black", linewidth=0.8)
        for y, r in enumerate(paired):
            diff.errorbar(r[f"{key}_delta"], y, xerr=r[f"{key}_delta_sd"] or None, fmt="o", capsize=3, markersize=4,
                          color=colors.get(r["row"], "gray"))
        diff.set_yticks(range(len(paired)), [f"{r['row']} {r['label']} ({r['paired']})" for r in paired], fontsize=7)
        diff.set_xscale("symlog", linthresh=1.0)
        deltas = [r[f"{key}_delta"] for r in paired] or [0.0]
        ticks = [t for t in DELTA_TICKS if abs(t) <= 1 or min(deltas) * 1.5 <= t <= max(deltas) * 1.5]
        diff.set_xticks(ticks, [f"{t:+g}" if t else "0" for t in ticks])
        diff.xaxis.set_minor_formatter(NullFormatter())
        diff.margins(x=0.06)
        diff.set_xlabel(f"{name} - base's, same seeds (n paired)\nlinear within ±1, log beyond")
        diff.set_title(title, fontsize=10)
        diff.grid(True, axis="x", alpha=0.3)
    fig.canvas.draw()  # the layout of all three panels, so that labels are placed where they will be drawn
    _place_labels(ax, labels)
    with atomic_path(out_png) as tmp, as_os_error(tmp):
        fig.savefig(tmp, dpi=110, format="png")
    return Path(out_png)


def _place_labels(ax: Any, labels: list[tuple[str, float, float]], fontsize: float = 7) -> None:
    """Annotate each point (text, x, y) beside it, on the first side where the label stays inside the axes
    and overlaps none placed before: right and above, right and below, left and above, left and below
    (then right and above)."""
    px = ax.figure.dpi / 72  # pixels a point
    width, height = 0.6 * fontsize * px, 1.2 * fontsize * px  # a character's box, roughly
    frame = ax.bbox  # the axes, in pixels
    taken: list[tuple[float, float, float, float]] = []  # (x0, y0, x1, y1) pixels of the labels placed
    sides = ((4, 3, "left"), (4, -3 - fontsize, "left"), (-4, 3, "right"), (-4, -3 - fontsize, "right"))
    for text, x, y in labels:
        cx, cy = ax.transData.transform((x, y))
        w = width * len(text)
        for dx, dy, ha in (*sides, sides[0]):
            x0 = cx + dx * px - (w if ha == "right" else 0)
            box = (x0, cy + dy * px, x0 + w, cy + dy * px + height)
            inside = frame.x0 <= box[0] and box[2] <= frame.x1 and frame.y0 <= box[1] and box[3] <= frame.y1
            if inside and not any(box[0] < t[2] and t[0] < box[2] and box[1] < t[3] and t[1] < box[3] for t in taken):
                break
        taken.append(box)
        ax.annotate(text, (x, y), textcoords="offset points", xytext=(dx, dy), ha=ha, fontsize=fontsize)


def _beside(r: dict[str, Any], base: dict[str, Any]) -> bool:
    """Whether row ``r``'s point lies within :data:`NEAR_BLEU` and :data:`NEAR_PPL` of the base's."""
    ratio = r["ppl"] / base["ppl"]
    return abs(r["bleu"] - base["bleu"]) < NEAR_BLEU and 1 / NEAR_PPL < ratio < NEAR_PPL


def write_report(results: dict[str, dict[str, Any]], grid: Sequence[Variant], out_dir: str | Path) -> list[Path]:
    """``table3.md`` and ``table3.png`` in ``out_dir``, from whatever results exist."""
    rows = table(results, grid)
    out_dir = Path(out_dir)
    caption = ("Ours: the base recipe's validation split (by default Multi30K de->en val, 1,014 pairs), every "
               f"variant {_budget(results)} steps, beam 4, no averaging; mean ± standard deviation over the seeds "
               "scored; the differences from the base pair each seed with the base's (the same batches), (n) seeds "
               "paired. The paper's: newstest2013, its base model trained 100K steps (perplexity per wordpiece, BLEU beam 4). "
               "Written by `qkv experiment table3`; see docs/EXPERIMENTS.md.\n\n")
    md = write_text(out_dir / "table3.md", caption + markdown(rows))
    if any("ppl" in r for r in rows):
        return [md, plot(rows, out_dir / "table3.png")]
    return [md]


# The rows the explorer's multi-head figure shows beside the paper's (the first article's claims: one head
# loses 0.9 BLEU, too many heads lose too, learned positions tie), and the file it reads them from.
EXPLORER_ROWS = (("base", "base"), ("A", "h=1"), ("A", "h=2"), ("A", "h=8"), ("A", "h=16"), ("E", "learned"))
EXPLORER_FILE = STATIC_DIR / "table3.js"


def explorer_table(results: dict[str, dict[str, Any]], grid: Sequence[Variant]) -> dict[str, Any]:
    """``EXPLORER_ROWS`` of :func:`table`, as the explorer's multi-head figure draws them."""
    rows = {(r["row"], r["label"]): r for r in table(results, grid)}
    base_paper = PAPER["base"]["bleu"]
    out = []
    for key in EXPLORER_ROWS:
        r = rows[key]
        paper = r["paper"] or {}
        out.append({
            "row": r["row"], "label": r["label"], "seeds": r["seeds"],
            "bleu": round(r["bleu"], 4), "bleu_sd": round(r["bleu_sd"], 4),
            "bleu_delta": round(r["bleu_delta"], 4) if "bleu_delta" in r else None,
            "bleu_delta_sd": round(r["bleu_delta_sd"], 4) if "bleu_delta_sd" in r else None,
            "paired": r.get("paired"), "paper_row": r["paper_row"], "paper_bleu": paper.get("bleu"),
            "paper_delta": round(paper["bleu"] - base_paper, 1) if "bleu" in paper else None,
        })
    return {"rows": out, "steps": _budget(results)}


def write_explorer_table(results_dir: str | Path, path: Path = EXPLORER_FILE) -> Path:
    """The explorer's ``static/table3.js`` from a results folder (docs/results/table3)."""
    grid = variants()
    data = explorer_table(read_results(results_dir, grid), grid)
    body = json.dumps(data, ensure_ascii=False, indent=1)
    return write_text(path, "/*\n * table3.js: qkv's rows (A) and (E) of Table 3 beside the paper's, for the explorer's "
                      "multi-head figure.\n * Written by qkv.experiments.table3.write_explorer_table('docs/results/table3'); "
                      "strict JSON below.\n */\nglobalThis.QKVTable3 = " + body + ";\n")


__all__ = ["EXPLORER_ROWS", "explorer_table", "write_explorer_table", "BASE_RECIPE", "STEPS", "SEEDS", "PAPER", "ROWS", "stem", "variants", "recipe_of", "train_and_score", "trained_and_scored", "table",
           "paired_deltas", "against", "markdown", "plot", "write_report", "base_overrides"]
