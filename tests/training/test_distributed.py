"""Data-parallel training on gloo, 2 ranks of one thread each on 127.0.0.1: DDP equals one process.

Every recipe here states the batch of the whole run; 2 ranks each train on half of it. The claims:

- the same losses (relative 1e-5) and the same final weights (absolute 1e-5) as one process on the
  whole batch, for a GPT (equal windows), for translation (token budgets: the ranks hold different
  numbers of target tokens) and for fine-tuning (response tokens);
- a run killed under torchrun resumes under torchrun to the very weights of the uninterrupted run;
- two torchrun launchers as two "nodes" (c10d rendezvous on 127.0.0.1) train what one launcher does;
- a rank that dies, or hangs, stops the other with a message instead of leaving it waiting;
- a translation batch of fewer pairs than ranks trains as one process does (a rank without a pair
  computes a stand-in weighted 0);
- a batch that does not divide over the ranks (a GPT's, whose windows weigh the same) is one clear
  error on every rank.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from qkv.cli import main

pytestmark = pytest.mark.distributed

WORKER = Path(__file__).with_name("rank_worker.py")
TEXT = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n"
        "First Citizen:\nYou are all resolved rather to die than to famish?\n") * 40
LOSS_RTOL, WEIGHT_ATOL = 1e-5, 1e-5


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)  # a test run under torchrun itself starts its ranks afresh
    return {**env, **extra}


def start_ranks(argv: list[str], n: int = 2, faults: dict[int, str] | None = None, **env: str) -> list[subprocess.Popen]:
    """``n`` processes of ``qkv ARGV`` with the environment torchrun gives its workers."""
    port = str(_port())
    procs = []
    for rank in range(n):
        rank_env = _env(RANK=str(rank), WORLD_SIZE=str(n), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(n),
                        MASTER_ADDR="127.0.0.1", MASTER_PORT=port, **env)
        fault = (faults or {}).get(rank, "none")
        procs.append(subprocess.Popen([sys.executable, str(WORKER), fault, "--", *argv], env=rank_env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return procs


def finish(procs: list[subprocess.Popen], timeout: float = 180) -> list[tuple[int, str, str]]:
    out = []
    for p in procs:
        try:
            stdout, stderr = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            stdout, stderr = p.communicate()
            pytest.fail(f"a rank did not finish in {timeout} s: {stderr[-2000:]}")
        out.append((p.returncode, stdout, stderr))
    return out


def run_ranks(argv: list[str], n: int = 2, **env: str) -> list[tuple[int, str, str]]:
    results = finish(start_ranks(argv, n, **env))
    for rank, (code, _, stderr) in enumerate(results):
        assert code == 0, f"rank {rank}: {stderr[-3000:]}"
    return results


def train_losses(run: Path) -> list[float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if r["split"] == "train"]


def assert_same_weights(a: Path, b: Path, atol: float = WEIGHT_ATOL) -> None:
    wa, wb = load_file(str(a)), load_file(str(b))
    assert wa.keys() == wb.keys()
    worst = max(float((wa[k] - wb[k]).abs().max()) for k in wa)
    assert worst <= atol, f"weights differ by {worst}"


def assert_same_run(one: Path, two: Path) -> None:
    la, lb = train_losses(one), train_losses(two)
    assert len(la) == len(lb) > 0
    assert la == pytest.approx(lb, rel=LOSS_RTOL)
    assert_same_weights(one / "last.safetensors", two / "last.safetensors")


def write_yaml(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def gpt(tmp_path_factory):
    """A GPT recipe (batch 4 windows: 2 per rank), trained by one process, in place."""
    root = tmp_path_factory.mktemp("gpt")
    (root / "text.txt").write_text(TEXT, encoding="utf-8")
    recipe = write_yaml(root / "gpt.yaml", f"""
model: {{d_model: 32, n_heads: 2, n_layers: 2, d_ff: 64, max_len: 32, dropout: 0.0}}
data: {{path: {root / 'text.txt'}}}
train: {{steps: 8, batch_size: 4, context: 16, eval_every: 4, log_every: 1, eval_iters: 3, warmup: 2, accumulate: 2,
        threads: 1}}
""")
    assert main(["train", "lm", "--recipe", str(recipe), "--run", str(root / "one"), "--quiet"]) == 0
    return root, recipe


def test_two_ranks_train_a_gpt_as_one_process_does(gpt):
    root, recipe = gpt
    run_ranks(["train", "lm", "--recipe", str(recipe), "--run-dir", str(root / "two"), "--quiet"])
    assert_same_run(root / "one", root / "two")
    # Validation was sharded over the ranks and added up: the same estimates as one process.
    valid = [[json.loads(line).get("loss") for line in (root / r / "metrics.jsonl").read_text().splitlines()
              if json.loads(line)["split"] in ("valid", "valid_full")] for r in ("one", "two")]
    assert valid[0] == pytest.approx(valid[1], rel=LOSS_RTOL)


def test_two_ranks_train_translation_as_one_process_does(tmp_path):
    """Token budgets: the ranks' halves of a batch hold different numbers of target tokens.

    Adam's epsilon is 1e-6 here, not the paper's 1e-9: the key projections' biases have a gradient that
    is zero in exact arithmetic (softmax ignores a score added to every key) and rounding noise of
    ~1e-12 in fp32, which an epsilon of 1e-9 turns into updates of the learning rate's size, different
    for any two summation orders (one process or two).
    """
    recipe = write_yaml(tmp_path / "mt.yaml", """
