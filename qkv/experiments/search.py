"""The search for the best translator a recipe's budget trains: one knob at a time around a recipe of
``qkv/recipes/mt/``, every variant the same steps, chosen on the validation split.

The knobs are those the work on small, low-resource Transformers turns (model width and depth, pre- or
post-LayerNorm, dropout and attention dropout, label smoothing, the size of the joint BPE vocabulary,
warmup and peak learning rate, tokens a batch). Short runs come first (a quarter of the recipe's step
budget and at least twice its warmup, on the recipe's own schedule), and the best few then run at the whole budget
(``--steps`` the budget, ``--knobs`` the few), and a second round puts winners together (``--knobs
dropout-0.2+peak_lr-0.002``: one variant of both). Every variant is scored on the validation split (beam 4,
length penalty 0.6, the last or the best checkpoint, whichever has the lower validation loss; no
averaging): no test set is read, so none is tuned on.

    qkv experiment search --recipe multi30k_de_en --jobs 2           # the short runs, two side by side
    qkv experiment search --recipe multi30k_de_en --report           # the table and the plot of what is there

A grid of qkv.experiments.grid: resumable, results in ``docs/results/search/RECIPE-STEPS``; the table and the
plot (validation BLEU against each knob's value) beside them; docs/EXPERIMENTS.md says what came of it.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Sequence

from qkv.data.translation import load_split
from qkv.evaluation.bleu import score
from qkv.experiments.grid import Variant, by_change, claim, read_results, result_path, spread
from qkv.experiments.table3 import paired_deltas, trained_and_scored
from qkv.files import as_os_error, atomic_path, write_json, write_text
from qkv.generation.api import Translator
from qkv.recipes import MTRecipe
from qkv.runs import AVERAGE_WEIGHTS_NAME, Run, load_model
from qkv.training import average_checkpoints, load_state_dict_into, recipes, save_weights

# Each recipe's budget: the optimizer steps it trained in the README's time on the 2-core machine, one thread
# (docs/results/multi30k.md, cmn_eng.md). The search counts steps, not minutes, so that its runs compare on a
# shared machine; the table shows what each variant's steps cost in time beside the base's.
BUDGETS = {"multi30k_de_en": 3452, "multi30k_en_de": 1403, "cmn_eng_zh_en": 2407}
SHORT = 4  # a short run trains budget / SHORT steps, and at least twice the recipe's warmup

# The knobs, in the order the short runs take them (first those whose effect shows early: the optimisation
# and the vocabulary; regularisation pays late), and the values tried beside the recipe's own.
KNOBS: dict[str, tuple[Any, ...]] = {
    "model.norm": ("pre",),
    "train.peak_lr": (5.0e-4, 2.0e-3),
    "data.vocab_size": (4000, 12000),
    "train.warmup": (200, 800),
    "data.max_tokens": (1500, 4000),
    "model.n_layers": (2, 4),
    "model.d_model": (384,),
    "model.dropout": (0.2, 0.3),
    "model.attn_dropout": (0.1,),
    "train.label_smoothing": (0.0, 0.2),
}
# The length penalties (GNMT's alpha, Section 6.1's 0.6 among them) at which the checkpoint average of every
# run at the whole budget is decoded: choosing one changes no training, so it is chosen on those runs.
LENGTH_PENALTIES = (0.0, 0.6, 1.0, 2.0, 3.0)
# A wider model keeps the base's shape: heads of 64 dimensions, d_ff four times d_model.
COUPLED: dict[str, Callable[[Any], tuple[str, ...]]] = {
    "model.d_model": lambda d: (f"model.n_heads={d // 64}", f"model.d_ff={4 * d}"),
}
# Variants joined by this make one variant of them all (a row of its own in the table and the plot).
COMBINED, COMBINED_ROW = "+", "combined"


def short_steps(recipe: str) -> int:
    """The steps of a short run of ``recipe``: a quarter of its budget, but at least twice its warmup (at most
    the budget). A run that ends inside the warmup ranks the warmup and nothing else: a quarter of en->de's
    1,403 steps is 350, all of them inside its 400 of warmup, and scored 16 BLEU against 34 at the budget."""
    if recipe not in BUDGETS:
        raise ValueError(f"no step budget is known for the recipe {recipe!r}; the search knows {sorted(BUDGETS)} "
                         "(give --steps)")
    warmup = recipes.load("mt", recipe).train.warmup
    return min(BUDGETS[recipe], max(BUDGETS[recipe] // SHORT, 2 * warmup))


def search_overrides(steps: int, whole: bool = False) -> list[str]:
    """What turns a shipped recipe into the search's base: a step budget and no time limit, no averaging (the
    trainer keeps the last or the best checkpoint, whichever has the lower validation loss), scored with beam 4
    on every validation sentence, one thread. A short run evaluates halfway (a checkpoint to resume from) and
    at the end and keeps one checkpoint; a run at the ``whole`` budget evaluates its loss at the recipe's own
    cadence and keeps the recipe's step checkpoints, on which checkpoint averaging is chosen afterwards."""
    cadence = [] if whole else [f"train.eval_every={max(steps // 2, 1)}", "train.keep_checkpoints=1"]
    return [f"train.steps={steps}", "train.max_minutes=null", *cadence, "train.average_last=0",
            "train.eval_bleu_sentences=0", "train.patience=0", "train.best_metric=loss", "train.test_beam=4",
            "train.test_alpha=0.6", "train.threads=1"]


