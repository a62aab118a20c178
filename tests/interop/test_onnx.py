"""`qkv export onnx`: the graphs onnxruntime runs equal the PyTorch model they come from.

The logits of every decoding step within 1e-4 of the model's own forward; greedy translations identical
(on the demo's 500 test sentences for the model the package carries); every head's attention equal to
what ``capture_attention`` records; a head switched off equal to ``heads_off``; the smaller forms
smaller and still translating alike; a run that cannot be exported refused in one line.
"""

import json

import numpy as np
import pytest
import torch

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from qkv.cli import main  # noqa: E402
from qkv.data.synthetic import SEED_SENTENCE  # noqa: E402
from qkv.data.translation import DataConfig, load_split  # noqa: E402
from qkv.generation.api import Translator  # noqa: E402
from qkv.interop.onnx import OnnxUnsupported, export_onnx, page_tokenizer  # noqa: E402
from qkv.interpret.ablation import heads_off  # noqa: E402
from qkv.interpret.capture import capture_attention  # noqa: E402
from qkv.interpret.explorer.embedded import DEMO_MODEL  # noqa: E402
from qkv.runs import Run, load_model  # noqa: E402

SENTENCES = ["小明累了，他想睡觉。", "小红饿了，她想回家。", "今天下午小刚在公园唱歌。"]


class Graphs:
    """An exported folder run by onnxruntime: encode, step, and greedy search as qkv's greedy_search."""

    def __init__(self, folder):
        self.folder = folder
        self.manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
        self.sessions = {name: ort.InferenceSession(str(folder / g["file"])) for name, g in self.manifest["graphs"].items()}
        s = self.manifest["sizes"]
        self.L, self.H, self.dk, self.dv = s["decoder_layers"], s["n_heads"], s["d_k"], s["d_v"]
        self.encoder_layers = s["encoder_layers"]

    def ones(self, layers):
        return np.ones((layers, self.H), np.float32)

    def cache(self):
        return (np.zeros((self.L, 1, self.H, 0, self.dk), np.float32), np.zeros((self.L, 1, self.H, 0, self.dv), np.float32))

    def encode(self, src, heads=None):
        heads = self.ones(self.encoder_layers) if heads is None else heads
        return self.sessions["encoder"].run(None, {"source": np.array([src]), "heads": heads})

    def step(self, token, position, past, memory, self_heads=None, cross_heads=None):
        feeds = {"token": np.array([[token]]), "position": np.array([[position]]), "past_keys": past[0],
                 "past_values": past[1], "memory_keys": memory[0], "memory_values": memory[1],
                 "self_heads": self.ones(self.L) if self_heads is None else self_heads,
                 "cross_heads": self.ones(self.L) if cross_heads is None else cross_heads}
        return self.sessions["decoder"].run(None, feeds)

    def greedy(self, src, bos, eos, max_len, **heads):
        keys, values, _ = self.encode(src, heads.pop("encoder", None))
        past, tokens = self.cache(), [bos]
        limit = min(len(src) + 50, max_len - 1)
        for t in range(limit + 1):
            logits, pk, pv, _, _ = self.step(tokens[-1], t, past, (keys, values), **heads)
            past = (pk, pv)
            nxt = eos if t >= limit else int(logits[0].argmax())
            if nxt == eos:
                break
            tokens.append(nxt)
        return tokens[1:]


@pytest.fixture(scope="module")
def mt_graphs(mt_run, tmp_path_factory):
    return Graphs(export_onnx(mt_run, tmp_path_factory.mktemp("onnx") / "mt"))


def test_every_steps_logits_equal_the_models_forward(mt_run, mt_graphs):
    model, tok = load_model(mt_run, device="cpu")
    for text in SENTENCES:
        src = tok.encode(text) + [tok.eos_id]
        keys, values, _ = mt_graphs.encode(src)
        past, prefix = mt_graphs.cache(), [tok.bos_id]
        for t in range(8):
            logits, pk, pv, _, _ = mt_graphs.step(prefix[-1], t, past, (keys, values))
            past = (pk, pv)
            with torch.no_grad():
                ref = model(torch.tensor([src]), torch.tensor([prefix]))[0, -1].numpy()
            np.testing.assert_allclose(logits[0], ref, atol=1e-4, rtol=0)
            assert pk.shape == (mt_graphs.L, 1, mt_graphs.H, t + 1, mt_graphs.dk)  # the cache, one position longer
            prefix.append(int(ref.argmax()))


