"""The explorer page in headless Chromium: its JS equals the Python reference, and it reacts to input.

Every page is opened with all requests routed: anything not for the local server (or file://) is
aborted and fails the test, as does any console error. Screenshots of each figure are saved to
test-artifacts/explorer/ for a human to look at.
"""

import io
import math
import os
import threading
from pathlib import Path

import numpy as np
import pytest

import figures_reference as F  # tests/interpret/figures_reference.py (conftest.py makes it importable)

from qkv.interpret.explorer import export_page, make_server

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "explorer"


def fake_provider(text: str) -> dict:
    """A stand-in model: per-character causal maps (the test text "value-error" is refused)."""
    if text == "value-error":
        raise ValueError("unknown token")
    return maps_for(list(text))


def maps_for(toks: list[str]) -> dict:
    n = len(toks)
    causal = np.tril(np.ones((n, n)))
    causal /= causal.sum(axis=1, keepdims=True)
    return {"maps": [
        {"name": "decoder self · layer 1", "query_tokens": toks, "key_tokens": toks,
         "weights": np.stack([causal, np.eye(n)])},
        {"name": "cross · layer 1", "query_tokens": toks[:2], "key_tokens": toks,
         "weights": np.full((2, 2, n), 1.0 / n)},
    ]}


@pytest.fixture(scope="module")
def playwright():
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing (install Debian's chromium: apt-get install -y chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    with sync_api.sync_playwright() as p:
        yield p


@pytest.fixture(scope="module")
def browser(playwright):
    b = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
    yield b
    b.close()


@pytest.fixture(scope="module")
def browser_without_cjk(playwright, tmp_path_factory):
    """Chromium on a machine with no CJK font: fontconfig sees only matplotlib's own fonts (DejaVu)."""
    import matplotlib

    folder = tmp_path_factory.mktemp("fontconfig")
    conf = folder / "fonts.conf"
    conf.write_text(f"""<?xml version="1.0"?>
<!DOCTYPE fontconfig SYSTEM "fonts.dtd">
<fontconfig><dir>{Path(matplotlib.get_data_path()) / "fonts" / "ttf"}</dir>
<cachedir>{folder / "cache"}</cachedir></fontconfig>
""", encoding="utf-8")
    env = {**os.environ, "FONTCONFIG_FILE": str(conf)}
    b = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, env=env)
    yield b
    b.close()


def serving(**options):
    """A running explorer server on 127.0.0.1 (make_server's ``options``), stopped when the fixture ends."""
    srv = make_server(quiet=True, **options)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.fixture(scope="module")
def server():
    yield from serving()


@pytest.fixture(scope="module")
def demo_server():
    """`qkv explore` with no --run: the server of the demo model the package carries."""
    from qkv.cli.explore import _load_views
    from qkv.data.synthetic import SEED_SENTENCE
    from qkv.interpret.explorer.embedded import DEMO_MODEL

    yield from serving(default_text=SEED_SENTENCE[0], model_name="qkv demo", **_load_views(str(DEMO_MODEL)))


@pytest.fixture(scope="module")
def demo_trace():
    """What figure 9 shows of the packaged demo model on the seed sentence (traces.translation_trace)."""
    from qkv.data.synthetic import SEED_SENTENCE
    from qkv.interpret.explorer.embedded import DEMO_MODEL
    from qkv.interpret.traces import make_trace_provider

    return make_trace_provider(DEMO_MODEL)[0](SEED_SENTENCE[0])


@pytest.fixture(scope="module")
def artifacts():
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


class Watched:
    """A page plus what it logged and requested."""

    def __init__(self, page, origin):
        self.page = page
        self.origin = origin
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.blocked: list[str] = []


@pytest.fixture
def watched(browser, server):
    yield from watch(browser, server)


@pytest.fixture
def watched_without_cjk(browser_without_cjk, server):
    yield from watch(browser_without_cjk, server)


@pytest.fixture
def watched_demo(browser, demo_server):
    yield from watch(browser, demo_server)


@pytest.fixture
def watched_demo_without_cjk(browser_without_cjk, demo_server):
    yield from watch(browser_without_cjk, demo_server)


def watch(browser, server):
    ctx = browser.new_context(viewport={"width": 1100, "height": 900}, service_workers="block")
    w = Watched(ctx.new_page(), server.url.rstrip("/"))

    def route(r):
        url = r.request.url
        w.requests.append(url)
        if url.startswith(w.origin + "/") or url.startswith("file://"):
            r.continue_()
        else:
            w.blocked.append(url)
            r.abort()

    ctx.route("**/*", route)
    w.page.on("console", lambda m: w.errors.append(m.text) if m.type == "error" else None)
    w.page.on("pageerror", lambda e: w.errors.append(str(e)))
    yield w
    ctx.close()
    assert w.errors == [], f"console errors: {w.errors}"
    assert w.blocked == [], f"requests that left 127.0.0.1: {w.blocked}"
    assert all(u.startswith(("http://127.0.0.1:", "file://")) for u in w.requests), w.requests


def open_page(w: Watched, url: str | None = None, lang: str | None = "en"):
    """Open the page (in ``lang`` by its address, or as the browser would choose with None) and wait
    until every figure is drawn: <html data-ready> (wait_for_function would need eval, which the
    page's Content-Security-Policy forbids, as it should)."""
    url = url or w.origin + "/"
    if lang:
        url += ("&" if "?" in url else "?") + "lang=" + lang
    w.page.goto(url)
    w.page.wait_for_selector("html[data-ready]", state="attached")
    assert w.page.evaluate("window.QKVExplorer && window.QKVExplorer.ready") is True
    # A live model's figures answer once their first sentence is computed (data-done on their output).
    for testid in ("teacher-out", "practice-out"):
        if w.page.get_by_test_id(testid).count():
            w.page.wait_for_selector(f"[data-testid={testid}][data-done]", state="attached", timeout=60_000)
    return w.page


def percents(page) -> list[float]:
    return [float(t.rstrip("%")) for t in page.get_by_test_id("fig1-pct").all_text_contents()]


def dom_weights(page) -> np.ndarray:
    return np.array([float(el.get_attribute("data-weight")) for el in page.get_by_test_id("fig1-pct").all()])


def key_plot_point(page, xy):
    """Screen coordinates of data point ``xy`` in figure 1's key plot (size 360, pad 16, range 4)."""
    box = page.locator("#fig1-keys svg").bounding_box()
    scale = (180 - 16) / 4
    k = box["width"] / 360
    return box["x"] + (180 + xy[0] * scale) * k, box["y"] + (180 - xy[1] * scale) * k


def drag_tip_to(page, xy):
    hb = page.get_by_test_id("fig1-handle").bounding_box()
    page.mouse.move(hb["x"] + hb["width"] / 2, hb["y"] + hb["height"] / 2)
    page.mouse.down()
    tx, ty = key_plot_point(page, xy)
    page.mouse.move(tx, ty, steps=6)
    page.mouse.up()


# ---------------------------------------------------------------- JS == Python


