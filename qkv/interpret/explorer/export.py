"""Write the explorer as ONE self-contained HTML file that works from file:// with no server.

``fetch()`` does not work from ``file://``, so every stylesheet and script of ``static/`` is inlined
and a model's attention maps, if any, are embedded as ``<script type="application/json"
id="qkv-model-data">``. The CJK font comes along as a WOFF2 data URL holding exactly the Chinese
glyphs of the page (its text, its scripts and its model's tokens), so the file renders 小明 on a
machine without CJK fonts. A Content-Security-Policy meta tag allows exactly those inline blocks (by
their sha256) and that font and nothing else: the file cannot load or send anything.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import tempfile
from pathlib import Path

from qkv.interpret.explorer.language import CATALOG_FILE, with_default_lang
from qkv.interpret.explorer.payload import normalize_attention_data
from qkv.interpret.fonts import FONT_URL, woff2_subset

STATIC_DIR = Path(__file__).resolve().parent / "static"

_SCRIPT_TAG = re.compile(r'<script src="([A-Za-z0-9_.-]+)"></script>')
_STYLE_TAG = re.compile(r'<link rel="stylesheet" href="([A-Za-z0-9_.-]+)">')
_CHARSET_TAG = '<meta charset="utf-8">'
_FONT_FACE = re.compile(r"@font-face\s*{[^}]*" + re.escape(f'url("{FONT_URL}") format("opentype")') + r"[^}]*}\s*")


def _sha256_source(text: str) -> str:
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return "'sha256-" + base64.b64encode(digest).decode("ascii") + "'"


def _read_static(name: str, static_dir: Path) -> str:
    path = static_dir / name
    if not path.is_file():
        raise FileNotFoundError(f"{path}: referenced by the page but missing")
    text = path.read_text(encoding="utf-8")
    # The text goes inside <script>/<style>; a closing tag in it would end the block early.
    if re.search(r"</(script|style)", text, flags=re.IGNORECASE):
        raise ValueError(f"{path}: contains a closing </script> or </style> and cannot be inlined")
    return text


def _json_for_script(obj: dict) -> str:
    # Escapes keep "</script>" or "<!--" in a token from ending the block; JSON.parse undoes them.
    text = json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _embed_font(css: str, page_text: str) -> str:
    """``css`` with the CJK font's source replaced by the glyphs of ``page_text`` (the rule dropped if none)."""
    rule = _FONT_FACE.search(css)
    if rule is None:
        return css
    woff2 = woff2_subset(page_text)
    if woff2 is None:
        return css[:rule.start()] + css[rule.end():]
    data = base64.b64encode(woff2).decode("ascii")
    face = rule.group(0).replace(f'url("{FONT_URL}") format("opentype")',
                                 f'url(data:font/woff2;base64,{data}) format("woff2")')
    return css[:rule.start()] + face + css[rule.end():]


def render_page(attention_data: dict | None = None, static_dir: Path = STATIC_DIR, lang: str | None = None,
                page: str = "index.html", strings: dict[str, str] | None = None) -> str:
    """Return the self-contained page as a string (see ``export_page``).

    ``page``: the page of ``static/`` to inline: the explorer (``index.html``), or the model figure alone
    (``notebook.html``, a notebook's view). ``strings``: the page speaks ``lang`` only (no toggle) and
    carries these of its strings instead of the whole catalog, so its font holds only their glyphs.
    """
    html = with_default_lang((static_dir / page).read_text(encoding="utf-8"), lang)
    if strings is not None:
        if lang is None:
            raise ValueError("render_page: strings of one language need that lang")
        html = html.replace(f'data-default-lang="{lang}"', f'data-default-lang="{lang}" data-lang="{lang}"', 1)
    styles: list[str] = []
    scripts: list[str] = []

    def inline_script(m: re.Match) -> str:
        js = _read_static(m.group(1), static_dir)
        if strings is not None and m.group(1) == CATALOG_FILE.name:
            js = f"globalThis.QKVCatalog = {_json_for_script({lang: strings})};\n"
        scripts.append(js)
        return f"<script>{js}</script>"

    html = _SCRIPT_TAG.sub(inline_script, html)
    if attention_data is not None:
        data = normalize_attention_data(attention_data)
        tag = f'<script type="application/json" id="qkv-model-data">{_json_for_script(data)}</script>\n'
        first_script = html.index("<script>")
        html = html[:first_script] + tag + html[first_script:]

    # The styles last: the font they embed holds the glyphs of everything else on the page.
    page_text = html

    def inline_style(m: re.Match) -> str:
        css = _embed_font(_read_static(m.group(1), static_dir), page_text)
        styles.append(css)
        return f"<style>{css}</style>"

    html = _STYLE_TAG.sub(inline_style, html)
    if not scripts or not styles:
        raise ValueError(f"{static_dir / page}: found no script or stylesheet tag to inline")
    if re.search(r"<(script|link)[^>]+(src|href)=\"(?!data:)", html):
        raise ValueError(f"{static_dir / page}: an external script or link is left after inlining")

    csp = (
        "default-src 'none'; "
        f"script-src {' '.join(_sha256_source(js) for js in scripts)}; "
        f"style-src {' '.join(_sha256_source(css) for css in styles)}; "
        "img-src data:; font-src data:; base-uri 'none'; form-action 'none'"
    )
    if _CHARSET_TAG not in html:
        raise ValueError(f"{static_dir / page}: missing {_CHARSET_TAG}")
    meta = f'\n<meta http-equiv="Content-Security-Policy" content="{csp}">'
    return html.replace(_CHARSET_TAG, _CHARSET_TAG + meta, 1)


def export_page(out_html: str | os.PathLike, attention_data: dict | None = None, lang: str | None = None) -> Path:
    """Write the explorer as one HTML file with all CSS, JS and data inlined.

    Args:
        out_html: Output path (parent folders are created).
        attention_data: A model's maps for the model figure (format in ``payload.py``), or None for the
            other figures only (the training-and-generating and practice figures show the traces
            embedded in ``static/traces.js``).
        lang: ``zh`` or ``en`` for a reader who has not chosen; None follows the browser.

    Returns:
        The path written. The file is written to a temporary name and renamed, so an interrupted
        export never leaves half a page.
    """
    out = Path(out_html)
    page = render_page(attention_data, lang=lang)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=out.name + ".", suffix=".tmp", dir=out.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(page)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out
