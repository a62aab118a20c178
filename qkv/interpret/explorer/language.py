"""The page's languages: the catalog of every string it shows (``static/catalog.js``) and the default
language a command gives it (``qkv explore --lang``), for the served and the exported page alike.

The page picks its language in ``static/lang.js``: the address's ``?lang=``, then the reader's own
choice, then ``<html data-default-lang>`` (written here), then the browser's languages.
"""

from __future__ import annotations

from pathlib import Path

from qkv.interpret.explorer.constants import load_constants

CATALOG_FILE = Path(__file__).resolve().parent / "static" / "catalog.js"
CATALOG: dict[str, dict[str, str]] = load_constants(CATALOG_FILE)  # {"zh": {key: text}, "en": {...}}
LANGS: tuple[str, ...] = tuple(CATALOG)  # ("zh", "en"): Chinese first
HTML_TAG = '<html lang="zh-CN" class="qkv-loading">'  # index.html's opening tag, where the default is written


def check_lang(lang: str | None) -> str | None:
    """``lang`` if it is one of the page's languages (or None); else a ValueError that names them."""
    if lang is not None and lang not in LANGS:
        raise ValueError(f"unknown language {lang!r}; the page speaks {', '.join(LANGS)}")
    return lang


def with_default_lang(html: str, lang: str | None) -> str:
    """``html`` (index.html) with ``lang`` as the language of a reader who has not chosen one."""
    if check_lang(lang) is None:
        return html
    if HTML_TAG not in html:
        raise ValueError(f"index.html does not open with {HTML_TAG}")
    code = CATALOG[lang]["lang.code"]
    return html.replace(HTML_TAG, f'<html lang="{code}" class="qkv-loading" data-default-lang="{lang}">', 1)


__all__ = ["CATALOG", "CATALOG_FILE", "LANGS", "check_lang", "with_default_lang"]