def whole_budget(recipe: str | Path, steps: int) -> bool:
    """Whether ``steps`` is the recipe's whole budget (or more); a recipe of no known budget runs what it is given."""
    return steps >= BUDGETS.get(Path(recipe).stem, 0)


def name_of(key: str, value: Any) -> str:
    """A variant's name without its seed: ``dropout-0.2``, ``norm-pre``."""
    return f"{key.split('.')[-1]}-{value}"


def singles() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Each one-knob variant by name (:func:`name_of`), in the order of :data:`KNOBS`: its knob and its overrides."""
    return {name_of(key, value): (key, (f"{key}={value}", *COUPLED.get(key, lambda _: ())(value)))
            for key, values in KNOBS.items() for value in values}


def variants(knobs: Sequence[str] | None = None, seeds: int = 1,
             base: dict[str, Any] | None = None) -> list[Variant]:
    """The base, then each value of each knob (``knobs``: only these keys or variant names, and combinations
    of variants, :func:`combination`), ``seeds`` seeds each; none that ``base`` (:func:`base_knobs`) already
    is (:func:`same_as_base`)."""
    one, same = singles(), set(same_as_base(base or {}))
    cells = [("base", "base", ()), *((key, stem, overrides) for stem, (key, overrides) in one.items()
                                     if stem not in same)]
    combined = dict.fromkeys(COMBINED.join(combination(k)) for k in knobs or () if COMBINED in k)  # in order, once
    cells += [(COMBINED_ROW, stem, tuple(o for part in stem.split(COMBINED) for o in one[part][1]))
              for stem in combined if not same & set(stem.split(COMBINED))]
    out = []
    for row, stem, overrides in cells:
        if knobs and row not in ("base", COMBINED_ROW) and row not in knobs and stem not in knobs:
            continue
        for seed in range(1, seeds + 1):
            out.append(Variant(name=f"{stem}_seed{seed}", row=row, label=stem, seed=seed,
                               overrides=(*overrides, f"train.seed={seed}")))
    return out


def same_as_base(base: dict[str, Any]) -> list[str]:
    """The variants whose value is the base's own (``base``: :func:`base_knobs`): a recipe that adopted a
    variant's value (dropout 0.2) would train the base again under the variant's name."""
    return [name_of(key, value) for key, values in KNOBS.items() for value in values
            if key in base and base[key] == value]


def base_knobs(recipe: str | Path, extra: Sequence[str] = ()) -> dict[str, Any]:
    """The base's value of each knob: the recipe with the search's own changes (``extra``). Every result records
    it, so that a results folder keeps saying what its base was after the recipe it searched has changed."""
    cfg = recipes.load("mt", recipe, list(extra))
    return {key: base_value(cfg, key) for key in KNOBS}


def combination(entry: str) -> list[str]:
    """The variants that ``entry`` (``dropout-0.2+peak_lr-0.002``) combines, in the order of :data:`KNOBS`
    (so that one combination has one name however it is written): the second round of a search puts the
    winners of the first together. Each part is a variant of a different knob."""
    parts, known = entry.split(COMBINED), {stem: key for stem, (key, _) in singles().items()}
    unknown = [p for p in parts if p not in known]
    if unknown or len(parts) < 2:
        raise ValueError(f"--knobs: {entry!r} combines {unknown or 'nothing'}; a combination joins two or more "
                         f"variants with {COMBINED!r}, e.g. dropout-0.2{COMBINED}peak_lr-0.002")
    keys = [known[p] for p in parts]
    if len(set(keys)) < len(keys):
        raise ValueError(f"--knobs: {entry!r} sets one knob twice; a combination changes each knob once")
    order = list(KNOBS)
    return sorted(parts, key=lambda p: order.index(known[p]))


def recipe_of(variant: Variant, recipe: str | Path, steps: int, extra: Sequence[str] = ()) -> MTRecipe:
    """The variant's recipe: the shipped one, the search's budget, the search's own changes to it (``extra``),
    the variant's change; its "test" split is the validation split, on which the search chooses."""
    cfg = recipes.load("mt", recipe, [*search_overrides(steps, whole_budget(recipe, steps)), *extra,
                                      *variant.overrides])
    return replace(cfg, data=replace(cfg.data, test=cfg.data.valid))


