"""A command that fails changes nothing: every way a resume, a fine-tuning or an evaluation can fail (a config.json
that is damaged or describes another model, weights that are gone or another run's, a run of the other kind, a
setting a resume cannot change) is one line on stderr, and leaves every run directory it was given, its base run
and whatever it would have written byte for byte as they were: the same files (hidden ones too, the writer's
lock among them), each with the same sha256. As a failed ``git commit`` leaves the index."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from qkv.cli import main


@pytest.fixture(scope="module")
def runs(tiny_jobs, tmp_path_factory):
    """Finished tiny runs, each with its checkpoint: ``mt`` (translation), ``lm`` (a GPT) and ``ft`` (``lm``
    fine-tuned)."""
    root = tmp_path_factory.mktemp("failed_commands")
    assert main(tiny_jobs.argv("mt", root / "mt")) == 0
    assert main(tiny_jobs.argv("lm", root / "lm")) == 0
    assert main(finetune(tiny_jobs, root / "lm", root / "ft")) == 0
    return root


def finetune(jobs, base: Path, out: Path, *more: str, data: Path | None = None) -> list[str]:
    """``qkv finetune`` of ``base`` into ``out`` with the tiny job's settings."""
    argv = ["finetune", "--run", str(base), "--data", str(data or jobs.root / "sft.jsonl"), "--out", str(out),
            "--quiet", *more]
    return argv + jobs.commands["finetune"][5:]  # the settings after --run BASE --data FILE


def snapshot(*folders: Path) -> dict[str, str]:
    """Every file under ``folders`` by path, with the sha256 of its bytes."""
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest()
            for folder in folders for p in sorted(folder.rglob("*")) if p.is_file()}


def edit_config(run: Path, change) -> None:
    path = run / "config.json"
    path.write_text(json.dumps(change(json.loads(path.read_text()))), encoding="utf-8")


def bigger(config: dict) -> dict:
    return {**config, "model": {**config["model"], "d_model": 32}}


def copy(runs: Path, tmp: Path, name: str, as_name: str | None = None) -> Path:
    return Path(shutil.copytree(runs / name, tmp / (as_name or name)))


def no_checkpoint(run: Path) -> None:
    for name in ("last.pt", "last.safetensors"):
        (run / name).unlink()


def no_weights(run: Path) -> None:
    for name in ("model", "best", "last"):
        (run / f"{name}.safetensors").unlink(missing_ok=True)


