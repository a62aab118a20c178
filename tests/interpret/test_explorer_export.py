"""Exporting the explorer as one self-contained HTML file, and the attention data it embeds."""

import base64
import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from qkv.interpret.explorer import AttentionDataError, export_page, normalize_attention_data

STATIC = Path(__file__).resolve().parents[2] / "qkv" / "interpret" / "explorer" / "static"


def sample_data(tokens=("小明", "累了", "他")):
    n = len(tokens)
    w = np.tril(np.ones((n, n)))
    w /= w.sum(axis=1, keepdims=True)
    return {"text": "".join(tokens), "maps": [
        {"name": "encoder self · layer 1", "query_tokens": list(tokens), "key_tokens": list(tokens),
         "weights": torch.tensor(np.stack([w, np.eye(n)]))},  # (H=2, T, L)
    ]}


def _csp(html: str) -> dict:
    content = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]+)">', html).group(1)
    return {d.split()[0]: d.split()[1:] for d in content.split("; ")}


def _sha(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def test_export_inlines_everything_and_pins_inline_blocks_by_hash(tmp_path):
    out = export_page(tmp_path / "sub" / "page.html")
    html = out.read_text(encoding="utf-8")
    assert out == tmp_path / "sub" / "page.html"
    assert not re.search(r"<script[^>]* src=", html) and 'rel="stylesheet"' not in html
    assert "https://" not in html and "http://" not in html.replace("http://www.w3.org/2000/svg", "")
    assert "QKVFigures" in html and "qkv-model-data" not in html.split("<script>", 1)[0]
    csp = _csp(html)
    assert csp["default-src"] == ["'none'"] and "connect-src" not in csp  # nothing may be fetched
    scripts = re.findall(r"<script>(.*?)</script>", html, flags=re.S)
    styles = re.findall(r"<style>(.*?)</style>", html, flags=re.S)
    page_scripts = re.findall(r'<script src="([^"]+)"></script>', (STATIC / "index.html").read_text(encoding="utf-8"))
    assert len(scripts) == len(page_scripts) >= 2 and len(styles) == 1  # every script of the page, inlined
    assert sorted(csp["script-src"]) == sorted(_sha(s) for s in scripts)
    assert csp["style-src"] == [_sha(styles[0])]
    assert not list(tmp_path.glob("sub/*.tmp"))


def test_export_embeds_model_data_safely(tmp_path):
    data = sample_data(("</script><script>alert(1)</script>", "&amp;", "<!--"))
    html = export_page(tmp_path / "page.html", data).read_text(encoding="utf-8")
    m = re.search(r'<script type="application/json" id="qkv-model-data">(.*?)</script>', html, flags=re.S)
    assert m and "<" not in m.group(1) and ">" not in m.group(1)
    embedded = json.loads(m.group(1))
    assert embedded["maps"][0]["query_tokens"][0] == "</script><script>alert(1)</script>"
    np.testing.assert_allclose(np.array(embedded["maps"][0]["weights"]).sum(-1), 1.0, atol=1e-4)


def test_export_rejects_bad_data_before_writing(tmp_path):
    bad = sample_data()
    bad["maps"][0]["weights"] = bad["maps"][0]["weights"][:, :2]  # T mismatch
    with pytest.raises(AttentionDataError, match=r"maps\[0\]\.weights\[0\] must have 3 rows"):
        export_page(tmp_path / "page.html", bad)
    assert not (tmp_path / "page.html").exists()


def test_normalize_accepts_numpy_torch_and_lists_and_rounds():
    data = normalize_attention_data(sample_data())
    json.dumps(data, allow_nan=False)
    w = data["maps"][0]["weights"]
    assert isinstance(w, list) and w[0][1] == [0.5, 0.5, 0.0]
    # 7 decimals: what a float32 weight holds, so the page can draw the model's own numbers.
    assert w[0][2] == [0.3333333] * 3
    # A fully masked row (all zeros) is allowed: masks give zeros, never NaN.
    zero = {"maps": [{"name": "m", "query_tokens": ["a"], "key_tokens": ["b"], "weights": [[[0.0]]]}]}
    assert normalize_attention_data(zero)["maps"][0]["weights"] == [[[0.0]]]


@pytest.mark.parametrize(
    "mutate,message",
    [
        (lambda d: d.update(maps=[]), "non-empty"),
        (lambda d: d.update(extra=1), "unknown key"),
        (lambda d: d.update(text=3), "text must be a string"),
        (lambda d: d.update(output=["a"]), "output must be a string"),
        (lambda d: d.update(output="x" * 20_001), "output has 20001 characters; the limit is 20000"),
        (lambda d: d["maps"][0].update(kind="decoder"), r"maps\[0\]\.kind is 'decoder'; expected one of encoder_self"),
        (lambda d: d["maps"][0].update(layer=-1), r"maps\[0\]\.layer must be an integer"),
        (lambda d: d["maps"][0].update(layer=True), r"maps\[0\]\.layer must be an integer"),
        (lambda d: d["maps"][0].update(layer="1"), r"maps\[0\]\.layer must be an integer"),
        (lambda d: d["maps"][0].update(layer=1.5), r"maps\[0\]\.layer must be an integer"),
        (lambda d: d["maps"][0].pop("name"), r"maps\[0\] is missing \['name'\]"),
        (lambda d: d["maps"][0].update(query_tokens=[1, 2, 3]), "query_tokens must be a list of strings"),
        (lambda d: d["maps"][0].update(key_tokens=["a"]), r"weights\[0\]\[0\] must have 1 weights"),
        (lambda d: d["maps"][0].update(weights=[[[float("nan")] * 3] * 3]), "non-finite"),
        (lambda d: d["maps"][0].update(weights=[[[2.0, -1.0, 0.0]] * 3]), "outside"),
        (lambda d: d["maps"][0].update(weights=[[[0.5, 0.2, 0.2]] * 3]), "sums to 0.9"),
        (lambda d: d["maps"][0].update(weights=[]), "non-empty"),
    ],
)
def test_normalize_names_the_offending_key(mutate, message):
    data = sample_data()
    mutate(data)
    with pytest.raises(AttentionDataError, match=message):
        normalize_attention_data(data)


def test_normalize_keeps_output_kind_and_layer():
    data = sample_data()
    data["output"] = "Xiaoming is tired, he"
    data["maps"][0].update(kind="encoder_self", layer=np.int64(1))  # numpy / 0-d tensor ints are fine
    data["maps"].append({**data["maps"][0], "name": "other", "kind": None, "layer": torch.tensor(0)})
    out = normalize_attention_data(data)
    assert out["output"] == "Xiaoming is tired, he"
    first, second = out["maps"]
    assert first["kind"] == "encoder_self" and first["layer"] == 1 and type(first["layer"]) is int
    assert "kind" not in second and second["layer"] == 0  # None means absent
    assert json.loads(json.dumps(out)) == out


def test_normalize_refuses_huge_payloads():
    n = 400
    data = {"maps": [{"name": f"m{i}", "query_tokens": ["a"] * n, "key_tokens": ["a"] * n,
                      "weights": np.full((8, n, n), 1.0 / n)} for i in range(2)]}
    with pytest.raises(AttentionDataError, match="too large"):
        normalize_attention_data(data)


def test_the_vendored_runtime_is_the_files_its_record_names(tmp_path, monkeypatch):
    """onnxruntime-web in the package: pinned, each file's sha256 recorded, its license beside it; a file
    changed since is refused, never shipped in a page."""
    import gzip
    import hashlib
    import json
    import shutil

    from qkv.interpret.explorer import vendored

    record = json.loads(vendored.RECORD.read_text(encoding="utf-8"))
    assert record["package"] == "onnxruntime-web" and record["version"] == vendored.VERSION
    assert record["refresh"] == "python -m qkv.interpret.explorer.vendored --refresh"
    for name, digest in record["sha256"].items():
        assert hashlib.sha256((vendored.FOLDER / name).read_bytes()).hexdigest() == digest, name
    assert "Permission is hereby granted" in (vendored.FOLDER / vendored.LICENSE).read_text(encoding="utf-8")
    assert sorted(record["sha256"]) == sorted([vendored.LICENSE] + [n for r in vendored.RUNTIMES.values() for n in (r.script, r.wasm_gz)])
    for backend, runtime in vendored.RUNTIMES.items():
        script = vendored.runtime_script(backend)
        assert f"globalThis.{runtime.name}={{" in script and "InferenceSession:" in script and "export{" not in script[-2000:]
        wasm = gzip.decompress(vendored.runtime_wasm_gz(backend))
        assert wasm[:4] == b"\0asm" and hashlib.sha256(wasm).hexdigest() == record["wasm_sha256"][runtime.wasm], backend
    copy = tmp_path / "onnxruntime-web"
    shutil.copytree(vendored.FOLDER, copy)
    (copy / vendored.RUNTIMES["webgpu"].script).write_text("/* changed */", encoding="utf-8")
    monkeypatch.setattr(vendored, "FOLDER", copy)
    monkeypatch.setattr(vendored, "RECORD", copy / "VENDOR.json")
    vendored._checked.cache_clear()
    try:
        with pytest.raises(vendored.VendorError, match="not the file"):
            vendored.runtime_script("wasm")  # any file changed: the page is not written
    finally:
        vendored._checked.cache_clear()


def test_the_packaged_demo_model_is_the_files_its_record_names(tmp_path, monkeypatch):
    """vendor/demo_model: its license beside it, every file's sha256 recorded (make demo-model) and checked."""
    import shutil

    from qkv.interpret.explorer import embedded
    from qkv.interpret.explorer.vendored import VendorError

    assert embedded.demo_model() == embedded.DEMO_MODEL
    assert "MIT License" in (embedded.DEMO_MODEL / "LICENSE").read_text(encoding="utf-8")
    copy = tmp_path / "demo_model"
    shutil.copytree(embedded.DEMO_MODEL, copy)
    (copy / "onnx" / "decoder.onnx").write_bytes(b"changed")
    monkeypatch.setattr(embedded, "DEMO_MODEL", copy)
    with pytest.raises(VendorError, match="decoder.onnx is not the file"):
        embedded.demo_model()
