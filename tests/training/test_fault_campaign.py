"""The random-kill campaign (bench/faults.py) as a test of the slow tier: a few cases of each job.

Each case SIGKILLs the real ``qkv`` process at a random instant (once or twice), resumes it, and
compares the final weights and metrics with a run never killed; the default tier's
``test_kill_points.py`` kills at every write on purpose instead. The full campaign's figures are in
docs/RELIABILITY.md.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "faults.py"


@pytest.mark.slow
@pytest.mark.parametrize("job", ["lm", "mt", "finetune"])
def test_random_kills_lose_nothing(tmp_path, job):
    out = tmp_path / "faults.json"
    subprocess.run([sys.executable, str(BENCH), "--job", job, "--cases", "3", "--seed", "1", "--out", str(out)],
                   check=True, capture_output=True, text=True, timeout=1200)
    report = json.loads(out.read_text())
    assert report["cases"] == 3 and report["kills"] >= 3
    assert report["lost"] == 0, report["results"]
