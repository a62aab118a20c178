import torch

from qkv.modules.attention import causal_mask, combine, lengths_mask, padding_mask


def test_padding_mask():
    m = padding_mask(torch.tensor([[4, 5, 0], [4, 0, 0]]), pad_id=0)
    assert m.shape == (2, 1, 1, 3) and m.dtype == torch.bool
    assert m[:, 0, 0].tolist() == [[True, True, False], [True, False, False]]
    assert torch.equal(m, lengths_mask(torch.tensor([2, 1]), 3))


def test_causal_mask_is_lower_triangular():
    m = causal_mask(4)[0, 0]
    assert torch.equal(m, torch.tril(torch.ones(4, 4, dtype=torch.bool)))


def test_causal_mask_with_cache_offset():
    # Two new queries at absolute positions 3 and 4 over 5 keys.
    m = causal_mask(2, 5, offset=3)[0, 0]
    assert m.tolist() == [[True, True, True, True, False], [True, True, True, True, True]]


def test_combine_broadcasts_and_skips_none():
    pad = padding_mask(torch.tensor([[1, 1, 0]]), 0)
    m = combine(pad, None, causal_mask(3))
    assert m.shape == (1, 1, 3, 3)
    assert m[0, 0].tolist() == [[True, False, False], [True, True, False], [True, True, False]]
    assert combine(None, None) is None
