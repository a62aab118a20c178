"""The modes of the files qkv writes: each gets the mode a plain ``open()`` gives under the user's umask, as a
file written whole through a temporary one too (safetensors' and mkdtemp's are private), and a file replaced
keeps the mode it had (as git and rsync keep it). Every writer, under umask 022 and 027."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from qkv.cli import main
from qkv.files import atomic_path, atomic_paths, creation_mode, match_mode, write_bytes, write_json, write_text
from qkv.weights import save_weights

UMASKS = (0o022, 0o027)
TINY_MT = ["--quiet", "train.steps=4", "model.d_model=16", "model.n_heads=2", "model.d_ff=32", "model.n_layers=1",
           "train.eval_every=2", "train.eval_bleu_sentences=0", "data.demo_train=200", "data.demo_valid=8",
           "data.demo_test=8", "train.keep_checkpoints=2", "train.average_last=2", "train.test_beam=1",
           "train.threads=1"]


@pytest.fixture(params=UMASKS, ids=lambda m: f"umask{m:03o}")
def umask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def open_mode(folder: Path, directory: bool = False) -> int:
    """What the system itself gives a new file (folder) under the umask now: the truth to compare with."""
    probe = folder / ".probe"
    if directory:
        probe.mkdir()
    else:
        probe.open("w").close()
    try:
        return mode(probe)
    finally:
        probe.rmdir() if directory else probe.unlink()


def modes(folder: Path) -> dict[str, int]:
    """Every file and folder under ``folder`` (hidden ones too), by relative path, with its mode."""
    return {p.relative_to(folder).as_posix(): mode(p) for p in sorted(folder.rglob("*"))}


def test_the_mode_of_a_new_file_is_what_open_gives(umask, tmp_path):
    assert creation_mode() == open_mode(tmp_path) == 0o666 & ~umask
    assert creation_mode(directory=True) == open_mode(tmp_path, directory=True) == 0o777 & ~umask


def test_every_file_written_whole_gets_the_mode_open_gives(umask, tmp_path):
    """Each way a file is written whole: text, bytes, JSON, a set of files, weights, and a library that writes
    through a private temporary file of its own into the temporary path (safetensors: 0600)."""
    write_text(tmp_path / "a.txt", "a\n")
    write_bytes(tmp_path / "b.bin", b"b")
    write_json(tmp_path / "c.json", {"c": 1})
    with atomic_paths(tmp_path / "d1", tmp_path / "d2") as (one, two):
        one.write_text("1")
        two.write_text("2")
    save_weights(tmp_path / "e.safetensors", torch.nn.Linear(2, 2))
    with atomic_path(tmp_path / "f.safetensors") as tmp:  # as the LoRA adapter is written
        save_file({"w": torch.zeros(2)}, str(tmp))
    assert modes(tmp_path) == dict.fromkeys(["a.txt", "b.bin", "c.json", "d1", "d2", "e.safetensors",
                                             "f.safetensors"], open_mode(tmp_path))


@pytest.mark.parametrize("kept", [0o600, 0o640, 0o755], ids=lambda m: f"{m:03o}")
def test_a_file_replaced_keeps_its_mode(tmp_path, kept):
    text, weights, folder = tmp_path / "a.txt", tmp_path / "w.safetensors", tmp_path / "folder"
    write_text(text, "old\n")
    save_weights(weights, torch.nn.Linear(2, 2))
    folder.mkdir()
    for path in (text, weights, folder):
        path.chmod(kept)
    write_text(text, "new\n")
    save_weights(weights, torch.nn.Linear(3, 3))
    staged = tmp_path / ".staged"
    staged.mkdir(mode=0o700)  # as mkdtemp makes one
    match_mode(staged, folder)
    assert (mode(text), mode(weights), mode(staged)) == (kept, kept, kept)
    assert text.read_text() == "new\n"


def test_every_file_of_a_run_gets_the_mode_open_gives(umask, tmp_path):
    """A translation run, trained: its weights (model, best, average, last and each step's), its trainer state,
    config.json, tokenizer.json, metrics.jsonl, results, curves, test hypotheses and its writer's lock."""
    run = tmp_path / "mt"
    assert main(["train", "mt", "--recipe", "demo", "--run", str(run), *TINY_MT]) == 0
    files = modes(run)
    assert {"model.safetensors", "best.safetensors", "average.safetensors", "last.safetensors", "last.pt",
            "step_0000004.safetensors", "config.json", "tokenizer.json", "metrics.jsonl", "results.json",
            "curves.png", ".writer.lock"} <= set(files)
    assert files == dict.fromkeys(files, open_mode(tmp_path))


@pytest.fixture(scope="module")
def tiny_mt(tmp_path_factory):
    run = tmp_path_factory.mktemp("modes") / "mt"
    assert main(["train", "mt", "--recipe", "demo", "--run", str(run), *TINY_MT]) == 0
    return run


@pytest.mark.parametrize("form", ["hf", "ctranslate2", "onnx"])
def test_the_folders_of_qkv_export_get_the_modes_open_gives(umask, tiny_mt, tmp_path, form):
    """The folder (mkdtemp's, private, renamed into place) and every file in it, e.g. the model.safetensors
    that ``save_pretrained`` writes through safetensors; replaced with --overwrite, each keeps its mode."""
    pytest.importorskip({"hf": "transformers", "ctranslate2": "ctranslate2", "onnx": "onnx"}[form])
    out = tmp_path / form
    assert main(["export", form, "--run", str(tiny_mt), "--out", str(out)]) == 0
    written = {".": mode(out), **modes(out)}
    assert written == {name: open_mode(tmp_path, directory=(out / name).is_dir()) for name in written}
    (out / "tokenizer.json").chmod(0o600)
    out.chmod(0o750)
    assert main(["export", form, "--run", str(tiny_mt), "--out", str(out), "--overwrite"]) == 0
    assert (mode(out / "tokenizer.json"), mode(out)) == (0o600, 0o750)


def test_the_exported_page_gets_the_mode_open_gives(umask, tmp_path, capsys):
    page = tmp_path / "page.html"
    assert main(["explore", "--export", str(page)]) == 0
    assert mode(page) == open_mode(tmp_path)
    page.chmod(0o600)
    assert main(["explore", "--export", str(page)]) == 0
    assert mode(page) == 0o600
