import pytest
import torch

from qkv.config import ModelConfig
from qkv.modules.layers import DecoderLayer, EncoderLayer, FeedForward


def test_feed_forward_is_position_wise():
    # "Applied to each position separately and identically" (Section 3.3).
    for act in ("relu", "gelu", "gelu_tanh", "swiglu"):
        ff = FeedForward(8, 16, act)
        x = torch.randn(2, 5, 8)
        full = ff(x)
        torch.testing.assert_close(ff(x[:, 3:4]), full[:, 3:4])


def test_feed_forward_relu_formula():
    ff = FeedForward(4, 6, "relu")
    x = torch.randn(3, 4)
    ref = torch.relu(x @ ff.w_1.weight.T + ff.w_1.bias) @ ff.w_2.weight.T + ff.w_2.bias
    torch.testing.assert_close(ff(x), ref)


def test_unknown_activation():
    with pytest.raises(ValueError, match="unknown activation"):
        FeedForward(4, 8, "tanh")


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_layers_keep_shape_and_post_norm_output_is_normalized(norm):
    cfg = ModelConfig(d_model=16, n_heads=4, d_ff=32, n_layers=1, dropout=0.0, norm=norm)
    enc, dec = EncoderLayer(cfg).eval(), DecoderLayer(cfg).eval()
    x, mem = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    y = enc(x)
    z = dec(x, mem)
    assert y.shape == (2, 5, 16) and z.shape == (2, 5, 16)
    if norm == "post":  # LayerNorm(x + Sublayer(x)) is the last op: zero mean, unit variance per position
        torch.testing.assert_close(y.mean(-1), torch.zeros(2, 5), atol=1e-5, rtol=0)
        torch.testing.assert_close(z.std(-1, unbiased=False), torch.ones(2, 5), atol=1e-3, rtol=0)


def test_decoder_layer_without_memory_is_an_error():
    cfg = ModelConfig(d_model=16, n_heads=4, d_ff=32, n_layers=1)
    with pytest.raises(ValueError, match="memory"):
        DecoderLayer(cfg)(torch.randn(1, 3, 16))
