"""A trainer killed at every point where it writes a file resumes to the run that was never killed.

For each trainer (``train lm``, ``train mt``, ``finetune``), a reference run records every file it
writes, in order, through ``qkv.io``'s atomic writes. Then, for each file it writes (config, tokenizer,
tokens, checkpoint weights and state, step files, best, model, average, results, curves), a forked copy
of this process runs the same command and dies with ``os._exit`` (no cleanup, no ``finally``: what
SIGKILL leaves) at that file's write: just before its rename, and for the checkpoint also after the
weights are renamed but not the state, after the weights' bytes are written but not the state's, and
just after both renames. The run is then resumed (or restarted, when no checkpoint was complete yet)
and must end with the reference's weights, bit for bit, and its metrics line for line (clock fields
aside).
"""

import json
import os
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

import qkv.io
from qkv.cli import main
from qkv.training import checkpoint

CLOCK = ("time", "elapsed", "tokens_per_s", "train_seconds", "seconds")
TEXT = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n") * 20
KILLED = 137  # the child's exit status when it died where it was told to


def _commands(root: Path) -> dict[str, list[str]]:
    """The three jobs, tiny, checkpointing every 2 steps."""
    (root / "text.txt").write_text(TEXT, encoding="utf-8")
    (root / "lm.yaml").write_text(f"""
model: {{d_model: 16, n_heads: 2, n_layers: 1, d_ff: 32, max_len: 32, dropout: 0.1}}
data: {{path: {root / 'text.txt'}}}
train: {{steps: 6, batch_size: 4, eval_every: 3, log_every: 1, eval_iters: 1, warmup: 1, checkpoint_every: 2}}
""", encoding="utf-8")
    (root / "mt.yaml").write_text("""
model: {d_model: 16, n_heads: 2, d_ff: 32, n_layers: 1, dropout: 0.1, max_len: 64}
data: {corpus: demo, vocab_size: 120, max_tokens: 200, max_src_len: 40, max_tgt_len: 40, demo_train: 100,
       demo_valid: 8, demo_test: 5}
train: {steps: 6, warmup: 2, eval_every: 2, eval_bleu_sentences: 2, log_every: 1, keep_checkpoints: 2,
        average_last: 2, test_beam: 2}
""", encoding="utf-8")
    (root / "sft.jsonl").write_text("".join(json.dumps({"prompt": f"All:\n{w}", "response": " Speak, speak."}) + "\n"
                                            for w in ("Before", "we", "proceed", "hear", "me", "speak")),
                                    encoding="utf-8")
    assert main(["train", "lm", "--recipe", str(root / "lm.yaml"), "--run", str(root / "base"), "--quiet"]) == 0
    return {
        "lm": ["train", "lm", "--recipe", str(root / "lm.yaml")],
        "mt": ["train", "mt", "--recipe", str(root / "mt.yaml")],
        "finetune": ["finetune", "--run", str(root / "base"), "--data", str(root / "sft.jsonl"), "train.steps=6",
                     "train.warmup=1", "train.eval_every=2", "train.log_every=1", "train.eval_iters=1",
                     "train.batch_size=2", "train.mix=0.5", "train.pretrain_batch_size=2"],
    }


def _run_argv(job: str, base: list[str], run: Path, resume: bool = False) -> list[str]:
    out = "--out" if job == "finetune" else "--run"
    if resume:
        return ([*base, out, str(run), "--resume"] if job == "finetune"
                else [base[0], base[1], "--run", str(run), "--resume"])
    return [*base, out, str(run), "--quiet", "--overwrite"]


def _events(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in CLOCK} for r in rows]


def _weights(run: Path) -> dict[str, dict]:
    return {name: load_file(str(run / name)) for name in ("last.safetensors", "model.safetensors")}


class Writes:
    """Hooks on qkv.io's atomic writes: record each file renamed into place, or die at one of them."""

    def __init__(self, monkeypatch, die_at: tuple[str, str, int] | None = None):
        self.renamed: list[str] = []
        self.die_at = die_at  # (when, file name, n-th time that file is written)
        self.seen: dict[tuple[str, str], int] = {}
        real_replace, real_save_model = qkv.io.os.replace, checkpoint.save_model
        writes = self

        class Os:  # qkv.io's `os`, with replace hooked
            def __getattr__(self, name):
                return getattr(os, name)

            @staticmethod
            def replace(src, dst):
                name = Path(dst).name
                writes._point("before rename", name)
                real_replace(src, dst)
                writes.renamed.append(name)
                writes._point("after rename", name)

        def save_model(model, path, *args, **kwargs):  # the checkpoint's weights, into their temporary file
            real_save_model(model, path, *args, **kwargs)
            writes._point("weights written", "last.safetensors")

        monkeypatch.setattr(qkv.io, "os", Os())
        monkeypatch.setattr(checkpoint, "save_model", save_model)

    def _point(self, when: str, name: str) -> None:
        key = (when, name)
        self.seen[key] = self.seen.get(key, 0) + 1
        if self.die_at == (when, name, self.seen[key]):
            os._exit(KILLED)


@pytest.fixture(scope="module")
def place(tmp_path_factory):
    root = tmp_path_factory.mktemp("kill_points")
    commands = _commands(root)
    references, renamed = {}, {}
    mp = pytest.MonkeyPatch()
    for job, base in commands.items():
        writes = Writes(mp)
        assert main(_run_argv(job, base, root / f"ref_{job}")) == 0
        references[job], renamed[job] = root / f"ref_{job}", writes.renamed
        mp.undo()
    return root, commands, references, renamed


def _points(renamed: list[str]) -> list[tuple[str, str, int]]:
    """Each file the run writes, at its last write but at most its second (the second checkpoint, the
    second evaluation's best); the checkpoint at every instant of its commit as well."""
    points = []
    for name in dict.fromkeys(renamed):
        n = min(2, renamed.count(name))
        points.append(("before rename", name, n))
    n = min(2, renamed.count("last.pt"))
    points += [("weights written", "last.safetensors", n), ("after rename", "last.safetensors", n),
               ("after rename", "last.pt", n)]
    return points


def _kill_and_resume(place, job: str, point: tuple[str, str, int], tmp_path) -> None:
    root, commands, references, _ = place
    run = tmp_path / "run"
    pid = os.fork()
    if pid == 0:  # the child: the same command, dying at `point`
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            mp = pytest.MonkeyPatch()
            Writes(mp, die_at=point)
            main(_run_argv(job, commands[job], run))
        finally:
            os._exit(0)  # it got to the end without passing the point
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == KILLED, f"{point} was not reached"
    resumable = (run / "last.pt").is_file()
    assert main(_run_argv(job, commands[job], run, resume=resumable) + ["--quiet"] * resumable) == 0
    assert _events(run) == _events(references[job]), point
    assert not list(run.glob(".*.tmp-*")), point  # what the dead process left is cleared
    ours, theirs = _weights(run), _weights(references[job])
    for name in theirs:
        assert ours[name].keys() == theirs[name].keys()
        assert all(bool((ours[name][k] == theirs[name][k]).all()) for k in theirs[name]), (point, name)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.parametrize("job", ["lm", "mt", "finetune"])
def test_a_kill_at_every_write_resumes_to_the_uninterrupted_run(place, job, tmp_path_factory, capsys):
    points = _points(place[3][job])
    assert ("before rename", "last.pt", 2) in points and len(points) >= 8, points
    for i, point in enumerate(points):
        _kill_and_resume(place, job, point, tmp_path_factory.mktemp(f"{job}{i}"))
        capsys.readouterr()
    print(f"{job}: {len(points)} kill points survived: {points}", file=sys.stderr)
