"""Translation quality: corpus BLEU and chrF with sacreBLEU, the standard, comparable implementation.

BLEU is cased with sacreBLEU's default ``13a`` tokenization applied to detokenized text (Post, 2018,
"A Call for Clarity in Reporting BLEU Scores"), so scores are comparable with published ones; the
signature string says exactly how a score was computed. sacreBLEU is imported only when scoring.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from qkv.files import read_lines


def _check(hyps: Sequence[str], refs: Sequence[str]) -> None:
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references: they must be line-aligned")
    if not refs:
        raise ValueError("no sentences to score")


def corpus_bleu(hyps: Sequence[str], refs: Sequence[str]) -> float:
    """Corpus BLEU (0-100), cased, 13a tokenization: sacreBLEU's defaults."""
    import sacrebleu

    _check(hyps, refs)
    return float(sacrebleu.corpus_bleu(list(hyps), [list(refs)]).score)


def corpus_chrf(hyps: Sequence[str], refs: Sequence[str]) -> float:
    """Corpus chrF (0-100): character n-gram F-score, sacreBLEU's defaults (n = 6, beta = 2)."""
    import sacrebleu

    _check(hyps, refs)
    return float(sacrebleu.corpus_chrf(list(hyps), [list(refs)]).score)


def score(hyps: Sequence[str], refs: Sequence[str]) -> dict[str, float | str | int]:
    """BLEU and chrF of line-aligned hypotheses and references, with sacreBLEU's signatures.

    Returns:
        ``{"bleu", "chrf", "exact" (share of identical lines), "sentences", "length_ratio" (the
        hypotheses' tokens over the references', as BLEU counts them), "brevity_penalty" (BLEU's
        factor for hypotheses shorter than the references: 1 when the ratio is >= 1, else
        exp(1 - 1 / ratio)), "bleu_signature", "chrf_signature"}``. A model that translates too
        short loses BLEU through the penalty alone, which the ratio tells apart from worse words.
    """
    from sacrebleu.metrics import BLEU, CHRF

    _check(hyps, refs)
    hyps, refs = list(hyps), list(refs)
    bleu, chrf = BLEU(), CHRF()
    b, c = bleu.corpus_score(hyps, [refs]), chrf.corpus_score(hyps, [refs])
    return {
        "bleu": float(b.score),
        "chrf": float(c.score),
        "exact": sum(h == r for h, r in zip(hyps, refs)) / len(refs),
        "sentences": len(refs),
        "length_ratio": b.sys_len / b.ref_len if b.ref_len else 0.0,
        "brevity_penalty": float(b.bp),
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
    }


def score_files(hyp_path: str | Path, ref_path: str | Path) -> dict[str, float | str | int]:
    """:func:`score` of two line-aligned UTF-8 files; errors name the files."""
    hyps, refs = read_lines(hyp_path), read_lines(ref_path)
    if len(hyps) != len(refs):
        raise ValueError(f"{hyp_path} has {len(hyps)} lines but {ref_path} has {len(refs)}: they must be line-aligned")
    return score(hyps, refs)


__all__ = ["corpus_bleu", "corpus_chrf", "score", "score_files"]
