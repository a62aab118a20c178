"""Which heads resolve pronouns: the first article's question (how does the model know 他 is 小明?)
asked of a translation model trained on the demo corpus, and answered by measurement, then by ablation.

Over held-out sentences of the demo corpus (its valid and test splits, topped up with more held-out
sentences whose pronoun needs its antecedent: :func:`held_out`; every one holds a combination never
seen in training), each sentence knows its pronoun's antecedent (``synthetic.Example.link``). Every
head of every layer is scored on the pronoun's row of its map, with the reference translation
teacher-forced:

- encoder self-attention: the row of the Chinese pronoun (他, 她, 自己), over the source;
- cross-attention: the row that writes the English pronoun (he, she), over the source, in the
  sentences where no Chinese word genders it (a dropped subject, 自己): where the source says 他, a
  head that reads 他 to write "he" is translating a word, not resolving it;
- decoder self-attention: the same rows, over the English read so far (the antecedent's English name,
  when it comes before the pronoun).

A head resolves a pronoun when its largest weight in that row lands on the antecedent (its first
token); ``share`` is the fraction resolved, ``weight`` the mean weight on the antecedent.

Where the head looks is not proof that the model uses it. So each head is switched off
(``interpret.ablation.heads_off``), alone and with others, and the sentences whose English pronoun
only the antecedent decides are translated again: ``flip`` is the share whose pronoun changed (he <->
she, or gone), ``bleu`` the BLEU of every held-out sentence without the head.
"""

from __future__ import annotations

import json
import random
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch

from qkv.data.synthetic import DEMO, NEEDS_ANTECEDENT, PEOPLE, SEED_SENTENCE, Example, all_examples, demo_examples
from qkv.evaluation.bleu import corpus_bleu
from qkv.generation.api import Translator
from qkv.interpret.ablation import heads_off
from qkv.interpret.capture import capture_attention
from qkv.devices import evaluating
from qkv.files import write_text
from qkv.runs import PRONOUNS_JSON, PRONOUNS_PNG, Run

KINDS = ("encoder_self", "decoder_self", "cross")
SPLITS = ("valid", "test")
BATCH = 64
# Sentences whose English pronoun only the antecedent decides, at least: what the cross- and decoder
# self-attention heads are scored on, and what the ablations translate again.
NEEDS_AT_LEAST = 600
MIN_PRONOUNS = 500  # a head is a candidate for the best one when scored on this many pronouns or more
_PRONOUN = re.compile(r"\b(he|she|He|She)\b")
ENGLISH_NAME = {zh: en for zh, en, _ in PEOPLE}
_SEED = next(ex for ex in all_examples() if ex.render() == SEED_SENTENCE)
_SEED_DROPPED = Example("zero", _SEED.person, state=_SEED.state, wish=_SEED.wish)  # 小明累了，想睡觉。


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
    template: str  # the generator's pattern (synthetic.TEMPLATES)


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
                        antecedent, read_name, len(link["candidates"]), link["needs_antecedent"], ex.template))
    return out


def _pad(rows: Sequence[Sequence[int]], pad: int) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([list(r) + [pad] * (width - len(r)) for r in rows])  # (B, width)


