"""A full disk is one line that names the file being written (as root, on a small tmpfs; skipped elsewhere):
tokenizing a corpus onto it, and resuming a run on it."""

import os
import subprocess

import pytest

from qkv.cli import main


@pytest.fixture
def disk(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a tmpfs needs root")
    yield disk
    subprocess.run(["umount", str(disk)], check=True)


def _fill(disk):
    try:
        with open(disk / "filler", "wb") as f:
            while True:
                f.write(b"\0" * 4096)
                f.flush()
    except OSError:  # full
        pass


def _recipe(tmp_path, lines):
    (tmp_path / "text.txt").write_text("To be, or not to be, that is the question.\n" * lines, encoding="utf-8")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"model: {{d_model: 16, n_heads: 2, n_layers: 1, d_ff: 32, max_len: 16}}\n"
                      f"data: {{path: {tmp_path / 'text.txt'}}}\n"
                      "train: {steps: 6, batch_size: 2, warmup: 1, eval_every: 2, eval_iters: 1, checkpoint_every: 2}\n",
                      encoding="utf-8")
    return recipe


def _one_line(capsys, *words):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("qkv train: error: ") and "No space left on device" in err[0], err
    assert all(w in err[0] for w in words), err[0]


def test_tokenizing_onto_a_full_disk_names_the_file(disk, tmp_path, capsys):
    recipe = _recipe(tmp_path, 30000)  # 1.3 M characters: a tokens.bin larger than the disk
    capsys.readouterr()
    assert main(["train", "lm", "--recipe", str(recipe), "--run", str(disk / "run"), "--quiet"]) == 1
    _one_line(capsys, str(disk / "run" / "tokens.bin"))


def test_resuming_on_a_full_disk_names_the_file(disk, tmp_path, crash_at, monkeypatch, capsys):
    recipe = _recipe(tmp_path, 40)
    run = disk / "run"
    crash_at(5)
    assert main(["train", "lm", "--recipe", str(recipe), "--run", str(run), "--quiet"]) != 0
    monkeypatch.undo()
    _fill(disk)
    capsys.readouterr()
    assert main(["train", "lm", "--run", str(run), "--resume", "--quiet"]) == 1
    _one_line(capsys, str(run) + "/")
    (disk / "filler").unlink()
    assert main(["train", "lm", "--run", str(run), "--resume", "--quiet"]) == 0  # given room, it goes on
