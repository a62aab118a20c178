"""``qkv export ctranslate2``: a run as a CTranslate2 folder, loaded back by CTranslate2's own Translator and Generator.

The log-probabilities CTranslate2 scores equal qkv's within fp32 rounding; its greedy and beam-4
decoding equal qkv's token for token (both ranking by log-probability: CTranslate2's length penalty
is |Y|^alpha, not GNMT's); the int8 folder decodes nearly as fp32; options the specs cannot hold
are named; without the library the command names the extra.
"""

import sys

import numpy as np
import pytest
import torch

from qkv.cli import main
from qkv.generation.api import Translator
from qkv.generation.beam import beam_search, greedy_search
from qkv.generation.decode import generate
from qkv.runs import load_model

ctranslate2 = pytest.importorskip("ctranslate2", reason="the ctranslate2 extra is not installed")

SOURCES = ["小明累了，他想睡觉。", "他想睡觉。", "小明累了。", "我们去公园吧。", "他们在学校。"]
PROMPTS = ["First", "All:\nSpeak", "hear me"]
LIMIT = 30


def export(run, out, *extra) -> int:
    return main(["export", "ctranslate2", "--run", str(run), "--out", str(out), *extra])


def _translator(out):
    return ctranslate2.Translator(str(out), device="cpu", inter_threads=1, intra_threads=1)


