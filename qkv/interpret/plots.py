"""Attention heatmaps as PNG files: one head, or a grid of every head of a layer.

matplotlib is imported lazily (Agg backend, no display needed). Chinese tokens are drawn with the
CJK font that qkv brings (``qkv.interpret.fonts``), whatever fonts the machine has.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from torch import Tensor

from qkv.interpret.fonts import use_in_matplotlib
from qkv.files import as_os_error, atomic_path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    use_in_matplotlib()
    plt.rcParams["axes.unicode_minus"] = False
    return plt


def plot_attention(weights: Tensor, query_tokens: Sequence[str], key_tokens: Sequence[str], out_png: str | Path,
                   title: str = "", heads: Sequence[int] | None = None, cols: int = 4) -> Path:
    """Heatmaps of one layer's attention: rows are queries, columns keys.

    Args:
        weights: (H, T, L) or (T, L) weights of one example (rows sum to 1).
        query_tokens, key_tokens: the T and L token strings.
        out_png: where to write the PNG.
        heads: which heads to draw (default all, as a grid of ``cols`` columns).

    Returns:
        The path written.
    """
    plt = _pyplot()
    w = weights.detach().float().cpu()
    if w.dim() == 2:
        w = w[None]
    if w.shape[-2:] != (len(query_tokens), len(key_tokens)):
        raise ValueError(f"plot_attention: weights of shape {tuple(w.shape)} do not match "
                         f"{len(query_tokens)} query and {len(key_tokens)} key tokens")
    heads = list(range(w.shape[0])) if heads is None else list(heads)
    cols = min(cols, len(heads))
    rows = (len(heads) + cols - 1) // cols
    cell = 0.32
    width = max(3.0, cell * len(key_tokens) + 1.2) * cols
    height = max(2.6, cell * len(query_tokens) + 1.2) * rows
    fig, axes = plt.subplots(rows, cols, figsize=(width, height), squeeze=False)
    for ax in axes.flat[len(heads):]:
        ax.axis("off")
    for ax, h in zip(axes.flat, heads):
        ax.imshow(w[h].numpy(), cmap="Blues", vmin=0.0, vmax=1.0, aspect="auto")
        ax.set_xticks(range(len(key_tokens)), key_tokens, rotation=90, fontsize=8)
        ax.set_yticks(range(len(query_tokens)), query_tokens, fontsize=8)
        ax.set_title(f"head {h}", fontsize=9)
        ax.tick_params(length=0)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    out_png = Path(out_png)
    with atomic_path(out_png) as tmp, as_os_error(tmp):
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    return out_png
