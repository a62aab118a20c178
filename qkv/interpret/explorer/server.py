"""The explorer's local web server: static page files plus a small JSON API, stdlib only.

Routes:
    GET /, /index.html, /<file>   the page files in ``static/`` (a fixed whitelist; no subfolders)
    GET /cjk.otf                  the CJK font qkv brings (``qkv.interpret.fonts``), for Chinese tokens
    GET /api/status               {"model": bool, "default_text": str, "max_text_chars": int, ...}
    GET /api/attention?text=...   the ``attention_provider``'s maps for ``text`` (the model figure);
                                  &off=cross:1:0,... switches those heads off (qkv.interpret.ablation);
                                  &beam=4 translates by beam search of 4 (default: greedy, as the run's view)
    POST /api/attention           the same with a JSON body {"text": "...", "off": "cross:1:0", "beam": 4}
    GET /api/trace?text=...       the ``trace_provider``'s trace for ``text`` (qkv.interpret.traces: the
                                  training-and-generating figure or GPT's practice problems); POST too

Safety, because a browser on the same machine can be pointed at it by any web site:
    * binds 127.0.0.1 unless told otherwise, and checks the Host header on loopback (DNS rebinding);
    * serves only whitelisted files: anything with ``..``, a backslash, ``%`` after decoding (double
      encoding), NUL or a nested path is refused with 400;
    * limits: URL 8 KiB, body 64 KiB, text 500 characters; every error is a JSON ``{"error": ...}``;
    * a Content-Security-Policy that forbids every resource not from this server;
    * one failing request never stops the server (handlers catch everything and answer 4xx/5xx).
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import threading
import traceback
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable
from urllib.parse import parse_qs, unquote, urlsplit

from qkv.interpret.ablation import parse_heads
from qkv.interpret.explorer.language import check_lang, with_default_lang
from qkv.interpret.explorer.payload import MAX_TEXT_CHARS, AttentionDataError, normalize_attention_data
from qkv.interpret.fonts import FONT_URL, font_bytes

STATIC_DIR = Path(__file__).resolve().parent / "static"
MAX_BODY_BYTES = 64 * 1024
REQUEST_SECONDS = 30  # the whole of one request, however its bytes trickle in
MAX_CONNECTIONS = 64  # connections served at once: many idle ones cannot exhaust the threads
MAX_URL_CHARS = 8 * 1024
MAX_BEAM = 8
NO_MODEL_MESSAGE = "no model loaded: start with --run DIR to see your model"

# 'self' only: no CDN, no external font, no analytics; data: for the empty favicon.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; font-src 'self'; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".json": "application/json; charset=utf-8",
}
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]", "::1")

AttentionProvider = Callable[[str], dict]
TraceProvider = Callable[[str], dict]


class RequestError(Exception):
    """A bad request, answered with ``status`` and a JSON error message."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


