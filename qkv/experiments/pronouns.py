"""Which heads resolve pronouns: the first article's question (how does the model know 他 is 小明?)
asked of a translation model trained on the demo corpus, and answered by measurement, then by ablation.

Over held-out sentences of the demo corpus (its valid and test splits: every one holds a combination
never seen in training), each sentence knows its pronoun's antecedent (``synthetic.Example.link``).
Every head of every layer is scored on the pronoun's row of its map, with the reference translation
teacher-forced:

- encoder self-attention: the row of the Chinese pronoun (他, 她, 自己), over the source;
- cross-attention: the row that writes the English pronoun (he, she), over the source;
- decoder self-attention: the same row, over the English read so far (the antecedent's English name,
  when it comes before the pronoun).

A head resolves a pronoun when its largest weight in that row lands on the antecedent (its first
token); ``share`` is the fraction resolved, ``weight`` the mean weight on the antecedent.

Where the head looks is not proof that the model uses it. So each head is switched off
(``interpret.ablation.heads_off``) and the sentences whose English pronoun only the antecedent decides
(a dropped subject, 自己) are translated again: ``flip`` is the share whose pronoun changed (he <-> she,
or gone), ``bleu`` the BLEU of every held-out sentence without the head.
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from qkv.data.synthetic import DEMO, PEOPLE, Example, demo_examples
from qkv.evaluation.bleu import corpus_bleu
from qkv.generation.api import Translator
from qkv.interpret.ablation import heads_off
from qkv.interpret.capture import capture_attention
from qkv.io import evaluating, write_text
from qkv.runs import PRONOUNS_JSON, PRONOUNS_PNG, Run

KINDS = ("encoder_self", "decoder_self", "cross")
SPLITS = ("valid", "test")
BATCH = 64
_PRONOUN = re.compile(r"\b(he|she|He|She)\b")
ENGLISH_NAME = {zh: en for zh, en, _ in PEOPLE}


@dataclass(frozen=True)
class Item:
    """One held-out sentence with a pronoun, as token positions of the model's tokenizer."""

    zh: str
    en: str
    src: tuple[int, ...]  # source ids, <eos> included
    read: tuple[int, ...]  # <bos> + the reference's ids
    produced: tuple[int, ...]  # the reference's ids + <eos>
    zh_row: int | None  # the Chinese pronoun's token (None: a dropped subject)
    en_row: int  # the decoder row that writes the English pronoun
    antecedent: int  # the antecedent's first source token
    antecedent_read: int | None  # its English name's first token in ``read``, if before ``en_row``
    candidates: int  # names in the sentence
    needs_antecedent: bool


def _find(pieces: Sequence[str], word: str, start: int = 0) -> int | None:
    """The index of the token where ``word`` starts (tokens joined without the word-start marker)."""
    for i in range(start, len(pieces)):
        joined = ""
        for piece in pieces[i:]:
            joined += piece
            if not word.startswith(joined):
                break
            if joined == word:
                return i
    return None


def items_of(examples: Sequence[Example], translator: Translator) -> list[Item]:
    """Every example with a pronoun, located in the model's tokens (those it cannot locate are skipped)."""
    tok = translator.tokenizer
    out = []
    for ex in examples:
        link = ex.link()
        if link is None:
            continue
        zh, en = ex.render()
        src = translator.encode_sources([zh])[0]
        ref = tok.encode(en)
        src_pieces = [tok.id_to_token(i).replace("▁", "") for i in src]
        ref_pieces = [tok.id_to_token(i).replace("▁", "") for i in ref]
        antecedent = _find(src_pieces, link["antecedent"])
        zh_row = _find(src_pieces, link["zh"]) if link["zh"] else None
        en_row = _find(ref_pieces, link["en"])
        if antecedent is None or en_row is None or (link["zh"] and zh_row is None):
            continue
        name = _find(ref_pieces, ENGLISH_NAME[link["antecedent"]])
        read_name = name + 1 if name is not None and name < en_row else None  # read = <bos> + ref
        out.append(Item(zh, en, tuple(src), tuple([tok.bos_id] + ref), tuple(ref + [tok.eos_id]), zh_row, en_row,
                        antecedent, read_name, len(link["candidates"]), link["needs_antecedent"]))
    return out


