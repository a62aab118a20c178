"""The tutorials (notebooks/): committed as notebooks/build.py writes them, without outputs; every one runs
from top to bottom (its asserts are the tutorial's own checks: hand-computed attention equals the
model's); the inline view draws in a saved HTML rendering, in Chromium, with no request and its Chinese
in the font it carries; the committed renderings are of the committed notebooks."""

import importlib.util
import json
import os
import re
import signal
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"

pytest.importorskip("nbclient", reason="the notebook extras are not installed (pip install -e '.[dev]')")


def _build():
    spec = importlib.util.spec_from_file_location("notebooks_build", ROOT / "notebooks" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build = _build()


def test_the_notebooks_are_what_build_writes_and_carry_no_outputs():
    written = build.written()
    assert {p.relative_to(ROOT / "notebooks").as_posix() for p in written} == {
        p.relative_to(ROOT / "notebooks").as_posix() for p in (ROOT / "notebooks").glob("*/*.ipynb")}
    for path, text in written.items():
        assert path.read_text(encoding="utf-8") == text, f"{path} is stale: run python notebooks/build.py"
        nb = json.loads(text)
        for cell in nb["cells"]:
            assert not cell.get("outputs") and cell.get("execution_count") is None, path


def test_the_two_languages_share_their_code():
    for name in build.NOTEBOOKS:
        zh, en = (json.loads((ROOT / "notebooks" / lang / f"{name}.ipynb").read_text(encoding="utf-8"))
                  for lang in ("zh", "en"))
        code = [["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"][1:] for nb in (zh, en)]
        assert code[0] == code[1]  # the first cell sets LANG
        zh_text, en_text = (["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown"] for nb in (zh, en))
        assert len(zh_text) == len(en_text) and all(a != b for a, b in zip(zh_text, en_text))  # each cell in both
        assert all(re.search("[\u4e00-\u9fff]{4}", t) for t in zh_text)  # the Chinese cells are in Chinese


# What shows that a notebook's training cell is under way, far enough to be stopped there as a reader stops it:
# the demo's first logged step (the demo then trains again from the start), the GPT's first checkpoint (it then
# goes on from there).
UNDER_WAY = {"01_who_is_he": "runs/demo/metrics.jsonl", "02_gpt_forgetting": "runs/gpt-base/last.pt"}


def interrupted(path: Path, cwd: Path, sign: str) -> dict:
    """Run the notebook at ``path`` in ``cwd`` until ``cwd/sign`` appears, then interrupt its kernel (SIGINT, what
    Jupyter's stop button sends) and shut the kernel down: which cell stopped, with what, and the run then."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    from qkv.runs import Run

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=build.TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": str(cwd)}})
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.05):
            if (cwd / sign).exists():
                os.kill(client.km.provisioner.pid, signal.SIGINT)
                return

    stopped = {"cell": None, "error": None}
    with client.setup_kernel():
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            for index, cell in enumerate(nb.cells):
                stopped["cell"] = cell.source
                client.execute_cell(cell, index)
            stopped["cell"] = None  # it ran to the end: the interrupt came too late
        except CellExecutionError as e:
            stopped["error"] = e.ename
        finally:
            done.set()
            watcher.join()
    run = Run(cwd / Path(sign).parent)
    return {**stopped, "finished": run.exists, "checkpoint": run.has_checkpoint}


@pytest.fixture(scope="module")
def sittings(tmp_path_factory):
    """Every notebook run top to bottom, in one folder (the first trains the demo, the others load it). Before
    that, the first of each name is stopped in its training cell and its kernel shut down, as a reader does:
    ``stopped`` says where; ``executed`` is the Run All that follows, each notebook's outputs."""
    cwd = tmp_path_factory.mktemp("notebooks")
    stopped, executed = {}, {}
    for path in build.written():
        if path.stem not in stopped:
            stopped[path.stem] = interrupted(path, cwd, UNDER_WAY[path.stem])
        executed[path] = build.execute(path, cwd)
    return {"stopped": stopped, "executed": executed}


@pytest.fixture(scope="module")
def executed(sittings):
    return sittings["executed"]


def test_a_notebook_stopped_in_its_training_runs_again_to_the_end(sittings):
    """Stopped mid-training, a run is not finished (Run.exists is False) and the next Run All trains it (from its
    checkpoint, or again) instead of skipping to cells that need it; the Run All's outputs are checked below."""
    stopped = sittings["stopped"]
    assert set(stopped) == set(UNDER_WAY)
    for name, where in stopped.items():
        assert where["error"] == "KeyboardInterrupt", (name, where)
        assert "run_demo(" in where["cell"] or "train_lm(" in where["cell"], (name, where["cell"])  # a training cell
        assert not where["finished"], name  # stopped part way: not a run yet
    assert stopped["02_gpt_forgetting"]["checkpoint"]  # the GPT goes on from its checkpoint


def test_every_notebook_runs_top_to_bottom_and_ends_with_its_view(executed):
    for path, nb in executed.items():
        outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
        assert not [o for o in outputs if o.output_type == "error"], path
        views = [o for o in outputs if "text/html" in o.get("data", {}) and "qkv-attention" in o["data"]["text/html"]]
        assert len(views) == (2 if path.stem == "01_who_is_he" else 0), path  # the first ends with two views


def test_a_saved_rendering_draws_the_view_offline_with_its_own_chinese_font(executed, tmp_path):
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing")
    sync_api = pytest.importorskip("playwright.sync_api")
    import matplotlib

    path = next(p for p in executed if p.parent.name == "zh" and p.stem == "01_who_is_he")
    page_file = tmp_path / "rendering.html"
    page_file.write_text(build.render_html(executed[path], path), encoding="utf-8")
    # A machine with no CJK font: fontconfig sees matplotlib's DejaVu only.
    conf = tmp_path / "fonts.conf"
    conf.write_text(f'<?xml version="1.0"?><fontconfig><dir>{Path(matplotlib.get_data_path()) / "fonts" / "ttf"}</dir>'
                    f"<cachedir>{tmp_path / 'cache'}</cachedir></fontconfig>", encoding="utf-8")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"],
                                    env={**os.environ, "FONTCONFIG_FILE": str(conf)})
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            requests = []
            page.on("request", lambda r: requests.append(r.url))
            page.goto(page_file.as_uri())
            page.wait_for_function("() => { const fs = [...document.querySelectorAll('iframe.qkv-attention')];"
                                   " return fs.length === 2 && fs.every(f => f.contentDocument &&"
                                   " f.contentDocument.documentElement.getAttribute('data-ready')); }", timeout=30000)
            # The page's own Chinese (the text, the printed outputs) in the glyphs it carries.
            page.evaluate("() => document.fonts.ready")
            assert page.evaluate("() => document.fonts.check('16px \"qkv CJK\"', '他是怎么找到小明的')")
            own = page.evaluate("() => [...document.fonts].filter(f => f.family.includes('qkv CJK')).map(f => f.status)")
            assert own == ["loaded"]
            frame = page.frame_locator("iframe.qkv-attention").first
            assert frame.locator("[data-testid=fig6-headview] line").count() > 0  # the head view's lines
            cells = frame.locator("[data-testid=fig6-headview] text").all_text_contents()
            assert "小明" in cells  # the head view's source tokens
            iframe = page.locator("iframe.qkv-attention").first.element_handle().content_frame()
            face = iframe.evaluate("() => [...document.fonts].filter(f => f.family.includes('qkv CJK'))"
                                   ".map(f => f.status)")
            assert face and all(s == "loaded" for s in face)  # its Chinese drawn in the font it carries
            assert iframe.evaluate("() => document.fonts.check('16px \"qkv CJK\"', '小明累了')")
            heights = page.locator("iframe.qkv-attention").evaluate_all("fs => fs.map(f => f.getBoundingClientRect().height)")
            assert all(h > 900 for h in heights), heights  # each grew to the page inside
            second = page.frame_locator("iframe.qkv-attention").nth(1)
            assert second.locator("[data-testid=fig6-output-all]").count() == 1  # heads off: the output with all on
        finally:
            browser.close()
    assert [u for u in requests if not u.startswith(("file:", "data:", "about:"))] == []