class ExplorerServer(ThreadingHTTPServer):
    """A threading HTTP server that holds the explorer's settings.

    Attributes:
        attention_provider: ``text -> dict`` in the format of ``payload.py``, or None when no model
            is loaded (then ``/api/attention`` answers 404). May be set after construction.
        default_text: The text the model figures start with.
        model_name: Shown above the model figures when a model is loaded.
        quiet: Do not log requests to stderr.
        trace_provider: ``text -> dict`` of ``qkv.interpret.traces`` (a translation trace or GPT's
            practice problems), or None (``/api/trace`` answers 404); ``trace_kind`` says which.
        model_sizes: The model's sizes for the encoder-decoder figure, or None.
        pronoun_head: The head ``qkv explain`` found resolving pronouns best ({kind, layer, head, share,
            n, share_two}), which the model figure opens on; or None.
        default_lang: ``zh`` or ``en`` for a reader with no choice of their own (``--lang``), or None
            to follow the browser.
    """

    daemon_threads = True
    request_queue_size = 64
    max_connections = MAX_CONNECTIONS  # open at once, each on its own thread; more are refused with 503

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        attention_provider: AttentionProvider | None = None,
        default_text: str = "",
        model_name: str | None = None,
        quiet: bool = False,
        static_dir: Path = STATIC_DIR,
        trace_provider: TraceProvider | None = None,
        trace_kind: str | None = None,
        model_sizes: dict | None = None,
        default_lang: str | None = None,
        pronoun_head: dict | None = None,
    ):
        check_lang(default_lang)
        if ":" in host.strip("[]"):
            self.address_family = socket.AF_INET6
        self.attention_provider = attention_provider
        self.default_text = default_text
        self.model_name = model_name
        self.quiet = quiet
        self.trace_provider = trace_provider
        self.trace_kind = trace_kind
        self.model_sizes = model_sizes
        self.default_lang = default_lang
        self.pronoun_head = pronoun_head
        self.static_dir = Path(static_dir)
        # Whitelist taken once: only plain files of known types directly in static/.
        self.static_files = {
            p.name: CONTENT_TYPES[p.suffix]
            for p in self.static_dir.iterdir()
            if p.is_file() and p.suffix in CONTENT_TYPES and not p.name.startswith(".")
        }
        # Serialise model calls: concurrent forwards would only fight for the same CPU cores.
        self.provider_lock = threading.Lock()
        self.connection_slots = threading.BoundedSemaphore(self.max_connections)
        self._slot_of: dict[Any, threading.BoundedSemaphore] = {}
        super().__init__((host.strip("[]"), port), ExplorerHandler)
        bound_host = host.strip("[]")
        self.allowed_hosts: set[str] | None = None
        if bound_host in LOOPBACK_NAMES or bound_host.startswith("127."):
            names = set(LOOPBACK_NAMES) | {bound_host}
            port_s = str(self.server_address[1])
            self.allowed_hosts = names | {f"{n}:{port_s}" for n in names} | {f"[{bound_host}]:{port_s}"}

    @property
    def url(self) -> str:
        """The page's address, e.g. ``http://127.0.0.1:8765/``."""
        host, port = self.server_address[:2]
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{port}/"

    def handle_error(self, request, client_address) -> None:  # noqa: D401 (stdlib hook)
        """Log an unexpected error in a request thread and keep serving."""
        if not self.quiet:
            print(f"explorer: error while serving {client_address}:", file=sys.stderr)
            traceback.print_exc(file=sys.stderr)

    def process_request(self, request, client_address) -> None:
        """A thread for the connection if one of ``max_connections`` is free; else a 503, at once."""
        slots = self.connection_slots
        if not slots.acquire(blocking=False):
            with contextlib.suppress(OSError):
                request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nRetry-After: 1\r\n"
                                b"Connection: close\r\n\r\n")
            self.shutdown_request(request)
            return
        self._slot_of[request] = slots  # released into the semaphore it came from
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slot_of.pop(request).release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slot_of.pop(request).release()