# A case: (what it is, how to make the directories it needs in tmp (from the finished runs), its command).
CASES = {
    # qkv train mt --resume
    "mt resume: config.json of another model size": (
        lambda r, t: edit_config(copy(r, t, "mt"), bigger), lambda j, r, t: ["train", "mt", "--run", f"{t}/mt", "--resume", "--quiet"]),
    "mt resume: config.json with a key no recipe has": (
        lambda r, t: edit_config(copy(r, t, "mt"), lambda c: {**c, "dta": c["data"]}),
        lambda j, r, t: ["train", "mt", "--run", f"{t}/mt", "--resume", "--quiet"]),
    "mt resume: config.json not JSON": (
        lambda r, t: (copy(r, t, "mt") / "config.json").write_text('{"model": '),
        lambda j, r, t: ["train", "mt", "--run", f"{t}/mt", "--resume", "--quiet"]),
    "mt resume: the checkpoint's weights gone": (
        lambda r, t: (copy(r, t, "mt") / "last.safetensors").unlink(),
        lambda j, r, t: ["train", "mt", "--run", f"{t}/mt", "--resume", "--quiet"]),
    "mt resume: the checkpoint's weights another run's": (
        lambda r, t: shutil.copy(r / "lm" / "last.safetensors", copy(r, t, "mt") / "last.safetensors"),
        lambda j, r, t: ["train", "mt", "--run", f"{t}/mt", "--resume", "--quiet"]),
    "mt resume: no checkpoint": (
        lambda r, t: no_checkpoint(copy(r, t, "mt")),
        lambda j, r, t: ["train", "mt", "--run", f"{t}/mt", "--resume", "--quiet"]),
    "mt resume: a setting its checkpoint fixes": (
        lambda r, t: copy(r, t, "mt"), lambda j, r, t: ["train", "mt", "--run", f"{t}/mt", "--resume", "--quiet", "model.d_model=32"]),
    "mt resume of a GPT run": (
        lambda r, t: copy(r, t, "lm"), lambda j, r, t: ["train", "mt", "--run", f"{t}/lm", "--resume", "--quiet"]),
    # qkv train lm --resume
    "lm resume: config.json of another model size": (
        lambda r, t: edit_config(copy(r, t, "lm"), bigger), lambda j, r, t: ["train", "lm", "--run", f"{t}/lm", "--resume", "--quiet"]),
    "lm resume: the checkpoint's weights another run's": (
        lambda r, t: shutil.copy(r / "mt" / "last.safetensors", copy(r, t, "lm") / "last.safetensors"),
        lambda j, r, t: ["train", "lm", "--run", f"{t}/lm", "--resume", "--quiet"]),
    "lm resume: the trainer state damaged": (
        lambda r, t: (copy(r, t, "lm") / "last.pt").write_bytes(b"damaged"),
        lambda j, r, t: ["train", "lm", "--run", f"{t}/lm", "--resume", "--quiet"]),
    "lm resume of a translation run": (
        lambda r, t: copy(r, t, "mt"), lambda j, r, t: ["train", "lm", "--run", f"{t}/mt", "--resume", "--quiet"]),
    # qkv finetune, new and --resume
    "finetune: a base run without weights": (
        lambda r, t: no_weights(copy(r, t, "lm", "base")), lambda j, r, t: finetune(j, t / "base", t / "out")),
    "finetune --overwrite: a base run without weights": (
        lambda r, t: (no_weights(copy(r, t, "lm", "base")), copy(r, t, "ft")),
        lambda j, r, t: finetune(j, t / "base", t / "ft", "--overwrite")),
    "finetune: a base run of the other kind": (
        lambda r, t: None, lambda j, r, t: finetune(j, r / "mt", t / "out")),
    "finetune: a base run whose config.json has a key no recipe has": (
        lambda r, t: edit_config(copy(r, t, "lm", "base"), lambda c: {**c, "note": 1}),
        lambda j, r, t: finetune(j, t / "base", t / "out")),
    "finetune --resume: the checkpoint's weights another run's": (
        lambda r, t: shutil.copy(r / "mt" / "last.safetensors", copy(r, t, "ft") / "last.safetensors"),
        lambda j, r, t: finetune(j, r / "lm", t / "ft", "--resume")),
    "finetune --resume: other task data": (
        lambda r, t: (copy(r, t, "ft"), (t / "other.jsonl").write_text('{"prompt": "All:", "response": " no"}\n' * 4)),
        lambda j, r, t: finetune(j, r / "lm", t / "ft", "--resume", data=t / "other.jsonl")),
    "finetune --resume: finetune.json damaged": (
        lambda r, t: (copy(r, t, "ft") / "finetune.json").write_text("{"),
        lambda j, r, t: finetune(j, r / "lm", t / "ft", "--resume")),
    # qkv eval mt|lm
    "eval mt: the weights gone": (
        lambda r, t: no_weights(copy(r, t, "mt")), lambda j, r, t: ["eval", "mt", "--run", f"{t}/mt"]),
    "eval mt: weights of another run": (
        lambda r, t: None, lambda j, r, t: ["eval", "mt", "--run", f"{r}/mt", "--weights", f"{r}/lm/model.safetensors"]),
    "eval mt: config.json of another model size": (
        lambda r, t: edit_config(copy(r, t, "mt"), bigger), lambda j, r, t: ["eval", "mt", "--run", f"{t}/mt"]),
    "eval mt of a GPT run": (lambda r, t: None, lambda j, r, t: ["eval", "mt", "--run", f"{r}/lm"]),
    "eval lm: config.json with a key no recipe has": (
        lambda r, t: edit_config(copy(r, t, "lm"), lambda c: {**c, "trian": c["train"]}),
        lambda j, r, t: ["eval", "lm", "--run", f"{t}/lm"]),
    "eval lm: the weights another run's": (
        lambda r, t: shutil.copy(r / "mt" / "model.safetensors", copy(r, t, "lm") / "model.safetensors"),
        lambda j, r, t: ["eval", "lm", "--run", f"{t}/lm"]),
    "eval lm of a translation run": (lambda r, t: None, lambda j, r, t: ["eval", "lm", "--run", f"{r}/mt"]),
}


@pytest.mark.parametrize("case", CASES)
def test_a_command_that_fails_leaves_every_run_as_it_found_it(tiny_jobs, runs, tmp_path, capsys, case):
    make, command = CASES[case]
    make(runs, tmp_path)
    before = snapshot(runs, tmp_path, tiny_jobs.root)
    capsys.readouterr()
    assert main([str(a) for a in command(tiny_jobs, runs, tmp_path)]) in (1, 2)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("qkv ") and ": error: " in err[0], err
    assert snapshot(runs, tmp_path, tiny_jobs.root) == before
