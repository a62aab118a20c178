import io
import json
import math

import numpy as np
import pytest
import torch

import qkv.training.logging as tlog
from qkv.training.logging import (
    MetricsLogger,
    NonFiniteLossError,
    Progress,
    check_finite,
    format_duration,
    read_metrics,
)


def test_metrics_lines_are_flushed_one_per_event(tmp_path):
    log = MetricsLogger(tmp_path / "run")
    log.log(10, "train", loss=torch.tensor(2.5), lr=1e-3, tokens=np.int64(640))
    # readable before close: each line is flushed as it is written
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 1
    rec = json.loads(lines[0])
    assert rec["step"] == 10 and rec["split"] == "train" and rec["loss"] == 2.5 and rec["tokens"] == 640
    assert rec["time"] > 1e9 and rec["elapsed"] >= 0
    log.log(10, "valid", loss=2.7, bleu=12.5)
    log.close()
    with MetricsLogger(tmp_path / "run") as again:  # a resumed run appends
        again.log(11, "train", loss=float("nan"))
    recs = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [(r["step"], r["split"]) for r in recs] == [(10, "train"), (10, "valid"), (11, "train")]
    assert math.isnan(recs[2]["loss"])


def test_metrics_logger_rejects_reserved_keys_and_objects(tmp_path):
    log = MetricsLogger(tmp_path)
    with pytest.raises(ValueError, match="reserved"):
        log.log(1, "train", step=3)
    with pytest.raises(TypeError, match="'model'"):
        log.log(1, "train", model=object())
    log.close()


def test_disabled_logger_writes_nothing(tmp_path):
    log = MetricsLogger(tmp_path / "rank1", enabled=False)
    assert log.log(1, "train", loss=1.0)["loss"] == 1.0
    assert not (tmp_path / "rank1").exists()


def test_read_metrics_skips_a_truncated_last_line_only(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text('{"step": 1, "split": "train", "loss": 3.0}\n{"step": 2, "spl')
    assert read_metrics(p) == [{"step": 1, "split": "train", "loss": 3.0}]
    p.write_text('{"step": 1\n{"step": 2, "split": "train", "loss": 3.0}\n')
    with pytest.raises(ValueError, match="metrics.jsonl:1"):
        read_metrics(p)


def test_check_finite():
    assert check_finite(torch.tensor(1.5), step=3) == 1.5
    assert check_finite(2.0, step=3) == 2.0
    for bad in (torch.tensor(float("nan")), torch.tensor(float("inf")), float("-inf")):
        with pytest.raises(NonFiniteLossError, match="at step 42"):
            check_finite(bad, step=42)


def test_format_duration():
    assert format_duration(3725) == "1:02:05"
    assert format_duration(float("nan")) == "?"


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def perf_counter(self):
        return self.now

    def time(self):
        return self.now


def test_plain_lines_every_n_steps_and_at_the_end_without_a_terminal(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(tlog, "time", clock)
    out = io.StringIO()  # not a terminal: tqdm's bar is off, the plain lines remain
    p = Progress(total=12, desc="mt", log_every=5, log_seconds=0, stream=out)
    for step in range(1, 13):
        clock.now += 0.5
        p.update(step, loss=torch.tensor(3.0 - step / 10), lr=step * 1e-4, tokens=100)
    p.close()
    lines = out.getvalue().splitlines()
    assert [line.split(" | ")[0] for line in lines] == ["mt step 5/12", "mt step 10/12", "mt step 12/12"]
    assert lines[0] == "mt step 5/12 | loss 2.5000 | lr 5.000e-04 | tok/s 200 | eta 0:00:04"
    assert lines[-1].endswith("eta 0:00:00")


def test_eta_never_passes_the_time_budget(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(tlog, "time", clock)
    by_steps = Progress(total=1000, log_every=0, log_seconds=0, stream=io.StringIO())
    budget = Progress(total=1000, log_every=0, log_seconds=0, seconds_left=30.0, stream=io.StringIO())
    for step in range(1, 11):
        clock.now += 1.0
        by_steps.update(step)
        budget.update(step)
    assert by_steps.eta_seconds == pytest.approx(990.0)  # 1 s a step, 990 steps to go
    assert budget.eta_seconds == pytest.approx(20.0)  # 30 s of budget, 10 spent
    clock.now += 100.0
    assert budget.eta_seconds == 0.0


def test_plain_lines_by_time(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(tlog, "time", clock)
    out = io.StringIO()
    p = Progress(total=100, log_every=0, log_seconds=10.0, stream=out)
    for step in range(1, 30):
        clock.now += 1.0
        p.update(step, loss=1.0)
    assert [line.split(" | ")[0] for line in out.getvalue().splitlines()] == [
        "train step 10/100",
        "train step 20/100",
    ]


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_bar_with_postfix_on_a_terminal_and_lines_too():
    out = Terminal()
    p = Progress(total=4, log_every=2, stream=out)
    for step in range(1, 5):
        p.update(step, loss=1.25, lr=1e-3, tokens=10)
    p.close()
    text = out.getvalue()
    assert "loss=1.2500" in text and "lr=1.000e-03" in text  # the bar's postfix
    assert "train step 2/4 | loss 1.2500" in text  # the plain line, written through the bar


def test_disabled_progress_is_silent():
    out = Terminal()
    p = Progress(total=4, log_every=1, stream=out, enabled=False)
    p.update(1, loss=1.0)
    p.close()
    assert out.getvalue() == ""


def test_a_resumed_run_says_where_it_took_up():
    out = io.StringIO()
    Progress(total=100, desc="train lm", start_step=40, stream=out).close()
    assert "train lm: resumed from the last checkpoint, step 40 of 100" in out.getvalue()
    fresh = io.StringIO()
    Progress(total=100, start_step=0, stream=fresh).close()
    assert "resumed" not in fresh.getvalue()
