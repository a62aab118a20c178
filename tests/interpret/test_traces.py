"""qkv.interpret.traces: training at once against generating one token at a time, and GPT's practice
problems, on real tiny runs; and the traces and Table 3 rows the explorer page embeds."""

import math

import numpy as np
import pytest
import torch

from qkv.generation.api import Translator
from qkv.interpret.model_maps import token_strings
from qkv.interpret.traces import make_trace_provider, model_sizes, practice_trace, translation_trace
from qkv.runs import load_model

SEED = "小明累了，他想睡觉。"


def test_translation_trace_generates_what_greedy_translate_writes(mt_run):
    tr = Translator.from_run(mt_run, device="cpu")
    trace = translation_trace(tr, SEED)
    words = tr.translate(SEED, beam=1)
    assert trace["output"] == words
    expected = token_strings(tr.tokenizer, tr.tokenizer.encode(words)) + ["<eos>"]
    assert [s["chosen"] for s in trace["steps"]] == expected == trace["target"]
    assert trace["read"] == ["<bos>"] + trace["target"][:-1]  # shifted right behind <bos>
    assert trace["source_tokens"] == token_strings(tr.tokenizer, tr.encode_sources([SEED])[0])
    for step in trace["steps"]:
        assert step["top"][0][1] >= step["top"][-1][1]
        assert sum(step["cross"]) == pytest.approx(1.0, abs=1e-4)  # a softmax row over the source
        assert len(step["cross"]) == len(trace["source_tokens"])


def test_translation_trace_teacher_forcing_equals_generating_step_by_step(mt_run):
    """The one teacher-forced pass gives each position the distribution the step-by-step generation had:
    the causal mask keeps every position from the tokens after it."""
    tr = Translator.from_run(mt_run, device="cpu")
    trace = translation_trace(tr, SEED)
    n = len(trace["read"])
    for t, (row, step) in enumerate(zip(trace["teacher"], trace["steps"])):
        if t == n - 1 and len(trace["steps"]) and step["chosen"] == "<eos>" and step["top"][0][0] != "<eos>":
            continue  # the length limit forced <eos>
        assert [c[0] for c in row["top"]] == [c[0] for c in step["top"]]
        np.testing.assert_allclose([c[1] for c in row["top"]], [c[1] for c in step["top"]], atol=1e-5)
    # The mask table: weights zero above the diagonal, rows summing to 1; log weights None there.
    w = np.array(trace["self_weights"])
    assert w.shape == (n, n)
    assert np.all(np.triu(w, 1) == 0) and np.allclose(w.sum(1), 1, atol=1e-5)
    logs = trace["self_log_weights"]
    assert all((logs[i][j] is None) == (j > i) for i in range(n) for j in range(n))
    assert math.exp(logs[n - 1][0]) == pytest.approx(w[n - 1, 0], rel=1e-3)
    assert trace["model"] == model_sizes(mt_run) == {"arch": "transformer", "d_model": 16, "n_heads": 2, "d_k": 8,
                                                     "d_ff": 32, "n_layers": 2, "n_decoder_layers": 2}


def test_practice_trace_one_pass_equals_each_prefix_alone(gpt_run):
    model, tok = load_model(gpt_run, device="cpu")
    text = "Xiaoming is tired, he wants to sleep."
    trace = practice_trace(model, tok, text)
    ids = tok.encode(text)
    assert len(trace["problems"]) == len(ids) - 1 and trace["tokens"] == token_strings(tok, ids)
    for t, p in enumerate(trace["problems"], 1):
        with torch.no_grad():
            alone = model(torch.tensor([ids[:t]]))[0, -1].float().log_softmax(-1)  # the prefix, nothing after it
        assert p["nll"] == pytest.approx(-float(alone[ids[t]]), abs=1e-5)
        assert p["prefix"] == trace["tokens"][:t] and p["answer"] == trace["tokens"][t]
    assert trace["mean_nll"] == pytest.approx(np.mean([p["nll"] for p in trace["problems"]]), abs=1e-6)


def test_practice_trace_refuses_what_it_cannot_cut(gpt_run):
    model, tok = load_model(gpt_run, device="cpu")
    with pytest.raises(ValueError, match="at least two tokens"):
        practice_trace(model, tok, "X")
    with pytest.raises(ValueError, match="reads at most"):
        practice_trace(model, tok, "Xiaoming is tired. " * 40)


def test_trace_providers_by_kind(mt_run, gpt_run):
    provide, kind = make_trace_provider(mt_run)
    assert kind == "translation" and provide(SEED)["source"] == SEED
    provide, kind = make_trace_provider(gpt_run)
    assert kind == "practice" and provide("Xiaoming is tired")["text"] == "Xiaoming is tired"
    with pytest.raises(ValueError, match="empty"):
        provide("   ")


# ---------------------------------------------------------------- what the page embeds


def test_the_practice_example_is_consistent():
    from qkv.interpret.explorer.constants import CONSTANTS
    from qkv.interpret.explorer.embedded import load

    practice = load()
    assert practice["text"] == CONSTANTS["PRACTICE_TEXT"]
    assert [("".join(p["prefix"]), p["answer"]) for p in practice["problems"]][1:3] == [("今天", "天"), ("今天天", "气")]
    for p in practice["problems"]:
        assert p["nll"] == pytest.approx(-math.log(p["p"]), rel=1e-4)


def test_the_packaged_demo_model_answers_the_first_articles_question():
    """The model the package carries (figures 9 and 11 with no --run) writes "he" for 他, every step its first choice."""
    from qkv.data.synthetic import SEED_SENTENCE
    from qkv.interpret.explorer.embedded import DEMO_MODEL

    provide, kind = make_trace_provider(DEMO_MODEL)
    teacher = provide(SEED_SENTENCE[0])
    assert kind == "translation" and len(teacher["read"]) == 10  # the first article's ten positions
    assert [s["chosen"] for s in teacher["steps"]] == teacher["target"]
    assert [r["top"][0][0] for r in teacher["teacher"]] == teacher["target"]
    assert teacher["output"] == SEED_SENTENCE[1]


def test_the_embedded_table3_rows_are_the_committed_results():
    from pathlib import Path

    from qkv.experiments.grid import read_results
    from qkv.experiments.table3 import EXPLORER_FILE, explorer_table, variants
    from qkv.interpret.explorer.constants import load_constants

    results = Path(__file__).resolve().parents[2] / "docs" / "results" / "table3"
    grid = variants()
    assert load_constants(EXPLORER_FILE) == explorer_table(read_results(results, grid), grid)
    rows = {(r["row"], r["label"]): r for r in load_constants(EXPLORER_FILE)["rows"]}
    assert rows[("A", "h=1")]["paper_delta"] == -0.9 and rows[("E", "learned")]["paper_bleu"] == 25.7
