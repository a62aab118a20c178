"""`qkv demo` and the translation commands end to end: train mt, resume, translate (stdin, files, bad input), eval mt."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import qkv.cli
from qkv.demo import ATTENTION_PNG, RESULTS_JSON, run_demo
from qkv.cli.mt import line_groups

ROOT = Path(__file__).resolve().parents[1]

TINY_YAML = """\
# A few steps of a tiny model, for tests.
#   qkv train mt --config tiny.yaml --run RUN
model: {d_model: 32, n_heads: 4, d_ff: 64, n_layers: 1, dropout: 0.1, max_len: 64}
data: {corpus: demo, vocab_size: 150, max_tokens: 300, max_src_len: 40, max_tgt_len: 40,
       demo_train: 300, demo_valid: 16, demo_test: 8}
train: {steps: 4, warmup: 2, peak_lr: 2.0e-3, eval_every: 2, eval_bleu_sentences: 4, log_every: 1, test_beam: 2}
"""

TINY_OVERRIDES = ["model.d_model=32", "model.d_ff=64", "model.n_layers=1", "data.vocab_size=150",
                  "data.demo_train=300", "data.demo_valid=16", "data.demo_test=8", "train.steps=4", "train.eval_every=2",
                  "train.eval_bleu_sentences=4", "train.warmup=2", "train.test_beam=2"]

# Runs the commands the way the `qkv` entry point does.
DRIVER = "import sys, qkv.cli as c; sys.exit(c.main(sys.argv[1:]))"


@pytest.fixture
def qkv_main():
    """``qkv.cli.main``, the entry point."""
    return qkv.cli.main


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A run of `qkv train mt` on a tiny config (4 steps)."""
    root = tmp_path_factory.mktemp("cli")
    config = root / "tiny.yaml"
    config.write_text(TINY_YAML, encoding="utf-8")
    run = root / "run"
    assert qkv.cli.main(["train", "mt", "--config", str(config), "--run", str(run)]) == 0
    return run


def test_the_demo_reads_the_shipped_recipe(monkeypatch, tmp_path):
    """`qkv demo` trains exactly what `qkv train mt --recipe demo` trains."""
    import qkv.demo
    from qkv.training import recipes

    seen = {}

    def fake_train(cfg, run_dir, **kw):
        seen["cfg"] = cfg
        raise KeyboardInterrupt  # stop before any work

    monkeypatch.setattr(qkv.demo, "train", fake_train)
    with pytest.raises(KeyboardInterrupt):
        run_demo(tmp_path / "demo", quiet=True)
    assert seen["cfg"] == recipes.load("mt", "demo")
    assert seen["cfg"].train.steps == 450 and seen["cfg"].data.corpus == "demo"


def test_train_mt_writes_a_usable_run(tiny_run):
    summary = json.loads((tiny_run / "results.json").read_text())
    assert summary["steps"] == 4
    assert (tiny_run / "model.safetensors").is_file() and (tiny_run / "tokenizer.json").is_file()


def test_resume_continues_from_the_last_checkpoint(tiny_run, qkv_main, capsys):
    assert qkv_main(["train", "mt", "--run", str(tiny_run), "--resume", "train.steps=6"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] == 6
    steps = [r["step"] for r in map(json.loads, (tiny_run / "metrics.jsonl").read_text().splitlines())
             if r["split"] == "train"]
    assert steps == [1, 2, 3, 4, 5, 6]


def test_train_mt_without_config_is_a_clear_error(qkv_main, capsys):
    assert qkv_main(["train", "mt"]) == 2
    assert "--recipe" in capsys.readouterr().err


def test_train_mt_unknown_key_suggests(qkv_main, tmp_path, capsys):
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY_YAML, encoding="utf-8")
    assert qkv_main(["train", "mt", "--config", str(config), "--run", str(tmp_path / "r"), "train.step=3"]) == 2
    assert "did you mean 'steps'" in capsys.readouterr().err


