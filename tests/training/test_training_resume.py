"""Exact resume: N steps in one go equal k steps, save, rebuild everything, load, N - k steps, bit for bit."""

import random

import pytest
import torch

from qkv.training.checkpoint import load_checkpoint, save_checkpoint
from qkv.evaluation.losses import label_smoothed_nll
from qkv.training.optim import build_adam, build_adamw
from qkv.training.schedules import noam_lr, set_lr

VOCAB, SEQ, N_SEQS, BATCH = 11, 9, 12, 3
TOTAL, SPLIT = 10, 4


class Loader:
    """Batches of a fixed corpus in a seeded order reshuffled each epoch; its position is saveable."""

    def __init__(self, seed: int) -> None:
        self.data = torch.randint(1, VOCAB, (N_SEQS, SEQ), generator=torch.Generator().manual_seed(123))
        self.gen = torch.Generator().manual_seed(seed)
        self.epoch, self.index = 0, 0
        self.order = torch.randperm(N_SEQS, generator=self.gen)

    def next(self) -> torch.Tensor:
        if self.index + BATCH > N_SEQS:
            self.epoch, self.index = self.epoch + 1, 0
            self.order = torch.randperm(N_SEQS, generator=self.gen)
        rows = self.data[self.order[self.index : self.index + BATCH]]
        self.index += BATCH
        # Python's RNG picks a crop, so its state must be restored too.
        start = random.randint(0, 2)
        return rows[:, start:]

    def state(self) -> dict:
        return {"epoch": self.epoch, "index": self.index, "order": self.order, "generator": self.gen.get_state()}

    def load(self, s: dict) -> None:
        self.epoch, self.index, self.order = s["epoch"], s["index"], s["order"]
        self.gen.set_state(s["generator"])


def _build(make_model, builder, seed):
    model = make_model(seed=seed, tied=True, dropout=0.2)  # dropout draws from torch's global RNG
    return model, builder(model, lr=0.0), Loader(seed=7)


def _train(model, opt, loader, first, last):
    losses = []
    model.train()
    for step in range(first, last + 1):
        set_lr(opt, noam_lr(step, d_model=8, warmup=3, factor=2.0))
        batch = loader.next()
        logits = model(batch[:, :-1])
        out = label_smoothed_nll(logits, batch[:, 1:], smoothing=0.1, ignore_index=0)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        opt.step()
        losses.append(out.loss.item())
    return losses


@pytest.mark.parametrize("builder", [build_adam, build_adamw], ids=["adam", "adamw"])
def test_resume_is_bit_exact(tmp_path, make_model, builder):
    torch.manual_seed(0)
    random.seed(0)
    model, opt, loader = _build(make_model, builder, seed=1)
    straight = _train(model, opt, loader, 1, TOTAL)
    final = {k: v.clone() for k, v in model.state_dict().items()}

    torch.manual_seed(0)
    random.seed(0)
    model, opt, loader = _build(make_model, builder, seed=1)
    first = _train(model, opt, loader, 1, SPLIT)
    save_checkpoint(tmp_path, "last", model, opt, {"step": SPLIT, "data": loader.state()})
    del model, opt, loader

    # A fresh process would start from other RNG states and other initial weights.
    torch.manual_seed(999)
    random.seed(999)
    model, opt, loader = _build(make_model, builder, seed=2)
    state = load_checkpoint(tmp_path, "last", model, opt)
    loader.load(state["data"])
    rest = _train(model, opt, loader, state["step"] + 1, TOTAL)

    assert first + rest == straight
    resumed = model.state_dict()
    for k, v in final.items():
        assert torch.equal(resumed[k], v), k
    assert model.head.weight is model.emb.weight


def test_resume_without_rng_restore_diverges(tmp_path, make_model):
    """The RNG states matter: without them the dropout masks and crops differ (so the test above can fail)."""
    torch.manual_seed(0)
    random.seed(0)
    model, opt, loader = _build(make_model, build_adam, seed=1)
    straight = _train(model, opt, loader, 1, TOTAL)

    torch.manual_seed(0)
    random.seed(0)
    model, opt, loader = _build(make_model, build_adam, seed=1)
    _train(model, opt, loader, 1, SPLIT)
    save_checkpoint(tmp_path, "last", model, opt, {"step": SPLIT, "data": loader.state()})
    torch.manual_seed(999)
    random.seed(999)
    model, opt, loader = _build(make_model, build_adam, seed=2)
    state = load_checkpoint(tmp_path, "last", model, opt, restore_rng=False)
    loader.load(state["data"])
    assert _train(model, opt, loader, SPLIT + 1, TOTAL) != straight[SPLIT:]
