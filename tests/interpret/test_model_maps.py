import torch

from qkv.cli import main
from qkv.interpret.explorer.payload import normalize_attention_data


def test_translation_maps_cover_every_kind_and_layer(mt_run):
    from qkv.interpret.model_maps import make_attention_provider

    payload = make_attention_provider(mt_run)("小明累了，他想睡觉。")
    kinds = [(m["kind"], m["layer"]) for m in payload["maps"]]
    assert kinds == [(k, layer) for k in ("encoder_self", "decoder_self", "cross") for layer in (0, 1)]
    for m in payload["maps"]:
        w = m["weights"]
        assert w.shape == (2, len(m["query_tokens"]), len(m["key_tokens"]))
        torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]))
    # Decoder rows are labeled with the token produced there, decoder keys with the tokens read:
    # the model reads "<bos> y1 .. yn" and produces "y1 .. yn <eos>".
    cross, dec = payload["maps"][4], payload["maps"][2]
    assert cross["key_tokens"][-1] == "<eos>" and cross["query_tokens"][-1] == "<eos>"
    assert dec["key_tokens"][0] == "<bos>" and dec["query_tokens"][:-1] == dec["key_tokens"][1:]
    assert cross["query_tokens"] == dec["query_tokens"]
    # What the explorer's server and export make of it: output, kind and layer kept, weights to 1e-7.
    page = normalize_attention_data(payload)
    assert page["output"] == payload["output"] and page["text"] == "小明累了，他想睡觉。"
    for m, p in zip(payload["maps"], page["maps"]):
        assert (p["kind"], p["layer"], p["name"]) == (m["kind"], m["layer"], m["name"])
        assert (torch.tensor(p["weights"], dtype=torch.float64) - m["weights"].double()).abs().max() <= 5e-8


def test_plot_attention_command_writes_pngs(mt_run, capsys, recwarn):
    assert main(["plot", "attention", "--run", str(mt_run), "小明累了。"]) == 0
    assert not [w for w in recwarn if "missing from font" in str(w.message)]
    paths = capsys.readouterr().out.split()
    assert len(paths) == 6 and all(p.endswith(".png") for p in paths)
    assert (mt_run / "attention" / "cross_layer1.png").stat().st_size > 1000


def test_not_a_run_dir(tmp_path, capsys):
    assert main(["plot", "attention", "--run", str(tmp_path), "x"]) == 2
    assert "no config.json" in capsys.readouterr().err
    assert main(["plot", "curves", "--run", str(tmp_path)]) == 2
    assert "no metrics.jsonl" in capsys.readouterr().err


def test_plot_curves_command(mt_run, tmp_path, capsys):
    out = tmp_path / "curves.png"
    assert main(["plot", "curves", "--run", str(mt_run), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_demo_figure_labels_rows_as_plot_attention_does(mt_run, tmp_path, monkeypatch):
    import qkv.demo
    from qkv.generation.api import Translator
    from qkv.interpret.model_maps import make_attention_provider

    drawn = []
    real = qkv.demo.plot_attention

    def recording(weights, queries, keys, path, **kw):
        drawn.append((queries, keys))
        return real(weights, queries, keys, path, **kw)

    monkeypatch.setattr(qkv.demo, "plot_attention", recording)
    text = "小明累了，他想睡觉。"
    qkv.demo.plot_seed_attention(Translator.from_run(mt_run), text, tmp_path / "seed.png")
    beam4 = make_attention_provider(mt_run, beam=4)(text)  # the demo draws its beam-4 translation
    assert drawn == [(m["query_tokens"], m["key_tokens"]) for m in beam4["maps"] if m["kind"] == "cross"]
    assert (tmp_path / "seed.png").is_file()
