import json

import pytest
import torch

from qkv.cli import main
from qkv.config import ModelConfig, to_dict


@pytest.fixture
def mt_run(tmp_path):
    """A translation run directory with an untrained tiny model: config.json, tokenizer.json, weights."""
    from qkv.models import Transformer
    from qkv.tokenizers.bpe import BPETokenizer
    from qkv.training.checkpoint import save_weights

    tok = BPETokenizer.train(["小明累了，他想睡觉。", "Xiaoming is tired, he wants to sleep."] * 5, vocab_size=80)
    cfg = ModelConfig(vocab_size=tok.vocab_size, d_model=16, n_heads=2, d_ff=32, n_layers=2, dropout=0.0, max_len=64)
    torch.manual_seed(0)
    tok.save(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model": to_dict(cfg)}))
    save_weights(tmp_path / "model.safetensors", Transformer(cfg))
    return tmp_path


def test_translation_maps_cover_every_kind_and_layer(mt_run):
    from qkv.interpret.model_maps import make_attention_provider

    payload = make_attention_provider(mt_run)("小明累了，他想睡觉。")
    kinds = [(m["kind"], m["layer"]) for m in payload["maps"]]
    assert kinds == [(k, layer) for k in ("encoder_self", "decoder_self", "cross") for layer in (0, 1)]
    for m in payload["maps"]:
        w = m["weights"]
        assert w.shape == (2, len(m["query_tokens"]), len(m["key_tokens"]))
        torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]))
    cross = payload["maps"][4]
    assert cross["key_tokens"][-1] == "<eos>" and cross["query_tokens"][0] == "<bos>"


def test_plot_attention_command_writes_pngs(mt_run, capsys):
    assert main(["plot", "attention", "--run", str(mt_run), "小明累了。"]) == 0
    paths = capsys.readouterr().out.split()
    assert len(paths) == 6 and all(p.endswith(".png") for p in paths)
    assert (mt_run / "attention" / "cross_layer1.png").stat().st_size > 1000


def test_not_a_run_dir(tmp_path, capsys):
    assert main(["plot", "attention", "--run", str(tmp_path), "x"]) == 2
    assert "no config.json" in capsys.readouterr().err
    assert main(["plot", "curves", "--run", str(tmp_path)]) == 2
    assert "no metrics.jsonl" in capsys.readouterr().err