def test_js_formulas_match_python(watched):
    page = open_page(watched)
    queries = [[2.4, 1.4], [-1.0, 0.5], [0.0, 0.0], [3.0, -2.0]]
    swaps = [(0, 2), (1, 4), (3, 3)]
    js = page.evaluate(
        """([queries, swaps]) => {
          const F = window.QKVFigures;
          const r = F.mulberry32(12345);
          const out = {mulberry: Array.from({length: 10}, () => r()), gauss: F.gaussians(7, 64)};
          out.fig1 = queries.map(q => F.figure1(q));
          out.hull = F.convexHull(F.FIG1_VALUES);
          out.fig2 = [[10, 64], [10, 2], [3, 512], [99, 16]].map(([s, d]) => F.figure2(s, d));
          out.fig3 = F.figure3();
          out.terms = F.dotProductTerms(2, 0);
          out.one = [0, 0.3, 1].map(a => F.oneHeadOutput(a));
          out.two = F.twoHeadOutput(0.95, 0.05);
          out.pe = [0, 1, 37, 100].map(p => F.sinusoidalPE(p));
          out.angles = [0, 5, 99].map(p => F.clockAngles(p));
          out.shift = [1, 7, 20].map(k => F.shiftAngles(k));
          out.words = swaps.map(([i, j]) => [false, true].map(pe =>
              F.wordOrderOutputs(F.swapped([0, 1, 2, 3, 4], i, j), pe)));
          out.change = swaps.map(([i, j]) => [F.wordOrderChange(i, j, false), F.wordOrderChange(i, j, true)]);
          out.steps = F.stepsPerTurn();
          out.cost = [1, 10, 1000].map(n => F.tableCost(n, 48));
          out.rounded = [[1/3, 1/3, 1/3], [0.8462, 0.0091, 0.1189, 0.0069, 0.0189],
                         F.figure2(10, 64).unscaled].map(w => F.roundPercents(w, 1));
          return out;
        }""",
        [queries, swaps],
    )

    def close(a, b):
        np.testing.assert_allclose(np.array(a, dtype=float), np.array(b, dtype=float), atol=1e-6, rtol=0)

    py_rand = F.mulberry32(12345)
    assert js["mulberry"] == [py_rand() for _ in range(10)]  # bit-exact integer arithmetic
    close(js["gauss"], F.gaussians(7, 64))
    for q, got in zip(queries, js["fig1"]):
        ref = F.figure1(np.array(q))
        for key in ("scores", "weights", "output"):
            close(got[key], ref[key])
    close(sorted(map(tuple, js["hull"])), sorted(map(tuple, F.convex_hull(F.FIG1_VALUES))))
    for (seed, d), got in zip([[10, 64], [10, 2], [3, 512], [99, 16]], js["fig2"]):
        ref = F.figure2(seed, d)
        for key in ("dots", "unscaled", "scaled", "max_unscaled", "max_scaled", "dot_std"):
            close(got[key], ref[key])
    ref3 = F.figure3()
    for key in ("Q", "K", "scores", "weights"):
        close(js["fig3"][key], ref3[key])
    ref_terms = F.dot_product_terms(2, 0)
    for key in ("q", "k", "products", "dot", "score"):
        close(js["terms"][key], ref_terms[key])
    close(js["one"], [F.one_head_output(a) for a in (0, 0.3, 1)])
    ref_two = F.two_head_output(0.95, 0.05)
    close(js["two"]["heads"], ref_two["heads"])
    close(js["two"]["concat"], ref_two["concat"])
    close(js["pe"], [F.sinusoidal_pe(p) for p in (0, 1, 37, 100)])
    close(js["angles"], [F.clock_angles(p) for p in (0, 5, 99)])
    close(js["shift"], [F.shift_angles(k) for k in (1, 7, 20)])
    close(js["steps"], F.steps_per_turn())
    assert js["cost"] == [F.table_cost(n, 48) for n in (1, 10, 1000)]
    for (i, j), got in zip(swaps, js["words"]):
        for pe, out in zip((False, True), got):
            close(out, F.word_order_outputs(F.swapped(range(5), i, j), pe))
    close(js["change"], [[F.word_order_change(i, j, pe) for pe in (False, True)] for i, j in swaps])
    assert js["rounded"] == [
        F.round_percents(w, 1)
        for w in (
            [1 / 3, 1 / 3, 1 / 3],
            [0.8462, 0.0091, 0.1189, 0.0069, 0.0189],
            F.figure2(10, 64)["unscaled"],
        )
    ]


# ---------------------------------------------------------------- interaction


def test_dragging_the_query_changes_weights_that_still_sum_to_100(watched):
    page = open_page(watched)
    before = percents(page)
    assert round(sum(before), 1) == 100.0
    assert before[0] == max(before)  # 小明 leads by default
    np.testing.assert_allclose(dom_weights(page), F.figure1()["weights"], atol=1e-6)

    drag_tip_to(page, [2.0, -0.3])  # point the query at 想
    after = percents(page)
    assert after != before and round(sum(after), 1) == 100.0
    assert after[3] == max(after)
    q = np.array(page.evaluate("window.QKVExplorer.fig1.getQuery()"))
    np.testing.assert_allclose(q, [2.0, -0.3], atol=0.1)  # the tip followed the mouse
    ref = F.figure1(q)
    np.testing.assert_allclose(dom_weights(page), ref["weights"], atol=1e-6)
    out = page.get_by_test_id("fig1-output")
    o = [float(out.get_attribute("data-x")), float(out.get_attribute("data-y"))]
    np.testing.assert_allclose(o, ref["output"], atol=1e-6)
    assert F.in_convex_hull(o, F.convex_hull(F.FIG1_VALUES))

    # Same direction, shorter arrow: flatter weights; longer: sharper.
    drag_tip_to(page, (q * 0.4).tolist())
    short_max = max(percents(page))
    drag_tip_to(page, (q * 1.8).tolist())
    long_max = max(percents(page))
    assert short_max < max(after) < long_max
    assert round(sum(percents(page)), 1) == 100.0


def test_query_handle_is_keyboard_accessible(watched):
    page = open_page(watched)
    page.get_by_test_id("fig1-handle").focus()
    for _ in range(5):
        page.keyboard.press("ArrowLeft")
    np.testing.assert_allclose(page.evaluate("window.QKVExplorer.fig1.getQuery()"), F.FIG1_QUERY + [-0.5, 0], atol=1e-9)
    page.locator("#fig1-reset").click()  # back to x(他)W^Q
    np.testing.assert_allclose(page.evaluate("window.QKVExplorer.fig1.getQuery()"), F.FIG1_QUERY, atol=1e-12)


def test_dk_slider_and_resample(watched):
    page = open_page(watched)
    def top(which="unscaled"):
        return float(page.get_by_test_id(f"fig2-max-{which}").get_attribute("data-value"))

    assert page.locator("#fig2-dk-val").text_content() == "64"
    assert top() >= 0.99 and top("scaled") <= 0.5
    shown = page.get_by_test_id("fig2-max-unscaled").text_content()
    assert shown == f"{100 * F.figure2(F.FIG2_DEFAULT_SEED, 64)['max_unscaled']:.1f}%"

    page.locator("#fig2-dk").fill("1")
    assert page.locator("#fig2-dk-val").text_content() == "2"
    ref = F.figure2(F.FIG2_DEFAULT_SEED, 2)
    assert top() != pytest.approx(F.figure2(F.FIG2_DEFAULT_SEED, 64)["max_unscaled"])
    assert top() == pytest.approx(ref["max_unscaled"], abs=1e-6)
    assert top("scaled") == pytest.approx(ref["max_scaled"], abs=1e-6)

    page.locator("#fig2-resample").click()
    assert page.locator("#fig2-seed").text_content() == f"seed {F.FIG2_DEFAULT_SEED + 1}"
    assert top() == pytest.approx(F.figure2(F.FIG2_DEFAULT_SEED + 1, 2)["max_unscaled"], abs=1e-6)


def test_clicking_a_table_cell_shows_its_dot_product(watched):
    page = open_page(watched)
    # Default selection: 他's query against 小明's key.
    assert "selected" in page.get_by_test_id("fig3-cell-2-0").get_attribute("class")
    page.get_by_test_id("fig3-cell-3-2").click()
    ref = F.dot_product_terms(3, 2)
    dot = page.get_by_test_id("fig3-dot")
    assert float(dot.get_attribute("data-value")) == pytest.approx(ref["dot"], abs=1e-9)
    assert dot.text_content() == f"{ref['dot']:.4f}".replace("-", "\u2212")
    detail = page.get_by_test_id("fig3-detail").text_content()
    assert "q(想)" in detail and "k(他)" in detail
    assert f"{ref['q'][0]:.2f}".replace("-", "\u2212") in page.get_by_test_id("fig3-q").text_content()
    assert "selected" in page.get_by_test_id("fig3-cell-3-2").get_attribute("class")
    assert "transposed" in page.get_by_test_id("fig3-cell-2-3").get_attribute("class")
    assert "selected" not in page.get_by_test_id("fig3-cell-2-0").get_attribute("class")
    back = F.dot_product_terms(2, 3)["score"]
    assert f"{back:.4f}".replace("-", "\u2212") in page.get_by_test_id("fig3-transposed").text_content()
    # Every row of the table shows weights that add up to 100%.
    for i in range(5):
        cells = [page.get_by_test_id(f"fig3-cell-{i}-{j}").locator(".w").text_content() for j in range(5)]
        assert round(sum(float(c.rstrip("%")) for c in cells), 1) == 100.0


def test_clock_turns_do_not_depend_on_position(watched):
    page = open_page(watched)
    page.locator("#fig5-k").fill("4")
    turns, hands = [], []
    for pos in ("0", "37", "100"):
        page.locator("#fig5-pos").fill(pos)
        turns.append([float(t.get_attribute("data-radians")) for t in page.get_by_test_id("fig5-turn").all()])
        angles = page.eval_on_selector_all("#fig5-clocks .hand", "els => els.map(e => e.dataset.angle)")
        hands.append([float(x) for x in angles])
    np.testing.assert_allclose(turns[0], F.shift_angles(4), atol=1e-9)
    steps = [float(x.get_attribute("data-steps")) for x in page.get_by_test_id("fig5-steps").all()]
    np.testing.assert_allclose(steps, F.steps_per_turn(), rtol=1e-9)
    assert turns[0] == turns[1] == turns[2]
    assert hands[0] != hands[1] != hands[2]
    np.testing.assert_allclose(hands[1], F.clock_angles(37), atol=1e-6)


