"""Attention inline in a notebook: ``qkv.interpret.show(model, "小明累了，他想睡觉。")`` in a Jupyter cell.

The view is the explorer's model figure (every kind of attention, layer and head: the head view, the
model view and one head's heat map, with hover), drawn from maps computed here and embedded in a
self-contained page: its scripts, styles and a font holding exactly the CJK glyphs it shows, nothing
fetched (a Content-Security-Policy forbids it), in Chinese or English. The page goes into an
``<iframe srcdoc>``, so each view is a document of its own: two views in one notebook share no id,
style or script, and the notebook's own styles do not reach it. Jupyter (Lab and classic) and VS
Code render it from ``_repr_html_``; ``.save(path)`` writes it as a file to open in any browser.

Heads are switched off in the call (``off=[("cross", 1, 0)]``), which translates again without them
(``interpret.ablation.heads_off``); the view then shows what the model wrote with every head on.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Sequence

from torch import nn

from qkv.generation.api import Translator
from qkv.interpret.ablation import Head
from qkv.interpret.explorer.export import render_page
from qkv.interpret.explorer.language import CATALOG, check_lang
from qkv.interpret.model_maps import load_run, make_attention_provider, pronoun_head
from qkv.files import write_text
from qkv.models import Transformer
from qkv.runs import Run
from qkv.tokenizers import Tokenizer

DEFAULT_LANG = "zh"  # the articles' readers'
HEIGHT_PX = 900  # the iframe's height until the page inside has been drawn and measured
# The catalog keys the model figure speaks (model_view.js: fig6.*; lang.js: the page's title and code).
_KEYS = ("fig6.", "lang.", "page.title")

# The iframe takes the height of the page inside once it is drawn (<html data-ready>); srcdoc pages
# are of the notebook's origin, so the notebook can measure them.
_FIT = ("var f=this,n=0,t=setInterval(function(){try{var d=f.contentDocument.documentElement;"
        "if(d.getAttribute('data-ready')||++n>100){f.style.height=(d.scrollHeight+4)+'px';clearInterval(t);}}"
        "catch(e){clearInterval(t);}},100);")


class AttentionView:
    """One sentence's attention maps, drawn where a notebook shows its cell's value."""

    def __init__(self, data: dict, lang: str = DEFAULT_LANG) -> None:
        self.data = data
        self.lang = check_lang(lang) or DEFAULT_LANG

    def page(self) -> str:
        """The view as a self-contained HTML page."""
        strings = {k: v for k, v in CATALOG[self.lang].items() if k.startswith(_KEYS)}
        return render_page(self.data, lang=self.lang, page="notebook.html", strings=strings)

    def _repr_html_(self) -> str:
        return (f'<iframe class="qkv-attention" srcdoc="{html.escape(self.page(), quote=True)}" '
                f'style="width:100%;height:{HEIGHT_PX}px;border:0" onload="{html.escape(_FIT, quote=True)}" '
                f'title="qkv attention"></iframe>')

    def save(self, path: str | Path) -> Path:
        """Write the view as an HTML file (atomically)."""
        return write_text(path, self.page())

    def __repr__(self) -> str:
        return f"AttentionView({self.data.get('text', '')!r} -> {self.data.get('output', '')!r}, lang={self.lang!r})"


def show(model: Run | str | Path | Translator | nn.Module, text: str, *, tokenizer: Tokenizer | None = None,
         off: Sequence[Head] = (), lang: str = DEFAULT_LANG, beam: int = 1, max_new_tokens: int = 32) -> AttentionView:
    """The attention of ``model`` on ``text``, as a view a notebook draws.

    Args:
        model: a run directory (or ``Run``), a ``Translator``, or a model with its ``tokenizer``: a
            ``Transformer`` translates ``text``, a ``GPT`` continues it.
        text: the sentence.
        off: heads to switch off, ``(kind, layer, head)`` with kind ``encoder_self``, ``decoder_self``,
            ``cross`` or ``self`` (a GPT's).
        lang: ``zh`` or ``en``.
        beam, max_new_tokens: how a translation is decoded (greedy by default); how far a GPT continues.

    A run that ``qkv explain`` measured opens on the head it found.
    """
    lang = check_lang(lang) or DEFAULT_LANG
    found = None
    if isinstance(model, (Run, str, Path)):
        found = pronoun_head(model)
        loaded = load_run(model)
    elif isinstance(model, Translator):
        loaded = model
    elif isinstance(model, nn.Module):
        if tokenizer is None:
            raise ValueError("show: a model needs its tokenizer (tokenizer=...), or give its run directory")
        loaded = Translator(model, tokenizer) if isinstance(model, Transformer) else (model, tokenizer)
    else:
        raise TypeError(f"show: expected a run directory, a Translator or a model, got {type(model).__name__}")
    data = make_attention_provider(None, beam=beam, max_new_tokens=max_new_tokens, loaded=loaded)(text, off=off)
    if found is not None:
        data["pronoun_head"] = {k: v for k, v in found.items() if k != "sentence"}
    return AttentionView(data, lang)


__all__ = ["AttentionView", "show", "DEFAULT_LANG"]
