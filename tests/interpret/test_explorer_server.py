"""The explorer server: static files only from static/, JSON API, limits, and surviving bad requests."""

import json
import socket
import threading
import urllib.parse

import numpy as np
import pytest

from qkv.interpret.explorer import make_server
from qkv.interpret.explorer.server import MAX_BODY_BYTES, MAX_TEXT_CHARS


def fake_provider(text: str) -> dict:
    """Causal maps over the characters of ``text``; some texts trigger the error paths."""
    if text == "value-error":
        raise ValueError("unknown token 'x'")
    if text == "boom":
        raise RuntimeError("model exploded")
    toks = list(text)[:20]
    n = len(toks)
    if text == "bad-data":
        bad = [[[0.5] * n] * n]  # rows sum to n / 2, not 1
        return {"maps": [{"name": "m", "query_tokens": toks, "key_tokens": toks, "weights": bad}]}
    causal = np.tril(np.ones((n, n)))
    causal /= causal.sum(axis=1, keepdims=True)
    return {"output": text[::-1], "maps": [{"name": "decoder self · layer 1", "kind": "decoder_self", "layer": 1,
                                            "query_tokens": toks, "key_tokens": toks,
                                            "weights": np.stack([causal, np.eye(n)])}]}  # (H=2, T, T)


@pytest.fixture(scope="module")
def server():
    srv = make_server(quiet=True)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.fixture
def provider(server):
    server.attention_provider = fake_provider
    yield
    server.attention_provider = None


def raw(server, data: bytes, timeout: float = 5.0):
    """Send raw bytes, read until the server closes; return (status or None, headers, body)."""
    host, port = server.server_address[:2]
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)  # an incomplete request ends here instead of stalling the server
        chunks = []
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
        except (ConnectionResetError, socket.timeout):
            pass
    resp = b"".join(chunks)
    head, _, body = resp.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    if not lines[0].startswith("HTTP/"):
        return None, {}, resp
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:] if ":" in ln)}
    return status, headers, body


def get(server, target: str, method: str = "GET", headers: dict | None = None, body: bytes = b""):
    port = server.server_address[1]
    hdrs = {"Host": f"127.0.0.1:{port}", "Connection": "close", **(headers or {})}
    if body:
        hdrs.setdefault("Content-Length", str(len(body)))
    req = f"{method} {target} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in hdrs.items()) + "\r\n"
    return raw(server, req.encode("utf-8") + body)


def test_index_and_static_files_with_csp(server):
    status, headers, body = get(server, "/")
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert b"figures.js" in body and b"explorer.js" in body
    csp = headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src 'self'" in csp and "connect-src 'self'" in csp
    assert "http" not in csp  # no external origin is allowed anywhere
    assert headers["x-content-type-options"] == "nosniff"
    js, css = "text/javascript", "text/css"
    for name, ctype in [("figures.js", js), ("explorer.js", js), ("style.css", css)]:
        status, headers, body = get(server, "/" + name)
        assert status == 200 and headers["content-type"].startswith(ctype) and len(body) > 1000


def test_the_cjk_font_is_served_from_the_package(server):
    from qkv.interpret.fonts import font_path

    status, headers, body = get(server, "/cjk.otf")
    assert status == 200 and headers["content-type"] == "font/otf" and body == font_path().read_bytes()
    assert body[:4] == b"OTTO" and "font-src 'self'" in headers["content-security-policy"]
    status, headers, body = get(server, "/cjk.otf", method="HEAD")
    assert status == 200 and body == b"" and int(headers["content-length"]) > 10_000_000


def test_served_files_reference_nothing_external(server):
    for name in ("/", "/figures.js", "/explorer.js", "/style.css"):
        body = get(server, name)[2].decode("utf-8")
        assert "http://" not in body.replace("http://www.w3.org/2000/svg", "")
        assert "https://" not in body and "//cdn" not in body and "@import" not in body