def train_and_score(variant: Variant, run: Path, resume: bool, recipe: str | Path, steps: int,
                    extra: Sequence[str] = (), quiet: bool = True) -> dict[str, Any]:
    """Train (or resume) the variant; its row: validation BLEU, chrF and perplexity, steps, time, parameters."""
    return {**trained_and_scored(None if resume else recipe_of(variant, recipe, steps, extra), run, quiet),
            "recipe": str(recipe), "base_changes": list(extra), "base_knobs": base_knobs(recipe, extra)}


def averaged(run: str | Path, alphas: Sequence[float] = LENGTH_PENALTIES) -> dict[str, Any]:
    """The validation scores of the average of the step checkpoints a finished run kept (at the whole budget
    the recipe's last 5, Section 6.1), decoded with beam 4 at each length penalty of ``alphas`` and at the
    recipe's own (whose BLEU and chrF are the average's ``bleu`` and ``chrf``); the average is written as the
    run's ``average`` weights, so that ``qkv eval mt --run RUN --split valid --weights average`` scores it again."""
    run = Run(run)
    steps = run.step_weights()
    if len(steps) < 2:
        raise ValueError(f"{run.path}: {len(steps)} step checkpoint(s), nothing to average (a run at the whole "
                         "budget keeps the recipe's last 5)")
    model, _ = load_model(run, "last", device="cpu")
    load_state_dict_into(model, average_checkpoints(steps), source="average")
    save_weights(run.file(AVERAGE_WEIGHTS_NAME), model, metadata={"averaged": str(len(steps))})
    cfg = run.recipe
    src, refs = load_split(cfg.data, cfg.data.valid)
    translator = Translator.from_run(run, weights="average", device="cpu")
    by_alpha = {}
    for alpha in sorted({cfg.train.test_alpha, *alphas}):
        result = score(translator.translate(src, beam=cfg.train.test_beam, alpha=alpha, truncate=True), refs)
        by_alpha[alpha_key(alpha)] = {key: result[key] for key in ("bleu", "chrf", "length_ratio")}
    own = by_alpha[alpha_key(cfg.train.test_alpha)]
    return {"checkpoints": [int(p.stem.split("_")[-1]) for p in steps], "bleu": own["bleu"], "chrf": own["chrf"],
            "length_penalty": by_alpha}


def alpha_key(alpha: float) -> str:
    """A length penalty as a key of a result's JSON: ``0.6``, ``2``."""
    return f"{alpha:g}"


