"""Evaluation: translation quality with sacreBLEU (BLEU, chrF), the token losses, and every model's validation loss."""

from qkv.evaluation.bleu import corpus_bleu, corpus_chrf, score, score_files

__all__ = ["corpus_bleu", "corpus_chrf", "score", "score_files"]