@pytest.mark.parametrize(
    "target",
    [
        "/../pyproject.toml",
        "/../../../../etc/passwd",
        "/..%2f..%2f..%2fetc%2fpasswd",
        "/%2e%2e/%2e%2e/etc/passwd",
        "/%252e%252e/%252e%252e/etc/passwd",
        "//etc/passwd",
        "/static/../server.py",
        "/..\\server.py",
        "/%5c..%5cserver.py",
        "/%2fetc%2fpasswd",
        "/C:/Windows/win.ini",
        "/index.html%00.js",
        "/.gitignore",
        "/server.py",
        "/__init__.py",
        "/%ff%fe",
    ],
)
def test_path_traversal_is_refused(server, target):
    status, headers, body = get(server, target)
    assert status in (400, 404)
    assert headers["content-type"].startswith("application/json")
    assert "error" in json.loads(body)
    assert b"[project]" not in body and b"root:" not in body and b"def " not in body


def test_absolute_form_target_is_refused(server):
    status, _, body = get(server, "http://evil.example/")
    assert status == 400 and "error" in json.loads(body)


def test_foreign_host_header_is_refused(server):
    # DNS rebinding: a foreign page whose name resolves to 127.0.0.1 sends its own Host.
    status, _, body = get(server, "/api/status", headers={"Host": "evil.example"})
    assert status == 403 and "Host" in json.loads(body)["error"]
    assert get(server, "/api/status", headers={"Host": f"localhost:{server.server_address[1]}"})[0] == 200


def test_status_without_model(server):
    status, headers, body = get(server, "/api/status")
    assert status == 200 and headers["cache-control"] == "no-store"
    assert json.loads(body) == {"model": False, "default_text": "", "max_text_chars": MAX_TEXT_CHARS}


def test_attention_without_model_is_a_clear_404(server):
    status, _, body = get(server, "/api/attention?text=hi")
    assert status == 404
    assert "--run DIR" in json.loads(body)["error"]


def test_attention_with_provider(server, provider):
    text = "小明累了，他想睡觉"
    status, _, body = get(server, "/api/attention?text=" + urllib.parse.quote(text))
    assert status == 200
    data = json.loads(body)
    assert data["text"] == text and data["output"] == text[::-1]
    (m,) = data["maps"]
    assert (m["kind"], m["layer"]) == ("decoder_self", 1)
    assert m["query_tokens"] == list(text)
    w = np.array(m["weights"])
    assert w.shape == (2, len(text), len(text))
    np.testing.assert_allclose(w.sum(axis=-1), 1.0, atol=1e-4)
    assert json.loads(get(server, "/api/status")[2])["model"] is True


def test_attention_post_json(server, provider):
    body = json.dumps({"text": "abc"}).encode()
    status, _, resp = get(server, "/api/attention", "POST", {"Content-Type": "application/json"}, body)
    assert status == 200 and json.loads(resp)["maps"][0]["key_tokens"] == ["a", "b", "c"]


@pytest.mark.parametrize(
    "target,status,fragment",
    [
        ("/api/attention?text=" + "a" * (MAX_TEXT_CHARS + 1), 413, "limit is 500"),
        ("/api/attention", 400, "missing 'text'"),
        ("/api/attention?text=", 400, "empty"),
        ("/api/attention?text=%20%20", 400, "empty"),
        ("/api/attention?text=a&text=b", 400, "once"),
        ("/api/attention?text=%ff", 400, "bad query"),
        ("/api/attention?text=a%00b", 400, "NUL"),
        ("/api/attention?text=value-error", 400, "could not read"),
        ("/api/attention?text=boom", 500, "provider failed"),
        ("/api/attention?text=bad-data", 500, "sums to"),
        ("/api/nothing", 404, "unknown API"),
        ("/nothing.html", 404, "no such file"),
        ("/api/attention?" + "&".join(f"f{i}=1" for i in range(20)), 400, "bad query"),
        ("/" + "a" * 9000, 414, "URL longer"),
    ],
)
def test_api_errors_are_clear_json(server, provider, target, status, fragment):
    got, headers, body = get(server, target)
    assert got == status
    assert headers["content-type"].startswith("application/json")
    err = json.loads(body)
    assert fragment in err["error"] and err["status"] == status


