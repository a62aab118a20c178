import io
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from qkv.interpret import fonts
from qkv.interpret.plots import _pyplot, plot_attention

STYLE_CSS = Path(fonts.__file__).parent / "explorer" / "static" / "style.css"


def test_writes_a_png_grid(tmp_path):
    w = torch.softmax(torch.randn(4, 3, 5), -1)
    out = plot_attention(w, ["我", "累", "了"], ["I", "am", "tired", ".", "<eos>"], tmp_path / "a.png", title="cross, layer 0")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_shape_mismatch_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="do not match"):
        plot_attention(torch.rand(2, 3, 4), ["a", "b"], ["c"] * 4, tmp_path / "x.png")


def test_chinese_is_drawn_with_the_font_qkv_brings(tmp_path):
    """觉 of the seed sentence (simplified; Japanese fonts lack it): no missing-glyph warning, and
    the pixels of the shipped font's glyph, not the box of DejaVu Sans."""
    plt = _pyplot()
    from matplotlib.font_manager import FontProperties

    def pixels(**font) -> np.ndarray:
        fig = plt.figure(figsize=(1, 1), dpi=50)
        fig.text(0.1, 0.3, "觉", fontsize=30, **font)
        fig.canvas.draw()
        image = np.asarray(fig.canvas.buffer_rgba()).copy()
        plt.close(fig)
        return image

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        drawn = pixels()  # the default font list that qkv sets
        plot_attention(torch.ones(1, 2, 2) / 2, ["小明", "睡觉"], ["他", "想"], tmp_path / "a.png")
    np.testing.assert_array_equal(drawn, pixels(fontproperties=FontProperties(fname=fonts.font_path())))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tofu = pixels(family="DejaVu Sans")
    assert np.abs(drawn.astype(int) - tofu).max() > 100


def test_the_explorer_page_loads_the_font_for_the_same_characters():
    css = STYLE_CSS.read_text(encoding="utf-8")
    face = re.search(r"@font-face\s*{([^}]*)}", css).group(1)
    assert f"unicode-range: {fonts.css_unicode_range()};" in face and f'url("{fonts.FONT_URL}")' in face


def test_the_subset_holds_exactly_the_chinese_of_the_text():
    from fontTools.ttLib import TTFont

    font = TTFont(io.BytesIO(fonts.woff2_subset("The seed: 小明累了，他想睡觉。")))
    assert font.flavor == "woff2"
    assert set(font.getBestCmap()) == {ord(c) for c in "小明累了，他想睡觉。"}
    assert fonts.woff2_subset("no Chinese here") is None
