"""Small modules for the training-infrastructure tests (independent of qkv.models), and the three jobs, tiny."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn


class TinyLM(nn.Module):
    """Embedding -> Linear -> LayerNorm -> dropout -> output projection, optionally tied to the embedding."""

    def __init__(self, vocab: int = 11, d: int = 8, tied: bool = True, dropout: float = 0.0) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.proj = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(d, vocab, bias=False)
        if tied:
            self.head.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T, V)
        return self.head(self.drop(self.norm(torch.relu(self.proj(self.emb(ids))))))


@pytest.fixture
def make_model():
    """Factory: ``make_model(seed=0, **TinyLM kwargs)``."""

    def make(seed: int = 0, **kwargs) -> TinyLM:
        torch.manual_seed(seed)
        return TinyLM(**kwargs)

    return make


@pytest.fixture
def crash_at(monkeypatch):
    """``crash_at(step)``: the trainer dies (KeyboardInterrupt) before its update at ``step`` (every trainer
    updates through ``loop.optimizer_step``); ``monkeypatch.undo()`` ends it."""
    from qkv.training import loop

    def install(step: int) -> None:
        real = loop.optimizer_step

        def dies(optimizer, loss, at, *args):
            if at == step:
                raise KeyboardInterrupt
            return real(optimizer, loss, at, *args)

        monkeypatch.setattr(loop, "optimizer_step", dies)

    return install


# ------------------------------------------------------------------------------------------------
# The three jobs, tiny, through the command line (the kill-point and non-finite tests)

CLOCK = ("time", "elapsed", "tokens_per_s", "train_seconds", "seconds")  # metrics fields that vary run to run
TEXT = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n") * 20


class TinyJobs:
    """``train lm``, ``train mt`` and ``finetune`` (of a GPT pretrained here), 6 steps each, checkpointing every
    2 or 3 steps: GPT at 2, 3, 4 and 6 (``checkpoint_every: 2``, ``eval_every: 3``), translation and
    fine-tuning at 2, 4 and 6 (``eval_every: 2``)."""

    CHECKPOINT_STEP = 4
    OTHER_STEP = {"lm": 5, "mt": 3, "finetune": 3}  # a step that saves nothing

    def __init__(self, root: Path) -> None:
        from qkv.cli import main

        self.root = root
        (root / "text.txt").write_text(TEXT, encoding="utf-8")
        (root / "lm.yaml").write_text(f"""
model: {{d_model: 16, n_heads: 2, n_layers: 1, d_ff: 32, max_len: 32, dropout: 0.1}}
data: {{path: {root / 'text.txt'}}}
train: {{steps: 6, batch_size: 4, eval_every: 3, log_every: 1, eval_iters: 1, warmup: 1, checkpoint_every: 2}}
""", encoding="utf-8")
        (root / "mt.yaml").write_text("""
model: {d_model: 16, n_heads: 2, d_ff: 32, n_layers: 1, dropout: 0.1, max_len: 64}
data: {corpus: demo, vocab_size: 120, max_tokens: 200, max_src_len: 40, max_tgt_len: 40, demo_train: 100,
       demo_valid: 8, demo_test: 5}
train: {steps: 6, warmup: 2, eval_every: 2, eval_bleu_sentences: 2, log_every: 1, keep_checkpoints: 2,
        average_last: 2, test_beam: 2}
""", encoding="utf-8")
        (root / "sft.jsonl").write_text("".join(json.dumps({"prompt": f"All:\n{w}", "response": " Speak, speak."})
                                                + "\n" for w in ("Before", "we", "proceed", "hear", "me", "speak")),
                                        encoding="utf-8")
        assert main(["train", "lm", "--recipe", str(root / "lm.yaml"), "--run", str(root / "base"), "--quiet"]) == 0
        self.commands = {
            "lm": ["train", "lm", "--recipe", str(root / "lm.yaml")],
            "mt": ["train", "mt", "--recipe", str(root / "mt.yaml")],
            "finetune": ["finetune", "--run", str(root / "base"), "--data", str(root / "sft.jsonl"), "train.steps=6",
                         "train.warmup=1", "train.eval_every=2", "train.log_every=1", "train.eval_iters=1",
                         "train.batch_size=2", "train.mix=0.5", "train.pretrain_batch_size=2"],
        }

    def argv(self, job: str, run: Path, resume: bool = False, overrides: tuple[str, ...] = ()) -> list[str]:
        """The command of ``job`` on ``run``: afresh (over whatever is there), or ``resume``-d."""
        base = self.commands[job]
        if job == "finetune":  # its settings are on the command line, its run is --out
            return [*base, *overrides, "--out", str(run), "--quiet", "--resume" if resume else "--overwrite"]
        if resume:
            return [*base[:2], "--run", str(run), "--resume", "--quiet", *overrides]
        return [*base, "--run", str(run), "--quiet", "--overwrite", *overrides]

    @staticmethod
    def events(run: Path) -> list[dict]:
        """metrics.jsonl without its clock fields."""
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if k not in CLOCK} for r in rows]

    @staticmethod
    def weights(run: Path, names=("last.safetensors", "model.safetensors")) -> dict[str, dict]:
        from safetensors.torch import load_file

        return {name: load_file(str(run / name)) for name in names}


@pytest.fixture(scope="session")
def tiny_jobs(tmp_path_factory) -> TinyJobs:
    return TinyJobs(tmp_path_factory.mktemp("tiny_jobs"))