@pytest.mark.parametrize(
    "headers,body,status",
    [
        ({"Content-Type": "application/json", "Content-Length": str(MAX_BODY_BYTES + 1)}, b"{}", 413),
        ({"Content-Type": "text/plain"}, b'{"text": "a"}', 415),
        ({"Content-Type": "application/json"}, b"{not json", 400),
        ({"Content-Type": "application/json"}, b'["text"]', 400),
        ({"Content-Type": "application/json"}, b"\xff\xfe", 400),
        ({"Content-Type": "application/json", "Content-Length": "-5"}, b"", 400),
        ({"Content-Type": "application/json", "Content-Length": "abc"}, b"", 400),
        ({"Content-Type": "application/json", "Transfer-Encoding": "chunked"}, b"", 411),
        ({"Content-Type": "application/json"}, None, 411),
    ],
)
def test_post_limits(server, provider, headers, body, status):
    port = server.server_address[1]
    hdrs = {"Host": f"127.0.0.1:{port}", "Connection": "close", **headers}
    if body is not None and "Content-Length" not in hdrs and "Transfer-Encoding" not in hdrs:
        hdrs["Content-Length"] = str(len(body))
    req = "POST /api/attention HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in hdrs.items()) + "\r\n"
    got, _, resp = raw(server, req.encode() + (body or b""))
    assert got == status
    assert "error" in json.loads(resp)


def test_methods_and_head(server):
    status, headers, body = get(server, "/", "HEAD")
    assert status == 200 and body == b"" and int(headers["content-length"]) > 0
    for method in ("PUT", "DELETE", "PATCH", "OPTIONS"):
        status, _, body = get(server, "/", method)
        assert status == 405 and "error" in json.loads(body)
    assert get(server, "/api/attention?text=a", "HEAD")[0] == 405
    status, _, body = get(server, "/", "BREW")
    assert status == 501 and "error" in json.loads(body)
    assert get(server, "/index.html", "POST", {"Content-Type": "application/json"}, b"{}")[0] == 405


