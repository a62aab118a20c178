"""What the package carries from elsewhere, each folder of ``vendor/`` with its license and a ``VENDOR.json``
of its files' sha256 (``checked_files``), and the first of them: the browser runtime the live page
carries, onnxruntime-web, pinned.

A user of the wheel needs neither npm nor a network: the files are in the package, each with its
sha256 in ``vendor/onnxruntime-web/VENDOR.json``, checked whenever a page is written (a changed file
is refused, not shipped). Two files of the npm package are kept, with its license:

- ``ort.wasm.bundle.min.mjs``: the JavaScript API with the WASM backend's loader bundled in (an ES
  module; the page inlines it and makes its exports one global, ``ort``);
- ``ort-wasm-simd-threaded.wasm.gz``: the WebAssembly of the CPU kernels, gzipped (a quarter of its
  14.8 MB; the page unpacks it with the browser's DecompressionStream, so the file and the site stay
  small). WebGPU's build (30 MB more) is not carried: a model this small decodes faster on WASM.

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
SCRIPT = "ort.wasm.bundle.min.mjs"
WASM = "ort-wasm-simd-threaded.wasm"
WASM_GZ = WASM + ".gz"
LICENSE = "LICENSE"
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


def runtime_script() -> str:
    """onnxruntime-web's API as a module script that sets ``globalThis.ort``."""
    js = _checked()[SCRIPT].decode("utf-8")
    m = _EXPORTS.search(js)
    if m is None:
        raise VendorError(f"{FOLDER / SCRIPT}: its exports are not where the page expects them (the bundle's last statement)")
    pairs = [part.strip().split(" as ") for part in m.group(1).split(",") if part.strip()]  # "a as B" or "a"
    props = ",".join(f"{p[-1]}:{p[0]}" for p in pairs)
    return js[:m.start()] + f"globalThis.ort={{{props}}};\n"


def runtime_wasm_gz() -> bytes:
    """The gzipped WebAssembly of onnxruntime-web's CPU kernels."""
    return _checked()[WASM_GZ]


def refresh(version: str = VERSION) -> Path:
    """Fetch ``onnxruntime-web@version`` with npm, keep its two files and its license, record their sha256."""
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(["npm", "pack", f"{PACKAGE}@{version}", "--json"], cwd=tmp, check=True,
                             capture_output=True, text=True)
        tarball = Path(tmp) / json.loads(out.stdout)[0]["filename"]
        with tarfile.open(tarball) as tar:
            script = tar.extractfile(f"package/dist/{SCRIPT}").read()
            wasm = tar.extractfile(f"package/dist/{WASM}").read()
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=9, mtime=0) as gz:  # mtime 0: the same bytes every time
        gz.write(wasm)
    FOLDER.mkdir(parents=True, exist_ok=True)
    write_bytes(FOLDER / SCRIPT, script)
    write_bytes(FOLDER / WASM_GZ, buf.getvalue())
    record_files(FOLDER, {"package": PACKAGE, "version": version, "license": "MIT", "wasm_sha256": sha256(wasm),
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