class ExplorerHandler(BaseHTTPRequestHandler):
    """Answers one connection's requests; see the module docstring for the routes."""

    server: ExplorerServer
    server_version = "qkv-explorer"
    sys_version = ""
    protocol_version = "HTTP/1.1"
    timeout = 15  # Seconds a client may stall on one read (slow-loris connections do not pin threads forever).
    request_seconds = REQUEST_SECONDS  # ... and all the reads of one request together

    def handle_one_request(self) -> None:
        # A client that trickles a byte every few seconds passes every per-read timeout; the deadline
        # of the whole request does not let it: when it passes, the connection is shut, which ends
        # whatever read or write is waiting on it.
        expire = threading.Timer(self.request_seconds, self._expire)
        expire.daemon = True
        expire.start()
        try:
            super().handle_one_request()
        finally:
            expire.cancel()

    def _expire(self) -> None:
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    # ------------------------------------------------------------------ methods
    def do_GET(self) -> None:  # noqa: N802 (stdlib naming)
        self._handle("GET")

    def do_HEAD(self) -> None:  # noqa: N802
        self._handle("HEAD")

    def do_POST(self) -> None:  # noqa: N802
        self._handle("POST")

    def _method_not_allowed(self) -> None:
        self._send_json(HTTPStatus.METHOD_NOT_ALLOWED, {"error": f"method {self.command} not allowed"})

    do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = _method_not_allowed

    # ------------------------------------------------------------------ plumbing
    def _handle(self, method: str) -> None:
        try:
            self._check_host()
            self._route(method)
        except RequestError as err:
            self._send_json(err.status, {"error": err.message})
        except (BrokenPipeError, ConnectionResetError, socket.timeout):
            self.close_connection = True
        except Exception:  # noqa: BLE001 - one bad request must never stop the server
            if not self.server.quiet:
                traceback.print_exc(file=sys.stderr)
            self._send_json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": "internal server error"})

    def _check_host(self) -> None:
        allowed = self.server.allowed_hosts
        hosts = self.headers.get_all("Host") or []
        if len(hosts) > 1:  # which one counts differs from proxy to proxy: none does
            raise RequestError(HTTPStatus.BAD_REQUEST, f"{len(hosts)} Host headers; send one")
        host = self.headers.get("Host")
        if allowed is not None and host is not None and host.lower() not in allowed:
            # A page on another site that resolved its name to 127.0.0.1 (DNS rebinding).
            raise RequestError(HTTPStatus.FORBIDDEN, f"unexpected Host header {host!r}")

    def _route(self, method: str) -> None:
        raw = self.path
        if len(raw) > MAX_URL_CHARS:
            raise RequestError(HTTPStatus.REQUEST_URI_TOO_LONG, f"URL longer than {MAX_URL_CHARS} characters")
        if not raw.startswith("/") or raw.startswith("//"):
            raise RequestError(HTTPStatus.BAD_REQUEST, "request target must be a path starting with one '/'")
        parts = urlsplit(raw)
        if method != "POST" and self.headers.get("Content-Length", "0").strip() not in ("", "0"):
            self.close_connection = True  # An unread body would be parsed as the next request.
        if parts.path.startswith("/api/"):
            self._api(method, parts.path, parts.query)
        elif method == "POST":
            raise RequestError(HTTPStatus.METHOD_NOT_ALLOWED, "POST is only accepted on /api/attention")
        else:
            self._static(parts.path, head=(method == "HEAD"))

    def _security_headers(self) -> None:
        self.send_header("Content-Security-Policy", CONTENT_SECURITY_POLICY)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("X-Frame-Options", "DENY")
        self.send_header("Cross-Origin-Resource-Policy", "same-origin")
        self.send_header("Cross-Origin-Opener-Policy", "same-origin")

    def _send_bytes(self, status: int, body: bytes, content_type: str, cache: str = "no-store") -> None:
        self.send_response(status)
        self._security_headers()
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", cache)
        if status >= 400:
            self.close_connection = True
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if getattr(self, "command", None) != "HEAD":
            self.wfile.write(body)

    def _send_json(self, status: int, obj: dict) -> None:
        if status >= 400 and "status" not in obj:
            obj = {**obj, "status": int(status)}
        body = json.dumps(obj, ensure_ascii=False, allow_nan=False).encode("utf-8")
        self._send_bytes(status, body, "application/json; charset=utf-8")

    def send_error(self, code, message=None, explain=None) -> None:  # noqa: D401 (stdlib hook)
        """Answer the base class's own errors (malformed request line, 414, 431, 501) in JSON."""
        try:
            short = self.responses[code][0]
        except KeyError:
            short = "error"
        self.close_connection = True
        if self.request_version in ("", "HTTP/0.9"):
            # The request line did not parse: answer with a full HTTP/1.1 status line and headers
            # rather than a bare HTTP/0.9 body, so every client sees the status code.
            self.request_version = "HTTP/1.1"
        try:
            self._send_json(code, {"error": message or short})
        except OSError:
            pass

    def log_message(self, format, *args) -> None:  # noqa: A002 (stdlib signature)
        if not self.server.quiet:
            sys.stderr.write(f"explorer: {self.address_string()} {format % args}\n")

    # ------------------------------------------------------------------ static files
    def _static(self, path: str, head: bool) -> None:
        try:
            decoded = unquote(path, errors="strict")
        except UnicodeDecodeError:
            raise RequestError(HTTPStatus.BAD_REQUEST, "path is not valid percent-encoded UTF-8") from None
        name = "index.html" if decoded == "/" else decoded[1:]
        # Refuse traversal in every disguise: "..", "\", nested or absolute paths, NUL, drive
        # letters, and anything still percent-encoded after one decoding (double encoding).
        if (
            not name
            or ".." in name
            or "/" in name
            or "\\" in name
            or "%" in name
            or ":" in name
            or "\x00" in name
            or name.startswith(".")
        ):
            raise RequestError(HTTPStatus.BAD_REQUEST, f"bad path {path!r}")
        if name == FONT_URL:
            # Not in static/: the file of the font package, 16 MB, that the browser keeps a day.
            self._send_bytes(HTTPStatus.OK, font_bytes(), "font/otf", cache="max-age=86400")
            return
        content_type = self.server.static_files.get(name)
        if content_type is None:
            raise RequestError(HTTPStatus.NOT_FOUND, f"no such file: {name}")
        body = (self.server.static_dir / name).read_bytes()
        if name == "index.html":
            body = with_default_lang(body.decode("utf-8"), self.server.default_lang).encode("utf-8")
        self._send_bytes(HTTPStatus.OK, body, content_type, cache="no-cache")

    # ------------------------------------------------------------------ API
    def _api(self, method: str, path: str, query: str) -> None:
        if path == "/api/status":
            if method == "POST":
                raise RequestError(HTTPStatus.METHOD_NOT_ALLOWED, "use GET for /api/status")
            self._send_json(HTTPStatus.OK, self._status())
        elif path in ("/api/attention", "/api/trace"):
            if method == "HEAD":  # would run the model for nothing
                raise RequestError(HTTPStatus.METHOD_NOT_ALLOWED, f"use GET or POST for {path}")
            if method == "POST":
                body = self._read_body()
                text, off, beam = body["text"], body.get("off", ""), str(body.get("beam", ""))
            else:
                text, off = self._query_text(query), self._query_field(query, "off")
                beam = self._query_field(query, "beam")
            if not isinstance(off, str):
                raise RequestError(HTTPStatus.BAD_REQUEST, 'off must be a string such as "cross:1:0,cross:1:2"')
            if path == "/api/attention":
                self._attention(text, off, _beam(beam))
            else:
                self._trace(text)
        else:
            raise RequestError(HTTPStatus.NOT_FOUND, f"unknown API route {path}")

    def _status(self) -> dict:
        srv = self.server
        out = {
            "model": srv.attention_provider is not None,
            "default_text": srv.default_text,
            "max_text_chars": MAX_TEXT_CHARS,
        }
        if srv.model_name:
            out["model_name"] = srv.model_name
        if srv.trace_provider is not None:
            out["trace"] = srv.trace_kind
        if srv.model_sizes:
            out["sizes"] = srv.model_sizes
        if srv.pronoun_head:
            out["pronoun_head"] = srv.pronoun_head
        return out

    def _query_fields(self, query: str) -> dict[str, list[str]]:
        try:
            return parse_qs(query, keep_blank_values=True, errors="strict", max_num_fields=8)
        except (ValueError, UnicodeDecodeError) as err:
            raise RequestError(HTTPStatus.BAD_REQUEST, f"bad query string: {err}") from None

    def _query_field(self, query: str, name: str) -> str:
        """An optional field given at most once ("" when absent)."""
        values = self._query_fields(query).get(name, [""])
        if len(values) > 1:
            raise RequestError(HTTPStatus.BAD_REQUEST, f"give '{name}' once")
        return values[0]

    def _query_text(self, query: str) -> str:
        values = self._query_fields(query).get("text")
        if not values:
            raise RequestError(HTTPStatus.BAD_REQUEST, "missing 'text' parameter: /api/attention?text=...")
        if len(values) > 1:
            raise RequestError(HTTPStatus.BAD_REQUEST, "give 'text' once")
        return values[0]

    def _read_body(self) -> dict:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True
            raise RequestError(
                HTTPStatus.LENGTH_REQUIRED, "chunked bodies are not accepted: send Content-Length"
            )
        length_s = self.headers.get("Content-Length")
        if length_s is None:
            self.close_connection = True
            raise RequestError(HTTPStatus.LENGTH_REQUIRED, "POST needs a Content-Length header")
        try:
            length = int(length_s)
            if length < 0:
                raise ValueError
        except ValueError:
            self.close_connection = True
            raise RequestError(HTTPStatus.BAD_REQUEST, f"bad Content-Length {length_s!r}") from None
        if length > MAX_BODY_BYTES:
            self.close_connection = True  # The body is left unread: the connection cannot be reused.
            raise RequestError(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"request body over {MAX_BODY_BYTES} bytes"
            )
        body = self.rfile.read(length)
        if len(body) != length:
            self.close_connection = True
            raise RequestError(HTTPStatus.BAD_REQUEST, "request body shorter than its Content-Length")
        ctype = self.headers.get("Content-Type", "").split(";")[0].strip().lower()
        if ctype != "application/json":
            raise RequestError(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, "send the body as application/json")
        try:
            obj = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise RequestError(HTTPStatus.BAD_REQUEST, f"body is not valid UTF-8 JSON: {err}") from None
        except RecursionError:  # arrays nested thousands deep exhaust the parser's stack
            raise RequestError(HTTPStatus.BAD_REQUEST, "body is JSON nested too deep") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
            raise RequestError(HTTPStatus.BAD_REQUEST, 'body must be a JSON object {"text": "..."}')
        return obj

    def _checked(self, text: str) -> str:
        if len(text) > MAX_TEXT_CHARS:
            raise RequestError(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"text is {len(text)} characters; the limit is {MAX_TEXT_CHARS}",
            )
        if not text.strip():
            raise RequestError(HTTPStatus.BAD_REQUEST, "text is empty")
        if "\x00" in text:
            raise RequestError(HTTPStatus.BAD_REQUEST, "text contains a NUL character")
        return text

    def _provide(self, provider: Callable[..., dict] | None, text: str, what: str, **options) -> dict:
        """``provider(text, **options)``, one model call at a time; a text (or option) it cannot take is a
        400, anything else a 500."""
        text = self._checked(text)
        if provider is None:
            raise RequestError(HTTPStatus.NOT_FOUND, NO_MODEL_MESSAGE)
        try:
            with self.server.provider_lock:
                return provider(text, **options)
        except (ValueError, KeyError) as err:
            raise RequestError(HTTPStatus.BAD_REQUEST, f"the model could not read this text: {err}") from None
        except Exception:  # noqa: BLE001
            if not self.server.quiet:
                traceback.print_exc(file=sys.stderr)
            raise RequestError(
                HTTPStatus.INTERNAL_SERVER_ERROR, f"the {what} provider failed (see the server log)"
            ) from None

    def _trace(self, text: str) -> None:
        self._send_json(HTTPStatus.OK, self._provide(self.server.trace_provider, text, "trace"))

    def _attention(self, text: str, off: str = "", beam: int | None = None) -> None:
        try:
            heads = parse_heads(off)
        except ValueError as err:
            raise RequestError(HTTPStatus.BAD_REQUEST, f"off: {err}") from None
        options = {"off": heads} if heads else {}
        if beam is not None:
            options["beam"] = beam
        raw = self._provide(self.server.attention_provider, text, "attention", **options)
        try:
            data = normalize_attention_data(raw)
        except AttentionDataError as err:
            raise RequestError(
                HTTPStatus.INTERNAL_SERVER_ERROR, f"the attention provider returned bad data: {err}"
            ) from None
        data.setdefault("text", text)
        self._send_json(HTTPStatus.OK, data)


