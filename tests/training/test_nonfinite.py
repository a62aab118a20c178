"""A NaN in a loss or a gradient, at a step that checkpoints and at one that does not, in every trainer.

``train.on_nonfinite: stop`` (the default): the run stops before updating on it with one line that says
the step, exit code 1; no file on disk holds a non-finite number; the kept checkpoint resumes, and the
resumed run ends where a run that never met the NaN ends. ``skip``: the batch is dropped, the run
goes on to its end, metrics.jsonl says which step was skipped, and nothing non-finite is saved;
``max_skips`` batches in a row still stop it.
"""

import pytest
import torch

from qkv.cli import main
from qkv.training import loop


def poison(monkeypatch, what: str, steps: set[int]) -> None:
    """Make the loss (``loss``) or one gradient (``grad``, the loss staying finite) NaN at ``steps``."""
    real = loop.optimizer_step

    def poisoned(optimizer, loss, step, clip_norm, parameters, scaler=None):
        parameters = list(parameters)
        if step in steps:
            if what == "loss":
                loss = loss * float("nan")
            else:
                next(p for p in parameters if p.grad is not None).grad.view(-1)[0] = float("nan")
        return real(optimizer, loss, step, clip_norm, parameters, scaler)

    monkeypatch.setattr(loop, "optimizer_step", poisoned)


def loop_state(run) -> dict:
    """The LoopState saved in the run's last checkpoint."""
    return torch.load(run / "last.pt", weights_only=True)["state"]["loop"]


def all_finite(run) -> bool:
    from safetensors.torch import load_file

    files = sorted(run.glob("*.safetensors"))
    assert files
    return all(bool(torch.isfinite(t).all()) for f in files for t in load_file(str(f)).values())


@pytest.fixture(scope="module")
def references(tiny_jobs, tmp_path_factory):
    root = tmp_path_factory.mktemp("nonfinite_references")
    for job in tiny_jobs.commands:
        assert main(tiny_jobs.argv(job, root / job)) == 0
    return root


@pytest.mark.parametrize("job", ["lm", "mt", "finetune"])
@pytest.mark.parametrize("what, where", [("grad", "checkpoint"), ("loss", "other")])
def test_a_nan_stops_the_run_and_nothing_non_finite_reaches_the_disk(tiny_jobs, references, tmp_path, monkeypatch,
                                                                     capsys, job, what, where):
    step = tiny_jobs.CHECKPOINT_STEP if where == "checkpoint" else tiny_jobs.OTHER_STEP[job]
    run = tmp_path / "run"
    poison(monkeypatch, what, {step})
    assert main(tiny_jobs.argv(job, run)) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"at step {step}" in err[0] and "stopped before updating on it" in err[0], err
    monkeypatch.undo()
    assert all_finite(run)
    kept = loop_state(run)["step"]
    assert kept < step  # the checkpoint before the NaN, never one after it
    assert f"Kept: the checkpoint of step {kept}; --resume continues from it" in err[0]
    # What was kept resumes; past the (injected) NaN, the run is the one that never met it.
    assert main(tiny_jobs.argv(job, run, resume=True)) == 0
    ours, theirs = tiny_jobs.weights(run), tiny_jobs.weights(references / job)
    assert all(bool((ours[n][k] == theirs[n][k]).all()) for n in theirs for k in theirs[n])
    assert tiny_jobs.events(run) == tiny_jobs.events(references / job)


@pytest.mark.parametrize("job", ["lm", "mt", "finetune"])
def test_skip_drops_the_batch_and_goes_on(tiny_jobs, tmp_path, monkeypatch, job):
    step = tiny_jobs.CHECKPOINT_STEP
    run = tmp_path / "run"
    poison(monkeypatch, "grad", {step})
    assert main(tiny_jobs.argv(job, run, overrides=("train.on_nonfinite=skip",))) == 0
    events = tiny_jobs.events(run)
    skipped = [e for e in events if e["split"] == "skipped"]
    assert [e["step"] for e in skipped] == [step] and "gradient norm is nan" in skipped[0]["reason"]
    assert step not in [e["step"] for e in events if e["split"] == "train"]
    assert max(e["step"] for e in events) == 6  # the run went on to its end
    assert all_finite(run)
    assert loop_state(run)["skipped"] == 1


def test_max_skips_in_a_row_stop_the_run_anyway(tiny_jobs, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    poison(monkeypatch, "loss", {3, 4, 5, 6})
    assert main(tiny_jobs.argv("lm", run, overrides=("train.on_nonfinite=skip", "train.max_skips=2"))) == 1
    err = capsys.readouterr().err
    assert "at step 5" in err and "2 batches in a row were skipped before it: train.max_skips" in err
    assert [e["step"] for e in tiny_jobs.events(run) if e["split"] == "skipped"] == [3, 4]
    assert all_finite(run)


def test_on_nonfinite_is_checked_as_the_recipe_is_read(tiny_jobs, tmp_path, capsys):
    assert main(tiny_jobs.argv("lm", tmp_path / "run", overrides=("train.on_nonfinite=ignore",))) == 2
    assert "train.on_nonfinite must be one of ['stop', 'skip'], got 'ignore'" in capsys.readouterr().err
