"""The `qkv explore` command: argument parsing, export, and the --run hook."""

import argparse
import socket

import pytest

from qkv.cli import explore as commands
from qkv.interpret import model_maps


def parse(*argv):
    parser = argparse.ArgumentParser(prog="qkv")
    commands.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["explore", *argv])


def test_register_defaults():
    args = parse()
    assert args.func is commands.cmd_explore
    assert (args.run, args.host, args.port, args.export, args.text) == (None, "127.0.0.1", 8765, None, None)


def test_export_without_run(tmp_path, capsys):
    out = tmp_path / "page.html"
    args = parse("--export", str(out))
    assert args.func(args) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert "QKVFigures" in out.read_text(encoding="utf-8")


def test_run_missing_dir(tmp_path, capsys):
    args = parse("--run", str(tmp_path / "nope"), "--export", str(tmp_path / "p.html"))
    assert commands.cmd_explore(args) == 2
    assert "no such directory" in capsys.readouterr().err


def test_run_dir_that_is_not_a_run(tmp_path, capsys):
    args = parse("--run", str(tmp_path), "--export", str(tmp_path / "p.html"))
    assert commands.cmd_explore(args) == 2
    err = capsys.readouterr().err
    assert "no config.json" in err and str(tmp_path) in err
    assert not (tmp_path / "p.html").exists()


@pytest.mark.parametrize("argv,message", [
    (("--text", "x" * 501), "limit is 500"),
    (("--port", "70000"), "--port must be"),
])
def test_bad_arguments(argv, message, capsys):
    assert commands.cmd_explore(parse(*argv)) == 2
    assert message in capsys.readouterr().err


def test_port_in_use_is_a_clear_error(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert commands.cmd_explore(parse("--port", str(port))) == 2
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err and "--port 0" in err


def test_export_a_real_run_embeds_the_model_it_runs(mt_run, tmp_path, capsys):
    """The exported page carries the run's graphs, the runtime and what the page reads of them; no maps
    computed ahead (the page computes them for whatever the reader types)."""
    import json
    import re

    out = tmp_path / "p.html"
    assert commands.cmd_explore(parse("--run", str(mt_run), "--export", str(out), "--text", "他想睡觉")) == 0
    html = out.read_text(encoding="utf-8")
    live = json.loads(re.search(r'id="qkv-live">(.*?)</script>', html, flags=re.S).group(1))
    assert live["default_text"] == "他想睡觉" and live["manifest"]["kind"] == "translation"
    assert live["manifest"]["sizes"]["d_model"] == 16
    files = re.findall(r'<script type="application/octet-stream" data-qkv-file="([^"]+)">', html)
    assert sorted(files) == sorted(["decoder.onnx", "encoder.onnx", *live["wasm"].values()])
    assert set(live["wasm"]) == {"wasm", "webgpu"}  # both runtimes' wasm, the WebGPU one used only when chosen
    assert 'id="qkv-model-data"' not in html
    assert "'wasm-unsafe-eval'" in html and "connect-src" not in html  # the file fetches nothing


def test_a_site_is_a_folder_of_the_page_the_model_and_the_runtime(mt_run, tmp_path, capsys):
    site = tmp_path / "site"
    assert commands.cmd_explore(parse("--run", str(mt_run), "--site", str(site))) == 0
    names = sorted(p.name for p in site.iterdir())
    assert names == ["decoder.onnx", "encoder.onnx", "index.html", "ort-wasm-simd-threaded.jspi.wasm.gz",
                     "ort-wasm-simd-threaded.wasm.gz"]
    html = (site / "index.html").read_text(encoding="utf-8")
    assert 'type="application/octet-stream"' not in html and "connect-src 'self'" in html
    assert commands.cmd_explore(parse("--export", str(tmp_path / "a.html"), "--site", str(site))) == 2
    assert "not both" in capsys.readouterr().err


def test_lang_is_checked_and_written_into_the_export(tmp_path, capsys):
    with pytest.raises(SystemExit):
        parse("--lang", "fr")
    assert "invalid choice: 'fr'" in capsys.readouterr().err
    out = tmp_path / "en.html"
    args = parse("--export", str(out), "--lang", "en")
    assert args.func(args) == 0
    assert 'data-default-lang="en"' in out.read_text(encoding="utf-8")


def test_the_head_qkv_explain_found_reaches_the_server(tmp_path, monkeypatch):
    import json

    from qkv.runs import PRONOUNS_JSON

    (tmp_path / PRONOUNS_JSON).write_text(json.dumps({"best": {"kind": "cross", "layer": 1, "head": 0, "share": 0.8,
                                                               "n": 600, "share_two": 0.5, "flip": 0.1},
                                                      "seed_sentence": {"sentence": "小明累了，想睡觉。"}}))
    assert model_maps.pronoun_head(str(tmp_path)) == {"kind": "cross", "layer": 1, "head": 0, "share": 0.8, "n": 600,
                                                     "share_two": 0.5, "sentence": "小明累了，想睡觉。"}
    (tmp_path / PRONOUNS_JSON).write_text("{}")
    with pytest.raises(LookupError, match="run it again"):
        model_maps.pronoun_head(str(tmp_path))
    assert model_maps.pronoun_head(str(tmp_path / "elsewhere")) is None


def test_the_server_starts_on_the_sentence_the_pronoun_head_is_seen_at_work_on(tmp_path, monkeypatch):
    head = {"kind": "cross", "layer": 1, "head": 0, "share": 0.8, "n": 600, "share_two": 0.5,
            "sentence": "小明累了，想睡觉。"}
    monkeypatch.setattr(commands, "_load_views", lambda run_dir: {"attention_provider": None, "pronoun_head": head})
    seen = {}
    monkeypatch.setattr(commands, "serve", lambda host, port, **kw: seen.update(kw) or 0)
    assert commands.cmd_explore(parse("--run", str(tmp_path))) == 0
    assert seen["default_text"] == "小明累了，想睡觉。" and seen["pronoun_head"] == head
    assert commands.cmd_explore(parse("--run", str(tmp_path), "--text", "他想")) == 0
    assert seen["default_text"] == "他想"  # --text wins