def _beam(value: str) -> int | None:
    """The ``beam`` field: absent (the provider's own), or a beam size of 1 (greedy) to ``MAX_BEAM``."""
    if value == "":
        return None
    if not value.isdigit() or not 1 <= int(value) <= MAX_BEAM:
        raise RequestError(HTTPStatus.BAD_REQUEST, f"beam must be a whole number from 1 to {MAX_BEAM}, got {value!r}")
    return int(value)


def make_server(
    host: str = "127.0.0.1",
    port: int = 0,
    attention_provider: AttentionProvider | None = None,
    *,
    default_text: str = "",
    model_name: str | None = None,
    quiet: bool = False,
    trace_provider: TraceProvider | None = None,
    trace_kind: str | None = None,
    model_sizes: dict | None = None,
    default_lang: str | None = None,
    pronoun_head: dict | None = None,
) -> ExplorerServer:
    """Create (bind, not start) the explorer server.

    Args:
        host: Interface to bind; loopback by default, so nothing is reachable from the network.
        port: TCP port; 0 picks a free one (read it back from ``server.url``).
        attention_provider: ``text -> dict`` giving a model's maps (see ``payload.py``), or None.
        default_text: The text the model figures start with.
        model_name: Shown above the model figures.
        quiet: Do not log requests to stderr.
        trace_provider, trace_kind: ``text -> dict`` of ``qkv.interpret.traces`` and which trace it
            gives (``translation`` or ``practice``), or None.
        model_sizes: The model's sizes (``traces.model_sizes``) for the encoder-decoder figure.
        default_lang: ``zh`` or ``en`` for a reader who has not chosen; None follows the browser.
        pronoun_head: The head the model figure opens on (``qkv explain``'s best), or None.

    Returns:
        An ``ExplorerServer``; call ``serve_forever()`` (in a thread if needed) and ``shutdown()``.
    """
    if not 0 <= int(port) <= 65535:
        raise ValueError(f"port must be in 0..65535, got {port}")
    if len(default_text) > MAX_TEXT_CHARS:
        raise ValueError(f"default text is {len(default_text)} characters; the limit is {MAX_TEXT_CHARS}")
    return ExplorerServer(
        host, int(port), attention_provider, default_text=default_text, model_name=model_name, quiet=quiet,
        trace_provider=trace_provider, trace_kind=trace_kind, model_sizes=model_sizes, default_lang=default_lang,
        pronoun_head=pronoun_head,
    )


def serve(host: str = "127.0.0.1", port: int = 0, attention_provider: AttentionProvider | None = None,
          **settings) -> int:
    """Run the explorer until Ctrl-C, printing its URL to stdout (with ``?lang=`` when a language is set).

    Args:
        host, port, attention_provider: As ``make_server``.
        **settings: ``make_server``'s keyword arguments.

    Returns:
        0 once stopped.
    """
    server = make_server(host, port, attention_provider, **settings)
    if server.allowed_hosts is None:
        print(
            f"explorer: listening on {host}, not loopback: anyone who can reach this machine can use it",
            file=sys.stderr,
        )
    lang = settings.get("default_lang")
    print(server.url + (f"?lang={lang}" if lang else ""), flush=True)
    print("explorer: press Ctrl-C to stop", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
