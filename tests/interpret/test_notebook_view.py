"""qkv.interpret.show: a model's attention as a notebook cell's view. The page inside is the explorer's model
figure alone, self-contained, in one language; two views in one notebook are two documents; in Chromium
both draw, each in its language, with nothing fetched."""

import html
import json
import re
from pathlib import Path

import pytest

from qkv.generation.api import Translator
from qkv.interpret import AttentionView, show
from qkv.runs import PRONOUNS_JSON, load_model

CHROMIUM = "/usr/bin/chromium"


def _page_of(view_html: str) -> str:
    m = re.search(r'srcdoc="([^"]*)"', view_html)
    assert m, view_html[:200]
    return html.unescape(m.group(1))


def test_a_view_is_an_iframe_holding_a_self_contained_page(mt_run):
    view = show(mt_run, "小明累了，他想睡觉。")
    assert isinstance(view, AttentionView) and view.lang == "zh"
    cell = view._repr_html_()
    assert cell.startswith('<iframe class="qkv-attention" srcdoc="') and "onload=" in cell
    page = _page_of(cell)
    assert 'data-lang="zh"' in page and 'http-equiv="Content-Security-Policy"' in page and "default-src 'none'" in page
    assert not re.search(r"<(script|link)[^>]+(src|href)=\"(?!data:)", page)  # nothing fetched
    assert 'id="qkv-model-data"' in page and "fig6-body" in page and "fig1" not in page  # the model figure alone
    catalog = re.search(r"globalThis\.QKVCatalog = (\{.*?\});\n", page).group(1)
    strings = json.loads(catalog)
    assert list(strings) == ["zh"] and all(k.startswith(("fig6.", "lang.", "page.")) for k in strings["zh"])
    assert "font/woff2;base64" in page  # the CJK glyphs it shows travel with it


def test_views_from_a_translator_or_a_model_and_heads_switched_off(mt_run, gpt_run, tmp_path):
    translator = Translator.from_run(mt_run, device="cpu")
    a = show(translator, "小明累了。", lang="en")
    b = show(translator.model, "小明累了。", tokenizer=translator.tokenizer, lang="en")
    assert a.page() == b.page() and a.data["output"] == translator.translate("小明累了。", beam=1)
    off = show(mt_run, "小明累了。", off=[("cross", 0, 0)])
    assert off.data["off"] == [["cross", 0, 0]] and "output_all_heads" in off.data
    gpt, tok = load_model(gpt_run, device="cpu")
    g = show(gpt, "To be", tokenizer=tok, max_new_tokens=3)
    assert {m["kind"] for m in g.data["maps"]} == {"self"}
    saved = g.save(tmp_path / "view.html")
    assert saved.read_text(encoding="utf-8") == g.page()


def test_a_run_qkv_explain_measured_opens_on_its_head(mt_run, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(mt_run, run)
    (run / PRONOUNS_JSON).write_text(json.dumps({"best": {"kind": "cross", "layer": 0, "head": 1, "share": 0.9,
                                                          "n": 600, "share_two": 0.8},
                                                 "seed_sentence": {"sentence": "小明累了，想睡觉。"}}))
    view = show(run, "小明累了，想睡觉。")
    assert view.data["pronoun_head"] == {"kind": "cross", "layer": 0, "head": 1, "share": 0.9, "n": 600,
                                         "share_two": 0.8}


def test_bad_calls_are_one_clear_error(mt_run):
    with pytest.raises(ValueError, match="unknown language 'fr'"):
        show(mt_run, "小明", lang="fr")
    translator = Translator.from_run(mt_run, device="cpu")
    with pytest.raises(ValueError, match="needs its tokenizer"):
        show(translator.model, "小明")
    with pytest.raises(TypeError, match="expected a run directory"):
        show(42, "小明")
    with pytest.raises(ValueError):
        show(mt_run, "   ")  # blank text, as the explorer refuses it


@pytest.mark.browser
def test_two_views_in_one_notebook_draw_each_in_its_language_and_fetch_nothing(mt_run, tmp_path):
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing")
    sync_api = pytest.importorskip("playwright.sync_api")
    zh, en = show(mt_run, "小明累了，他想睡觉。"), show(mt_run, "小红饿了。", lang="en", off=[("cross", 0, 1)])
    notebook = tmp_path / "notebook.html"
    notebook.write_text(f"<!doctype html><html><body><h1>out</h1>{zh._repr_html_()}{en._repr_html_()}</body></html>",
                        encoding="utf-8")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            requests = []
            page.on("request", lambda r: requests.append(r.url))
            page.goto(notebook.as_uri())
            page.wait_for_function("() => [...document.querySelectorAll('iframe.qkv-attention')].every(f =>"
                                   " f.contentDocument && f.contentDocument.documentElement.getAttribute('data-ready'))",
                                   timeout=30000)
            frames = [page.locator("iframe.qkv-attention").nth(i).element_handle().content_frame() for i in range(2)]
            langs = [f.evaluate("() => document.documentElement.lang") for f in frames]
            assert langs == ["zh-CN", "en"]
            titles = [f.locator("[data-testid=fig6-detail-title]").text_content() for f in frames]
            assert "层" in titles[0] and "layer" in titles[1]
            assert frames[1].locator("[data-testid=fig6-output-all]").count() == 1  # heads off: the output with all on
            for f in frames:
                assert f.locator("[data-testid=fig6-headview] line").count() > 0
                assert "fig6." not in f.evaluate("() => document.body.innerText")  # no catalog key left untranslated
            heights = [float(page.locator("iframe.qkv-attention").nth(i).evaluate("f => f.getBoundingClientRect().height"))
                       for i in range(2)]
            assert all(h > 600 for h in heights)  # each iframe grew to its page
        finally:
            browser.close()
    assert [u for u in requests if not u.startswith(("file:", "data:", "about:"))] == []
