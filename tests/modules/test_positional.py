import math

import pytest
import torch

from qkv.modules.attention import SelfAttention
from qkv.modules.layers import LearnedPositionalEmbedding, RotaryEmbedding, SinusoidalPositionalEncoding, sinusoidal_table


def test_sinusoidal_matches_the_paper_formula_and_is_bounded():
    pe = sinusoidal_table(50, 16)
    for pos in (0, 7, 49):
        for i in range(8):
            angle = pos / 10000 ** (2 * i / 16)
            assert pe[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)
    assert pe.min() >= -1 and pe.max() <= 1


def test_sinusoidal_shift_is_a_rotation_independent_of_position():
    # "For any fixed offset k, PE(pos+k) can be represented as a linear function of PE(pos)"
    # (Section 3.5): each (sin, cos) pair turns by the angle k * w_i, whatever pos is.
    d, k = 16, 5
    pe = sinusoidal_table(100, d).double()
    freqs = torch.tensor([1 / 10000 ** (2 * i / d) for i in range(d // 2)], dtype=torch.float64)
    r = torch.zeros(d, d, dtype=torch.float64)
    for i, w in enumerate(freqs):
        c, s = math.cos(k * w), math.sin(k * w)
        # [sin(a+b), cos(a+b)] = [[cos b, sin b], [-sin b, cos b]] [sin a, cos a]
        r[2 * i:2 * i + 2, 2 * i:2 * i + 2] = torch.tensor([[c, s], [-s, c]], dtype=torch.float64)
    for pos in (0, 13, 60):
        torch.testing.assert_close(r @ pe[pos], pe[pos + k], atol=1e-5, rtol=0)


def test_too_long_is_a_clear_error():
    for module in (SinusoidalPositionalEncoding(8, 10), LearnedPositionalEmbedding(8, 10)):
        with pytest.raises(ValueError, match="longer than the positional table"):
            module(8, offset=5)
    with pytest.raises(ValueError, match="max_len=10"):
        RotaryEmbedding(8, 10)(torch.randn(1, 1, 11, 8))


def test_rope_scores_depend_only_on_relative_position():
    rope = RotaryEmbedding(8, 64)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def score(i, j):
        return (rope(q, offset=i) * rope(k, offset=j)).sum().item()

    assert score(3, 1) == pytest.approx(score(20, 18), abs=1e-5)
    assert score(3, 1) != pytest.approx(score(3, 2), abs=1e-3)
    # Rotations keep lengths.
    torch.testing.assert_close(rope(q, offset=9).norm(), q.norm())


def test_positions_break_permutation_equivariance():
    mha = SelfAttention(16, 4).eval()
    pe = SinusoidalPositionalEncoding(16, 32)
    x = torch.randn(1, 7, 16)
    perm = torch.tensor([1, 0, 2, 3, 4, 5, 6])
    out, _ = mha(x + pe(7))
    out_perm, _ = mha(x[:, perm] + pe(7))
    assert not torch.allclose(out_perm, out[:, perm], atol=1e-4)