def test_greedy_translations_equal_qkv_translate(mt_run, mt_graphs):
    tr = Translator.from_run(mt_run, device="cpu")
    tok = tr.tokenizer
    for text in SENTENCES:
        ids = mt_graphs.greedy(tr.encode_sources([text])[0], tok.bos_id, tok.eos_id, tr.model.cfg.max_len)
        assert tok.decode(ids).strip() == tr.translate(text, beam=1)


def test_every_heads_attention_is_an_output(mt_run, mt_graphs):
    """The weights the graphs hand back are those capture_attention records of one teacher-forced pass."""
    model, tok = load_model(mt_run, device="cpu")
    src = tok.encode(SENTENCES[0]) + [tok.eos_id]
    read = [tok.bos_id] + tok.encode("Xiaoming is tired")
    with torch.no_grad(), capture_attention(model) as maps:
        model(torch.tensor([src]), torch.tensor([read]))
    keys, values, enc_w = mt_graphs.encode(src)
    for layer in range(mt_graphs.encoder_layers):
        np.testing.assert_allclose(enc_w[layer, 0], maps["encoder_self"][layer][0].numpy(), atol=1e-5)
    past = mt_graphs.cache()
    for t, token in enumerate(read):
        _, pk, pv, self_w, cross_w = mt_graphs.step(token, t, past, (keys, values))
        past = (pk, pv)
        for layer in range(mt_graphs.L):
            np.testing.assert_allclose(self_w[layer, 0], maps["decoder_self"][layer][0, :, t, :t + 1].numpy(), atol=1e-5)
            np.testing.assert_allclose(cross_w[layer, 0], maps["cross"][layer][0, :, t].numpy(), atol=1e-5)


@pytest.mark.parametrize("kind", ["encoder_self", "decoder_self", "cross"])
def test_a_head_switched_off_is_heads_off(mt_run, mt_graphs, kind):
    tr = Translator.from_run(mt_run, device="cpu")
    tok = tr.tokenizer
    src = tr.encode_sources([SENTENCES[0]])[0]
    layers = mt_graphs.encoder_layers if kind == "encoder_self" else mt_graphs.L
    mask = np.ones((layers, mt_graphs.H), np.float32)
    mask[layers - 1, 0] = 0
    arg = {"encoder_self": "encoder", "decoder_self": "self_heads", "cross": "cross_heads"}[kind]
    ids = mt_graphs.greedy(src, tok.bos_id, tok.eos_id, tr.model.cfg.max_len, **{arg: mask})
    with heads_off(tr.model, [(kind, layers - 1, 0)]):
        expected = tr.translate(SENTENCES[0], beam=1)
        keys, values, _ = mt_graphs.encode(src, mask if kind == "encoder_self" else None)
        with torch.no_grad():
            ref = tr.model(torch.tensor([src]), torch.tensor([[tok.bos_id]]))[0, -1].numpy()
    assert tok.decode(ids).strip() == expected
    logits = mt_graphs.step(tok.bos_id, 0, mt_graphs.cache(), (keys, values),
                            **({arg: mask} if kind != "encoder_self" else {}))[0]
    np.testing.assert_allclose(logits[0], ref, atol=1e-4, rtol=0)