def test_word_order_swap_with_and_without_pe(watched):
    page = open_page(watched)
    verdict = page.get_by_test_id("fig5-verdict")
    assert float(verdict.get_attribute("data-change")) < 1e-9
    assert "only reordered" in verdict.text_content()
    page.locator("#fig5-pe").check()
    change = lambda: float(verdict.get_attribute("data-change"))  # noqa: E731
    assert change() == pytest.approx(F.word_order_change(0, 2, True), abs=1e-6)
    assert "computes something new" in verdict.text_content()
    page.locator("#fig5-swap-b").select_option("4")
    assert change() == pytest.approx(F.word_order_change(0, 4, True), abs=1e-6)
    page.locator("#fig5-pe").uncheck()
    assert float(verdict.get_attribute("data-change")) < 1e-9


def test_one_head_versus_two(watched):
    page = open_page(watched)
    page.locator("#fig4-split").fill("100")
    assert "distance to v(小明) 0.00" in page.locator("#fig4-one-readout").text_content()
    concat = page.locator("#fig4-concat").text_content()
    expected = F.two_head_output(0.95, 0.05)["concat"]
    assert concat.endswith("[" + ", ".join(f"{x:.2f}".replace("-", "\u2212") for x in expected) + "]")


# ---------------------------------------------------------------- figure 6


def test_figure6_placeholder_without_model(watched):
    page = open_page(watched)
    assert "--run DIR to see your model" in page.get_by_test_id("fig6-body").text_content()


def test_figure6_with_a_model(watched, server, artifacts):
    from playwright.sync_api import expect

    server.attention_provider = fake_provider
    server.default_text = "小明累了"
    try:
        page = open_page(watched)
        heat = page.get_by_test_id("fig6-heatmap").locator("g.cell")
        expect(heat).to_have_count(16)  # default text: 4 x 4
        page.locator("#fig6-text").fill("他想睡觉了")
        page.locator("#fig6-run").click()
        expect(heat).to_have_count(25)
        # Maps without kind/layer are grouped by their names ("cross · layer 1").
        assert page.locator("#fig6-kinds button").all_text_contents() == ["decoder self", "cross"]
        page.locator("#fig6-head").select_option("mean")
        page.locator("#fig6-kinds [data-kind=cross]").click()
        assert heat.count() == 10  # cross: 2 x 5
        assert page.get_by_test_id("fig6-detail-title").text_content() == "cross · layer 1 · mean of heads"
        heat.first.hover()
        assert page.get_by_test_id("fig6-info").text_content() == "他 → 他: 20.0%"
        page.locator("#fig6").screenshot(path=str(artifacts / "fig6-model.png"))
        page.locator("#fig6-text").fill("好" * 120)  # long text: drawn on one canvas
        page.locator("#fig6-run").click()
        # A new text keeps the chosen kind, layer and head.
        expect(page.get_by_test_id("fig6-detail-title")).to_have_text("cross · layer 1 · mean of heads")
        page.locator("#fig6-kinds [data-kind=decoder_self]").click()
        expect(page.get_by_test_id("fig6-heatmap").locator("canvas")).to_have_count(1)
        assert heat.count() == 0
        # The head view stays light: at most its line budget, and it says what it left out.
        assert page.locator("[data-testid=fig6-headview] line").count() <= 12000
        page.locator("#fig6-text").fill("value-error")
        page.locator("#fig6-run").click()
        expect(page.get_by_test_id("fig6-error")).to_contain_text("could not read")
        # The 400 of a rejected request is logged by Chromium as a console error; it is expected here.
        watched.errors[:] = [e for e in watched.errors if "400" not in e]
    finally:
        server.attention_provider = None
        server.default_text = ""


# ---------------------------------------------------------------- figure 6 on a real model

REAL_TEXT = "小明累了，他想睡觉。"


@pytest.fixture(scope="module")
def real_payload(mt_run):
    """The tiny model's provider and what it returned for each text it was asked (as computed in Python)."""
    from qkv.interpret.model_maps import make_attention_provider

    provide = make_attention_provider(mt_run)
    served: dict[str, dict] = {}

    def recording(text: str) -> dict:
        served[text] = provide(text)
        return served[text]

    return recording, served


def find_map(payload, kind, layer):
    (m,) = [m for m in payload["maps"] if m["kind"] == kind and m["layer"] == layer]
    return m


def head_view_lines(page) -> list[tuple[int, int, int, float]]:
    rows = page.eval_on_selector_all(
        "[data-testid=fig6-headview] line.att",
        "els => els.map(e => [e.dataset.head, e.dataset.q, e.dataset.k, e.getAttribute('stroke-opacity')])",
    )
    return [(int(h), int(q), int(k), float(w)) for h, q, k, w in rows]


def assert_lines_match(page, m, heads=None):
    """Every drawn line's opacity is its weight; every nonzero weight of the shown heads is drawn."""
    w = m["weights"].numpy()
    heads = range(w.shape[0]) if heads is None else heads
    lines = head_view_lines(page)
    assert len(lines) == sum(int((w[h] > 0).sum()) for h in heads)
    assert {h for h, *_ in lines} == set(heads)
    err = max(abs(op - float(w[h, q, k])) for h, q, k, op in lines)
    assert err <= 1e-6, err


def test_figure6_head_and_model_view_of_a_real_model(watched, server, real_payload, artifacts):
    from playwright.sync_api import expect

    provider, served = real_payload
    server.attention_provider = provider
    try:
        page = open_page(watched)
        page.locator("#fig6-text").fill(REAL_TEXT)
        page.locator("#fig6-run").click()
        expect(page.get_by_test_id("fig6-outbox")).to_be_visible(timeout=30_000)
        payload = served[REAL_TEXT]
        assert payload["output"]  # an untrained model babbles, but it does say something
        expect(page.get_by_test_id("fig6-output-text")).to_have_text(payload["output"])
        assert "translation" in page.get_by_test_id("fig6-outbox").text_content()

        # Head view: encoder self, layer 0 first; opacities are the model's weights.
        kinds = page.locator("#fig6-kinds button")
        assert kinds.all_text_contents() == ["encoder self", "decoder self", "cross"]
        assert_lines_match(page, find_map(payload, "encoder_self", 0))
        page.locator("#fig6-kinds [data-kind=cross]").click()
        page.locator("#fig6-layer").select_option("1")
        cross1 = find_map(payload, "cross", 1)
        assert_lines_match(page, cross1)
        colours = page.eval_on_selector_all(
            "[data-testid=fig6-headview] g[data-head]", "gs => gs.map(g => g.getAttribute('stroke'))"
        )
        assert len(set(colours)) == 2  # one colour per head

        # Hovering a query token leaves only its lines highlighted; the rest are dimmed.
        page.get_by_test_id("fig6-hv-panel").scroll_into_view_if_needed()
        page.get_by_test_id("fig6-hv-q").nth(2).hover()
        svg = page.get_by_test_id("fig6-headview")
        assert "focus" in svg.get_attribute("class")
        on = page.eval_on_selector_all("[data-testid=fig6-headview] line.att.on", "els => els.map(e => e.dataset.q)")
        assert on and set(on) == {"2"} and len(on) == 2 * len(cross1["key_tokens"])
        opacity = page.eval_on_selector_all(
            "[data-testid=fig6-headview] line.att",
            "els => els.map(e => [e.classList.contains('on'), Number(getComputedStyle(e).opacity)])",
        )
        assert all(o == 1 for is_on, o in opacity if is_on) and all(o < 0.1 for is_on, o in opacity if not is_on)
        best = int(cross1["weights"][0, 2].argmax())
        assert f"head 0 → {cross1['key_tokens'][best]}" in page.get_by_test_id("fig6-hv-info").text_content()
        page.get_by_test_id("fig6-hv-panel").screenshot(path=str(artifacts / "fig6-headview-hover.png"))
        assert page.locator("[data-testid=fig6-headview] line.att.on").count() == len(on)  # still hovered
        # ... and a key token: only the lines into it.
        page.get_by_test_id("fig6-hv-k").nth(1).hover()
        on = page.eval_on_selector_all("[data-testid=fig6-headview] line.att.on", "els => els.map(e => e.dataset.k)")
        assert set(on) == {"1"} and len(on) == 2 * len(cross1["query_tokens"])
        page.mouse.move(1, 1)
        assert page.locator("[data-testid=fig6-headview] line.att.on").count() == 0

        # Head chips: head 1 off leaves head 0's lines only.
        page.locator("#fig6-heads [data-head='1']").click()
        assert_lines_match(page, cross1, heads=[0])
        page.locator("#fig6-heads .chip-all").click()
        assert_lines_match(page, cross1)

        # Model view: n_layers x n_heads maps of this kind; hover names one, click opens it.
        cells = page.get_by_test_id("fig6-cell")
        assert cells.count() == 2 * 2
        assert page.get_by_test_id("fig6-modelview").get_attribute("data-kind") == "cross"
        cell = page.locator("[data-testid=fig6-cell][data-layer='0'][data-head='1']")
        page.get_by_test_id("fig6-modelview").scroll_into_view_if_needed()
        cell.hover()
        tip = page.get_by_test_id("fig6-tooltip")
        expect(tip).to_be_visible()
        assert "layer 0 · head 1" in tip.text_content() and "cross" in tip.text_content()
        page.locator("#fig6 .fig6-mv").screenshot(path=str(artifacts / "fig6-tooltip.png"))
        expect(tip).to_be_visible()  # the screenshot did not scroll the hovered cell away
        cell.click()
        assert page.get_by_test_id("fig6-detail-title").text_content() == "cross · layer 0 · head 1"
        assert "sel" in cell.get_attribute("class")
        assert page.locator("#fig6-layer").input_value() == "0" and page.locator("#fig6-head").input_value() == "1"
        cross0 = find_map(payload, "cross", 0)
        rects = page.eval_on_selector_all(
            "[data-testid=fig6-heatmap] g.cell", "els => els.map(e => [e.dataset.r, e.dataset.l, e.dataset.weight])"
        )
        w = cross0["weights"][1].numpy()
        assert len(rects) == w.size
        assert max(abs(float(x) - w[int(r), int(l)]) for r, l, x in rects) <= 1e-6
        assert_lines_match(page, cross0)  # the head view followed to layer 0

        page.locator("#fig6-kinds [data-kind=decoder_self]").click()
        assert cells.count() == 4
        assert_lines_match(page, find_map(payload, "decoder_self", 0))  # causal zeros draw no line
        page.locator("#fig6").screenshot(path=str(artifacts / "fig6-real.png"))

        page.set_viewport_size({"width": 420, "height": 900})
        page.locator("#fig6").screenshot(path=str(artifacts / "fig6-narrow.png"))
        assert page.evaluate("document.documentElement.scrollWidth") <= 420
    finally:
        server.attention_provider = None