def test_a_stray_file_in_the_work_tree_is_seen_and_a_notebooks_runs_are_not(untracked_files):
    """The check every test session ends with (tests/conftest.py): a file left in the work tree is named, while
    what a notebook writes beside itself (runs/) is ignored by git, so a Run All leaves git status clean."""
    if untracked_files() is None:
        pytest.skip("not a git checkout")
    stray, runs = ROOT / "left-by-a-test.txt", ROOT / "notebooks" / "en" / "runs"
    made = not runs.exists()
    try:
        stray.write_text("x", encoding="utf-8")
        runs.mkdir(exist_ok=True)
        (runs / "left-by-a-test.json").write_text("{}", encoding="utf-8")
        seen = untracked_files()
    finally:
        stray.unlink(missing_ok=True)
        (runs / "left-by-a-test.json").unlink(missing_ok=True)
        if made:
            runs.rmdir()
    assert "left-by-a-test.txt" in seen
    assert not [p for p in seen if p.startswith("notebooks/")], seen


def test_the_committed_renderings_are_of_the_committed_notebooks():
    for path in build.written():
        html = build.HTML_DIR / path.parent.name / f"{path.stem}.html"
        assert html.is_file(), f"{html} is missing: run python notebooks/build.py --html"
        head = html.read_text(encoding="utf-8")[:300]
        assert f"sha256 {build.fingerprint(path)}" in head, f"{html} is stale: run python notebooks/build.py --html"