def test_a_gpt_step_equals_the_models_forward(gpt_run, tmp_path):
    folder = export_onnx(gpt_run, tmp_path / "gpt")
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["kind"] == "gpt" and list(manifest["graphs"]) == ["step"]
    step = ort.InferenceSession(str(folder / "step.onnx"))
    model, tok = load_model(gpt_run, device="cpu")
    ids = tok.encode("Xiaoming is tired")
    s = manifest["sizes"]
    past = (np.zeros((s["decoder_layers"], 1, s["n_heads"], 0, s["d_k"]), np.float32),) * 2
    heads = np.ones((s["decoder_layers"], s["n_heads"]), np.float32)
    with torch.no_grad(), capture_attention(model) as maps:
        ref = model(torch.tensor([ids]))[0].numpy()
    for t, token in enumerate(ids):
        logits, pk, pv, w = step.run(None, {"token": np.array([[token]]), "position": np.array([[t]]),
                                            "past_keys": past[0], "past_values": past[1], "heads": heads})
        past = (pk, pv)
        np.testing.assert_allclose(logits[0], ref[t], atol=1e-4, rtol=0)
        np.testing.assert_allclose(w[:, 0], torch.stack(maps["self"])[:, 0, :, t, :t + 1].numpy(), atol=1e-5)


@pytest.fixture(scope="module")
def demo():
    """The packaged demo model, its translator and the first 100 of its corpus's test sentences."""
    run = Run(DEMO_MODEL)
    data = DataConfig(**{k: v for k, v in run.config["data"].items() if k in DataConfig.__dataclass_fields__})
    return run, Translator.from_run(run, device="cpu"), load_split(data, "test")[0]


@pytest.mark.parametrize("form", ["fp16", "int8"])
def test_the_smaller_forms_translate_as_the_model_does(demo, tmp_path, form):
    """fp16 and int8 weights on the demo model: its greedy translations, 99 of 100 at least (all 500 of
    the test set when measured: docs/BENCHMARKS.md)."""
    run, tr, sources = demo
    tok = tr.tokenizer
    graphs = Graphs(export_onnx(run.path, tmp_path / form, form=form))
    got = [tok.decode(graphs.greedy(src, tok.bos_id, tok.eos_id, 128)).strip() for src in tr.encode_sources(sources[:100])]
    assert sum(a == b for a, b in zip(got, tr.translate(sources[:100], beam=1))) >= 99


def test_the_smaller_forms_are_a_half_and_a_quarter(tmp_path):
    """On the demo model (0.7M parameters), where the weights, not the graph, make the file."""
    size = {form: sum(f.stat().st_size for f in export_onnx(DEMO_MODEL, tmp_path / form, form=form).glob("*.onnx"))
            for form in ("fp32", "fp16", "int8")}
    assert size["fp16"] < 0.6 * size["fp32"] and size["int8"] < 0.4 * size["fp32"], size


def test_the_packaged_demo_model_translates_the_demos_500_test_sentences_alike(demo, tmp_path):
    """onnxruntime (fp32 graphs) and PyTorch greedy on every test sentence of the demo corpus: identical."""
    run, tr, sources = demo
    tok = tr.tokenizer
    graphs = Graphs(export_onnx(run.path, tmp_path / "demo"))
    assert len(sources) == 500
    got = [tok.decode(graphs.greedy(src, tok.bos_id, tok.eos_id, tr.model.cfg.max_len)).strip()
           for src in tr.encode_sources(sources)]
    assert got == tr.translate(sources, beam=1)
    assert tr.translate(SEED_SENTENCE[0], beam=1) == SEED_SENTENCE[1]


def test_a_run_it_cannot_export_gets_one_line(tmp_path, capsys, trained_runs):
    assert main(["export", "onnx", "--run", str(tmp_path / "nothing"), "--out", str(tmp_path / "o")]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nothing" in err and "Traceback" not in err
    # GPT-2's byte-level BPE: the graphs could run it, but the page could not tokenize for it.
    model, tok = load_model(trained_runs["gpt_bpe"], device="cpu")
    with pytest.raises(OnnxUnsupported, match="byte"):
        page_tokenizer(tok, {})
    assert main(["export", "onnx", "--run", str(trained_runs["gpt_bpe"]), "--out", str(tmp_path / "b")]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "tokenize" in err
    assert not (tmp_path / "b").exists()  # nothing half-written