MALFORMED = [  # (bytes, expected status; None = the connection closes without an answer)
    (b"GARBAGE\r\n\r\n", 400),
    (b"\x00\x01\x02\x03\xff\xfe\r\n\r\n", 400),
    (b"GET / HTTP/9.9\r\n\r\n", 505),
    (b"GET / HTTP/1.1 extra words\r\n\r\n", 400),
    (b"GET " + b"/" * 70000 + b" HTTP/1.1\r\n\r\n", 414),
    (b"GET / HTTP/1.1\r\n" + b"".join(b"X-H%d: 1\r\n" % i for i in range(150)) + b"\r\n", 431),
    (b"GET / HTTP/1.1\r\nX-Long: " + b"a" * 70000 + b"\r\n\r\n", 431),
    (b"GET /api/attention?text=%E4%B8 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 400),
    (b"POST /api/attention HTTP/1.1\r\nContent-Type: application/json\r\n"
     b"Content-Length: 100\r\n\r\n{\"te", 400),  # body shorter than announced
    (b"GET /%%%% HTTP/1.1\r\n\r\n", 400),
    (b"GET /api/status HTTP/1.1\r\nHost: 127.0.0.1:1:2:3\r\n\r\n", 403),
    (b"GET / HTTP/1.1\r\nHost: 127.0.0.1", 200),  # cut short: the server answers what it got
    (b"", None),
    (b"\r\n\r\n\r\n", None),
]


@pytest.mark.parametrize("data,expected", MALFORMED, ids=range(len(MALFORMED)))
def test_malformed_request_gets_a_json_error(server, data, expected):
    status, headers, body = raw(server, data, timeout=3)
    assert status == expected
    if expected is not None and expected >= 400:
        assert headers["content-type"].startswith("application/json")
        assert json.loads(body)["status"] == expected


def test_burst_of_malformed_requests_then_good_one(server, provider):
    # A stalled client holds one connection open without finishing its request...
    port = server.server_address[1]
    stalled = socket.create_connection(server.server_address[:2], timeout=5)
    stalled.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1")
    errors = []

    def fire(data):
        try:
            raw(server, data, timeout=3)
        except OSError as err:  # the server may reset a connection; it must not die
            errors.append(err)

    # ...while the whole burst arrives at once from several threads.
    threads = [threading.Thread(target=fire, args=(d,)) for d, _ in MALFORMED * 3]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    try:
        status, _, body = get(server, "/api/attention?text=ok")
        assert status == 200 and json.loads(body)["maps"]
        assert get(server, "/")[0] == 200
        assert get(server, "/api/status", headers={"Host": f"127.0.0.1:{port}"})[0] == 200
    finally:
        stalled.close()


def test_keep_alive_serves_several_requests_on_one_connection(server):
    port = server.server_address[1]
    one = f"GET /api/status HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
    last = f"GET /api/status HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode()
    _, _, _ = raw(server, one + one + last)
    with socket.create_connection(server.server_address[:2], timeout=5) as s:
        s.sendall(one + last)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    assert data.count(b"HTTP/1.1 200") == 2


def test_make_server_arguments():
    with pytest.raises(ValueError, match="port"):
        make_server(port=70000)
    with pytest.raises(ValueError, match="limit"):
        make_server(default_text="x" * (MAX_TEXT_CHARS + 1))
    srv = make_server(port=0, quiet=True, default_text="hello")
    try:
        assert srv.url.startswith("http://127.0.0.1:") and srv.server_address[1] > 0
        assert srv.default_text == "hello" and srv.attention_provider is None
    finally:
        srv.server_close()


def test_two_host_headers_are_refused(server):
    port = server.server_address[1]
    status, _, body = raw(server, f"GET /api/status HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nHost: evil.example\r\n"
                                  "Connection: close\r\n\r\n".encode())
    assert status == 400 and "2 Host headers" in json.loads(body)["error"]


def test_json_nested_thousands_deep_is_a_400_not_a_500(server, provider):
    port = server.server_address[1]
    payload = b"[" * 30000 + b"]" * 30000
    status, _, body = raw(server, f"POST /api/attention HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: "
                                  f"application/json\r\nContent-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
                                  .encode() + payload)
    assert status == 400 and "nested too deep" in json.loads(body)["error"]
    assert get(server, "/api/status")[0] == 200  # and the server goes on answering


def test_a_client_that_trickles_its_request_is_cut_off_at_the_deadline(server, monkeypatch):
    """One byte every 0.3 s passes every per-read timeout; the request's own deadline (2 s here) does not."""
    import time

    from qkv.interpret.explorer.server import ExplorerHandler

    monkeypatch.setattr(ExplorerHandler, "request_seconds", 2.0)
    host, port = server.server_address[:2]
    t0 = time.monotonic()
    with socket.create_connection((host, port), timeout=10) as s:
        s.sendall(b"GET /api/status HTTP/1.1\r\n")
        closed = False
        for _ in range(40):  # up to 12 s of trickling
            try:
                s.sendall(b"X")
                time.sleep(0.3)
                s.setblocking(False)
                try:
                    if s.recv(1) == b"":
                        closed = True
                        break
                except BlockingIOError:
                    pass
                finally:
                    s.setblocking(True)
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            assert get(server, "/api/status")[0] == 200  # the others are answered meanwhile
    assert closed and time.monotonic() - t0 < 6


def test_connections_past_the_cap_get_a_503_at_once_and_the_server_recovers(server, monkeypatch):
    import threading
    import time

    monkeypatch.setattr(server, "connection_slots", threading.BoundedSemaphore(2))  # the module's server, after
    host, port = server.server_address[:2]
    idle = [socket.create_connection((host, port), timeout=5) for _ in range(2)]  # each holds a thread
    time.sleep(0.3)
    t0 = time.monotonic()
    with socket.create_connection((host, port), timeout=5) as s:  # answered as it is accepted, unread
        reply = s.recv(4096)
    assert reply.startswith(b"HTTP/1.1 503") and time.monotonic() - t0 < 2
    for s in idle:
        s.close()
    def status():
        try:
            return get(server, "/api/status")[0]
        except OSError:  # refused at the cap before the request was sent
            return None

    deadline = time.monotonic() + 5
    while status() != 200:  # the idle connections' threads see them close
        assert time.monotonic() < deadline
        time.sleep(0.1)


# ---------------------------------------------------------------- traces, sizes and the page's language


def fake_trace(text: str) -> dict:
    if text == "value-error":
        raise ValueError("unknown token 'x'")
    return {"text": text, "problems": [], "mean_nll": 0.0}


def test_trace_route_status_and_errors(server):
    assert get(server, "/api/trace?text=hi")[0] == 404  # no model loaded
    server.trace_provider, server.trace_kind = fake_trace, "practice"
    server.model_sizes = {"arch": "gpt", "d_model": 16}
    try:
        status, _, body = get(server, "/api/status")
        assert json.loads(body)["trace"] == "practice" and json.loads(body)["sizes"]["d_model"] == 16
        status, _, body = get(server, "/api/trace?text=" + urllib.parse.quote("今天天气很好"))
        assert status == 200 and json.loads(body)["text"] == "今天天气很好"
        payload = json.dumps({"text": "posted"}).encode()
        status, _, body = get(server, "/api/trace", "POST", {"Content-Type": "application/json"}, payload)
        assert status == 200 and json.loads(body)["text"] == "posted"
        status, _, body = get(server, "/api/trace?text=value-error")
        assert status == 400 and "could not read" in json.loads(body)["error"]
        assert get(server, "/api/trace?text=" + "x" * (MAX_TEXT_CHARS + 1))[0] == 413
        assert get(server, "/api/trace?text=hi", "HEAD")[0] == 405
    finally:
        server.trace_provider = server.trace_kind = server.model_sizes = None


def test_index_carries_the_default_language_when_one_is_given(server):
    _, _, body = get(server, "/")
    assert b"data-default-lang" not in body  # the browser's languages decide
    server.default_lang = "en"
    try:
        _, _, body = get(server, "/")
        assert b'<html lang="en" class="qkv-loading" data-default-lang="en">' in body
    finally:
        server.default_lang = None
    with pytest.raises(ValueError, match="unknown language 'fr'"):
        make_server(default_lang="fr")


def test_every_catalog_key_the_page_uses_exists_in_both_languages():
    import re
    from pathlib import Path

    from qkv.interpret.explorer.language import CATALOG, LANGS

    assert LANGS == ("zh", "en")  # Chinese first
    assert set(CATALOG["zh"]) == set(CATALOG["en"])
    for key in CATALOG["zh"]:  # the same {slots} in both languages
        assert set(re.findall(r"\{\w+\}", CATALOG["zh"][key])) == set(re.findall(r"\{\w+\}", CATALOG["en"][key])), key
    static = Path(__file__).resolve().parents[2] / "qkv" / "interpret" / "explorer" / "static"
    sections = {key.split(".")[0] for key in CATALOG["zh"]}
    used = set()
    for path in static.glob("*.js"):  # every string literal of the form section.key, in every script
        used |= {k for k in re.findall(r'"([a-z0-9]+\.[a-z0-9_.]*)"', path.read_text(encoding="utf-8"))
                 if k.split(".")[0] in sections and not path.name == "catalog.js"}
    used |= set(re.findall(r'data-i18n(?:-\w+)?="([^"]+)"', (static / "index.html").read_text(encoding="utf-8")))
    assert len(used) > 150
    # A key ending in "." or "_" is the start of keys made at run time ("fig6.kind." + kind).
    missing = sorted(k for k in used if k not in CATALOG["zh"] and not (
        k[-1] in "._" and any(c.startswith(k) for c in CATALOG["zh"])))
    assert not missing, missing


def test_attention_with_heads_switched_off(server):
    seen = []

    def provider(text, off=()):
        seen.append(list(off))
        return fake_provider(text)

    server.attention_provider = provider
    try:
        assert get(server, "/api/attention?text=hi")[0] == 200
        assert get(server, "/api/attention?text=hi&off=" + urllib.parse.quote("cross:1:0,encoder_self:0:3"))[0] == 200
        payload = json.dumps({"text": "hi", "off": "cross:0:1"}).encode()
        assert get(server, "/api/attention", "POST", {"Content-Type": "application/json"}, payload)[0] == 200
        assert seen == [[], [("cross", 1, 0), ("encoder_self", 0, 3)], [("cross", 0, 1)]]
        status, _, body = get(server, "/api/attention?text=hi&off=cross:1")
        assert status == 400 and "KIND:LAYER:HEAD" in json.loads(body)["error"]
        payload = json.dumps({"text": "hi", "off": 3}).encode()
        assert get(server, "/api/attention", "POST", {"Content-Type": "application/json"}, payload)[0] == 400
    finally:
        server.attention_provider = None