def _pad(rows: Sequence[Sequence[int]], pad: int) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([list(r) + [pad] * (width - len(r)) for r in rows])  # (B, width)


def resolved(row: torch.Tensor, target: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For one pronoun's row of every head, ``row`` (H, L): whether each head's largest weight is on
    ``target`` (H,) bool, and its weight there (H,)."""
    return row.argmax(-1) == target, row[:, target]


@torch.no_grad()
def head_scores(translator: Translator, items: Sequence[Item]) -> dict[tuple[str, int, int], dict[str, float]]:
    """``{(kind, layer, head): {"share", "weight", "n", "share_two", "n_two"}}`` over ``items``."""
    model, pad = translator.model, translator.tokenizer.pad_id
    sums: dict[tuple[str, int, int], list[float]] = {}  # hits, weight, n, hits of two, n of two
    with evaluating(model):
        for start in range(0, len(items), BATCH):
            batch = items[start:start + BATCH]
            src = _pad([it.src for it in batch], pad).to(translator.device)
            read = _pad([it.read for it in batch], pad).to(translator.device)
            with capture_attention(model) as maps:
                model(src, read)
            for kind in KINDS:
                for layer, w in enumerate(maps.get(kind, [])):
                    w = w.float().cpu()  # (B, H, T, L)
                    for b, it in enumerate(batch):
                        row, target = (it.zh_row, it.antecedent) if kind == "encoder_self" else \
                            (it.en_row, it.antecedent_read) if kind == "decoder_self" else (it.en_row, it.antecedent)
                        if row is None or target is None:
                            continue
                        hits, on_target = resolved(w[b, :, row], target)
                        for head in range(hits.shape[0]):
                            acc = sums.setdefault((kind, layer, head), [0.0] * 5)
                            acc[0] += float(hits[head])
                            acc[1] += float(on_target[head])
                            acc[2] += 1
                            if it.candidates == 2:
                                acc[3] += float(hits[head])
                                acc[4] += 1
    return {key: {"share": a[0] / a[2], "weight": a[1] / a[2], "n": int(a[2]),
                  "share_two": a[3] / a[4] if a[4] else None, "n_two": int(a[4])}
            for key, a in sums.items()}


def pronoun(text: str) -> str | None:
    """The first he/she of a translation, lower-cased (None if it has none)."""
    m = _PRONOUN.search(text)
    return m.group(1).lower() if m else None


def ablations(translator: Translator, items: Sequence[Item], heads: Sequence[tuple[str, int, int]],
              every: Sequence[Example]) -> tuple[dict, float]:
    """For each head switched off alone: ``flip`` (share of the pronouns only the antecedent decides
    that change) and ``bleu`` (all held-out sentences); and the BLEU with every head on."""
    needs = [it for it in items if it.needs_antecedent]
    sources, references = [ex.render()[0] for ex in every], [ex.render()[1] for ex in every]
    base = translator.translate([it.zh for it in needs], beam=1)
    base_bleu = corpus_bleu(translator.translate(sources, beam=1), references)
    out = {}
    for head in heads:
        with heads_off(translator.model, [head]):
            changed = translator.translate([it.zh for it in needs], beam=1)
            bleu = corpus_bleu(translator.translate(sources, beam=1), references)
        flips = sum(pronoun(a) != pronoun(b) for a, b in zip(base, changed))
        out[head] = {"flip": flips / len(needs) if needs else 0.0, "bleu": bleu, "n_flip": len(needs)}
    return out, base_bleu


def held_out(run: Run) -> list[Example]:
    """The run's held-out demo sentences: its valid and test splits, as its recipe drew them."""
    data = run.section("data")
    if data.get("corpus") != DEMO:
        raise ValueError(f"--run {run.path}: trained on {data.get('corpus')!r}; pronoun heads are measured on the "
                         "demo corpus, whose sentences know their pronouns' antecedents (train with qkv demo)")
    splits = demo_examples(data.get("demo_seed", 0), data.get("demo_train", 20000), data.get("demo_valid", 500),
                           data.get("demo_test", 500))
    return [ex for split in SPLITS for ex in splits[split]]


def explain(run: Run | str | Path, device: str | None = "cpu") -> dict[str, Any]:
    """Score every head, switch each off; the results as ``pronouns.json`` holds them."""
    run = Run.of(run)
    every = held_out(run)  # first: a run of another corpus is refused before its model loads
    translator = Translator.from_run(run, device=device)
    items = items_of(every, translator)
    scores = head_scores(translator, items)
    heads = sorted(scores)
    effects, base_bleu = ablations(translator, items, heads, every)
    rows = [{"kind": k, "layer": layer, "head": h, **scores[k, layer, h], **effects[k, layer, h]}
            for k, layer, h in heads]
    best = max(rows, key=lambda r: (r["share"], r["weight"]))
    others = [r["flip"] for r in rows if r is not best]
    return {
        "run": str(run.path), "sentences": len(every), "pronouns": len(items),
        "two_candidates": sum(it.candidates == 2 for it in items),
        "needs_antecedent": sum(it.needs_antecedent for it in items),
        "bleu": base_bleu, "heads": rows, "best": best,
        "median_flip": statistics.median(others) if others else None,
    }


def markdown(results: dict[str, Any]) -> str:
    """The heads as a table, best first."""
    lines = [f"{results['pronouns']} pronouns in {results['sentences']} held-out sentences "
             f"({results['two_candidates']} with two candidates, {results['needs_antecedent']} whose English "
             f"pronoun only the antecedent decides); BLEU {results['bleu']:.1f} with every head on.", "",
             "| kind | layer | head | resolved | weight on antecedent | resolved (two candidates) | "
             "pronoun changed when off | BLEU when off |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in sorted(results["heads"], key=lambda r: -r["share"]):
        two = "" if r["share_two"] is None else f"{100 * r['share_two']:.1f}%"
        lines.append(f"| {r['kind']} | {r['layer']} | {r['head']} | {100 * r['share']:.1f}% | {r['weight']:.3f} | "
                     f"{two} | {100 * r['flip']:.1f}% | {r['bleu']:.1f} |")
    return "\n".join(lines) + "\n"


def plot(results: dict[str, Any], out_png: str | Path) -> Path:
    """One heat map per kind: layers by heads, the share resolved, with the pronoun changes when off."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = [k for k in KINDS if any(r["kind"] == k for r in results["heads"])]
    fig, axes = plt.subplots(1, len(kinds), figsize=(4.2 * len(kinds), 3.2), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        rows = [r for r in results["heads"] if r["kind"] == kind]
        n_layers, n_heads = max(r["layer"] for r in rows) + 1, max(r["head"] for r in rows) + 1
        grid = torch.zeros(n_layers, n_heads)
        for r in rows:
            grid[r["layer"], r["head"]] = r["share"]
            ax.text(r["head"], r["layer"], f"{100 * r['share']:.0f}%\noff: {100 * r['flip']:.0f}%", ha="center",
                    va="center", fontsize=8, color="white" if r["share"] > 0.6 else "black")
        ax.imshow(grid.numpy(), vmin=0, vmax=1, cmap="Blues")
        ax.set_title(kind.replace("_", " "))
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_xticks(range(n_heads))
        ax.set_yticks(range(n_layers))
    fig.suptitle("pronouns resolved (largest weight on the antecedent); off: pronoun changed when switched off",
                 fontsize=9)
    fig.tight_layout()
    out_png = Path(out_png)
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return out_png


def write(results: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """``pronouns.json`` and ``pronouns.png`` in ``out_dir`` (a run directory)."""
    out_dir = Path(out_dir)
    return [write_text(out_dir / PRONOUNS_JSON, json.dumps(results, indent=1) + "\n"),
            plot(results, out_dir / PRONOUNS_PNG)]


__all__ = ["Item", "items_of", "resolved", "head_scores", "ablations", "pronoun", "held_out", "explain", "markdown", "plot",
           "write", "KINDS", "SPLITS"]
