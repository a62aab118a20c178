"""The GPT commands end to end: train lm, generate (argument and stdin), eval lm, finetune; shared groups."""

import argparse
import shutil
import io
import json

import pytest
import torch

import qkv.cli
from qkv.accel.compiled import cpu_compiler_available
from qkv.cli.common import command_group
from qkv.cli.lm import register
from qkv.generation.completer import Completer
from qkv.generation.decode import generate

TEXT = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n") * 20


@pytest.fixture(autouse=True)
def _wired(monkeypatch):
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    (root / "corpus.txt").write_text(TEXT, encoding="utf-8")
    cfg = root / "tiny.yaml"
    cfg.write_text(
        "model: {d_model: 32, n_heads: 4, d_ff: 64, n_layers: 2, max_len: 32, dropout: 0.0}\n"
        f"data: {{path: {root / 'corpus.txt'}}}\n"
        "train: {batch_size: 4, steps: 6, warmup: 1, eval_every: 3, eval_iters: 1}\n"
    )
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    assert qkv.cli.main(["train", "lm", "--config", str(cfg), "--run", str(root / "run"), "--quiet",
                         "train.steps=8"]) == 0
    torch.set_num_threads(n)
    return root / "run"


def test_train_lm_writes_a_run_and_a_json_summary(run, capsys):
    assert json.loads((run / "config.json").read_text())["train"]["steps"] == 8  # the override
    assert qkv.cli.main(["train", "lm", "--run", str(run), "--resume", "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out)["step"] == 8


def test_generate_streams_the_prompt_and_its_continuation(run, capsys):
    assert qkv.cli.main(["generate", "--run", str(run), "All:", "-n", "12", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("All:") and out.endswith("\n") and len(out) > len("All:\n")
    assert qkv.cli.main(["generate", "--run", str(run), "All:", "-n", "12", "--seed", "1"]) == 0
    assert capsys.readouterr().out == out


def test_the_command_the_completer_and_generate_sample_alike_by_default(run, capsys):
    """One default temperature (qkv.config.TEMPERATURE): the same seed continues a prompt alike in all three."""
    assert qkv.cli.main(["generate", "--run", str(run), "All:", "-n", "20", "--seed", "3"]) == 0
    printed = capsys.readouterr().out.removeprefix("All:").removesuffix("\n")
    completer = Completer.from_run(run)
    assert completer.complete("All:", max_new_tokens=20, seed=3) == printed
    tokenizer = completer.tokenizer
    new = generate(completer.model, [tokenizer.encode("All:")], 20, eos_id=tokenizer.eos_id,
                   generator=torch.Generator().manual_seed(3))[0]
    assert tokenizer.decode([t for t in new if t != tokenizer.eos_id]) == printed


@pytest.mark.skipif(not cpu_compiler_available(),
                    reason="torch.compile's CPU backend needs a C++ compiler")
def test_generate_compile_prints_what_eager_generation_prints(run, capsys):
    import torch._dynamo

    torch._dynamo.reset()
    assert qkv.cli.main(["generate", "--run", str(run), "All:", "-n", "20", "--temperature", "0"]) == 0
    eager = capsys.readouterr().out
    assert qkv.cli.main(["generate", "--run", str(run), "All:", "-n", "20", "--temperature", "0", "--compile"]) == 0
    assert capsys.readouterr().out == eager
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # it did compile
    torch._dynamo.reset()


def test_generate_reads_stdin_lines_and_writes_one_line_each(run, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("All:\\nSpeak\nFirst\n\n"))
    assert qkv.cli.main(["generate", "--run", str(run), "-n", "20", "--temperature", "0"]) == 0
    lines = capsys.readouterr().out.split("\n")
    assert len(lines) == 4 and lines[-1] == ""  # three inputs (one empty), three lines


def test_the_prompt_and_stdin_lines_take_the_escapes_that_output_lines_are_written_with(run, capsys, monkeypatch):
    from qkv.cli.lm import _escape, _unescape

    for text in ("All:\nSpeak", "a backslash and an n: \\n", "\t\\\\\n", "C:\\new", ""):
        assert _unescape(_escape(text)) == text and "\n" not in _escape(text)
    greedy = ["-n", "12", "--temperature", "0"]
    assert qkv.cli.main(["generate", "--run", str(run), "All:\nSpeak", *greedy]) == 0  # a real newline
    newline = capsys.readouterr().out
    assert qkv.cli.main(["generate", "--run", str(run), "All:\\nSpeak", *greedy]) == 0  # backslash n, as typed in ''
    assert capsys.readouterr().out == newline
    assert qkv.cli.main(["generate", "--run", str(run), "All:\\nSpeak", "--no-escape", *greedy]) == 0
    assert capsys.readouterr().out.startswith("All:\\nSpeak")  # as written
    monkeypatch.setattr("sys.stdin", io.StringIO("All:\\nSpeak\n"))
    assert qkv.cli.main(["generate", "--run", str(run), *greedy]) == 0
    continuation = newline.removeprefix("All:\nSpeak").removesuffix("\n")  # stdin's output is the new text only
    assert capsys.readouterr().out == _escape(continuation) + "\n"  # the same text, as one line
    # --stop takes the same escapes: '\n\n' (as typed in '') is a blank line, with --no-escape as written.
    from qkv.generation.completer import Completer

    stops = []
    monkeypatch.setattr(Completer, "complete", lambda self, prompt, **kw: stops.append(kw["stop"]) or "")
    assert qkv.cli.main(["generate", "--run", str(run), "All:", "--stop", "\\n\\n", "--stop", "C:\\\\new"]) == 0
    assert qkv.cli.main(["generate", "--run", str(run), "All:", "--stop", "\\n\\n", "--no-escape"]) == 0
    assert stops == [["\n\n", "C:\\new"], ["\\n\\n"]]


def test_generate_rejects_bad_arguments_with_a_message(run, capsys):
    assert qkv.cli.main(["generate", "--run", str(run), "x", "--temperature", "-1"]) == 2
    assert "temperature must be a finite number >= 0" in capsys.readouterr().err
    assert qkv.cli.main(["generate", "--run", str(run), "x" * 40]) == 2
    captured = capsys.readouterr()
    assert "--sliding-window" in captured.err and captured.out == ""  # nothing echoed before the error
    assert qkv.cli.main(["generate", "--run", str(run), "x", "--stop", ""]) == 2
    assert "--stop '' would end every completion" in capsys.readouterr().err


def test_eval_lm_prints_loss_and_perplexity(run, capsys, monkeypatch):
    kept = []
    monkeypatch.setattr("qkv.cli.lm.keep_freed_memory", lambda: kept.append(True))  # scores as a trainer does
    assert qkv.cli.main(["eval", "lm", "--run", str(run), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ppl"] == pytest.approx(2.718281828 ** out["loss"], rel=1e-6) and out["tokens"] > 100
    assert kept == [True]


def test_finetune_reports_a_malformed_file_by_line(run, tmp_path, capsys):
    data = tmp_path / "pairs.jsonl"
    data.write_text('{"prompt": "All:", "response": " Speak."}\n["not", "an", "object"]\n', encoding="utf-8")
    assert qkv.cli.main(["finetune", "--run", str(run), "--data", str(data), "--out", str(tmp_path / "ft")]) == 2
    assert "pairs.jsonl:2: expected an object" in capsys.readouterr().err


def test_finetune_with_lora_from_the_command_line(run, tmp_path, capsys):
    data = tmp_path / "pairs.jsonl"
    data.write_text('{"prompt": "All:", "response": " Speak."}\n{"prompt": "First", "response": " Citizen"}\n')
    assert qkv.cli.main(["finetune", "--run", str(run), "--data", str(data), "--valid", str(data), "--out",
                         str(tmp_path / "ft"), "--lora", "2", "--quiet", "train.steps=4", "train.warmup=1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["step"] == 4 and out["after"]["task_loss"] < out["before"]["task_loss"]
    assert qkv.cli.main(["eval", "lm", "--run", str(tmp_path / "ft"), "--json"]) == 0  # the base run's corpus
    assert json.loads(capsys.readouterr().out)["loss"] == pytest.approx(out["after"]["pretrain_loss"])
    with pytest.raises(SystemExit):  # --mix and --lora are alternatives
        qkv.cli.main(["finetune", "--run", str(run), "--data", str(data), "--out", "x", "--mix", "1", "--lora", "2"])


def test_register_joins_a_train_group_created_by_another_module():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    mt = sub.add_parser("train").add_subparsers(dest="what")
    mt.add_parser("mt").set_defaults(func="mt")
    register(sub)
    assert parser.parse_args(["train", "mt"]).func == "mt"
    assert parser.parse_args(["train", "lm", "--config", "x.yaml"]).recipe == "x.yaml"
    assert command_group(sub, "train", "") is mt


def test_generate_takes_every_weights_name_of_the_run(run, tmp_path, capsys):
    """One weights vocabulary for every command: `--weights average` works for a GPT as for translation."""
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    shutil.copy(copy / "model.safetensors", copy / "average.safetensors")
    args = ["generate", "--run", str(copy), "All:", "-n", "8", "--temperature", "0"]
    assert qkv.cli.main(args) == 0
    expected = capsys.readouterr().out
    for name in ("average", "best", "last", str(copy / "model.safetensors")):
        assert qkv.cli.main(args + ["--weights", name]) == 0, name
        assert capsys.readouterr().out.startswith("All:")
    assert qkv.cli.main(args + ["--weights", "average"]) == 0 and capsys.readouterr().out == expected
    (copy / "average.safetensors").unlink()
    assert qkv.cli.main(args + ["--weights", "average"]) == 2
    err = capsys.readouterr().err
    assert "no average.safetensors" in err and "this run has model, best, last" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_device_cuda_without_cuda_is_one_clear_line(run, capsys):
    for argv in (["generate", "--run", str(run), "All:", "-n", "2"], ["eval", "lm", "--run", str(run)]):
        assert qkv.cli.main(argv + ["--device", "cuda"]) == 2
        err = capsys.readouterr().err
        assert "torch sees no CUDA device" in err and "--device cpu" in err and "Traceback" not in err
    assert qkv.cli.main(["generate", "--run", str(run), "All:", "-n", "2", "--device", "gpu"]) == 2
    assert "unknown device 'gpu'" in capsys.readouterr().err


def test_a_translation_run_is_refused_by_generate(run, tmp_path, capsys):
    fake = tmp_path / "mt"
    shutil.copytree(run, fake)
    config = json.loads((fake / "config.json").read_text())
    config["model"]["arch"] = "transformer"
    (fake / "config.json").write_text(json.dumps(config))
    assert qkv.cli.main(["generate", "--run", str(fake), "All:"]) == 2
    assert "not a GPT" in capsys.readouterr().err
