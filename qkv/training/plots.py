"""Training curves from a run's ``metrics.jsonl`` as one PNG: loss per split, and learning rate and BLEU when logged.

matplotlib is imported inside the function, and through its object API with the Agg canvas (no
pyplot, no global backend switch), so importing this module costs nothing and it works without a
display.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qkv.files import as_os_error, atomic_path
from qkv.training.logging import read_metrics


def _series(records: list[dict[str, Any]], key: str) -> dict[str, tuple[list[int], list[float]]]:
    """Per split, the steps and values of ``key``; a later record for the same (split, step) wins.

    A run resumed from an earlier checkpoint logs some steps twice; the later values are the ones the
    final model followed.
    """
    by_split: dict[str, dict[int, float]] = {}
    for r in records:
        v = r.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and "step" in r:
            by_split.setdefault(str(r.get("split", "?")), {})[int(r["step"])] = float(v)
    return {s: (sorted(d), [d[k] for k in sorted(d)]) for s, d in by_split.items()}


def plot_curves(metrics_path: str | Path, out_png: str | Path, title: str | None = None) -> Path:
    """Draw loss vs step for every split (train, valid...), plus panels for ``lr`` and ``bleu`` if present.

    Args:
        metrics_path: A ``metrics.jsonl`` written by :class:`qkv.training.logging.MetricsLogger`.
        out_png: The image to write (its directory is created).
        title: Figure title; the run directory's name by default.

    Returns:
        The PNG path.

    Raises:
        ValueError: If the file holds no ``loss``, ``lr`` or ``bleu`` value to draw.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    metrics_path, out_png = Path(metrics_path), Path(out_png)
    records = read_metrics(metrics_path)
    panels = [(key, label, _series(records, key)) for key, label in (("loss", "loss"), ("lr", "learning rate"), ("bleu", "BLEU"))]
    panels = [p for p in panels if p[2]]
    if not panels:
        raise ValueError(f"{metrics_path}: no 'loss', 'lr' or 'bleu' values to plot")

    fig = Figure(figsize=(8, 2.2 + 2.3 * len(panels)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (key, label, series) in zip(axes, panels):
        for split, (steps, values) in sorted(series.items(), key=lambda kv: kv[0] != "train"):
            dense = len(steps) > 50  # many points (train): a thin line; few (eval): markers
            ax.plot(steps, values, label=split, linewidth=1.0 if dense else 1.5, marker=None if dense else "o", markersize=3)
        only = next(iter(series)) if len(series) == 1 else None
        ax.set_ylabel(label if only in (None, "train") else f"{label} ({only})")
        ax.grid(True, alpha=0.3)
        if key == "lr":
            ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
        if len(series) > 1 or key == "loss":
            ax.legend(loc="best", fontsize="small")
    axes[-1].set_xlabel("step")
    fig.suptitle(title if title is not None else metrics_path.parent.name or str(metrics_path))
    with atomic_path(out_png) as tmp, as_os_error(tmp):
        fig.savefig(tmp, dpi=110, format="png")
    return out_png
