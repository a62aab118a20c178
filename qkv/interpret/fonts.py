"""The CJK font that qkv brings, so that Chinese tokens render on a machine with no fonts installed.

The font is Noto Sans CJK SC Regular (SIL Open Font License 1.1), as the ``mpl-font`` package ships
it: that package's only job is carrying the font file, and qkv never imports it, only reads the file.
Why this one: the package index has no package of just one Simplified Chinese font; of those that
carry one, ``mpl-font`` is the smallest with a free font and no dependencies (71 MB installed: four
weights of Noto Sans CJK SC and WenQuanYi Micro Hei), where ``mplfonts`` is 107 MB plus two
dependencies. A Japanese font package (IPAex, 6 MB) was tried and lacks simplified characters
such as 觉 of the seed sentence.

Three users: matplotlib figures (``use_in_matplotlib``), the explorer's server (``font_bytes``,
served as ``FONT_URL``) and its exported page (``woff2_subset``: only the glyphs on the page).
"""

from __future__ import annotations

import io
from functools import cache
from importlib.resources import files
from pathlib import Path

FONT_PACKAGE = "mpl_font"
FONT_FILE = "fonts/noto/NotoSansCJKsc-Regular.otf"
FAMILY = "Noto Sans CJK SC"
FONT_URL = "cjk.otf"  # the name the explorer's style.css loads it by
# The code points the font is used for, everything else keeps the page's and matplotlib's own fonts:
# CJK punctuation, kana, the unified ideographs and their extension A, compatibility ideographs, and
# full-width forms (，。！？).
CJK_RANGES = ((0x2E80, 0x9FFF), (0xF900, 0xFAFF), (0xFE30, 0xFE4F), (0xFF00, 0xFFEF))


def is_cjk(ch: str) -> bool:
    """Whether one character is drawn with the CJK font."""
    code = ord(ch)
    return any(lo <= code <= hi for lo, hi in CJK_RANGES)


def css_unicode_range() -> str:
    """``CJK_RANGES`` as a CSS ``unicode-range`` value."""
    return ", ".join(f"U+{lo:04X}-{hi:04X}" for lo, hi in CJK_RANGES)


@cache
def font_path() -> Path:
    """The font file, from the installed package (a dependency of qkv)."""
    try:
        path = Path(str(files(FONT_PACKAGE) / FONT_FILE))
    except ModuleNotFoundError:
        path = None
    if path is None or not path.is_file():
        raise FileNotFoundError(f"the CJK font {FAMILY} is missing: reinstall qkv's dependencies "
                                f"(pip install mpl-font), which carry {FONT_FILE}")
    return path


def font_bytes() -> bytes:
    return font_path().read_bytes()


@cache
def use_in_matplotlib() -> str:
    """Register the font with matplotlib and put it after DejaVu Sans in the font family list.

    matplotlib (3.6 and later) falls back glyph by glyph along the list, so Latin text keeps
    DejaVu Sans and only CJK characters come from Noto. Returns the family name.
    """
    import matplotlib
    from matplotlib import font_manager

    font_manager.fontManager.addfont(str(font_path()))
    matplotlib.rcParams["font.family"] = ["DejaVu Sans", FAMILY]
    return FAMILY


def woff2_subset(text: str) -> bytes | None:
    """The font cut down to the CJK characters of ``text``, as WOFF2; None if there are none.

    fontTools' subsetter keeps exactly those glyphs (and what they are built of), so the seed
    sentence costs 5 KB instead of the font's 16 MB.
    """
    unicodes = tuple(sorted({ord(ch) for ch in text if is_cjk(ch)}))
    return _woff2(unicodes) if unicodes else None


@cache
def _woff2(unicodes: tuple[int, ...]) -> bytes:
    # Cached: subsetting takes about two seconds (parsing the 16 MB font), and a page exported
    # twice holds the same characters.
    from fontTools import subset

    options = subset.Options()
    options.flavor = "woff2"
    options.name_IDs = ["*"]  # the copyright, the license and the family name stay with the font
    options.notdef_outline = True  # a character the font lacks shows its box, not nothing
    font = subset.load_font(str(font_path()), options)
    try:
        subsetter = subset.Subsetter(options)
        subsetter.populate(unicodes=unicodes)
        subsetter.subset(font)
        out = io.BytesIO()
        subset.save_font(font, out, options)
    finally:
        font.close()
    return out.getvalue()