def add_averages(grid: Sequence[Variant], out: str | Path, results: str | Path,
                 log: Callable[[str], None] = print) -> list[str]:
    """Score the checkpoint average of every variant that has a result and a run in ``out`` that kept step
    checkpoints (runs at the whole budget), at the length penalties it has no score for yet; its result gains
    (or extends) ``average``. The names done."""
    done = []
    for variant in grid:
        run = Path(out) / variant.name
        if not _missing_alphas(results, variant, run):
            continue
        with claim(Path(out), variant) as mine:  # workers side by side average each run once
            missing = _missing_alphas(results, variant, run) if mine else []
            if not missing:
                continue
            log(f"{variant.name}: scoring the average of its last checkpoints")
            result = read_results(results, [variant])[variant.name]
            old, new = result.get("average", {}), averaged(run, missing)
            merged = {**old, **new, "length_penalty": {**old.get("length_penalty", {}), **new["length_penalty"]}}
            write_json(result_path(Path(results), variant), {**result, "average": merged})
            done.append(variant.name)
    return done


def _missing_alphas(results: str | Path, variant: Variant, run: Path) -> list[float]:
    """The length penalties at which the variant's checkpoint average has no score yet; none for a variant
    without a result or without a run that kept step checkpoints."""
    result = read_results(results, [variant]).get(variant.name)
    if result is None or len(Run(run).step_weights()) < 2:
        return []
    scored = result.get("average", {}).get("length_penalty", {})
    return [a for a in LENGTH_PENALTIES if alpha_key(a) not in scored]


def base_value(cfg: MTRecipe, key: str) -> Any:
    """The recipe's own value of ``section.field``."""
    section, field = key.split(".")
    return getattr(getattr(cfg, section), field)


