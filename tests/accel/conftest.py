"""What the decoding tests share."""

import pytest

from qkv.cli import main


@pytest.fixture
def tiny_lm_run(tmp_path):
    """``make(max_len)``: a GPT run of one layer trained 2 steps on a repeated line, for `qkv generate` to load."""

    def make(max_len: int = 32):
        text = tmp_path / "t.txt"
        text.write_text("abcdefgh \n" * 200, encoding="utf-8")
        run = tmp_path / "run"
        assert main(["train", "lm", "--recipe", "baby", f"data.path={text}", "model.d_model=16", "model.n_heads=2",
                     "model.n_layers=1", "model.d_ff=32", f"model.max_len={max_len}", "train.context=16",
                     "train.steps=2", "train.eval_every=2", "train.eval_iters=1", "train.threads=1", "--run", str(run),
                     "--quiet"]) == 0
        return run

    return make
