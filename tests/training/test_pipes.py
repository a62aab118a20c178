"""A pipe answers every line it can (qkv.cli.pipe): one bad line among 200 gets one error line on stderr with
its number and an empty output line; the other 199 are answered as they would be alone; the exit code says
that a line failed."""

import io
import sys

import pytest

from qkv.cli import main


@pytest.fixture(scope="module")
def runs(tiny_jobs, tmp_path_factory):
    root = tmp_path_factory.mktemp("pipes")
    for job in ("lm", "mt"):
        assert main(tiny_jobs.argv(job, root / job)) == 0
    return root


def _pipe(monkeypatch, capsys, argv, lines):
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(line + "\n" for line in lines)))
    capsys.readouterr()
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out.split("\n")[:-1], captured.err.strip().splitlines()


@pytest.mark.parametrize("job", ["generate", "translate"])
def test_a_200_line_pipe_with_one_bad_line_answers_the_other_199(runs, job, monkeypatch, capsys):
    if job == "generate":
        argv = ["generate", "--run", str(runs / "lm"), "-n", "4", "--temperature", "0", "--batch-size", "16"]
        good = [f"First Citizen {i % 7}" for i in range(200)]
        bad = "speak " * 40  # more tokens than the context of 32
    else:
        argv = ["translate", "--run", str(runs / "mt"), "--beam", "1", "--batch-size", "16"]
        good = ["小明累了，他想睡觉。", "小红明天在学校想吃饭。"] * 100
        bad = "小明累了，他想睡觉。" * 12  # more tokens than the model's 64 positions
    lines = list(good)
    lines[137] = bad
    code, out, err = _pipe(monkeypatch, capsys, argv, lines)
    assert code == 2
    assert len(out) == 200 and out[137] == ""
    assert len(err) == 2 and err[0].startswith(f"qkv {job}: error: stdin, line 138: ") and "1 of 200 lines" in err[1]
    # Every other line is what the pipe answers without the bad one.
    code, alone, err = _pipe(monkeypatch, capsys, argv, good)
    assert code == 0 and not err
    assert [o for i, o in enumerate(out) if i != 137] == [a for i, a in enumerate(alone) if i != 137]