def resolved(row: torch.Tensor, target: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For one pronoun's row of every head, ``row`` (H, L): whether each head's largest weight is on
    ``target`` (H,) bool, and its weight there (H,)."""
    return row.argmax(-1) == target, row[:, target]


@torch.no_grad()
def pronoun_rows(translator: Translator, items: Sequence[Item]) -> Iterator[tuple[Item, str, int, torch.Tensor, int]]:
    """``(item, kind, layer, rows, target)`` for every item and every layer of each kind: ``rows`` (H, L)
    the pronoun's row of each head, ``target`` the antecedent's position in it (the reference
    teacher-forced; a kind with no pronoun row or no antecedent to read in an item is left out)."""
    model, pad = translator.model, translator.tokenizer.pad_id
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
                        if kind != "encoder_self" and not it.needs_antecedent:
                            continue  # he/she translates 他/她 there: a head that reads 他 is translating
                        if row is not None and target is not None:
                            yield it, kind, layer, w[b, :, row], target


def head_scores(translator: Translator, items: Sequence[Item]) -> dict[tuple[str, int, int], dict[str, float]]:
    """``{(kind, layer, head): {"share", "weight", "n", "share_two", "n_two"}}`` over ``items``."""
    sums: dict[tuple[str, int, int], list[float]] = {}  # hits, weight, n, hits of two, n of two
    for it, kind, layer, rows, target in pronoun_rows(translator, items):
        hits, on_target = resolved(rows, target)
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


def on_seed_sentence(translator: Translator, head: tuple[str, int, int]) -> dict[str, Any] | None:
    """Where ``head`` looks on the seed sentence: an encoder head from 他 (小明累了，他想睡觉。), a cross- or
    decoder self-attention head from the "he" it writes when 他 is dropped (小明累了，想睡觉。, where only
    小明 can tell he from she). The sentence, the token of its largest weight, that weight, and whether
    it is the antecedent 小明."""
    kind, layer, h = head
    example = _SEED if kind == "encoder_self" else _SEED_DROPPED
    items = items_of([example], translator)
    for _, k, lay, rows, target in pronoun_rows(translator, items):
        if (k, lay) == (kind, layer):
            keys = items[0].src if kind != "decoder_self" else items[0].read
            top = int(rows[h].argmax())
            return {"sentence": example.render()[0], "token": translator.tokenizer.id_to_token(keys[top]).replace("▁", ""),
                    "weight": float(rows[h, top]), "on_antecedent": top == target}
    return None


def pronoun(text: str) -> str | None:
    """The first he/she of a translation, lower-cased (None if it has none)."""
    m = _PRONOUN.search(text)
    return m.group(1).lower() if m else None


def ablations(translator: Translator, items: Sequence[Item], head_sets: Sequence[Sequence[tuple[str, int, int]]],
              every: Sequence[Example]) -> tuple[list[dict[str, Any]], float]:
    """For each set of heads switched off together (one head is a set of one): ``flip`` (share of the
    pronouns only the antecedent decides that change), ``flip_by_template`` (changed / sentences of
    each pattern) and ``bleu`` (all held-out sentences); and the BLEU with every head on."""
    needs = [it for it in items if it.needs_antecedent]
    sources, references = [ex.render()[0] for ex in every], [ex.render()[1] for ex in every]
    at = {zh: i for i, zh in enumerate(sources)}  # each needs item is one of the sentences translated
    hyps = translator.translate(sources, beam=1)
    base, base_bleu = [hyps[at[it.zh]] for it in needs], corpus_bleu(hyps, references)
    out = []
    for heads in head_sets:
        with heads_off(translator.model, list(heads)):
            hyps = translator.translate(sources, beam=1)  # once: BLEU of all, and the pronouns among them
        bleu, changed = corpus_bleu(hyps, references), [hyps[at[it.zh]] for it in needs]
        flipped = [pronoun(a) != pronoun(b) for a, b in zip(base, changed)]
        by_template: dict[str, list[int]] = {}
        for it, f in zip(needs, flipped):
            acc = by_template.setdefault(it.template, [0, 0])
            acc[0] += f
            acc[1] += 1
        out.append({"flip": sum(flipped) / len(needs) if needs else 0.0, "bleu": bleu, "n_flip": len(needs),
                    "flip_by_template": {t: a for t, a in sorted(by_template.items())}})
    return out, base_bleu


def head_sets(rows: Sequence[dict[str, Any]], best: dict[str, Any]) -> dict[str, list[tuple[str, int, int]]]:
    """The sets of heads switched off together: the best head with every head of its layer and kind that
    resolves at least half the pronouns (heads that share the work cover for each other when one is
    off), and each layer of each kind whole."""
    peers = [(r["kind"], r["layer"], r["head"]) for r in rows
             if (r["kind"], r["layer"]) == (best["kind"], best["layer"]) and (r is best or r["share"] >= 0.5)]
    sets = {"resolving heads of the best head's layer": peers}
    for r in rows:
        sets.setdefault(f"{r['kind']} layer {r['layer']}", []).append((r["kind"], r["layer"], r["head"]))
    return sets


def held_out(run: Run) -> list[Example]:
    """The held-out demo sentences the heads are measured on: the run's valid and test splits, as its
    recipe drew them, and then, until :data:`NEEDS_AT_LEAST` of them have an English pronoun that only
    the antecedent decides, more held-out sentences of those patterns (every held-out sentence holds a
    combination that no training sentence holds: none was seen in training)."""
    data = run.section("data")
    if data.get("corpus") != DEMO:
        raise ValueError(f"--run {run.path}: trained on {data.get('corpus')!r}; pronoun heads are measured on the "
                         "demo corpus, whose sentences know their pronouns' antecedents (train with qkv demo)")
    splits = demo_examples(data.get("demo_seed", 0), data.get("demo_train", 20000), data.get("demo_valid", 500),
                           data.get("demo_test", 500))
    chosen = [ex for split in SPLITS for ex in splits[split]]
    short = NEEDS_AT_LEAST - sum(ex.template in NEEDS_ANTECEDENT for ex in chosen)
    if short > 0:
        taken = set(chosen)
        pool = [ex for ex in all_examples() if ex.held_out and ex.template in NEEDS_ANTECEDENT and ex not in taken]
        random.Random(0).shuffle(pool)
        chosen += pool[:short]
    return chosen


def explain(run: Run | str | Path, device: str | None = "cpu") -> dict[str, Any]:
    """Score every head, switch each off alone and in sets; the results as ``pronouns.json`` holds them."""
    run = Run.of(run)
    every = held_out(run)  # first: a run of another corpus is refused before its model loads
    translator = Translator.from_run(run, device=device)
    items = items_of(every, translator)
    scores = head_scores(translator, items)
    heads = sorted(scores)
    rows = [{"kind": k, "layer": layer, "head": h, **scores[k, layer, h]} for k, layer, h in heads]
    # The best head: the largest share among the heads scored on MIN_PRONOUNS pronouns or more (decoder
    # self-attention is scored only where the name was written before the pronoun: too few to compare).
    scored = [r for r in rows if r["n"] >= MIN_PRONOUNS] or rows
    best = max(scored, key=lambda r: (r["share"], r["weight"]))
    sets = head_sets(rows, best)
    effects, base_bleu = ablations(translator, items, [[h] for h in heads] + list(sets.values()), every)
    for r, effect in zip(rows, effects):
        r.update(effect)
    others = [r["flip"] for r in rows if r is not best]
    return {
        "run": str(run.path), "sentences": len(every), "pronouns": len(items),
        "two_candidates": sum(it.candidates == 2 for it in items),
        "needs_antecedent": sum(it.needs_antecedent for it in items),
        "bleu": base_bleu, "heads": rows, "best": best,
        "seed_sentence": on_seed_sentence(translator, (best["kind"], best["layer"], best["head"])),
        "median_flip": statistics.median(others) if others else None,
        "sets": [{"name": name, "heads": [list(h) for h in hs], **effect}
                 for (name, hs), effect in zip(sets.items(), effects[len(heads):])],
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
    lines += ["", "| switched off together | heads | pronoun changed | by pattern (changed / sentences) | BLEU |",
              "|---|---|---:|---|---:|"]
    for st in results["sets"]:
        heads = ", ".join(f"{layer}.{h}" for _, layer, h in st["heads"])
        patterns = ", ".join(f"{t} {c}/{n}" for t, (c, n) in st["flip_by_template"].items())
        lines.append(f"| {st['name']} | {heads} | {100 * st['flip']:.1f}% | {patterns} | {st['bleu']:.1f} |")
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


__all__ = ["Item", "items_of", "resolved", "pronoun_rows", "head_scores", "on_seed_sentence", "ablations", "head_sets", "pronoun", "held_out", "explain", "markdown", "plot",
           "write", "KINDS", "SPLITS"]