def test_figure6_of_a_gpt_shows_the_continuation_and_self_attention(watched, server, gpt_run, artifacts):
    from playwright.sync_api import expect

    from qkv.interpret.model_maps import make_attention_provider

    provide = make_attention_provider(gpt_run, max_new_tokens=6)
    served = {}
    server.attention_provider = lambda text: served.setdefault(text, provide(text))
    try:
        page = open_page(watched)
        page.locator("#fig6-text").fill("Xiaoming is tired")
        page.locator("#fig6-run").click()
        expect(page.get_by_test_id("fig6-outbox")).to_contain_text("continuation", timeout=30_000)
        payload = served["Xiaoming is tired"]
        expect(page.get_by_test_id("fig6-output-text")).to_have_text(payload["output"])
        assert page.locator("#fig6-kinds button").all_text_contents() == ["self"]
        assert page.get_by_test_id("fig6-cell").count() == 3 * 3
        assert page.locator("#fig6-heads .chip").count() == 3
        page.locator("#fig6-layer").select_option("2")
        assert_lines_match(page, find_map(payload, "self", 2))
        page.locator("#fig6").screenshot(path=str(artifacts / "fig6-gpt.png"))
    finally:
        server.attention_provider = None


def test_figure6_exported_real_model_works_from_file_url(watched, real_payload, tmp_path, artifacts):
    provider, served = real_payload
    payload = served.get(REAL_TEXT) or provider(REAL_TEXT)
    out = export_page(tmp_path / "model.html", payload)
    page = open_page(watched, out.as_uri())
    box = page.get_by_test_id("fig6-outbox").text_content()
    assert REAL_TEXT in box and payload["output"] in box
    assert_lines_match(page, find_map(payload, "encoder_self", 0))
    assert page.get_by_test_id("fig6-cell").count() == 4
    page.locator("#fig6-kinds [data-kind=cross]").click()
    page.locator("[data-testid=fig6-cell][data-layer='1'][data-head='0']").click()
    assert page.get_by_test_id("fig6-detail-title").text_content() == "cross · layer 1 · head 0"
    assert_lines_match(page, find_map(payload, "cross", 1))
    assert all(u.startswith("file://") for u in watched.requests)
    page.locator("#fig6").screenshot(path=str(artifacts / "fig6-exported-model.png"))


# ---------------------------------------------------------------- export and screenshots


def test_exported_page_works_from_file_url(watched, tmp_path, artifacts):
    tokens = ["小明", "累了", "，", "他", "想"]
    out = export_page(tmp_path / "page.html", maps_for(tokens))
    page = open_page(watched, out.as_uri())
    assert page.get_by_test_id("fig6-heatmap").locator("g.cell").count() == 25
    assert round(sum(percents(page)), 1) == 100.0
    drag_tip_to(page, [-1.0, -1.5])
    assert round(sum(percents(page)), 1) == 100.0
    assert all(u.startswith("file://") for u in watched.requests)
    page.locator("#fig6").screenshot(path=str(artifacts / "fig6-exported.png"))

    plain = export_page(tmp_path / "plain.html")
    page = open_page(watched, plain.as_uri())
    assert "--run DIR to see your model" in page.get_by_test_id("fig6-body").text_content()


def pixels(png: bytes) -> np.ndarray:
    import matplotlib.image as mpimg

    return mpimg.imread(io.BytesIO(png), format="png")


# SVG labels and HTML badges with 小明, as a reader sees them first: figure 1's key and value, figure
# 2's bar, the head's badge, figure 5's scatter.
FIRST_PAINT_LABELS = [
    ("#fig1-keys svg text.ptlabel", "k(小明)"),
    ("#fig1-values svg text.ptlabel", "v(小明)"),
    ("#fig2-scaled svg text.xlabel", "k(小明)"),
    ("#fig5-scatter svg text.ptlabel", "小明"),
    (".sentence .tok.t0", "小明"),
]


def element_with_text(page, selector: str, text: str):
    return page.locator(selector).filter(has_text=text).first


def rendered_in(page, selector: str, text: str, family: str) -> np.ndarray:
    """The pixels of a copy of the element (its whole SVG or badge copied beside it, so the copy is laid
    out afresh), drawn in ``family``: the reference for what the element should and should not look like."""
    copy = element_with_text(page, selector, text).evaluate_handle(
        """(el, family) => {
             const root = el.closest('svg') || el;
             const twin = root.cloneNode(true);
             twin.style.width = root.getBoundingClientRect().width + 'px';
             root.parentNode.insertBefore(twin, root.nextSibling);
             const index = [...root.querySelectorAll('*')].indexOf(el);
             const same = index < 0 ? twin : twin.querySelectorAll('*')[index];
             same.style.fontFamily = family;
             return same;
           }""", family)
    png = copy.as_element().screenshot()
    copy.evaluate("el => (el.closest('svg') || el).remove()")
    return pixels(png)


@pytest.mark.parametrize("where", ["exported", "served"])
def test_chinese_labels_render_at_first_paint_without_any_cjk_font(watched_without_cjk, tmp_path, artifacts, where):
    """Every label with 小明, as first painted (nothing restyled or resized before it is read), is drawn
    with the CJK face qkv brings, not as the empty boxes this browser draws without one."""
    w = watched_without_cjk
    url = export_page(tmp_path / "page.html").as_uri() if where == "exported" else None
    page = open_page(w, url, lang="zh")
    first = {}
    for selector, text in FIRST_PAINT_LABELS:  # read every label before anything on the page changes
        element = element_with_text(page, selector, text)
        element.scroll_into_view_if_needed()
        first[selector] = pixels(element.screenshot())
    page.locator("#fig1").screenshot(path=str(artifacts / f"fig1-no-cjk-font-{where}.png"))
    faces = page.evaluate("[...document.fonts].map(f => [f.family, f.status])")
    assert ["qkv CJK", "loaded"] in faces, faces
    for selector, text in FIRST_PAINT_LABELS:
        drawn = first[selector]
        tofu = rendered_in(page, selector, text, '"DejaVu Sans"')  # this browser's empty boxes
        right = rendered_in(page, selector, text, '"qkv CJK"')
        assert drawn.shape == right.shape, selector
        assert np.abs(drawn - tofu).max() > 0.5 if drawn.shape == tofu.shape else True, f"{selector}: boxes"
        np.testing.assert_allclose(drawn, right, atol=0.05, rtol=0, err_msg=f"{selector} is not drawn in the CJK face")
    if where == "exported":
        assert all(u.startswith("file://") for u in w.requests)
    else:
        assert any(u.endswith("/cjk.otf") for u in w.requests)


FIGURES = ["fig1", "fig2", "fig3", "cost", "fig4", "multihead", "fig5", "stack", "teacher", "practice", "fig6"]


