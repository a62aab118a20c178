"""Fixtures for the data tests: an isolated lookup path and a tiny registered corpus."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from qkv.data import corpora as C


def spec(path: str, content: bytes) -> C.FileSpec:
    return C.FileSpec(path, content.count(b"\n"), len(content), hashlib.sha256(content).hexdigest())


def _write_corpus(root: Path, name: str, files: dict[str, bytes]) -> Path:
    """Write ``files`` into ``root/name``; returns the corpus directory."""
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    for p, c in files.items():
        (d / p).write_bytes(c)
    return d


def _serving(files: dict[str, bytes], calls: list[str]):
    """A fake downloader for fetch(): serves ``files`` by the last part of the URL, records the URLs."""
    def downloader(url: str, dest: Path) -> None:
        calls.append(url)
        dest.write_bytes(files[url.rsplit("/", 1)[1]])
    return downloader


@pytest.fixture
def write_corpus():
    return _write_corpus


@pytest.fixture
def serving():
    return _serving


@pytest.fixture
def isolated(monkeypatch, tmp_path):
    """No $QKV_DATA, no shared data and an empty user cache: only what a test puts there is found."""
    monkeypatch.delenv(C.ENV_VAR, raising=False)
    monkeypatch.setattr(C, "checkout_data_root", lambda: tmp_path / "checkout-shared")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path


@pytest.fixture
def tiny(monkeypatch):
    """A small parallel corpus 'tiny' (xx-yy, splits a/b) and text corpus 'tinytext' in the registry."""
    files = {"a.xx": b"eins\nzwei\n", "a.yy": b"one\ntwo\n", "b.xx": b"drei\n", "b.yy": b"three\n"}
    par = C.Corpus(
        name="tiny", kind="parallel", languages=("xx", "yy"), splits=("a", "b"),
        files=tuple(spec(p, c) for p, c in files.items()),
        description="test", source="test", license="test",
        downloads=tuple(C.Download(f"https://example.invalid/{p}.gz", f"{p}.gz") for p in files), build="gunzip",
    )
    text = b"To be, or not to be\n\xe5\xad\xa6\n"
    txt = C.Corpus(
        name="tinytext", kind="text", languages=("en",), splits=(), files=(spec("input.txt", text),),
        description="test", source="test", license="test",
        downloads=(C.Download("https://example.invalid/input.txt", "input.txt"),),
    )
    monkeypatch.setattr(C, "_BY_NAME", {**C._BY_NAME, "tiny": par, "tinytext": txt})
    monkeypatch.setattr(C, "_CORPORA", (*C._CORPORA, par, txt))
    return {"tiny": files, "tinytext": {"input.txt": text}}
