import pytest
import torch

from qkv.interpret.plots import plot_attention


def test_writes_a_png_grid(tmp_path):
    w = torch.softmax(torch.randn(4, 3, 5), -1)
    out = plot_attention(w, ["我", "累", "了"], ["I", "am", "tired", ".", "<eos>"], tmp_path / "a.png", title="cross, layer 0")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_shape_mismatch_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="do not match"):
        plot_attention(torch.rand(2, 3, 4), ["a", "b"], ["c"] * 4, tmp_path / "x.png")