@pytest.mark.parametrize("lang", ["zh", "en"])
def test_screenshots_of_every_figure(watched_demo_without_cjk, artifacts, lang):
    page = open_page(watched_demo_without_cjk, lang=lang)
    assert page.evaluate("document.documentElement.lang") == {"zh": "zh-CN", "en": "en"}[lang]
    for name in FIGURES:
        page.locator(f"#{name}").screenshot(path=str(artifacts / f"{lang}-{name}.png"))
    page.locator("header.page").screenshot(path=str(artifacts / f"{lang}-header.png"))
    page.locator("#fig5-pe").check()
    page.locator("#fig5").screenshot(path=str(artifacts / f"{lang}-fig5-pe.png"))
    page.locator("[data-box=ffn]").first.click()
    page.locator("#stack").screenshot(path=str(artifacts / f"{lang}-stack-ffn.png"))
    for _ in range(5):
        page.get_by_test_id("teacher-next").click()
    page.locator("#teacher").screenshot(path=str(artifacts / f"{lang}-teacher-step5.png"))
    page.set_viewport_size({"width": 420, "height": 900})
    for name in ("fig1", "fig3", "stack", "teacher"):
        page.locator(f"#{name}").screenshot(path=str(artifacts / f"{lang}-{name}-narrow.png"))
    sizes = {p.name: p.stat().st_size for p in artifacts.glob(f"{lang}-*.png")}
    assert all(size > 5000 for size in sizes.values()), sizes
    # Nothing sticks out of the page horizontally on a phone-sized screen.
    assert page.evaluate("document.documentElement.scrollWidth") <= 420


# ---------------------------------------------------------------- the articles' numbers, in both languages


def svg_percents(page, selector: str) -> list[float]:
    return [float(t.rstrip("%")) for t in page.locator(selector).all_text_contents() if t]


@pytest.mark.parametrize("lang", ["zh", "en"])
def test_the_articles_numbers_are_on_the_page(watched, lang):
    page = open_page(watched, lang=lang)
    # Figure 1 opens at 57% on 小明 (the first article's number).
    assert percents(page)[0] == 57.0
    # Figure 3's row 3 is figure 1's 他: the same 57.0% on 小明, the same weights.
    assert page.get_by_test_id("fig3-cell-2-0").locator(".w").text_content() == "57.0%"
    row = [float(page.get_by_test_id(f"fig3-cell-2-{j}").locator(".w").text_content().rstrip("%")) for j in range(5)]
    assert row == percents(page)
    assert float(page.get_by_test_id("fig3-row-note").get_attribute("data-weight")) == pytest.approx(
        float(dom_weights(page)[0]), abs=1e-12)
    assert "57.0%" in page.get_by_test_id("fig3-row-note").text_content()
    # Figure 2 at d_k = 64: 99% on one key unscaled; 39%, 22%, 16%, ... scaled; sqrt(64) = 8 shown.
    assert page.locator("#fig2-dk-val").text_content() == "64"
    assert page.get_by_test_id("fig2-max-unscaled").text_content() == "99.1%"
    assert sorted(svg_percents(page, "#fig2-scaled text.pctlabel"), reverse=True)[:3] == [39, 22, 16]
    assert "8.00" in page.get_by_test_id("fig2-spread").text_content()
    # ... and as d_k grows, the same vectors get more dimensions: the unscaled spike never falls.
    spikes = []
    for i in range(1, len(F.FIG2_DK_CHOICES) + 1):
        page.locator("#fig2-dk").fill(str(i))
        spikes.append(float(page.get_by_test_id("fig2-max-unscaled").get_attribute("data-value")))
    assert all(b >= a for a, b in zip(spikes, spikes[1:])) and spikes[-1] > 0.999, spikes
    # Figure 7's clocks: 6.3 steps a turn for the fastest hand, 19,869 for the slowest.
    assert page.get_by_test_id("fig5-fastest").text_content() == "6.3"
    assert page.get_by_test_id("fig5-slowest").text_content() == "19,869"
    # The table's cost: n^2 scores, 4 bytes each.
    page.locator("#cost-n").fill("1000")
    assert page.get_by_test_id("cost-one").get_attribute("data-scores") == "1000000"
    assert "1,000,000" in page.get_by_test_id("cost-one").text_content()
    # Multi-head at the paper's size: 8 heads of 64; Table 3's rows beside qkv's.
    assert page.get_by_test_id("multihead-head").count() == 8
    assert page.get_by_test_id("multihead-split").get_attribute("data-dk") == "64"
    table = page.get_by_test_id("table3").text_content()
    for paper in ("24.9", "25.8", "25.7", "−0.9"):
        assert paper in table
    page.locator("#multihead-h").fill("0")  # one head of 512
    assert page.get_by_test_id("multihead-head").count() == 1
    assert page.get_by_test_id("multihead-split").get_attribute("data-dk") == "512"


@pytest.mark.parametrize("lang", ["zh", "en"])
def test_the_encoder_decoder_boxes_open_their_explanations(watched_demo, demo_trace, lang):
    page = open_page(watched_demo, lang=lang)
    sizes = page.get_by_test_id("stack-sizes")
    assert sizes.get_attribute("data-d-model") == str(demo_trace["model"]["d_model"])  # the model's, shown first
    page.locator("#stack-which [data-sizes=paper]").click()
    assert sizes.get_attribute("data-d-model") == "512"  # the paper's base
    boxes = page.get_by_test_id("stack-box")
    kinds = set(page.eval_on_selector_all("[data-testid=stack-box]", "els => els.map(e => e.dataset.box)"))
    assert kinds == {"embed", "self_attn", "masked_attn", "cross_attn", "add_norm", "ffn", "output"}
    assert boxes.count() == 13  # 4 + 6 sublayers, two embeddings, the output
    page.locator("[data-box=ffn]").first.click()
    assert "2048" in page.get_by_test_id("stack-detail-text").text_content()
    page.locator("[data-box=masked_attn]").click()
    detail = page.get_by_test_id("stack-detail")
    assert "−∞" in detail.text_content() and detail.locator("a").get_attribute("href") == "#teacher"
    page.locator("#stack-which [data-sizes=run]").click()  # the demo model's sizes again
    assert sizes.get_attribute("data-d-model") == str(demo_trace["model"]["d_model"])


from qkv.interpret.explorer.embedded import load as load_practice  # noqa: E402

PRACTICE = load_practice()


def mask_cells(page):
    return page.eval_on_selector_all("[data-testid=teacher-mask-cell]",
                                     "els => els.map(e => [+e.dataset.i, +e.dataset.j, e.textContent])")


def step_to_the_end(page) -> list[str]:
    """Press "next token" until <eos>; the tokens the page generated."""
    import json as _json

    nxt = page.get_by_test_id("teacher-next")
    while nxt.is_enabled():
        nxt.click()
    return _json.loads(page.get_by_test_id("teacher-generated").get_attribute("data-tokens"))


@pytest.mark.parametrize("lang", ["zh", "en"])
def test_training_at_once_then_generating_one_token_at_a_time(watched_demo, demo_trace, lang):
    page = open_page(watched_demo, lang=lang)
    tr = demo_trace
    n = len(tr["read"])
    assert n == 10 and tr["read"][0] == "<bos>" and tr["target"][-1] == "<eos>"  # the article's 10 positions
    assert tr["read"][1:] == tr["target"][:-1]  # the target shifted right behind <bos>
    shift = page.get_by_test_id("teacher-shift").text_content()
    assert "<bos>" in shift and "wants" in shift
    # The causal mask: -inf above the diagonal before the softmax, exactly 0 after.
    cells = mask_cells(page)
    assert len(cells) == n * n
    assert all((t == "−∞") == (j > i) for i, j, t in cells)
    page.get_by_test_id("teacher-mask-after").click()
    cells = mask_cells(page)
    assert all((t == "0") == (j > i) for i, j, t in cells)
    weights = page.eval_on_selector_all("[data-testid=teacher-mask-cell]", "els => els.map(e => +e.dataset.weight)")
    np.testing.assert_allclose(np.array(weights).reshape(n, n).sum(axis=1), 1.0, atol=1e-4)
    # One teacher-forced pass: ten predictions at once.
    assert page.get_by_test_id("teacher-pass-row").count() == n
    # Generating: one token per click, until <eos>, the same tokens the pass predicted.
    assert page.get_by_test_id("teacher-generated").get_attribute("data-tokens") == "[]"
    page.get_by_test_id("teacher-next").click()
    assert page.get_by_test_id("teacher-candidate").count() == len(tr["steps"][0]["top"])
    assert page.get_by_test_id("teacher-cross").count() == len(tr["source_tokens"])
    generated = step_to_the_end(page)
    assert generated == tr["target"]
    assert tr["output"] in page.get_by_test_id("teacher-done").text_content()
    page.get_by_test_id("teacher-reset").click()
    assert page.get_by_test_id("teacher-generated").get_attribute("data-tokens") == "[]"


@pytest.mark.parametrize("lang", ["zh", "en"])
def test_gpt_practice_problems(watched, lang):
    page = open_page(watched, lang=lang)
    tr = PRACTICE
    assert tr["text"] == "今天天气很好"
    rows = page.get_by_test_id("practice-row")
    assert rows.count() == len(tr["problems"]) == 5
    assert rows.nth(1).text_content().startswith("今天 →")  # 今天 -> 天
    nll = [float(r.get_attribute("data-nll")) for r in rows.all()]
    np.testing.assert_allclose(nll, [-math.log(p["p"]) for p in tr["problems"]], rtol=1e-4)  # p is kept to 6 decimals
    assert page.get_by_test_id("practice-mean").text_content() == f"{tr['mean_nll']:.2f}"