def test_a_translation_run_translates_in_ctranslate2_as_in_qkv(trained_runs, tmp_path):
    out = tmp_path / "ct2"
    assert export(trained_runs["mt"], out) == 0
    assert {"model.bin", "config.json", "shared_vocabulary.json", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    model, tokenizer = load_model(trained_runs["mt"], device="cpu")
    ids = Translator(model, tokenizer).encode_sources(SOURCES)  # each with its <eos>
    tokens = [[tokenizer.id_to_token(i) for i in s[:-1]] for s in ids]  # CTranslate2 appends <eos> itself
    vocab = {tokenizer.id_to_token(i): i for i in range(tokenizer.vocab_size)}
    src = torch.nn.utils.rnn.pad_sequence([torch.tensor(s) for s in ids], batch_first=True)  # (B, S)
    ct2 = _translator(out)
    greedy = greedy_search(model, src, tokenizer.bos_id, tokenizer.eos_id, limit=LIMIT)
    beams = [h[0].tokens for h in beam_search(model, src, tokenizer.bos_id, tokenizer.eos_id, beam_size=4, alpha=0.0,
                                               limit=LIMIT)]
    for beam, expected in ((1, greedy), (4, beams)):
        # min_decoding_length=0: CTranslate2's default (1) forbids the empty translation qkv's search may choose.
        results = ct2.translate_batch(tokens, beam_size=beam, length_penalty=0.0, max_decoding_length=LIMIT + 1,
                                      min_decoding_length=0)
        # A translation that runs to the limit: CTranslate2 writes one token more in place of qkv's <eos>.
        assert [[vocab[t] for t in r.hypotheses[0]][:LIMIT] for r in results] == expected, beam
    assert any(len(e) > 2 for e in greedy)  # a model that says something
    # Scores: the log-probability of each target token (and the <eos>), teacher-forced.
    targets = [[tokenizer.id_to_token(i) for i in e] for e in greedy]
    scored = ct2.score_batch(tokens, targets)
    for row, (expected, result) in enumerate(zip(greedy, scored)):
        tgt = torch.tensor([[tokenizer.bos_id, *expected]])
        with torch.no_grad():
            logp = torch.log_softmax(model(src[row:row + 1], tgt), -1)[0]  # (T, V)
        want = logp.gather(1, torch.tensor([*expected, tokenizer.eos_id])[:, None])[:, 0]
        np.testing.assert_allclose(result.log_probs, want.numpy(), atol=1e-4)


def test_an_int8_folder_scores_near_fp32(trained_runs, tmp_path):
    # Near, not equal: on this barely trained model int8 moves a token's log-probability by ~0.5 nats
    # on average (0.07 on the Multi30K base model; its BLEU cost is in docs/BENCHMARKS.md).
    fp32, int8 = tmp_path / "fp32", tmp_path / "int8"
    assert export(trained_runs["mt"], fp32) == 0 and export(trained_runs["mt"], int8, "--quantization", "int8") == 0
    assert (int8 / "model.bin").stat().st_size < 0.5 * (fp32 / "model.bin").stat().st_size
    _, tokenizer = load_model(trained_runs["mt"], device="cpu")
    tokens = [tokenizer.tokens(s) for s in SOURCES]
    targets = [r.hypotheses[0] for r in _translator(fp32).translate_batch(tokens, beam_size=1, max_decoding_length=LIMIT)]
    a, b = ([np.array(r.log_probs) for r in _translator(d).score_batch(tokens, targets)] for d in (fp32, int8))
    gap = np.abs(np.concatenate(a) - np.concatenate(b))
    assert 0 < gap.mean() < 1.0


@pytest.mark.parametrize("name", ["gpt_char", "gpt_bpe"])
def test_a_gpt_run_continues_in_ctranslate2_as_in_qkv(trained_runs, tmp_path, name):
    out = tmp_path / "ct2"
    assert export(trained_runs[name], out) == 0
    model, tokenizer = load_model(trained_runs[name], device="cpu")
    ct2 = ctranslate2.Generator(str(out), device="cpu", inter_threads=1, intra_threads=1)
    vocab = {tokenizer.id_to_token(i): i for i in range(tokenizer.vocab_size)}
    ids = tokenizer.encode(trained_runs["text"][:60])[:20]
    logits = np.array(ct2.forward_batch([[tokenizer.id_to_token(i) for i in ids]]))  # (1, T, V)
    with torch.no_grad():
        np.testing.assert_allclose(logits, model(torch.tensor([ids])).numpy(), atol=1e-4)
    for prompt in PROMPTS:
        ids = tokenizer.encode(prompt)
        ours = generate(model, [ids], max_new_tokens=12, temperature=0.0, eos_id=tokenizer.eos_id)[0]
        result = ct2.generate_batch([[tokenizer.id_to_token(i) for i in ids]], max_length=12, sampling_topk=1,
                                    include_prompt_in_result=False)[0]
        assert [vocab[t] for t in result.sequences[0]] == ours[:len(result.sequences[0])]
        assert len(result.sequences[0]) >= min(len(ours), 11)


def test_what_ctranslate2_cannot_hold_is_named(trained_runs, tmp_path, capsys):
    run = tmp_path / "rope"
    assert main(["train", "mt", "--recipe", "demo", "model.d_model=16", "model.n_heads=2", "model.d_ff=32",
                 "model.n_layers=1", "data.demo_train=50", "train.eval_bleu_sentences=0", "train.test_beam=1",
                 "model.positional=rope", "train.steps=1", "train.eval_every=1", "--run", str(run), "--quiet"]) == 0
    capsys.readouterr()
    assert export(run, tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model.positional" in err and "rope" in err, err
    assert not (tmp_path / "out").exists()


def test_a_folder_that_holds_something_is_replaced_only_when_asked(trained_runs, tmp_path, capsys):
    out = tmp_path / "ct2"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert export(trained_runs["gpt_char"], out) == 2
    assert "--overwrite" in capsys.readouterr().err and (out / "keep.txt").exists()
    assert export(trained_runs["gpt_char"], out, "--overwrite") == 0
    assert not (out / "keep.txt").exists() and (out / "model.bin").exists()


def test_without_ctranslate2_the_command_names_the_extra(trained_runs, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # import fails as if it were not installed
    assert export(trained_runs["mt"], tmp_path / "ct2") == 2
    err = capsys.readouterr().err
    assert "qkv[ctranslate2]" in err and err.count("\n") == 1


@pytest.mark.parametrize("option", ["model.norm=pre", "model.positional=learned", "model.bias=false",
                                    "model.activation=gelu", "model.tie_embeddings=false"])
def test_each_option_the_specs_hold_scores_as_qkv_does(tmp_path, option):
    run = tmp_path / "run"
    assert main(["train", "mt", "--recipe", "demo", "model.d_model=16", "model.n_heads=2", "model.d_ff=32",
                 "model.n_layers=1", "data.demo_train=50", "train.eval_bleu_sentences=0", "train.test_beam=1",
                 "train.threads=1", option, "train.steps=3", "train.eval_every=3", "--run", str(run), "--quiet"]) == 0
    assert export(run, tmp_path / "ct2") == 0
    model, tokenizer = load_model(run, device="cpu")
    src_ids = tokenizer.encode(SOURCES[0])
    tgt_ids = tokenizer.encode(SOURCES[1])[:6]
    scored = _translator(tmp_path / "ct2").score_batch([[tokenizer.id_to_token(i) for i in src_ids]],
                                                       [[tokenizer.id_to_token(i) for i in tgt_ids]])[0]
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([src_ids + [tokenizer.eos_id]]),
                                       torch.tensor([[tokenizer.bos_id, *tgt_ids]])), -1)[0]  # (T, V)
    want = logp.gather(1, torch.tensor([*tgt_ids, tokenizer.eos_id])[:, None])[:, 0]
    np.testing.assert_allclose(scored.log_probs, want.numpy(), atol=1e-4)
