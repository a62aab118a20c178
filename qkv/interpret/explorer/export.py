"""Write the explorer as ONE self-contained HTML file that works from file:// with no server, or as a site.

``fetch()`` does not work from ``file://``, so every stylesheet and script of ``static/`` is inlined.
A live page (``LiveModel``: the graphs of ``qkv export onnx``) carries the model and onnxruntime-web
(``vendored.py``) and runs the model itself: its graphs and the runtimes' gzipped wasm are embedded
base64 (``<script type="application/octet-stream" data-qkv-file="NAME">``), what the page needs to
know of them as ``<script type="application/json" id="qkv-live">``. A notebook's view embeds a
model's maps instead (``<script type="application/json" id="qkv-model-data">``). The CJK font comes
along as a WOFF2 data URL holding exactly the Chinese glyphs of the page (its text, its scripts and
its model's vocabulary), so the file renders 小明 on a machine without CJK fonts. A
Content-Security-Policy meta tag allows exactly those inline blocks (by their sha256), that font,
and WebAssembly ('wasm-unsafe-eval', which onnxruntime-web compiles its kernels with) and nothing
else: the file cannot load or send anything. A site (``export_site``) is the same page as
``index.html`` with the model and the runtime as files beside it, fetched from its own origin.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from qkv.interpret.explorer.language import CATALOG_FILE, with_default_lang
from qkv.interpret.explorer.payload import normalize_attention_data
from qkv.interpret.explorer.vendored import RUNTIMES, runtime_script, runtime_wasm_gz
from qkv.interpret.fonts import FONT_URL, woff2_subset
from qkv.files import atomic_paths

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


@dataclass
class LiveModel:
    """A model the page runs itself: the folder ``qkv export onnx`` writes, read.

    Attributes:
        manifest: its ``manifest.json`` (the graphs, the sizes, the tokenizer the page encodes with).
        files: each graph's bytes by file name.
        model_name, default_text: what the page says it runs, and the sentence it starts on.
        pronoun_head: the head ``qkv explain`` found, if it was run (the model figure opens on it).
    """

    manifest: dict
    files: dict[str, bytes]
    model_name: str = ""
    default_text: str = ""
    pronoun_head: dict | None = None

    @classmethod
    def from_folder(cls, folder: str | os.PathLike, **kwargs) -> LiveModel:
        folder = Path(folder)
        manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
        files = {g["file"]: (folder / g["file"]).read_bytes() for g in manifest["graphs"].values()}
        return cls(manifest, files, **kwargs)

    def config(self) -> dict:
        """The page's ``#qkv-live`` JSON."""
        return {"manifest": self.manifest, "wasm": {b: r.wasm_gz for b, r in RUNTIMES.items()}, "model_name": self.model_name,
                "default_text": self.default_text, "pronoun_head": self.pronoun_head}

    def blobs(self) -> dict[str, bytes]:
        """Every file the page loads: the graphs and each runtime's wasm."""
        return {**self.files, **{r.wasm_gz: runtime_wasm_gz(b) for b, r in RUNTIMES.items()}}


def _blob_tag(name: str, data: bytes) -> str:
    return (f'<script type="application/octet-stream" data-qkv-file="{name}">'
            f'{base64.b64encode(data).decode("ascii")}</script>\n')


def render_page(attention_data: dict | None = None, static_dir: Path = STATIC_DIR, lang: str | None = None,
                page: str = "index.html", strings: dict[str, str] | None = None, live: LiveModel | None = None,
                site: bool = False) -> str:
    """Return the self-contained page as a string (see ``export_page``).

    ``page``: the page of ``static/`` to inline: the explorer (``index.html``), or the model figure alone
    (``notebook.html``, a notebook's view). ``strings``: the page speaks ``lang`` only (no toggle) and
    carries these of its strings instead of the whole catalog, so its font holds only their glyphs.
    ``live``: the model the page runs; ``site``: its files are beside the page (``export_site``), not in it.
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
    if live is not None:
        runtimes = [runtime_script(backend) for backend in RUNTIMES]
        scripts.extend(runtimes)
        tags = (f'<script type="application/json" id="qkv-live">{_json_for_script(live.config())}</script>\n'
                + "".join(f'<script type="module">{js}</script>\n' for js in runtimes))
        first_script = html.index("<script>")
        html = html[:first_script] + tags + html[first_script:]

    # The styles last: the font they embed holds the glyphs of everything else on the page.
    page_text = html

    def inline_style(m: re.Match) -> str:
        css = _embed_font(_read_static(m.group(1), static_dir), page_text)
        styles.append(css)
        return f"<style>{css}</style>"

    html = _STYLE_TAG.sub(inline_style, html)
    if live is not None and not site:  # after the font: base64 holds no glyph
        blobs = "".join(_blob_tag(name, data) for name, data in live.blobs().items())
        html = html.replace("</body>", blobs + "</body>", 1)
    if not scripts or not styles:
        raise ValueError(f"{static_dir / page}: found no script or stylesheet tag to inline")
    if re.search(r"<(script|link)[^>]+(src|href)=\"(?!data:)", html):
        raise ValueError(f"{static_dir / page}: an external script or link is left after inlining")

    wasm = " 'wasm-unsafe-eval'" if live is not None else ""  # onnxruntime-web compiles its kernels
    connect = "connect-src 'self'; " if site else ""  # a site fetches its model and runtime from its own origin
    csp = (
        "default-src 'none'; "
        f"script-src {' '.join(_sha256_source(js) for js in scripts)}{wasm}; "
        f"style-src {' '.join(_sha256_source(css) for css in styles)}; "
        f"{connect}img-src data:; font-src data:; base-uri 'none'; form-action 'none'"
    )
    if _CHARSET_TAG not in html:
        raise ValueError(f"{static_dir / page}: missing {_CHARSET_TAG}")
    meta = f'\n<meta http-equiv="Content-Security-Policy" content="{csp}">'
    return html.replace(_CHARSET_TAG, _CHARSET_TAG + meta, 1)


def export_page(out_html: str | os.PathLike, attention_data: dict | None = None, lang: str | None = None,
                live: LiveModel | None = None) -> Path:
    """Write the explorer as one HTML file with all CSS, JS and data inlined.

    Args:
        out_html: Output path (parent folders are created).
        attention_data: A model's maps for the model figure (format in ``payload.py``), or None.
        lang: ``zh`` or ``en`` for a reader who has not chosen; None follows the browser.
        live: the model the page runs (its figures 9 to 11 then answer any sentence typed).

    Returns:
        The path written. The file is written to a temporary name and renamed, so an interrupted
        export never leaves half a page.
    """
    out = Path(out_html)
    page = render_page(attention_data, lang=lang, live=live)
    with atomic_paths(out) as (tmp,):
        tmp.write_text(page, encoding="utf-8")
    return out


def export_site(out_dir: str | os.PathLike, live: LiveModel, lang: str | None = None) -> Path:
    """Write the live explorer as a folder any static host serves as it is: ``index.html`` and, beside it,
    the model's graphs and the runtime's wasm (fetched from the page's own origin). All the files are
    written, or none is (``files.atomic_paths``)."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"{out} is a file, not a folder: choose another --site")
    files = {"index.html": render_page(lang=lang, live=live, site=True).encode("utf-8"), **live.blobs()}
    with atomic_paths(*(out / name for name in files)) as tmps:
        for tmp, data in zip(tmps, files.values()):
            tmp.write_bytes(data)
    return out