def test_generation_from_a_run_matches_qkv_translate_greedy(watched, server, mt_run):
    """With --run, the figure traces the model live; its steps are `qkv translate --beam 1`'s tokens."""
    from qkv.generation.api import Translator
    from qkv.interpret.model_maps import token_strings
    from qkv.interpret.traces import make_trace_provider, model_sizes

    provide, kind = make_trace_provider(mt_run)
    server.trace_provider, server.trace_kind, server.model_sizes = provide, kind, model_sizes(mt_run)
    server.attention_provider = fake_provider
    try:
        page = open_page(watched)
        page.get_by_test_id("teacher-pass-row").first.wait_for()
        tr = Translator.from_run(mt_run, device="cpu")
        text = "小明累了，他想睡觉。"  # the text the figure starts with (the embedded trace's)
        expected = token_strings(tr.tokenizer, tr.tokenizer.encode(tr.translate(text, beam=1))) + ["<eos>"]
        assert step_to_the_end(page) == expected
        assert page.get_by_test_id("stack-sizes").get_attribute("data-d-model") == "16"  # the run's, shown first
    finally:
        server.trace_provider = server.trace_kind = server.model_sizes = server.attention_provider = None


def test_practice_problems_from_a_gpt_run(watched, server, gpt_run):
    from playwright.sync_api import expect

    from qkv.interpret.traces import make_trace_provider

    provide, kind = make_trace_provider(gpt_run)
    server.trace_provider, server.trace_kind = provide, kind
    try:
        page = open_page(watched)
        rows = page.get_by_test_id("practice-row")
        rows.first.wait_for()
        page.locator("#practice .trace-text").fill("Xiaoming is tired")
        page.locator("#practice button[type=submit]").click()
        expected = provide("Xiaoming is tired")
        expect(rows).to_have_count(len(expected["problems"]))
        expect(rows.first).to_contain_text(expected["problems"][0]["prefix"][0])
        nll = [float(r.get_attribute("data-nll")) for r in rows.all()]
        np.testing.assert_allclose(nll, [p["nll"] for p in expected["problems"]], atol=1e-6)
    finally:
        server.trace_provider = server.trace_kind = None


# ---------------------------------------------------------------- one catalog, two languages


def visible_text(page) -> str:
    """What a reader sees: the rendered text of the page, SVG labels, and the options of its lists."""
    return page.evaluate("""() => [document.body.innerText,
        ...[...document.querySelectorAll('svg text')].map(t => t.textContent),
        ...[...document.querySelectorAll('[aria-label]')].map(e => e.getAttribute('aria-label')),
        ...[...document.querySelectorAll('[title]')].map(e => e.getAttribute('title'))].join('\\n')""")


def test_no_visible_string_outside_the_catalog(watched_demo, demo_trace):
    """In Chinese, every Latin word on the page comes from the Chinese catalog or the data; in English,
    every Chinese run comes from the English catalog or the data (tokens, traces). A string written in
    the code instead of the catalog shows up in the other language and fails this."""
    import json as _json
    import re

    from qkv.interpret.explorer.language import CATALOG

    data = (_json.dumps([PRACTICE, demo_trace], ensure_ascii=False) + "".join(F.TOKENS) + "KB MB GB TB"
            + "qkv demo")
    for lang, word in (("zh", r"[A-Za-z]{2,}"), ("en", r"[\u2e80-\u9fff\uff00-\uffef]+")):
        page = open_page(watched_demo, lang=lang)
        page.locator("[data-box=cross_attn]").click()
        page.get_by_test_id("teacher-next").click()
        pool = re.sub(r"<[^>]+>", "", " ".join(CATALOG[lang].values())) + data  # the text of its markup
        stray = {w for w in re.findall(word, visible_text(page)) if w not in pool}
        assert not stray, f"{lang}: not in the catalog: {sorted(stray)[:20]}"


def test_the_language_follows_the_browser_and_the_toggle_persists(browser, server):
    for locale, lang in (("zh-CN", "zh"), ("en-GB", "en"), ("fr-FR", "zh")):
        ctx = browser.new_context(locale=locale)
        page = ctx.new_page()
        page.goto(server.url)
        page.wait_for_selector("html[data-ready]", state="attached")
        assert page.evaluate("window.QKVExplorer.lang") == lang, locale
        ctx.close()
    ctx = browser.new_context(locale="en-US")
    page = ctx.new_page()
    page.goto(server.url)
    page.wait_for_selector("html[data-ready]", state="attached")
    toggle = page.get_by_test_id("lang-toggle")
    assert toggle.text_content() == "中文"
    toggle.click()
    page.wait_for_url("**lang=zh**")
    page.wait_for_selector("html[data-ready]", state="attached")
    assert page.evaluate("window.QKVExplorer.lang") == "zh"
    assert page.locator("#fig1-title").text_content().endswith("查询去找键")
    page.goto(server.url)  # no ?lang: the reader's choice is remembered
    page.wait_for_selector("html[data-ready]", state="attached")
    assert page.evaluate("window.QKVExplorer.lang") == "zh"
    ctx.close()
    # `qkv explore --lang en`: the default for a reader who has not chosen.
    server.default_lang = "en"
    try:
        ctx = browser.new_context(locale="zh-CN")
        page = ctx.new_page()
        page.goto(server.url)
        page.wait_for_selector("html[data-ready]", state="attached")
        assert page.evaluate("window.QKVExplorer.lang") == "en"
        ctx.close()
    finally:
        server.default_lang = None


@pytest.mark.parametrize("lang", ["zh", "en"])
def test_exported_page_in_each_language_works_from_file_url(watched, tmp_path, demo_trace, lang):
    from qkv.cli import main

    out = tmp_path / f"{lang}.html"
    assert main(["explore", "--export", str(out), "--lang", lang]) == 0
    page = open_page(watched, out.as_uri(), lang=None)
    assert page.evaluate("window.QKVExplorer.lang") == lang
    assert percents(page)[0] == 57.0
    assert step_to_the_end(page) == demo_trace["target"]
    assert page.get_by_test_id("practice-row").count() == 5
    assert all(u.startswith("file://") for u in watched.requests)


def test_switching_a_head_off_translates_again_without_it(watched, server, mt_run):
    from playwright.sync_api import expect

    from qkv.interpret.model_maps import make_attention_provider

    provide = make_attention_provider(mt_run)
    # What the page must show, computed first: the server's thread and this one must not run the model at once.
    all_on, off = provide(REAL_TEXT)["output"], provide(REAL_TEXT, off=[("cross", 1, 0)])["output"]
    server.attention_provider = provide
    try:
        page = open_page(watched)
        page.locator("#fig6-text").fill(REAL_TEXT)
        page.locator("#fig6-run").click()
        expect(page.get_by_test_id("fig6-outbox")).to_be_visible(timeout=30_000)
        page.locator("#fig6-kinds [data-kind=cross]").click()
        page.locator("[data-testid=fig6-cell][data-layer='1'][data-head='0']").click()
        switch = page.get_by_test_id("fig6-switch")
        assert switch.get_attribute("data-head") == "cross:1:0"
        switch.click()
        expect(page.get_by_test_id("fig6-output-all")).to_have_text(all_on)
        expect(page.get_by_test_id("fig6-output-text")).to_have_text(off or "")
        assert "cross · layer 1 · head 0" in page.get_by_test_id("fig6-off").text_content()
        cell = page.locator("[data-testid=fig6-cell][data-layer='1'][data-head='0']")
        assert "off" in cell.get_attribute("class").split()
        assert page.get_by_test_id("fig6-switch").text_content() == "Switch this head back on"
        page.get_by_test_id("fig6-all-on").click()
        expect(page.get_by_test_id("fig6-output-all")).to_have_count(0)
        assert page.get_by_test_id("fig6-off").text_content() == ""
    finally:
        server.attention_provider = None


def test_the_model_figure_opens_on_the_head_qkv_explain_found(watched, server):
    server.attention_provider = fake_provider
    server.default_text = "小明累了"
    server.pronoun_head = {"kind": "cross", "layer": 1, "head": 1, "share": 0.9, "n": 512, "share_two": 0.75}
    try:
        page = open_page(watched, lang="zh")
        note = page.get_by_test_id("fig6-pronoun-head")
        note.wait_for()
        assert "512" in note.text_content() and "90.0%" in note.text_content() and "75.0%" in note.text_content()
        assert page.get_by_test_id("fig6-detail-title").text_content() == "交叉注意力 · 第 1 层 · 头 1"
    finally:
        server.attention_provider = server.pronoun_head = None
        server.default_text = ""


# ---------------------------------------------------------------- the model in the page (no Python, no server)

LIVE_TEXTS = ["小明累了，他想睡觉。", "小红饿了，她想回家。", "小刚和小丽在公园唱歌，他们很高兴。"]


