"""Token-budget batching: shifted targets, budgets, bucketing, per-epoch reshuffle, a rank's rows, exact resume."""

import random

import pytest
import torch

from qkv.parallel import block
from qkv.data.translation import (
    BatchStream, collate, eval_batches, padding_fraction, token_budget_batches,
)

PAD, BOS, EOS = 0, 1, 2


def _examples(n=200, seed=0, max_len=30):
    """Pairs whose target length follows the source length, as in real parallel text."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        s = rng.randint(1, max_len)
        t = max(1, s + rng.randint(-3, 3))
        out.append(([rng.randint(4, 99) for _ in range(s)], [rng.randint(4, 99) for _ in range(t)]))
    return out


def test_collate_shifts_targets_behind_bos_and_pads():
    batch = collate([([5, 6, 7], [8, 9]), ([10], [11, 12, 13, 14])], PAD, BOS, EOS)
    assert batch.src.tolist() == [[5, 6, 7, EOS], [10, EOS, PAD, PAD]]
    assert batch.tgt_in.tolist() == [[BOS, 8, 9, PAD, PAD], [BOS, 11, 12, 13, 14]]
    assert batch.tgt_out.tolist() == [[8, 9, EOS, PAD, PAD], [11, 12, 13, 14, EOS]]
    # Teacher forcing: the input at t+1 is the target at t.
    real = batch.tgt_in[:, 1:] != PAD
    assert torch.equal(batch.tgt_in[:, 1:][real], batch.tgt_out[:, :-1][real])
    assert (batch.src_tokens, batch.tgt_tokens, batch.padded_tokens) == (6, 8, 8 + 10)
    assert batch.padding_fraction == pytest.approx(1 - 14 / 18)


def test_collate_without_source_eos():
    batch = collate([([5, 6], [8])], PAD, BOS, EOS, src_eos=False)
    assert batch.src.tolist() == [[5, 6]]


def test_budget_respected_and_every_example_once():
    ex = _examples()
    s = [len(a) + 1 for a, _ in ex]
    t = [len(b) + 1 for _, b in ex]
    batches = token_budget_batches(s, t, max_tokens=120, seed=3, epoch=0)
    assert sorted(i for b in batches for i in b) == list(range(len(ex)))
    for b in batches:
        assert len(b) * max(max(s[i], t[i]) for i in b) <= 120
    # The collated tensors are no bigger than the budget either.
    for b in batches[:5]:
        batch = collate([ex[i] for i in b], PAD, BOS, EOS)
        assert batch.src.numel() <= 120 and batch.tgt_in.numel() <= 120


def test_oversized_example_gets_its_own_batch():
    batches = token_budget_batches([50, 2, 2], [3, 2, 2], max_tokens=10, shuffle=False)
    assert [0] in batches and sorted(i for b in batches for i in b) == [0, 1, 2]


def test_max_sentences_caps_batch_size():
    batches = token_budget_batches([2] * 10, [2] * 10, max_tokens=1000, max_sentences=3, shuffle=False)
    assert max(len(b) for b in batches) == 3


def test_bucketing_reduces_padding():
    ex = _examples(n=400)
    s = [len(a) + 1 for a, _ in ex]
    t = [len(b) + 1 for _, b in ex]
    bucketed = token_budget_batches(s, t, 200, seed=0, bucketed=True)
    scattered = token_budget_batches(s, t, 200, seed=0, bucketed=False)
    assert padding_fraction(bucketed, s, t) < 0.5 * padding_fraction(scattered, s, t)


def test_reshuffled_each_epoch_but_reproducible():
    ex = _examples()
    s = [len(a) for a, _ in ex]
    t = [len(b) for _, b in ex]
    e0 = token_budget_batches(s, t, 150, seed=1, epoch=0)
    assert e0 == token_budget_batches(s, t, 150, seed=1, epoch=0)
    assert e0 != token_budget_batches(s, t, 150, seed=1, epoch=1)
    assert e0 != token_budget_batches(s, t, 150, seed=2, epoch=0)


def test_rows_of_ranks_together_are_the_batch_with_less_padding():
    ex = _examples(n=40)
    batch = collate(ex[:7], PAD, BOS, EOS, list(range(7)))
    parts = [batch.rows(block(batch.size, r, 3), PAD) for r in range(3)]
    assert [p.size for p in parts] == [3, 2, 2]
    assert sum((p.indices for p in parts), []) == batch.indices
    assert sum(p.src_tokens for p in parts) == batch.src_tokens
    assert sum(p.tgt_tokens for p in parts) == batch.tgt_tokens
    for p, lo in zip(parts, (0, 3, 5)):
        # Same real tokens; only padding columns are gone, and at least one row still fills each tensor.
        assert torch.equal(p.src, batch.src[lo:lo + p.size, :p.src.shape[1]])
        assert (batch.src[lo:lo + p.size, p.src.shape[1]:] == PAD).all()
        assert (p.src != PAD).sum(1).max() == p.src.shape[1]
        assert torch.equal(p.tgt_out, batch.tgt_out[lo:lo + p.size, :p.tgt_out.shape[1]])
    # Fewer rows than ranks: one row each for the first ranks, an empty block for the others.
    assert [range(*block(batch.size, r, 8).indices(batch.size)) for r in range(8)] == \
        [range(r, r + 1) for r in range(7)] + [range(7, 7)]


def test_stream_reports_padding_of_what_it_yields():
    ex = _examples(n=100)
    stream = BatchStream(ex, 200, PAD, BOS, EOS, seed=0)
    reported = stream.epoch_padding_fraction()
    batches = [next(stream) for _ in range(stream.batches_per_epoch)]
    pads = sum(b.padded_tokens for b in batches) - sum(b.src_tokens + b.tgt_tokens for b in batches)
    assert reported == pytest.approx(pads / sum(b.padded_tokens for b in batches))
    assert sorted(i for b in batches for i in b.indices) == list(range(100))


def test_stream_resume_continues_exactly_across_epochs():
    ex = _examples(n=60)
    a = BatchStream(ex, 150, PAD, BOS, EOS, seed=5)
    per_epoch = a.batches_per_epoch
    for _ in range(per_epoch - 2):
        next(a)
    state = a.state_dict()
    expected = [next(a).indices for _ in range(5)]  # crosses into epoch 1
    b = BatchStream(ex, 150, PAD, BOS, EOS, seed=5)
    b.load_state_dict(state)
    assert [next(b).indices for _ in range(5)] == expected
    assert b.epoch == 1


def test_stream_rejects_state_of_other_data():
    a = BatchStream(_examples(n=60), 150, PAD, BOS, EOS, seed=5)
    b = BatchStream(_examples(n=61), 150, PAD, BOS, EOS, seed=5)
    with pytest.raises(ValueError, match="changed since the checkpoint"):
        b.load_state_dict(a.state_dict())


def test_eval_batches_cover_everything_in_order_of_length():
    ex = _examples(n=50)
    batches = list(eval_batches(ex, 200, PAD, BOS, EOS))
    assert sorted(i for b in batches for i in b.indices) == list(range(50))
    assert batches[0].src.shape[1] <= batches[-1].src.shape[1]
