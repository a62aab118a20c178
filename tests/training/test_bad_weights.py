"""Weights are checked when loaded for use: NaN or infinite values, and a weights path that is not a regular
file, are one line in every command and an error in the Python API; never a traceback, an empty output or a
silent fallback to other weights."""

import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from qkv.cli import main
from qkv.generation.api import Translator
from qkv.weights import CheckpointError


def _poison(path, value=float("nan")):
    tensors = load_file(str(path))
    name = sorted(tensors)[0]
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[0] = value
    save_file(tensors, str(path))
    return name


@pytest.fixture(scope="module")
def runs(tiny_jobs, tmp_path_factory):
    root = tmp_path_factory.mktemp("bad_weights")
    out = {}
    for job in ("lm", "mt"):
        assert main(tiny_jobs.argv(job, root / job)) == 0
        out[job] = root / job
    return out


def _one_line(capsys, *words):
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in captured.err, captured.err
    assert all(w in err[0] for w in words), err[0]
    return captured.out


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
@pytest.mark.parametrize("argv", [
    ["generate", "First", "-n", "5", "--seed", "1"],
    ["generate", "First", "-n", "5", "--temperature", "0"],
    ["eval", "lm"],
])
def test_non_finite_gpt_weights_are_one_line(runs, tmp_path, argv, value, capsys):
    run = tmp_path / "run"
    os.system(f"cp -r {runs['lm']} {run}")
    name = _poison(run / "model.safetensors", value)
    capsys.readouterr()
    assert main([*argv[:2], "--run", str(run), *argv[2:]]) == 1  # damaged weights: exit 1, as a damaged checkpoint
    _one_line(capsys, "model.safetensors", name, "NaN or infinite", "--weights")
    # --weights best is the way out the line names, and it works.
    assert main([*argv[:2], "--run", str(run), "--weights", "best", *argv[2:]]) == 0


def test_non_finite_translator_weights_are_one_line_and_an_error_in_the_api(runs, tmp_path, capsys):
    run = tmp_path / "run"
    os.system(f"cp -r {runs['mt']} {run}")
    name = _poison(run / "model.safetensors")
    capsys.readouterr()
    (tmp_path / "in.txt").write_text("小明累了。\n", encoding="utf-8")
    assert main(["translate", "--run", str(run), "--beam", "1", "--input", str(tmp_path / "in.txt")]) == 1
    assert _one_line(capsys, "model.safetensors", name, "NaN or infinite") == ""  # no empty translation printed
    with pytest.raises(CheckpointError, match="NaN or infinite"):
        Translator.from_run(run, device="cpu")


@pytest.mark.parametrize("kind", ["folder", "device", "broken link"])
def test_weights_that_are_not_a_file_are_one_line_never_a_fallback(runs, tmp_path, kind, capsys):
    run = tmp_path / "run"
    os.system(f"cp -r {runs['mt']} {run}")
    weights = run / "model.safetensors"
    weights.unlink()
    if kind == "folder":
        weights.mkdir()
    else:
        weights.symlink_to("/dev/zero" if kind == "device" else tmp_path / "gone.safetensors")
    assert (run / "best.safetensors").is_file()  # what was silently used before
    (tmp_path / "in.txt").write_text("小明累了。\n", encoding="utf-8")
    capsys.readouterr()
    assert main(["translate", "--run", str(run), "--beam", "1", "--input", str(tmp_path / "in.txt")]) == 2
    _one_line(capsys, "model.safetensors", kind if kind != "device" else "not a regular file", "--weights")


def test_non_finite_weights_are_refused_by_the_loader_itself():
    from qkv.weights import load_state_dict_into

    model = torch.nn.Linear(2, 2)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state["bias"][1] = float("nan")
    with pytest.raises(CheckpointError, match="x.safetensors: tensor bias holds NaN"):
        load_state_dict_into(model, state, source="x.safetensors")
    assert bool(torch.isfinite(model.bias).all())  # nothing copied in
