import json
import math
import struct
import subprocess
import sys

import pytest

from qkv.training.plots import plot_curves


def _png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def _write(path, with_bleu):
    with open(path, "w") as f:
        for step in range(1, 201):
            f.write(json.dumps({"step": step, "split": "train", "loss": 5 * math.exp(-step / 50), "lr": 1e-3 * min(1, step / 20)}) + "\n")
            if step % 20 == 0:
                rec = {"step": step, "split": "valid", "loss": 5 * math.exp(-step / 60) + 0.2}
                if with_bleu:
                    rec["bleu"] = step / 10
                f.write(json.dumps(rec) + "\n")


def test_writes_a_png_with_one_panel_per_metric(tmp_path):
    _write(tmp_path / "a.jsonl", with_bleu=True)
    _write(tmp_path / "b.jsonl", with_bleu=False)
    a = plot_curves(tmp_path / "a.jsonl", tmp_path / "out" / "a.png")
    b = plot_curves(tmp_path / "b.jsonl", tmp_path / "b.png", title="no bleu")
    assert a.stat().st_size > 5000
    (wa, ha), (wb, hb) = _png_size(a), _png_size(b)
    assert wa == wb and ha > hb  # the BLEU panel adds height


def test_nothing_to_plot_is_an_error(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text(json.dumps({"step": 1, "split": "train", "tokens": 5}) + "\n")
    with pytest.raises(ValueError, match="no 'loss'"):
        plot_curves(p, tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def test_importing_training_does_not_load_matplotlib():
    # (tqdm is not checked: torch itself imports it.)
    code = "import sys, qkv.training; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False"]