model: {d_model: 32, n_heads: 4, d_ff: 64, n_layers: 1, dropout: 0.0, max_len: 64}
data: {corpus: demo, vocab_size: 150, max_tokens: 300, max_src_len: 40, max_tgt_len: 40, demo_train: 300,
       demo_valid: 16, demo_test: 8}
train: {steps: 6, warmup: 2, peak_lr: 2.0e-3, adam_eps: 1.0e-6, eval_every: 3, eval_bleu_sentences: 5, log_every: 1,
        keep_checkpoints: 2, average_last: 2, test_beam: 2, threads: 1}
""")
    assert main(["train", "mt", "--recipe", str(recipe), "--run", str(tmp_path / "one"), "--quiet"]) == 0
    results = run_ranks(["train", "mt", "--recipe", str(recipe), "--run-dir", str(tmp_path / "two"), "--quiet"])
    assert_same_run(tmp_path / "one", tmp_path / "two")
    assert results[1][1] == ""  # only rank 0 prints the summary
    one, two = (json.loads((tmp_path / r / "results.json").read_text()) for r in ("one", "two"))
    assert one["final"] == two["final"]
    assert one["test"]["bleu"] == pytest.approx(two["test"]["bleu"], abs=1e-6)  # the sharded test translations


def test_a_translation_batch_of_fewer_pairs_than_ranks_trains_as_one_process_does(tmp_path):
    """The smallest token budget a recipe may give (one sentence of the longest kept, max_src_len + 1) gives
    most batches one pair (and the last cut of an epoch's length order can hold one pair at any budget):
    rank 1 has none of it, computes a stand-in weighted 0, and the two ranks still train what one process
    does, with accumulation too."""
    recipe = write_yaml(tmp_path / "mt.yaml", """
model: {d_model: 32, n_heads: 4, d_ff: 64, n_layers: 1, dropout: 0.0, max_len: 64}
data: {corpus: demo, vocab_size: 150, max_tokens: 17, max_src_len: 16, max_tgt_len: 16, demo_train: 100,
       demo_valid: 5, demo_test: 5}
train: {steps: 4, accumulate: 2, warmup: 2, peak_lr: 2.0e-3, adam_eps: 1.0e-6, eval_every: 2, eval_bleu_sentences: 0,
        log_every: 1, test_beam: 1, threads: 1}
""")
    assert main(["train", "mt", "--recipe", str(recipe), "--run", str(tmp_path / "one"), "--quiet"]) == 0
    run_ranks(["train", "mt", "--recipe", str(recipe), "--run-dir", str(tmp_path / "two"), "--quiet"])
    assert_same_run(tmp_path / "one", tmp_path / "two")


def test_two_ranks_finetune_as_one_process_does(gpt, tmp_path):
    root, _ = gpt
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": f"S{i}:", "response": " sp" * (1 + i % 3)}) + "\n"
                             for i in range(12)), encoding="utf-8")
    recipe = write_yaml(tmp_path / "ft.yaml", "train: {steps: 6, batch_size: 4, warmup: 1, eval_every: 3, "
                                              "eval_iters: 2, log_every: 1, lr: 3.0e-3, mix: 0.5, threads: 1}\n")
    common = ["finetune", "--run", str(root / "one"), "--data", str(pairs), "--valid", str(pairs), "--recipe",
              str(recipe), "--quiet"]
    assert main([*common, "--out", str(tmp_path / "one")]) == 0
    run_ranks([*common, "--out", str(tmp_path / "two")])
    assert_same_run(tmp_path / "one", tmp_path / "two")


def test_a_run_killed_under_torchrun_resumes_under_torchrun_exactly(tmp_path):
    """Dropout on: each rank's own random state is saved and restored with the checkpoint."""
    (tmp_path / "text.txt").write_text(TEXT, encoding="utf-8")
    recipe = write_yaml(tmp_path / "gpt.yaml", f"""
model: {{d_model: 48, n_heads: 2, n_layers: 2, d_ff: 96, max_len: 32, dropout: 0.1}}
data: {{path: {tmp_path / 'text.txt'}}}
train: {{steps: 300, batch_size: 8, context: 32, eval_every: 1000, log_every: 1, eval_iters: 2, warmup: 5,
        checkpoint_every: 5, threads: 1}}
""")
    run_ranks(["train", "lm", "--recipe", str(recipe), "--run-dir", str(tmp_path / "straight"), "--quiet"])

    killed = tmp_path / "killed"
    launcher = [sys.executable, "-m", "qkv", "train", "lm", "--nproc-per-node", "2", "--quiet"]
    proc = subprocess.Popen([*launcher, "--recipe", str(recipe), "--run", str(killed)], env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        lines = (killed / "metrics.jsonl").read_text().count("\n") if (killed / "metrics.jsonl").is_file() else 0
        if lines >= 60:
            break
        time.sleep(0.05)
    assert proc.poll() is None, f"the run ended before it could be killed: {proc.stderr.read()[-2000:]}"
    os.killpg(proc.pid, signal.SIGKILL)  # the launcher and both ranks, at once
    proc.wait()
    assert (killed / "last.pt").is_file() and not (killed / "model.safetensors").exists()

    done = subprocess.run([*launcher, "--run", str(killed), "--resume"], env=_env(), capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["step"] == 300
    assert_same_weights(tmp_path / "straight" / "last.safetensors", killed / "last.safetensors", atol=0.0)


def test_two_launchers_as_two_nodes_train_what_one_launcher_does(gpt):
    """torchrun's c10d rendezvous on 127.0.0.1: nothing qkv-specific, one process per "node"."""
    root, recipe = gpt
    port = _port()
    # The rendezvous store lives here, not in one of the launchers: a launcher that hosts it closes it when
    # its own worker is done, and the other launcher, still polling the store, failed with a broken pipe
    # (1 run in many). Hosting the store apart is what a cluster does with its rendezvous endpoint.
    store = torch.distributed.TCPStore("127.0.0.1", port, is_master=True, multi_tenant=True, wait_for_workers=False)
    procs = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
         f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-conf=is_host=false", "--rdzv-id=qkv-test", "--max-restarts=0",
         "-m", "qkv", "train", "lm", "--recipe", str(recipe), "--run-dir", str(root / "nodes"), "--quiet"],
        env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = finish(procs)
    del store  # after both launchers are done
    for code, _, stderr in results:
        assert code == 0, stderr[-3000:]
    assert_same_run(root / "one", root / "nodes")


@pytest.mark.parametrize("how", ["exit", "hang"])
def test_a_rank_that_dies_or_hangs_stops_the_other_with_a_message(gpt, tmp_path, how):
    root, recipe = gpt
    t0 = time.monotonic()
    procs = start_ranks(["train", "lm", "--recipe", str(recipe), "--run-dir", str(tmp_path / "run"), "--quiet"],
                        faults={1: f"{how}@3"}, QKV_COLLECTIVE_TIMEOUT="8")
    try:
        code, _, stderr = finish(procs[:1], timeout=90)[0]
    finally:
        procs[1].kill()
        procs[1].communicate()
    assert code == 1, stderr[-3000:]  # a failure while running, not bad input
    assert time.monotonic() - t0 < 80
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert "Traceback" not in stderr
    assert lines[-1].startswith("rank 0: qkv train: error: lost contact with the other ranks"), lines[-1]


def test_a_batch_that_does_not_divide_over_the_ranks_is_one_clear_error(gpt, tmp_path):
    root, recipe = gpt
    results = finish(start_ranks(["train", "lm", "--recipe", str(recipe), "--run-dir", str(tmp_path / "run"),
                                  "--quiet", "train.batch_size=3"]))
    for rank, (code, _, stderr) in enumerate(results):
        assert code == 2
        assert stderr.strip().splitlines()[-1] == (
            f"rank {rank}: qkv train: error: train.batch_size=3 does not divide over 2 ranks (every rank takes as "
            "many windows): make it a multiple of the number of processes")


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
    except (OSError, IndexError):
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_ranks_stop_when_their_launcher_is_killed_alone(tmp_path):
    (tmp_path / "text.txt").write_text(TEXT, encoding="utf-8")
    recipe = write_yaml(tmp_path / "gpt.yaml", f"""
model: {{d_model: 48, n_heads: 2, n_layers: 2, d_ff: 96, max_len: 32}}
data: {{path: {tmp_path / 'text.txt'}}}
train: {{steps: 100000, batch_size: 8, context: 32, eval_every: 100000, log_every: 1, eval_iters: 2, warmup: 5,
        checkpoint_every: 50, threads: 1}}
""")
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "qkv", "train", "lm", "--nproc-per-node", "2", "--quiet", "--recipe",
                             str(recipe), "--run", str(run)], env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not ((run / "metrics.jsonl").is_file() and (run / "metrics.jsonl").read_text().count("\n") >= 5):
            assert time.monotonic() < deadline and proc.poll() is None, "the run did not start"
            time.sleep(0.05)
        ranks = _children(proc.pid)
        assert len(ranks) == 2, ranks
        os.kill(proc.pid, signal.SIGKILL)  # the launcher alone
        proc.wait()
        deadline = time.monotonic() + 30  # well within the collective timeout
        while any(_running(r) for r in ranks):
            assert time.monotonic() < deadline, "the ranks trained on without their launcher"
            time.sleep(0.1)
        lines = (run / "metrics.jsonl").read_text().count("\n")
        time.sleep(1.5)
        assert (run / "metrics.jsonl").read_text().count("\n") == lines  # nothing writes the run any more
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
