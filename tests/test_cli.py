import json
import subprocess
import sys

from qkv.cli import main


def test_help_lists_commands(capsys):
    assert main([]) == 0
    assert "info" in capsys.readouterr().out


def test_info_preset_prints_count_and_paper_figure(capsys):
    assert main(["info", "--preset", "transformer-base"]) == 0
    out = capsys.readouterr().out
    assert "63,082,496" in out and "65M" in out
    assert main(["info", "--preset", "transformer-big", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["preset"]["parameters"] == 214_245_376 and info["preset"]["paper_parameters"] == "213M"


def test_info_vocab_and_bad_preset(capsys):
    assert main(["info", "--preset", "tiny-gpt", "--vocab", "100", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["preset"]["config"]["vocab_size"] == 100
    assert main(["info", "--preset", "nope"]) == 2
    assert "unknown preset" in capsys.readouterr().err


def test_module_entry_point():
    out = subprocess.run([sys.executable, "-m", "qkv", "info", "--json"], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)["qkv"]


def test_public_names():
    import qkv

    for name in ("Transformer", "GPT", "ModelConfig", "Translator", "Completer", "generate", "beam_search",
                 "capture_attention"):
        assert callable(getattr(qkv, name)), name


def test_a_closed_pipe_ends_quietly():
    """`qkv info | head -0`: the reader leaves before qkv writes; no BrokenPipeError traceback, exit 0."""
    for argv in (["info"], ["data", "list"]):
        proc = subprocess.run(f"{sys.executable} -m qkv {' '.join(argv)} | head -0; exit ${{PIPESTATUS[0]}}",
                              shell=True, executable="/bin/bash", capture_output=True, text=True)
        assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr
        assert proc.returncode == 0, argv


def test_a_bad_override_value_is_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "qkv", "train", "lm", "--recipe", "baby", "--run", str(tmp_path / "r"),
                           "train.lr=[1"], capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "train.lr=[1" in proc.stderr and "not valid YAML" in proc.stderr


def test_bad_numbers_are_refused_as_the_arguments_are_read(capsys):
    import pytest

    for argv, message in [
        (["generate", "--run", "r", "--temperature", "nan", "x"], "argument --temperature: must be a finite number"),
        (["translate", "--run", "r", "--alpha", "inf"], "argument --alpha: must be a finite number"),
        (["translate", "--run", "r", "--batch-size", "0"], "argument --batch-size: must be an integer >= 1, got 0"),
        (["generate", "--run", "r", "--seed", "-3", "x"], "argument --seed: must be in [0, 2^63), got -3"),
        (["eval", "mt", "--run", "r", "--beam", "0"], "argument --beam: must be an integer >= 1, got 0"),
    ]:
        with pytest.raises(SystemExit) as stop:
            main(argv)
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, err


def test_failures_while_running_exit_1_input_errors_2_and_qkv_debug_shows_the_traceback(tmp_path, capsys, monkeypatch):
    import pytest

    (tmp_path / "text.txt").write_text("To be, or not to be, that is the question.\n" * 20, encoding="utf-8")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"model: {{d_model: 16, n_heads: 2, n_layers: 1, d_ff: 32, max_len: 16}}\n"
                      f"data: {{path: {tmp_path / 'text.txt'}}}\n"
                      "train: {steps: 2, batch_size: 2, warmup: 1, eval_every: 2, eval_iters: 1}\n", encoding="utf-8")
    run = tmp_path / "run"
    assert main(["train", "lm", "--recipe", str(recipe), "--run", str(run), "--quiet"]) == 0
    (run / "last.pt").write_bytes(b"not a checkpoint")
    capsys.readouterr()
    # A damaged checkpoint: a failure while running (1), one line naming the file.
    assert main(["train", "lm", "--run", str(run), "--resume"]) == 1
    err = capsys.readouterr().err
    assert "last.pt" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    # A path that is not there is the user's input (2).
    assert main(["train", "lm", "--run", str(tmp_path / "nowhere"), "--resume"]) == 2
    capsys.readouterr()
    monkeypatch.setenv("QKV_DEBUG", "1")
    with pytest.raises(Exception):
        main(["train", "lm", "--run", str(run), "--resume"])


def test_a_full_disk_at_a_checkpoint_is_one_line_and_keeps_the_checkpoint_before(tmp_path, capsys, monkeypatch):
    """ENOSPC while the step-4 checkpoint is written (root ignores read-only modes, so the write is made to fail
    the way a full disk or a read-only folder fails it): exit 1, one line, step 2's checkpoint whole, and a
    resume from it ends where a run never stopped ends."""
    import errno

    import qkv.files
    from safetensors.torch import load_file

    (tmp_path / "text.txt").write_text("To be, or not to be, that is the question.\n" * 20, encoding="utf-8")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"model: {{d_model: 16, n_heads: 2, n_layers: 1, d_ff: 32, max_len: 16}}\n"
                      f"data: {{path: {tmp_path / 'text.txt'}}}\n"
                      "train: {steps: 6, batch_size: 2, warmup: 1, eval_every: 2, eval_iters: 1}\n", encoding="utf-8")
    assert main(["train", "lm", "--recipe", str(recipe), "--run", str(tmp_path / "straight"), "--quiet"]) == 0
    real = qkv.files._fsync_file
    saves = []

    def full_disk(path):
        if ".last.pt.tmp-" in str(path):
            saves.append(path)
            if len(saves) == 2:  # the second checkpoint, step 4
                raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path)

    monkeypatch.setattr(qkv.files, "_fsync_file", full_disk)
    run = tmp_path / "run"
    capsys.readouterr()
    assert main(["train", "lm", "--recipe", str(recipe), "--run", str(run), "--quiet"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"qkv train: error: {run / 'last.pt'}: No space left on device"], err
    monkeypatch.undo()
    assert not list(run.glob(".*tmp-*"))  # the failed save left nothing behind
    assert main(["train", "lm", "--run", str(run), "--resume", "--quiet"]) == 0
    a, b = load_file(str(tmp_path / "straight" / "last.safetensors")), load_file(str(run / "last.safetensors"))
    assert all(bool((a[k] == b[k]).all()) for k in a)


def test_a_really_full_disk_is_one_line_and_the_run_resumes_once_there_is_room(tmp_path, capsys):
    """A tmpfs sized so that the first checkpoint fits and the second does not (as root; skipped elsewhere):
    the real ENOSPC is one line naming the file, exit 1; the first checkpoint is whole; remounted read-only,
    a resume is one line too; given room, the run resumes to the weights of a run that never ran out."""
    import math
    import os
    import subprocess

    import pytest
    from safetensors.torch import load_file

    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a tmpfs needs root")
    try:
        (tmp_path / "text.txt").write_text("To be, or not to be, that is the question.\n" * 200, encoding="utf-8")
        recipe = tmp_path / "r.yaml"
        recipe.write_text(f"model: {{d_model: 64, n_heads: 2, n_layers: 2, d_ff: 128, max_len: 32}}\n"
                          f"data: {{path: {tmp_path / 'text.txt'}}}\n"
                          "train: {steps: 6, batch_size: 2, warmup: 1, eval_every: 100, eval_iters: 1, "
                          "checkpoint_every: 2}\n", encoding="utf-8")
        straight = tmp_path / "straight"
        assert main(["train", "lm", "--recipe", str(recipe), "--run", str(straight), "--quiet"]) == 0
        # Room for what is on disk at the second checkpoint, plus half of one checkpoint.
        pages = {p.name: math.ceil(p.stat().st_size / 4096) for p in straight.iterdir()}
        checkpoint = pages["last.safetensors"] + pages["last.pt"]
        present = checkpoint + sum(pages[n] for n in ("config.json", "tokenizer.json", "tokens.bin",
                                                      "tokens.bin.json", "metrics.jsonl"))
        subprocess.run(["mount", "-o", f"remount,size={(present + checkpoint // 2) * 4}k", str(disk)], check=True)
        run = disk / "run"
        capsys.readouterr()
        assert main(["train", "lm", "--recipe", str(recipe), "--run", str(run), "--quiet"]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("qkv train: error: ") and "No space left on device" in err[0], err
        assert str(run / "last.") in err[0]  # the file being written, not a temporary
        assert not list(run.glob(".*tmp-*"))  # the failed save took its temporary files with it
        assert torch_load_step(run) == 2  # the first checkpoint, whole
        # A read-only file system (root ignores a folder's modes, not a read-only mount): one line, exit 1.
        subprocess.run(["mount", "-o", "remount,ro,size=64m", str(disk)], check=True)
        assert main(["train", "lm", "--run", str(run), "--resume", "--quiet"]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "Read-only file system" in err[0] and str(run) in err[0], err
        subprocess.run(["mount", "-o", "remount,rw", str(disk)], check=True)
        assert torch_load_step(run) == 2
        assert main(["train", "lm", "--run", str(run), "--resume", "--quiet"]) == 0
        for name in ("last.safetensors", "model.safetensors"):
            a, b = load_file(str(straight / name)), load_file(str(run / name))
            assert all(bool((a[k] == b[k]).all()) for k in a), name
    finally:  # lazily: the failed run's memory map of tokens.bin may live until the garbage collector runs
        subprocess.run(["umount", "-l", str(disk)], check=False)


def torch_load_step(run) -> int:
    import torch

    return torch.load(run / "last.pt", weights_only=True)["state"]["loop"]["step"]


def test_a_launched_rank_ends_without_the_interpreters_teardown():
    """Under torchrun a rank leaves by os._exit once its group is destroyed: gloo's threads were seen to
    abort a finished rank in the teardown (exit code -6). Exit codes and printed results survive."""
    import os
    import subprocess
    import sys

    code = ("import atexit, sys\n"
            "atexit.register(lambda: print('teardown ran'))\n"
            "from qkv.cli import main\n"
            "sys.exit(7 + main(['info', '--preset', 'transformer-base']))\n")
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "63,082,496" in done.stdout and "teardown ran" not in done.stdout
    env.pop("RANK")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 7 and "teardown ran" in done.stdout  # not launched: the usual exit
