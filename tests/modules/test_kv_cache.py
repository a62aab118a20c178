import pytest
import torch

from qkv import Transformer, preset
from qkv.modules.attention import KVCache


def test_update_appends_and_returns_prefix():
    c = KVCache(2, 3, 10, 4)
    k1, v1 = torch.randn(2, 3, 4, 4), torch.randn(2, 3, 4, 4)
    k, v = c.update(k1, v1)
    assert k.shape == (2, 3, 4, 4) and c.length == 4
    k2, v2 = torch.randn(2, 3, 1, 4), torch.randn(2, 3, 1, 4)
    k, v = c.update(k2, v2)
    torch.testing.assert_close(k, torch.cat([k1, k2], 2))
    torch.testing.assert_close(v, torch.cat([v1, v2], 2))
    c.reset()
    assert c.length == 0


def test_overflow_and_shape_errors():
    c = KVCache(1, 2, 4, 8)
    c.update(torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8))
    with pytest.raises(ValueError, match="KVCache is full"):
        c.update(torch.randn(1, 2, 2, 8), torch.randn(1, 2, 2, 8))
    with pytest.raises(ValueError, match="the cache holds"):
        c.update(torch.randn(1, 3, 1, 8), torch.randn(1, 3, 1, 8))


def test_reorder_moves_rows():
    c = KVCache(3, 1, 4, 2)
    k = torch.arange(3.0)[:, None, None, None].expand(3, 1, 2, 2).contiguous()
    c.update(k, k)
    c.reorder(torch.tensor([2, 2, 0]))
    assert c.k[:, 0, 0, 0].tolist() == [2.0, 2.0, 0.0]


def test_reorders_in_a_row_keep_each_rows_past():
    # Reordering swaps buffers: a row copied twice (two hypotheses of one parent), rows dropped, and
    # appends after each reorder must all keep the right past.
    c = KVCache(4, 2, 6, 3)
    ref = torch.randn(4, 2, 2, 3)
    c.update(ref, ref)
    for indices in ([1, 1, 3, 0], [2, 0, 0]):
        idx = torch.tensor(indices)
        c.reorder(idx)
        new = torch.randn(len(indices), 2, 1, 3)
        ref = torch.cat([ref[idx], new], dim=2)
        k, v = c.update(new, new)
        assert torch.equal(k, ref) and torch.equal(v, ref)


def test_reorder_narrows_and_widens_in_place():
    # Beam search's first step: one row per sentence, then each row fans out to its sentence's beam.
    c = KVCache(6, 2, 5, 3)
    allocated = c.k.data_ptr()
    c.reorder(torch.arange(2))
    first = torch.randn(2, 2, 1, 3)
    c.update(first, -first)
    c.reorder(torch.tensor([0, 0, 0, 1, 1, 1]))
    assert c.k.shape == (6, 2, 5, 3) and c.k.data_ptr() == allocated
    k, v = c.update(torch.zeros(6, 2, 1, 3), torch.zeros(6, 2, 1, 3))
    assert torch.equal(k[:, :, :1], first.repeat_interleave(3, dim=0))
    assert torch.equal(v[:, :, :1], -first.repeat_interleave(3, dim=0))
    with pytest.raises(ValueError, match="the cache holds"):  # rows in use: 6, not 2
        c.update(first, first)


def test_reorder_without_sources_leaves_the_source_keys():
    model = Transformer(preset("tiny-transformer")).eval()
    src = torch.randint(4, model.cfg.vocab_size, (2, 5))
    model.setup_cache(2, 8)
    memory = model.encode(src)
    model.decode(torch.ones(2, 1, dtype=torch.long), memory, None)
    self_cache, cross_cache = model.decoder_layers[0].self_attn.cache, model.decoder_layers[0].cross_attn.cache
    self_k, cross_k = self_cache.k[:, :, :1].clone(), cross_cache.k.clone()
    model.reorder_cache(torch.tensor([1, 0]))
    assert torch.equal(self_cache.k[:, :, :1], self_k.flip(0))
    assert torch.equal(cross_cache.k, cross_k)
    model.reorder_cache(torch.tensor([1, 0]), sources=torch.tensor([1, 0]))
    assert torch.equal(cross_cache.k, cross_k.flip(0))
    model.clear_cache()