@pytest.fixture(scope="module")
def live_pages(tmp_path_factory, mt_run, gpt_run):
    """`qkv explore --run R --export page.html` of the tiny translator and the tiny GPT, and a site of the first."""
    from qkv.cli import main

    root = tmp_path_factory.mktemp("live")
    pages = {"mt": root / "mt.html", "gpt": root / "gpt.html", "site": root / "site"}
    assert main(["explore", "--run", str(mt_run), "--export", str(pages["mt"])]) == 0
    assert main(["explore", "--run", str(gpt_run), "--export", str(pages["gpt"])]) == 0
    assert main(["explore", "--run", str(mt_run), "--site", str(pages["site"])]) == 0
    return pages


def ask_fig6(page, text: str, beam: int = 1) -> dict:
    """Type ``text`` into the model figure, choose the search, press the button; what the figure drew."""
    out = page.locator("#fig6-output")
    before = out.get_attribute("data-done")
    page.locator("#fig6-text").fill(text)
    if page.locator("#fig6-beam").count():
        page.locator("#fig6-beam").select_option(str(beam))
    page.locator("#fig6-run").click()
    page.wait_for_selector(f"#fig6-output[data-done]:not([data-done='{before}'])", state="attached", timeout=60_000)
    return page.evaluate("document.getElementById('fig6-output').qkvAnswer || null")


def shown_output(page) -> str:
    return page.get_by_test_id("fig6-output-text").text_content()


def assert_maps_equal(got: list[dict], expected: list[dict], atol: float = 1e-4):
    assert [(m["kind"], m["layer"]) for m in got] == [(m["kind"], m["layer"]) for m in expected]
    for g, e in zip(got, expected):
        assert g["query_tokens"] == e["query_tokens"] and g["key_tokens"] == e["key_tokens"], g["name"]
        np.testing.assert_allclose(np.array(g["weights"]), np.asarray(e["weights"]), atol=atol, rtol=0, err_msg=g["name"])


def test_the_exported_page_translates_what_a_reader_types(watched, live_pages, mt_run):
    """From file://, every request outside the page refused: three sentences typed (the last one never in
    the corpus), each translated greedily and by beam 4 exactly as `qkv translate` does, and every
    attention row drawn equal to PyTorch's (within 1e-4)."""
    from qkv.data.synthetic import demo_corpus
    from qkv.generation.api import Translator
    from qkv.interpret.model_maps import translation_maps

    assert LIVE_TEXTS[2] not in demo_corpus(0, 400, 8, 8)["train"][0]
    tr = Translator.from_run(mt_run, device="cpu")
    page = open_page(watched, live_pages["mt"].as_uri())
    assert page.get_by_test_id("fig6-live").count() == 1
    for text in LIVE_TEXTS:
        for beam in (1, 4):
            data = ask_fig6(page, text, beam)
            assert shown_output(page) == (tr.translate(text, beam=beam) or shown_output(page)), (text, beam)
            assert data["output"] == tr.translate(text, beam=beam), (text, beam)
            assert_maps_equal(data["maps"], translation_maps(tr, text, beam)["maps"])
    assert all(u.startswith("file://") for u in watched.requests)


@pytest.fixture(scope="module")
def browser_with_webgpu(playwright):
    """Chromium with WebGPU on its software adapter (SwiftShader): slow, but WebGPU's kernels."""
    args = [a for a in CHROMIUM_ARGS if a != "--disable-gpu"] + ["--enable-unsafe-webgpu"]
    b = playwright.chromium.launch(executable_path=CHROMIUM, args=args)
    yield b
    b.close()


@pytest.fixture
def watched_webgpu(browser_with_webgpu, server):
    yield from watch(browser_with_webgpu, server)


def backend_switch(page) -> dict:
    """The page's backend switch once it has asked the browser what it can run."""
    page.wait_for_selector("#fig6-backend[data-checked]", state="attached", timeout=30_000)
    return page.evaluate("""() => { const s = document.getElementById('fig6-backend');
        return { value: s.value, note: document.getElementById('fig6-backend-note').textContent,
                 options: Array.from(s.options).map(o => [o.value, o.disabled, o.title]) }; }""")


@pytest.mark.parametrize("lang", ["zh", "en"])
def test_without_webgpu_the_page_runs_on_wasm_and_says_why(watched, live_pages, mt_run, lang):
    """Headless Chromium has navigator.gpu but no adapter: the page runs on WASM, the WebGPU option is
    off with the reason beside it, in the reader's language; a link that asks for WebGPU
    (?backend=webgpu) is answered on WASM, and the line beside the switch says why."""
    from qkv.generation.api import Translator
    from qkv.interpret.explorer.language import CATALOG

    said = CATALOG[lang]
    page = open_page(watched, live_pages["mt"].as_uri(), lang=lang)
    switch = backend_switch(page)
    assert switch["value"] == "wasm"
    assert switch["options"] == [["wasm", False, ""], ["webgpu", True, said["backend.no_adapter"]]]
    assert switch["note"] == said["backend.unavailable"].replace("{why}", said["backend.no_adapter"])

    page = open_page(watched, live_pages["mt"].as_uri() + "?backend=webgpu", lang=lang)
    data = ask_fig6(page, LIVE_TEXTS[1])
    switch = backend_switch(page)
    assert switch["value"] == "wasm"
    assert switch["note"] == said["backend.fell_back"].replace("{backend}", said["backend.webgpu"]).replace("{why}", said["backend.no_adapter"])
    assert "notes" not in data
    assert data["output"] == Translator.from_run(mt_run, device="cpu").translate(LIVE_TEXTS[1], beam=1)


def test_on_webgpu_the_page_gives_the_same_answers(watched_webgpu, live_pages, mt_run):
    """Switched to WebGPU (SwiftShader's adapter), the page translates as `qkv translate` does, greedy
    and beam 4, and draws PyTorch's attention within 1e-4; when the device is lost, the next question
    is answered on WASM and says so."""
    from qkv.generation.api import Translator
    from qkv.interpret.explorer.language import CATALOG
    from qkv.interpret.model_maps import translation_maps

    tr = Translator.from_run(mt_run, device="cpu")
    page = open_page(watched_webgpu, live_pages["mt"].as_uri())
    assert backend_switch(page)["options"] == [["wasm", False, ""], ["webgpu", False, ""]]
    before = page.locator("#fig6-output").get_attribute("data-done")
    page.locator("#fig6-backend").select_option("webgpu")
    page.wait_for_selector(f"#fig6-output[data-done]:not([data-done='{before}'])", state="attached", timeout=120_000)
    assert backend_switch(page)["value"] == "webgpu"
    for beam in (1, 4):
        data = ask_fig6(page, LIVE_TEXTS[0], beam)
        assert data["output"] == tr.translate(LIVE_TEXTS[0], beam=beam), beam
        assert_maps_equal(data["maps"], translation_maps(tr, LIVE_TEXTS[0], beam)["maps"])
        assert backend_switch(page)["value"] == "webgpu"

    page.evaluate("globalThis.ortWebGPU.env.webgpu.device.destroy()")  # the device lost, as a GPU reset does
    data = ask_fig6(page, LIVE_TEXTS[2])
    assert data["output"] == tr.translate(LIVE_TEXTS[2], beam=1)
    # onnxruntime logs the lost device's failed download (and its colour reset); nothing else may be logged.
    watched_webgpu.errors[:] = [e for e in watched_webgpu.errors if "Device was lost" not in e and e.strip("\x1b[m")]
    switch = backend_switch(page)
    start = CATALOG["en"]["backend.fell_back"].split("{why}")[0].replace("{backend}", CATALOG["en"]["backend.webgpu"])
    assert switch["value"] == "wasm" and switch["note"].startswith(start), switch
    assert "lost" in switch["note"] and ".cc:" not in switch["note"], switch  # the browser's words, not onnxruntime's source


def test_a_head_switched_off_in_the_page_is_the_servers_answer(watched, live_pages, mt_run):
    from playwright.sync_api import expect

    from qkv.interpret.model_maps import make_attention_provider

    provide = make_attention_provider(mt_run)
    page = open_page(watched, live_pages["mt"].as_uri())
    for kind, layer, head in (("cross", 1, 0), ("encoder_self", 0, 1), ("decoder_self", 1, 1)):
        ask_fig6(page, LIVE_TEXTS[0])
        page.locator(f"#fig6-kinds [data-kind={kind}]").click()
        page.locator(f"[data-testid=fig6-cell][data-layer='{layer}'][data-head='{head}']").click()
        before = page.locator("#fig6-output").get_attribute("data-done")
        page.get_by_test_id("fig6-switch").click()
        page.wait_for_selector(f"#fig6-output[data-done]:not([data-done='{before}'])", state="attached", timeout=60_000)
        expected = provide(LIVE_TEXTS[0], off=[(kind, layer, head)])
        data = page.evaluate("document.getElementById('fig6-output').qkvAnswer")
        assert data["output"] == expected["output"] and data["output_all_heads"] == expected["output_all_heads"]
        expect(page.get_by_test_id("fig6-output-all")).to_have_text(expected["output_all_heads"])
        assert_maps_equal(data["maps"], expected["maps"])
        page.get_by_test_id("fig6-all-on").click()
        page.wait_for_selector("#fig6-output:not(.busy)", state="attached")


