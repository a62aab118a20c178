"""What the package carries from elsewhere, each folder of ``vendor/`` with its license and a ``VENDOR.json``
of its files' sha256 (``checked_files``), and the first of them: the browser runtime the live page
carries, onnxruntime-web, pinned.

A user of the wheel needs neither npm nor a network: the files are in the package, each with its
sha256 in ``vendor/onnxruntime-web/VENDOR.json``, checked whenever a page is written (a changed file
is refused, not shipped). Two builds of the npm package are kept (``RUNTIMES``), each as its
JavaScript API with the loader bundled in (an ES module; the page inlines it and makes its exports one
global) and its WebAssembly gzipped (the page unpacks it with the browser's DecompressionStream, so the
file and the site stay small), with the package's license:

- ``wasm``: ``ort.wasm.bundle.min.mjs`` and ``ort-wasm-simd-threaded.wasm.gz`` (3.8 MB of 14.8), the
  CPU kernels every browser runs; the page starts on it (``globalThis.ort``);
- ``webgpu``: ``ort.jspi.bundle.min.mjs`` and ``ort-wasm-simd-threaded.jspi.wasm.gz`` (4.4 MB of 17.9),
  the WebGPU execution provider, in the build that suspends on the GPU through JavaScript Promise
  Integration (``WebAssembly.Suspending``), smaller and faster to start than the asyncify build (7.1 MB);
  unpacked only when a reader switches the page to WebGPU (``globalThis.ortWebGPU``).

Refresh (a new version: change ``VERSION``, run, commit the folder)::

    python -m qkv.interpret.explorer.vendored --refresh
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import re
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from qkv.errors import QkvError
from qkv.files import write_bytes, write_text

MODULE = "qkv.interpret.explorer.vendored"
PACKAGE = "onnxruntime-web"
VERSION = "1.31.1"
RECORD_NAME = "VENDOR.json"
FOLDER = Path(__file__).resolve().parent / "vendor" / PACKAGE
RECORD = FOLDER / RECORD_NAME
LICENSE = "LICENSE"


@dataclass(frozen=True)
class Runtime:
    """One build of onnxruntime-web: its bundled API (``script``), its WebAssembly (``wasm``), and the
    global the page gives the API's exports."""

    script: str
    wasm: str
    name: str

    @property
    def wasm_gz(self) -> str:
        return self.wasm + ".gz"


RUNTIMES = {
    "wasm": Runtime("ort.wasm.bundle.min.mjs", "ort-wasm-simd-threaded.wasm", "ort"),
    "webgpu": Runtime("ort.jspi.bundle.min.mjs", "ort-wasm-simd-threaded.jspi.wasm", "ortWebGPU"),
}
# The bundle ends with its exports, `export{a as InferenceSession,...};`: the page has no module
# loader to import them, so they become the properties of one global.
_EXPORTS = re.compile(r"export\s*\{([^}]*)\};?\s*(//# sourceMappingURL=\S+\s*)?$")


class VendorError(QkvError):
    """The vendored runtime is missing or not the files its record names."""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def checked_files(folder: Path, remedy: str) -> dict[str, bytes]:
    """The files of ``folder`` its ``VENDOR.json`` records, by name, each checked against its sha256.

    Raises:
        VendorError: the record is missing, or a file is not the one it records (``remedy`` says what to do).
    """
    record = folder / RECORD_NAME
    try:
        digests = json.loads(record.read_text(encoding="utf-8"))["sha256"]
    except (OSError, ValueError, KeyError) as err:
        raise VendorError(f"{record}: {err}; {remedy}") from None
    files = {}
    for name, digest in digests.items():
        path = folder / name
        data = path.read_bytes() if path.is_file() else b""
        if sha256(data) != digest:
            raise VendorError(f"{path} is not the file {RECORD_NAME} records (sha256 {digest[:12]}...); {remedy}")
        files[name] = data
    return files


def record_files(folder: Path, about: dict) -> Path:
    """Write ``folder``'s ``VENDOR.json``: ``about`` and the sha256 of every file below it."""
    names = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and p.name != RECORD_NAME)
    record = {**about, "sha256": {n: sha256((folder / n).read_bytes()) for n in names}}
    return write_text(folder / RECORD_NAME, json.dumps(record, indent=1) + "\n")


@lru_cache(maxsize=1)
def _checked() -> dict[str, bytes]:
    """The vendored runtime's files by name, each checked against its recorded sha256."""
    return checked_files(FOLDER, f"reinstall qkv, or refresh it (python -m {MODULE} --refresh)")


def runtime_script(backend: str) -> str:
    """``backend``'s onnxruntime-web API as a module script that sets its global (``RUNTIMES``)."""
    runtime = RUNTIMES[backend]
    js = _checked()[runtime.script].decode("utf-8")
    m = _EXPORTS.search(js)
    if m is None:
        raise VendorError(f"{FOLDER / runtime.script}: its exports are not where the page expects them (the bundle's last statement)")
    pairs = [part.strip().split(" as ") for part in m.group(1).split(",") if part.strip()]  # "a as B" or "a"
    props = ",".join(f"{p[-1]}:{p[0]}" for p in pairs)
    return js[:m.start()] + f"globalThis.{runtime.name}={{{props}}};\n"


def runtime_wasm_gz(backend: str) -> bytes:
    """The gzipped WebAssembly of ``backend``'s onnxruntime-web."""
    return _checked()[RUNTIMES[backend].wasm_gz]


def refresh(version: str = VERSION) -> Path:
    """Fetch ``onnxruntime-web@version`` with npm, keep each runtime's two files and the license, record their sha256."""
    files: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(["npm", "pack", f"{PACKAGE}@{version}", "--json"], cwd=tmp, check=True,
                             capture_output=True, text=True)
        tarball = Path(tmp) / json.loads(out.stdout)[0]["filename"]
        with tarfile.open(tarball) as tar:
            for runtime in RUNTIMES.values():
                files[runtime.script] = tar.extractfile(f"package/dist/{runtime.script}").read()
                files[runtime.wasm] = tar.extractfile(f"package/dist/{runtime.wasm}").read()
    FOLDER.mkdir(parents=True, exist_ok=True)
    for runtime in RUNTIMES.values():
        buf = io.BytesIO()
        with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=9, mtime=0) as gz:  # mtime 0: the same bytes every time
            gz.write(files[runtime.wasm])
        write_bytes(FOLDER / runtime.script, files[runtime.script])
        write_bytes(FOLDER / runtime.wasm_gz, buf.getvalue())
    record_files(FOLDER, {"package": PACKAGE, "version": version, "license": "MIT",
                          "wasm_sha256": {r.wasm: sha256(files[r.wasm]) for r in RUNTIMES.values()},
                          "refresh": f"python -m {MODULE} --refresh"})
    _checked.cache_clear()
    return FOLDER


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=f"Check, or refresh, the vendored {PACKAGE}.")
    parser.add_argument("--refresh", action="store_true", help=f"fetch {PACKAGE}@{VERSION} with npm and record it")
    args = parser.parse_args(argv)
    if args.refresh:
        print(refresh())
    _checked()
    print(f"{PACKAGE} {VERSION}: {', '.join(sorted(_checked()))} as recorded")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