def test_translate_files_keep_one_line_per_line(tiny_run, qkv_main, tmp_path):
    src = tmp_path / "in.zh"
    src.write_text("小明饿了，他想吃饭。\n\n   \n¿Qué? 🙂 ☃ Ж\n小红很忙。", encoding="utf-8")  # no final newline
    out = tmp_path / "out.en"
    argv = ["translate", "--run", str(tiny_run), "--input", str(src), "--output", str(out), "--beam", "2"]
    assert qkv_main(argv) == 0
    lines = out.read_text(encoding="utf-8").split("\n")
    assert len(lines) == 6 and lines[-1] == ""  # 5 lines, each ended by a newline
    assert lines[1] == "" and lines[2] == ""


def test_translate_nbest(tiny_run, qkv_main, tmp_path, capsys):
    src = tmp_path / "in.zh"
    src.write_text("小明饿了，他想吃饭。\n", encoding="utf-8")
    assert qkv_main(["translate", "--run", str(tiny_run), "--input", str(src), "--beam", "3", "--nbest", "2"]) == 0
    fields = capsys.readouterr().out.rstrip("\n").split("\t")
    assert len(fields) == 4 and float(fields[1]) >= float(fields[3])


def test_translate_too_long_input(tiny_run, qkv_main, tmp_path, capsys):
    src = tmp_path / "long.zh"
    src.write_text("小明饿了。\n" + "小明饿了，他想吃饭。" * 40 + "\n", encoding="utf-8")
    assert qkv_main(["translate", "--run", str(tiny_run), "--input", str(src)]) == 2
    err = capsys.readouterr().err
    assert "line 2" in err and "--truncate" in err and "at most 64" in err
    out = tmp_path / "out.en"
    assert qkv_main(["translate", "--run", str(tiny_run), "--input", str(src), "--output", str(out), "--truncate"]) == 0
    assert len(out.read_text(encoding="utf-8").splitlines()) == 2


def test_translate_names_what_is_missing(tiny_run, qkv_main, tmp_path, capsys):
    assert qkv_main(["translate", "--run", str(tmp_path / "nowhere")]) == 2
    assert "run directory not found" in capsys.readouterr().err
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "config.json").write_bytes((tiny_run / "config.json").read_bytes())
    assert qkv_main(["translate", "--run", str(partial)]) == 2
    err = capsys.readouterr().err
    assert "tokenizer.json" in err and "model.safetensors" in err


def test_translate_rejects_mismatched_files(tiny_run, qkv_main, tmp_path, capsys):
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for name in ("tokenizer.json", "model.safetensors"):
        (mixed / name).write_bytes((tiny_run / name).read_bytes())
    cfg = json.loads((tiny_run / "config.json").read_text())
    cfg["model"]["d_model"] = 64
    (mixed / "config.json").write_text(json.dumps(cfg))
    assert qkv_main(["translate", "--run", str(mixed)]) == 2
    assert "different runs" in capsys.readouterr().err


