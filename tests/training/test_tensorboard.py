"""``train.logger: tensorboard``: every trainer's numbers as TensorBoard events, read back with TensorBoard's
own event reader, equal to metrics.jsonl; a resumed run's events equal an uninterrupted run's."""

import importlib
import json

import pytest

from qkv.cli import main
from qkv.runs import TENSORBOARD_DIR

pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader  # noqa: E402

TENSORBOARD = ("train.logger=tensorboard",)
CLOCK = ("tokens_per_s", "train_seconds", "seconds")  # values that differ between two runs of one recipe


def scalars(run) -> dict[tuple[str, int], float]:
    """Every scalar of the run's events by (tag, step), as TensorBoard shows them."""
    events = EventAccumulator(str(run / TENSORBOARD_DIR), size_guidance={"scalars": 0})
    events.Reload()
    return {(tag, e.step): e.value for tag in events.Tags()["scalars"] for e in events.Scalars(tag)}


def logged(run) -> dict[tuple[str, int], float]:
    """The numbers of metrics.jsonl, keyed as TensorBoard's tags."""
    out = {}
    for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        for name, value in record.items():
            if name not in ("step", "split", "time", "elapsed") and isinstance(value, (int, float)) \
                    and not isinstance(value, bool):
                out[(f"{record['split']}/{name}", record["step"])] = value
    return out


def without_clock(values: dict) -> dict:
    return {k: v for k, v in values.items() if k[0].split("/")[1] not in CLOCK}


@pytest.mark.parametrize("job", ["lm", "mt", "finetune"])
def test_events_hold_the_numbers_of_metrics_jsonl(tiny_jobs, tmp_path, job):
    run = tmp_path / job
    assert main(tiny_jobs.argv(job, run, overrides=TENSORBOARD)) == 0
    events, numbers = scalars(run), logged(run)
    assert events.keys() == numbers.keys()
    assert all(events[k] == pytest.approx(v, rel=1e-6, abs=1e-6) for k, v in numbers.items())
    tags = {tag for tag, _ in events}
    assert "train/loss" in tags and "train/lr" in tags and any(t.startswith("valid/") for t in tags)
    if job == "mt":
        assert "valid/bleu" in tags


@pytest.mark.parametrize("job", ["lm", "mt"])
def test_a_resumed_run_shows_what_an_uninterrupted_one_shows(tiny_jobs, tmp_path, crash_at, monkeypatch, job):
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    assert main(tiny_jobs.argv(job, reference, overrides=TENSORBOARD)) == 0
    crash_at(tiny_jobs.OTHER_STEP[job])  # past a checkpoint, after logging beyond it
    checkpoint = {"lm": 4, "mt": 2}[job]  # the last one before that step
    assert main(tiny_jobs.argv(job, resumed, overrides=TENSORBOARD)) == 130  # interrupted
    monkeypatch.undo()
    assert main(tiny_jobs.argv(job, resumed, resume=True)) == 0
    first, second = sorted((resumed / TENSORBOARD_DIR).iterdir())  # the first run's events, the resumed run's
    # The resumed run tells TensorBoard to drop the first run's events after the checkpoint.
    starts = [e.step for e in EventFileLoader(str(second)).Load() if e.HasField("session_log")]
    assert starts == [checkpoint + 1]
    expected = without_clock(scalars(reference))
    got = without_clock(scalars(resumed))
    assert got.keys() == expected.keys()  # nothing twice, nothing missing
    assert all(got[k] == pytest.approx(v, rel=1e-5, abs=1e-6) for k, v in expected.items())


def test_overwrite_removes_the_old_events(tiny_jobs, tmp_path):
    run = tmp_path / "lm"
    assert main(tiny_jobs.argv("lm", run, overrides=TENSORBOARD)) == 0
    assert main(tiny_jobs.argv("lm", run, overrides=TENSORBOARD)) == 0  # argv() overwrites
    assert len(list((run / TENSORBOARD_DIR).iterdir())) == 1


def test_an_unknown_logger_and_a_missing_tensorboard_are_one_line(tiny_jobs, tmp_path, monkeypatch, capsys):
    assert main(tiny_jobs.argv("lm", tmp_path / "a", overrides=("train.logger=wandb",))) == 2
    assert "train.logger must be one of ['jsonl', 'tensorboard'], got 'wandb'" in capsys.readouterr().err
    real = importlib.import_module

    def without_tensorboard(name, *args):
        if name.startswith("torch.utils.tensorboard"):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", without_tensorboard)
    assert main(tiny_jobs.argv("lm", tmp_path / "b", overrides=TENSORBOARD)) == 2
    err = capsys.readouterr().err
    assert err == ("qkv train: error: train.logger: tensorboard needs tensorboard, an optional part of qkv: "
                   "pip install 'qkv[tensorboard]'\n")