def test_figure_9_in_the_page_is_the_servers_trace(watched, live_pages, mt_run):
    from qkv.interpret.traces import make_trace_provider

    provide, _ = make_trace_provider(mt_run)
    page = open_page(watched, live_pages["mt"].as_uri())
    for text in LIVE_TEXTS[1:]:
        out = page.get_by_test_id("teacher-out")
        before = out.get_attribute("data-done")
        page.locator("#teacher .trace-text").fill(text)
        page.locator("#teacher button[type=submit]").click()
        page.wait_for_selector(f"[data-testid=teacher-out]:not([data-done='{before}'])", state="attached", timeout=60_000)
        got = page.evaluate("document.querySelector('[data-testid=teacher-out]').qkvAnswer")
        expected = provide(text)
        for key in ("source_tokens", "output", "read", "target"):
            assert got[key] == expected[key], key
        np.testing.assert_allclose(got["self_weights"], expected["self_weights"], atol=1e-4)
        for g, e in zip(got["steps"], expected["steps"]):
            assert g["chosen"] == e["chosen"] and [c[0] for c in g["top"]][:1] == [c[0] for c in e["top"]][:1]
            np.testing.assert_allclose(g["cross"], e["cross"], atol=1e-4)
        assert step_to_the_end(page) == expected["target"]


def test_a_gpt_page_continues_a_prompt_token_by_token(watched, live_pages, gpt_run):
    from qkv.interpret.model_maps import completion_maps
    from qkv.interpret.traces import practice_trace
    from qkv.runs import load_model

    model, tok = load_model(gpt_run, device="cpu")
    page = open_page(watched, live_pages["gpt"].as_uri())
    for text in ("Xiaoming is", "he wants"):
        data = ask_fig6(page, text)
        expected = completion_maps(model, tok, text)
        assert data["output"] == expected["output"]
        assert_maps_equal(data["maps"], expected["maps"])
    out = page.get_by_test_id("practice-out")
    before = out.get_attribute("data-done")
    page.locator("#practice .trace-text").fill("Xiaoming is tired")
    page.locator("#practice button[type=submit]").click()
    page.wait_for_selector(f"[data-testid=practice-out]:not([data-done='{before}'])", state="attached", timeout=60_000)
    nll = [float(r.get_attribute("data-nll")) for r in page.get_by_test_id("practice-row").all()]
    np.testing.assert_allclose(nll, [p["nll"] for p in practice_trace(model, tok, "Xiaoming is tired")["problems"]], atol=1e-4)


@pytest.mark.parametrize("lang", ["zh", "en"])
def test_bad_input_gets_a_message_in_the_readers_language(watched, live_pages, mt_run, lang):
    from qkv.generation.api import Translator
    from qkv.interpret.explorer.language import CATALOG

    def said(key, **slots):
        import html
        import re
        text = CATALOG[lang][key]
        for k, v in slots.items():
            text = text.replace("{" + k + "}", str(v))
        return html.unescape(re.sub(r"<[^>]+>", "", text))

    tr = Translator.from_run(mt_run, device="cpu")
    page = open_page(watched, live_pages["mt"].as_uri() + f"?lang={lang}", lang=None)
    ask_fig6(page, "   ")
    assert page.get_by_test_id("fig6-error").text_content() == said("input.empty")
    long = "小明累了。" * 2000  # 10,000 characters
    page.evaluate("t => { document.getElementById('fig6-text').removeAttribute('maxlength'); }", None)
    ask_fig6(page, long)
    assert page.get_by_test_id("fig6-error").text_content() == said("input.too_long", n=10000, max=500)
    data = ask_fig6(page, "小明😀累了。")
    assert data["output"] == tr.translate("小明😀累了。", beam=1)
    assert "😀" in page.get_by_test_id("fig6-note").first.text_content()
    # A lone surrogate (a paste can carry one): replaced by U+FFFD, said so, and translated.
    page.evaluate("() => { document.getElementById('fig6-text').value = '\\ud800小明累了。'; }")
    before = page.locator("#fig6-output").get_attribute("data-done")
    page.locator("#fig6-run").click()
    page.wait_for_selector(f"#fig6-output[data-done]:not([data-done='{before}'])", state="attached")
    notes = " ".join(page.get_by_test_id("fig6-note").all_text_contents())
    assert said("input.surrogate") in notes
    # ... and the page keeps working.
    ask_fig6(page, LIVE_TEXTS[0])
    assert shown_output(page) == tr.translate(LIVE_TEXTS[0], beam=1)
    assert page.get_by_test_id("fig6-error").count() == 0


def test_the_page_tokenizes_as_the_run_does(watched, live_pages, mt_run):
    from qkv.data.synthetic import demo_corpus
    from qkv.runs import load_model

    _, tok = load_model(mt_run, device="cpu")
    texts = list(demo_corpus(0, 50, 8, 8)["train"][0]) + list(demo_corpus(0, 50, 8, 8)["train"][1]) + [
        "  Hello,  world!  ", "小明.累了", "<unk>他<eos>", "e\u0301te\u0301", "tab\there", "x\n y", "???", "他他他",
        "Xiaoming's (tired) — 'really'?", "ＡＢＣ１２３", "😀 emoji", "",
    ]
    page = open_page(watched, live_pages["mt"].as_uri())
    got = page.evaluate("""async (texts) => {
        const a = window.QKVExplorer.answers;
        const m = await a.ready;
        return texts.map(t => m.tokenizer.encode(t));
    }""", texts)
    for text, ids in zip(texts, got):
        assert ids == tok.encode(text), text


def test_the_pages_font_holds_every_character_the_model_reads_or_writes(live_pages, mt_run):
    import base64
    import io
    import re

    from fontTools.ttLib import TTFont

    from qkv.runs import load_model

    _, tok = load_model(mt_run, device="cpu")
    html = live_pages["mt"].read_text(encoding="utf-8")
    font = TTFont(io.BytesIO(base64.b64decode(re.search(r"data:font/woff2;base64,([A-Za-z0-9+/=]+)", html).group(1))))
    cmap = font.getBestCmap()
    cjk = {c for i in range(tok.vocab_size) for c in tok.id_to_token(i) if "\u2e80" <= c <= "\uffef" and c != "\u2581"}
    assert cjk and all(ord(c) in cmap for c in cjk), sorted(c for c in cjk if ord(c) not in cmap)


def test_the_site_works_from_a_static_host(browser, live_pages, mt_run):
    """`--site`: served as it is by a plain static server (Python's), the page fetches its model and runtime
    from its own origin and translates."""
    import functools
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    from qkv.generation.api import Translator
    from qkv.interpret.explorer.vendored import RUNTIMES

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(live_pages["site"])))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()

    class Site:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/"
    try:
        for w in watch(browser, Site):
            page = open_page(w)
            data = ask_fig6(page, LIVE_TEXTS[2])
            assert data["output"] == Translator.from_run(mt_run, device="cpu").translate(LIVE_TEXTS[2], beam=1)
            assert any(u.endswith("/encoder.onnx") for u in w.requests)
            # WebGPU's runtime is fetched only by a reader who switches to it.
            assert not any(RUNTIMES["webgpu"].wasm_gz in u for u in w.requests), w.requests
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.mark.parametrize("lang", ["zh", "en"])
def test_screenshots_of_the_live_figures_after_a_new_sentence(watched_without_cjk, artifacts, lang):
    """The packaged demo's exported page, figures 9 and 11 after typing a sentence of one's own."""
    import shutil
    import tempfile

    from qkv.cli import main

    folder = Path(tempfile.mkdtemp())
    try:
        out = folder / "page.html"
        assert main(["explore", "--export", str(out), "--lang", lang]) == 0
        page = open_page(watched_without_cjk, out.as_uri(), lang=None)
        ask_fig6(page, "小丽在学校很高兴，她想唱歌。")
        page.locator("#fig6-kinds [data-kind=cross]").click()
        page.locator("#fig6").screenshot(path=str(artifacts / f"live-{lang}-fig11.png"))
        page.locator("#teacher .trace-text").fill("小丽在学校很高兴，她想唱歌。")
        before = page.get_by_test_id("teacher-out").get_attribute("data-done")
        page.locator("#teacher button[type=submit]").click()
        page.wait_for_selector(f"[data-testid=teacher-out]:not([data-done='{before}'])", state="attached")
        for _ in range(4):
            page.get_by_test_id("teacher-next").click()
        page.locator("#teacher").screenshot(path=str(artifacts / f"live-{lang}-fig9.png"))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