def table(results: dict[str, dict[str, Any]], grid: Sequence[Variant]) -> list[dict[str, Any]]:
    """One row per variant (mean and spread over its seeds), with its BLEU minus the base's seed for seed, and
    its training time over the base's."""
    deltas = paired_deltas(results, grid)
    base = [results[v.name] for v in grid if v.row == "base" and v.name in results]
    base_seconds = sum(r["train_seconds"] for r in base) / len(base) if base else None
    rows = []
    for (row, label), seeds in by_change(grid).items():
        found = [results[v.name] for v in seeds if v.name in results]
        entry: dict[str, Any] = {"row": row, "label": label, "seeds": len(found)}
        if found:
            for key in ("bleu", "chrf", "ppl", "train_seconds"):
                entry[key], entry[f"{key}_sd"] = spread([r[key] for r in found])
            entry["parameters"], entry["steps"] = found[0]["parameters"], found[0]["steps"]
            if all("average" in r for r in found):
                entry["bleu_average"], entry["bleu_average_sd"] = spread([r["average"]["bleu"] for r in found])
                curves = [r["average"].get("length_penalty", {}) for r in found]
                common = [a for a in curves[0] if all(a in c for c in curves)]  # the alphas every seed has
                if common:
                    entry["length_penalty"] = {a: spread([c[a]["bleu"] for c in curves])[0] for a in common}
                    entry["alpha"] = max(common, key=entry["length_penalty"].get)
            if base_seconds:
                entry["time_ratio"] = entry["train_seconds"] / base_seconds
        pairs = [deltas[v.name]["bleu"] for v in seeds if v.name in deltas]
        if pairs:
            entry["paired"] = len(pairs)
            entry["bleu_delta"], entry["bleu_delta_sd"] = spread(pairs)
        rows.append(entry)
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    """The table, the base first, then each knob's values in the order tried; the BLEU of the checkpoint
    average beside the chosen weights' where the runs have one (the whole budget), and the average's at the
    length penalty that scores it best."""
    averages = any("bleu_average" in r for r in rows)
    alphas = any("alpha" in r for r in rows)
    header = ["knob", "variant", "seeds", "BLEU (valid)", *(["BLEU, averaged"] if averages else []),
              *(["averaged, best length penalty"] if alphas else []), "chrF",
              "PPL", "BLEU - base, same seeds", "steps", "time / base's", "params"]
    lines = ["| " + " | ".join(header) + " |", "|---|---|" + "---:|" * (len(header) - 2)]
    for r in rows:
        if "bleu" not in r:
            lines.append(f"| {r['row']} | {r['label']} | 0 |" + " |" * (len(header) - 3))
            continue
        sd = (lambda key, digits: f" ± {r[f'{key}_sd']:.{digits}f}" if r["seeds"] > 1 else "")
        delta = "" if "bleu_delta" not in r else (
            f"{r['bleu_delta']:+.1f}" + (f" ± {r['bleu_delta_sd']:.1f}" if r["paired"] > 1 else "") + f" ({r['paired']})")
        ratio = f"{r['time_ratio']:.2f}" if "time_ratio" in r else ""
        average = ([f"{r['bleu_average']:.1f}{sd('bleu_average', 1)}" if "bleu_average" in r else ""]
                   if averages else [])
        best = ([f"{r['length_penalty'][r['alpha']]:.1f} (α {r['alpha']})" if "alpha" in r else ""] if alphas else [])
        cells = [r["row"], r["label"], str(r["seeds"]), f"{r['bleu']:.1f}{sd('bleu', 1)}", *average, *best,
                 f"{r['chrf']:.1f}", f"{r['ppl']:.2f}", delta, str(r["steps"]), ratio, f"{r['parameters'] / 1e6:.2f}M"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


PANEL_WIDTH = 3.2  # inches a panel of the plot


def plot(rows: list[dict[str, Any]], knobs_of_base: dict[str, Any], title: str, out_png: str | Path) -> Path:
    """One panel per knob: validation BLEU against the knob's values, the recipe's own among them (the base,
    black), the base's BLEU a dashed line across every panel; where runs were averaged, a last panel of each
    average's BLEU against the length penalty."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    base = next((r for r in rows if r["row"] == "base" and "bleu" in r), None)
    knobs = [k for k in KNOBS if any(r["row"] == k and "bleu" in r for r in rows)]
    if any(r["row"] == COMBINED_ROW and "bleu" in r for r in rows):
        knobs.append(COMBINED_ROW)
    curves = [r for r in rows if "length_penalty" in r]
    panels = len(knobs) + bool(curves)
    columns = min(panels, 5) or 1
    fig = Figure(figsize=(PANEL_WIDTH * columns, 3.0 * math.ceil(panels / columns) + 0.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = list(fig.subplots(math.ceil(panels / columns) or 1, columns, squeeze=False, sharey=True).flat)
    for ax in axes[panels:]:
        ax.set_visible(False)
    if curves:  # the last panel: each checkpoint average's BLEU against the length penalty it is decoded with
        ax = axes[len(knobs)]
        for r in curves:
            alphas = sorted(r["length_penalty"], key=float)
            ax.plot([float(a) for a in alphas], [r["length_penalty"][a] for a in alphas], marker="o", markersize=4,
                    label=r["label"], color="black" if r is base else None)
        ax.set_xlabel("length penalty α (checkpoint average)")
        ax.legend(fontsize=7)
        ax.grid(True, axis="y", alpha=0.3)
    for ax, key in zip(axes, knobs):
        points = _combined(rows, base) if key == COMBINED_ROW else _knob(rows, base, knobs_of_base, key)
        xs = [str(x) for x, _ in points]
        for i, (_, r) in enumerate(points):
            ax.errorbar(i, r["bleu"], yerr=r["bleu_sd"] or None, fmt="o", capsize=3,
                        color="black" if r is base else "tab:blue", markersize=6 if r is base else 5)
        if base is not None:
            ax.axhline(base["bleu"], color="gray", linestyle="--", linewidth=0.8)
        ax.set_xticks(range(len(xs)), xs)
        if key == COMBINED_ROW:  # variant names, not values: slanted so that neighbours do not overlap
            ax.tick_params(axis="x", labelsize=7, labelrotation=25)
        ax.set_xlabel(key)
        ax.grid(True, axis="y", alpha=0.3)
    fig.supylabel("validation BLEU, beam 4")
    # A 10-point title holds about 12 characters an inch: wrapped, a one-panel plot shows all of its title.
    fig.suptitle(textwrap.fill(title, width=int(12 * PANEL_WIDTH * columns)), fontsize=10)
    with atomic_path(out_png) as tmp, as_os_error(tmp):
        fig.savefig(tmp, dpi=110, format="png")
    return Path(out_png)


def _knob(rows: list[dict[str, Any]], base: dict[str, Any] | None, knobs_of_base: dict[str, Any],
          key: str) -> list[tuple[Any, dict]]:
    """A knob's panel: (value, row) of each of its variants and of the base, numbers in order."""
    points = [(_value(r["label"], key), r) for r in rows if r["row"] == key and "bleu" in r]
    if base is not None:
        points.append((knobs_of_base[key], base))
    if all(isinstance(x, (int, float)) for x, _ in points):  # numbers in order; words (norm) as tried
        points.sort(key=lambda p: p[0])
    return points


def _combined(rows: list[dict[str, Any]], base: dict[str, Any] | None) -> list[tuple[str, dict]]:
    """The combinations' panel: the base, then each combination after the variants it combines (those scored)."""
    by_label = {r["label"]: r for r in rows if "bleu" in r}
    points = [("base", base)] if base is not None else []
    for r in rows:
        if r["row"] == COMBINED_ROW and "bleu" in r:
            parts = [(p, by_label[p]) for p in r["label"].split(COMBINED) if p in by_label]
            points += [p for p in parts if p not in points] + [(r["label"].replace(COMBINED, "+\n"), r)]
    return points


def _value(label: str, key: str) -> Any:
    """The value of ``key`` that the variant ``label`` (:func:`name_of`) tries."""
    return next(v for v in KNOBS[key] if name_of(key, v) == label)


def write_report(results: dict[str, dict[str, Any]], grid: Sequence[Variant], recipe: str | Path,
                 out_dir: str | Path, extra: Sequence[str] = ()) -> list[Path]:
    """``search.md`` and ``search.png`` in ``out_dir``, from whatever results exist; the base as its results
    record it, and what the recipe has changed since."""
    rows = table(results, grid)
    steps = sorted({r["steps"] for r in results.values()})
    budget = " / ".join(map(str, steps)) or "N"
    now, then = base_knobs(recipe, extra), recorded_base(results, recipe, extra)
    changed = [f"{key} {then[key]!r} (now {now.get(key)!r})" for key in then if then[key] != now.get(key)]
    since = f" The base is the recipe as it was when these ran: {', '.join(changed)}." if changed else ""
    caption = (f"The recipe `{recipe}`, one knob changed at a time (in the row `{COMBINED_ROW}`, the variants "
               f"joined by `{COMBINED}` together), every variant {budget} steps (the recipe's "
               "schedule), scored on its validation split: cased sacreBLEU, beam 4, length penalty 0.6, the last "
               "or the best checkpoint, whichever has the lower validation loss (and beside it, where the runs kept "
               "their checkpoints, the average of those, and the average at the length penalty of "
               f"{', '.join(map(alpha_key, LENGTH_PENALTIES))} that scores it best); mean ± standard deviation over "
               "the seeds scored; the difference from the base pairs each seed with the base's (the same batches). "
               "Time: the training time of the variant's steps over the base's on the same machine. Written by "
               f"`qkv experiment search`; see docs/EXPERIMENTS.md.{since}\n\n")
    out_dir = Path(out_dir)
    md = write_text(out_dir / "search.md", caption + markdown(rows))
    if not any("bleu" in r for r in rows):
        return [md]
    return [md, plot(rows, then, f"{recipe}: validation BLEU against each knob, {budget} steps",
                     out_dir / "search.png")]


def recorded_base(results: dict[str, dict[str, Any]], recipe: str | Path, extra: Sequence[str] = ()) -> dict[str, Any]:
    """The base's knobs as the results record them (:func:`base_knobs`; one folder, one base:
    :func:`qkv.experiments.grid.check_results`), or the recipe's today where none does."""
    return next((r["base_knobs"] for r in results.values() if "base_knobs" in r), None) or base_knobs(recipe, extra)


__all__ = ["BUDGETS", "SHORT", "KNOBS", "LENGTH_PENALTIES", "COUPLED", "COMBINED", "COMBINED_ROW", "short_steps",
           "search_overrides", "whole_budget", "name_of", "singles", "variants", "same_as_base", "base_knobs",
           "combination", "recipe_of", "train_and_score", "averaged", "alpha_key", "add_averages", "base_value",
           "table", "markdown", "plot", "write_report", "recorded_base"]
