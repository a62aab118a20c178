"""A trainer killed at every point where it writes a file resumes to the run that was never killed.

For each trainer (``train lm``, ``train mt``, ``finetune``), a reference run records every file it
writes, in order, through ``qkv.files``'s atomic writes. Then, for each file it writes (config, tokenizer,
tokens, checkpoint weights and state, step files, best, model, average, results, curves), a forked copy
of this process runs the same command and dies with ``os._exit`` (no cleanup, no ``finally``: what
SIGKILL leaves) at that file's write: just before its rename, and for the checkpoint also after the
weights are renamed but not the state, after the weights' bytes are written but not the state's, and
just after both renames. The run is then resumed (or restarted, when no checkpoint was complete yet)
and must end with the reference's weights, bit for bit, and its metrics line for line (clock fields
aside).
"""

import os
import sys
from pathlib import Path

import pytest

import qkv.files
from qkv.cli import main
from qkv.training import checkpoint

KILLED = 137  # the child's exit status when it died where it was told to


class Writes:
    """Hooks on qkv.files's atomic writes: record each file renamed into place, or die at one of them."""

    def __init__(self, monkeypatch, die_at: tuple[str, str, int] | None = None, within: Path | None = None):
        self.renamed: list[str] = []  # the files renamed into place under ``within`` (the run directory)
        self.die_at = die_at  # (when, file name, n-th time that file is written)
        self.seen: dict[tuple[str, str], int] = {}
        real_replace, real_write_weights = qkv.files.os.replace, checkpoint.write_weights
        writes = self

        class Os:  # qkv.files's `os`, with replace hooked
            def __getattr__(self, name):
                return getattr(os, name)

            @staticmethod
            def replace(src, dst):
                name = Path(dst).name
                writes._point("before rename", name)
                real_replace(src, dst)
                if within is None or Path(dst).resolve().is_relative_to(within.resolve()):
                    writes.renamed.append(name)  # not, e.g., decoding's kernel choices in the user cache
                writes._point("after rename", name)

        def write_weights(model, path, *args, **kwargs):  # the checkpoint's weights, into their temporary file
            real_write_weights(model, path, *args, **kwargs)
            writes._point("weights written", "last.safetensors")

        monkeypatch.setattr(qkv.files, "os", Os())
        monkeypatch.setattr(checkpoint, "write_weights", write_weights)

    def _point(self, when: str, name: str) -> None:
        key = (when, name)
        self.seen[key] = self.seen.get(key, 0) + 1
        if self.die_at == (when, name, self.seen[key]):
            os._exit(KILLED)


@pytest.fixture(scope="module")
def references(tiny_jobs, tmp_path_factory):
    """Each job run once, never killed: its run directory and the files it wrote, in order."""
    root = tmp_path_factory.mktemp("references")
    out = {}
    mp = pytest.MonkeyPatch()
    for job in tiny_jobs.commands:
        writes = Writes(mp, within=root / job)
        assert main(tiny_jobs.argv(job, root / job)) == 0
        out[job] = (root / job, writes.renamed)
        mp.undo()
    return out


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


def _kill_and_resume(jobs, job: str, reference: Path, point: tuple[str, str, int], run: Path,
                     resume: bool | None = None) -> None:
    pid = os.fork()
    if pid == 0:  # the child: the same command, dying at `point`
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            Writes(pytest.MonkeyPatch(), die_at=point)
            main(jobs.argv(job, run))
        finally:
            os._exit(0)  # it got to the end without passing the point
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == KILLED, f"{point} was not reached"
    # Resume what the kill left, or start again when no checkpoint was complete yet (nothing to keep).
    if resume is None:
        resume = (run / "last.pt").is_file()
    assert main(jobs.argv(job, run, resume=resume)) == 0
    assert jobs.events(run) == jobs.events(reference), point
    assert not list(run.glob(".*.tmp-*")), point  # what the dead process left is cleared
    ours, theirs = jobs.weights(run), jobs.weights(reference)
    for name in theirs:
        assert ours[name].keys() == theirs[name].keys()
        assert all(bool((ours[name][k] == theirs[name][k]).all()) for k in theirs[name]), (point, name)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.parametrize("job", ["lm", "mt", "finetune"])
def test_a_kill_at_every_write_resumes_to_the_uninterrupted_run(tiny_jobs, references, job, tmp_path_factory,
                                                                 capsys):
    reference, renamed = references[job]
    points = _points(renamed)
    assert ("before rename", "last.pt", 2) in points and ("before rename", "tokenizer.json", 1) in points, points
    for i, point in enumerate(points):
        _kill_and_resume(tiny_jobs, job, reference, point, tmp_path_factory.mktemp(f"{job}{i}") / "run")
        capsys.readouterr()
    print(f"{job}: {len(points)} kill points survived: {points}", file=sys.stderr)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.parametrize("job", ["lm", "mt", "finetune"])
def test_a_kill_between_the_first_checkpoints_renames_resumes(tiny_jobs, references, job, tmp_path, capsys):
    """The first save's weights renamed, its state still in its temporary file: there is no last.pt yet,
    and --resume takes the temporary file (its id checked against the weights') as the checkpoint."""
    reference, _ = references[job]
    run = tmp_path / "run"
    with pytest.warns(UserWarning, match="interrupted between its two files; finished it from .last.pt.tmp-"):
        _kill_and_resume(tiny_jobs, job, reference, ("after rename", "last.safetensors", 1), run, resume=True)
