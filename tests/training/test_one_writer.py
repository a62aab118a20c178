"""A run directory has one writer (``Run.writing``): a second trainer, resume, overwrite or fine-tuning into a
run that is being written is refused in one line naming the holder; what a killed writer left is cleared."""

import os
import subprocess
import sys
import time

import pytest

from qkv.cli import main
from qkv.runs import WRITER_LOCK, Run

# Holds the run's writer lock until killed, as a trainer does while it trains.
HOLDER = """
import sys, time
from qkv.runs import Run
with Run(sys.argv[1]).writing():
    print("holding", flush=True)
    time.sleep(600)
"""

# A resume that waits, at its first step, until the file named by QKV_TEST_GO exists: it holds the run while
# the second one starts, however slow the machine.
WAITING_RESUME = """
import os, sys, time
from pathlib import Path
from qkv.cli import main
from qkv.training import loop
real, go = loop.optimizer_step, Path(os.environ["QKV_TEST_GO"])
def waits(*args):
    deadline = time.monotonic() + 120
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return real(*args)
loop.optimizer_step = waits
sys.exit(main(sys.argv[1:]))
"""


def _hold(run):
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "holding"
    return holder


@pytest.mark.skipif(os.name != "posix", reason="POSIX file locks")
@pytest.mark.parametrize("job", ["lm", "mt", "finetune"])
@pytest.mark.parametrize("how", ["new", "resume", "overwrite"])
def test_a_second_writer_is_refused_in_one_line_that_names_the_holder(tiny_jobs, job, how, tmp_path, capsys):
    run = tmp_path / "run"
    if how != "new":
        assert main(tiny_jobs.argv(job, run)) == 0
    before = {p.name: p.stat().st_mtime_ns for p in run.iterdir() if p.name != WRITER_LOCK} if run.exists() else {}
    holder = _hold(run)
    try:
        capsys.readouterr()
        assert main(tiny_jobs.argv(job, run, resume=how == "resume") if how != "new" else
                    [a for a in tiny_jobs.argv(job, run) if a != "--overwrite"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"is being written by pid {holder.pid} (" in err[0] and "one writer" in err[0], err
        after = {p.name: p.stat().st_mtime_ns for p in run.iterdir() if p.name != WRITER_LOCK}
        assert after == before  # nothing of the run touched
    finally:
        holder.kill()
        holder.wait()
    # The holder killed: the system let go of its lock, and the run is writable again.
    assert main(tiny_jobs.argv(job, run, resume=how == "resume")) == 0


@pytest.mark.skipif(os.name != "posix", reason="POSIX file locks")
def test_two_concurrent_resumes_one_refused_and_the_metrics_of_one_run(tiny_jobs, crash_at, tmp_path, monkeypatch):
    reference, run = tmp_path / "reference", tmp_path / "run"
    assert main(tiny_jobs.argv("lm", reference)) == 0
    crash_at(5)  # after the checkpoint of step 4
    assert main(tiny_jobs.argv("lm", run)) != 0  # interrupted
    monkeypatch.undo()
    go = tmp_path / "go"
    first = subprocess.Popen([sys.executable, "-c", WAITING_RESUME, *tiny_jobs.argv("lm", run, resume=True)],
                             env={**os.environ, "QKV_TEST_GO": str(go)})
    try:
        deadline = time.monotonic() + 60
        while f"pid {first.pid} " not in _text(run / WRITER_LOCK):
            assert time.monotonic() < deadline and first.poll() is None
            time.sleep(0.05)
        assert main(tiny_jobs.argv("lm", run, resume=True)) == 2  # the second: refused
        go.touch()
        assert first.wait(timeout=120) == 0
    finally:
        first.kill()
    assert tiny_jobs.events(run) == tiny_jobs.events(reference)  # as many lines as one uninterrupted run


def _text(path):
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def test_readers_never_wait_on_the_writer(tiny_jobs, tmp_path):
    run = tmp_path / "run"
    assert main(tiny_jobs.argv("lm", run)) == 0
    holder = _hold(run)
    try:
        assert main(["generate", "--run", str(run), "First", "-n", "3", "--seed", "1"]) == 0
        assert main(["eval", "lm", "--run", str(run)]) == 0
    finally:
        holder.kill()
        holder.wait()


def test_a_start_that_writes_nothing_leaves_no_folder(tmp_path, capsys):
    run = tmp_path / "new"
    assert main(["train", "lm", "--run", str(run), "--resume"]) != 0
    assert not run.exists()  # the lock's file and folder went with the start that failed


def test_what_a_killed_writer_left_is_cleared_at_the_next_start(tiny_jobs, tmp_path):
    run = tmp_path / "run"
    assert main(tiny_jobs.argv("lm", run)) == 0
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        stale = [run / ".tmpQ8sYDg", run / f".config.json.tmp-{gone.pid}-0123abcd"]  # safetensors', qkv's
        live = run / f".results.json.tmp-{alive.pid}-0123abcd"  # a reader writing now
        for p in [*stale, live]:
            p.write_bytes(b"half")
        assert main(tiny_jobs.argv("lm", run, resume=True)) == 0
        assert not any(p.exists() for p in stale) and live.exists()
    finally:
        alive.kill()
        alive.wait()
    assert Run(run).has_checkpoint


TRY = """
import sys
from qkv.runs import Run, RunError
try:
    with Run(sys.argv[1]).writing():
        print("took it")
except RunError:
    print("refused")
"""


@pytest.mark.skipif(os.name != "posix", reason="POSIX file locks")
def test_a_job_within_a_job_holds_the_lock_until_the_outer_one_ends(tmp_path):
    """qkv demo holds its run and calls the trainer, which takes the same lock: within one process the lock
    is taken once, and the inner job's end does not let go of it."""
    run = tmp_path / "run"

    def other():
        return subprocess.run([sys.executable, "-c", TRY, str(run)], capture_output=True, text=True).stdout.strip()

    with Run(run).writing():
        with Run(run).writing():
            assert other() == "refused"
        assert other() == "refused"  # still held by the outer block
    assert other() == "took it"