def test_translate_stdin_pipe(tiny_run):
    """Through a real pipe: empty lines stay empty, undecodable bytes and unknown characters never crash."""
    data = "小明饿了，他想吃饭。\n\n".encode() + b"\xff\xfe broken\n" + "🙂\n".encode()
    proc = subprocess.run([sys.executable, "-c", DRIVER, "translate", "--run", str(tiny_run), "--beam", "1"],
                          input=data, capture_output=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr.decode()
    lines = proc.stdout.decode("utf-8").split("\n")
    assert len(lines) == 5 and lines[1] == "" and lines[-1] == ""


def test_line_groups_read_what_has_arrived():
    r, w = os.pipe()
    os.write(w, "a\nb\n".encode())
    with open(r, "rb") as reader:
        groups = line_groups(reader, size=10)
        assert next(groups) == ["a", "b"]  # both lines were there; nothing waits for more
        os.write(w, "c\r\nd".encode())
        os.close(w)
        assert list(groups) == [["c"], ["d"]]


def test_line_groups_respect_size():
    import io

    assert list(line_groups(io.StringIO("1\n2\n3\n"), size=2)) == [["1", "2"], ["3"]]


def test_eval_mt_on_the_run_and_on_files(tiny_run, qkv_main, tmp_path, capsys):
    assert qkv_main(["eval", "mt", "--run", str(tiny_run), "--split", "test", "--beam", "1", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["sentences"] == 8 and 0 <= result["bleu"] <= 100
    ref = tmp_path / "ref.en"
    ref.write_text("Xiaoming is tired.\nShe wants to sleep.\n", encoding="utf-8")
    assert qkv_main(["eval", "mt", "--hyp", str(ref), "--ref", str(ref)]) == 0
    out = capsys.readouterr().out
    assert "BLEU 100.00" in out and "chrF 100.00" in out and "length ratio 1.000" in out
    short = tmp_path / "short.en"
    short.write_text("Xiaoming is tired.\n", encoding="utf-8")
    assert qkv_main(["eval", "mt", "--hyp", str(short), "--ref", str(ref)]) == 2
    assert "must be line-aligned" in capsys.readouterr().err


def test_eval_mt_picks_the_weights_of_the_run(tiny_run, qkv_main, capsys):
    from qkv.weights import average_checkpoints
    from safetensors.torch import load_file

    steps = sorted(tiny_run.glob("step_*.safetensors"))  # the trainer averages the last 5 (all that are kept)
    assert len(steps) >= 2
    averaged, saved = average_checkpoints(steps), load_file(tiny_run / "average.safetensors")
    assert averaged.keys() == saved.keys() and all(torch.equal(averaged[k], saved[k]) for k in saved)
    for weights in ("model", "best", "last", "average", str(steps[0])):
        assert qkv_main(["eval", "mt", "--run", str(tiny_run), "--split", "test", "--beam", "1", "--json",
                         "--weights", weights]) == 0
        assert 0 <= json.loads(capsys.readouterr().out)["bleu"] <= 100
    assert qkv_main(["eval", "mt", "--run", str(tiny_run), "--weights", "step_0000099"]) == 2
    assert "step_0000099" in capsys.readouterr().err


def test_train_group_tolerates_a_second_registration():
    import argparse

    from qkv.cli import common, mt

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    group = common.command_group(sub, "train", "train")
    group.add_parser("lm")
    mt.register(sub)
    assert set(common.command_group(sub, "train", "train").choices) == {"lm", "mt"}


def test_demo_smoke(tmp_path, capsys, recwarn):
    """The whole demo with a tiny budget: it runs, writes its files and says where they are."""
    run = tmp_path / "demo"
    assert run_demo(run, overrides=TINY_OVERRIDES, quiet=True) == 0
    # The seed sentence is drawn with the font qkv brings, whatever fonts the machine has.
    assert not [w for w in recwarn if "missing from font" in str(w.message)]
    out = capsys.readouterr().out
    assert "Test BLEU" in out and "小明累了，他想睡觉。" in out and "Try next" in out and str(run) in out
    comments = {line.index(" # ") for line in out.splitlines() if line.startswith("  qkv ") and " # " in line}
    assert len(comments) == 1  # the suggested commands' comments in one column, whatever the run's path
    assert (run / ATTENTION_PNG).stat().st_size > 1000
    results = json.loads((run / RESULTS_JSON).read_text(encoding="utf-8"))
    assert results["seed_sentence"] == "小明累了，他想睡觉。" and len(results["examples"]) == 5
    assert run_demo(run, overrides=TINY_OVERRIDES, quiet=True) == 0  # a second demo replaces the first


@pytest.mark.slow
def test_demo_reaches_its_targets(tmp_path):
    """The real `qkv demo`, in a fresh process with torch's default threads: the seed sentence exact
    and test BLEU >= 90, within the time budget."""
    run = tmp_path / "demo"
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    proc = subprocess.run([sys.executable, "-c", DRIVER, "demo", "--run", str(run)], capture_output=True,
                          timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    results = json.loads((run / RESULTS_JSON).read_text(encoding="utf-8"))
    assert results["seed_translation"] == "Xiaoming is tired, he wants to sleep."
    assert results["test_bleu"] >= 90.0
    assert results["wall_seconds"] < 300  # the budget is 180 s; a busy shared machine is slower
    assert "Xiaoming is tired, he wants to sleep." in proc.stdout.decode()
