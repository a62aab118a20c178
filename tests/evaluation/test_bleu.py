"""sacreBLEU BLEU and chrF: cased, 13a-tokenized, line-aligned inputs, errors that name the files."""

import math

import pytest

from qkv.evaluation.bleu import corpus_bleu, corpus_chrf, score, score_files

REFS = ["Xiaoming is tired, he wants to sleep.", "The dog bit the man.", "It was not unexpected."]


def test_identical_text_scores_100():
    assert corpus_bleu(REFS, REFS) == pytest.approx(100.0)
    assert corpus_chrf(REFS, REFS) == pytest.approx(100.0)


def test_bleu_is_cased():
    lowered = [r.lower() for r in REFS]
    assert corpus_bleu(lowered, REFS) < 85.0  # three capitals lost: 79.5
    assert corpus_bleu(REFS, REFS) == pytest.approx(100.0)


def test_13a_tokenization_splits_punctuation():
    # "sleep." is scored as "sleep ." either way: spacing the period changes nothing.
    spaced = ["Xiaoming is tired , he wants to sleep ."]
    assert corpus_bleu(spaced, REFS[:1]) == pytest.approx(100.0)


def test_worse_translation_scores_lower():
    close = ["Xiaoming is tired, he wants to rest.", "The dog bit the man.", "It was not unexpected."]
    far = ["Xiaohong is happy.", "A cat.", "Surprising."]
    assert corpus_bleu(far, REFS) < corpus_bleu(close, REFS) < 100.0
    assert corpus_chrf(far, REFS) < corpus_chrf(close, REFS) < 100.0


def test_score_reports_signatures_and_exact_matches():
    s = score(REFS[:2] + ["Nope."], REFS)
    assert s["exact"] == pytest.approx(2 / 3)
    assert s["sentences"] == 3
    assert "tok:13a" in s["bleu_signature"] and "case:mixed" in s["bleu_signature"]
    assert "nc:6" in s["chrf_signature"]
    assert s["length_ratio"] == pytest.approx(17 / 20) and s["brevity_penalty"] < 1  # "Nope ." for 5 tokens


def test_a_short_translation_loses_bleu_through_the_brevity_penalty_alone():
    ref = ["a man in a blue shirt is riding a red bike down the street ."]
    half = ["a man in a blue shirt is riding"]  # every n-gram right, half the length
    s = score(half, ref)
    assert s["length_ratio"] == pytest.approx(8 / 15)
    assert s["brevity_penalty"] == pytest.approx(math.exp(1 - 15 / 8))
    assert s["bleu"] == pytest.approx(100 * s["brevity_penalty"])  # precisions all 1
    assert score(ref, ref)["brevity_penalty"] == 1.0


def test_misaligned_inputs_are_errors(tmp_path):
    with pytest.raises(ValueError, match="2 hypotheses but 3 references"):
        corpus_bleu(REFS[:2], REFS)
    with pytest.raises(ValueError, match="no sentences"):
        score([], [])
    hyp, ref = tmp_path / "hyp.txt", tmp_path / "ref.txt"
    hyp.write_text("a\nb\n", encoding="utf-8")
    ref.write_text("a\n", encoding="utf-8")
    with pytest.raises(ValueError, match="hyp.txt has 2 lines but .*ref.txt has 1"):
        score_files(hyp, ref)


def test_score_files(tmp_path):
    hyp, ref = tmp_path / "hyp.txt", tmp_path / "ref.txt"
    ref.write_text("\n".join(REFS) + "\n", encoding="utf-8")
    hyp.write_text("\n".join(REFS) + "\n", encoding="utf-8")
    assert score_files(hyp, ref)["bleu"] == pytest.approx(100.0)
