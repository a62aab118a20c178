"""``qkv data list|check|fetch``: output, exit codes, and messages that name the file."""

from __future__ import annotations

import argparse
import gzip

import pytest

from qkv.cli import data as commands
from qkv.data import corpora as C


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="qkv")
    commands.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


def test_list_shows_every_corpus_and_where_it_is(isolated, tiny, capsys, write_corpus):
    d = write_corpus(isolated / "d", "tiny", tiny["tiny"])
    assert run(["data", "list", "--data-dir", str(isolated / "d")]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert set(rows) >= {"multi30k", "cmn-eng", "iwslt15-zh-en", "tinyshakespeare", "tang-poems", "tiny"}
    assert rows["tiny"].endswith(str(d)) and "a:2 b:1" in rows["tiny"] and "xx-yy" in rows["tiny"]
    assert rows["multi30k"].endswith("missing") and "train:29000 val:1014 test2016:1000" in rows["multi30k"]
    assert "(eval only)" in rows["iwslt15-zh-en"] and "13.1 MB" in rows["tang-poems"]


def test_check_ok_and_failure_exit_codes(isolated, tiny, capsys, write_corpus):
    d = write_corpus(isolated / "d", "tiny", tiny["tiny"])
    assert run(["data", "check", "--data-dir", str(isolated / "d"), "tiny"]) == 0
    assert "tiny: OK" in capsys.readouterr().out

    (d / "a.yy").write_bytes(b"one\ntwo\nthree\n")
    assert run(["data", "check", "--data-dir", str(isolated / "d"), "tiny"]) == 1
    out = capsys.readouterr().out
    assert "tiny: FAILED" in out and f"{d / 'a.yy'}: 3 lines, expected 2" in out


def test_check_missing(isolated, tiny, capsys, write_corpus):
    # A --data-dir that is not there is a typo, refused as the arguments are read (not "searched, found nothing").
    with pytest.raises(SystemExit):
        run(["data", "check", "--data-dir", str(isolated / "d"), "tiny"])
    assert f"argument --data-dir: no such directory: {isolated / 'd'}" in capsys.readouterr().err
    (isolated / "d").mkdir()
    # Named and missing: a failure that says where it looked.
    assert run(["data", "check", "--data-dir", str(isolated / "d"), "tiny"]) == 1
    assert "not found" in capsys.readouterr().out
    # Unnamed: missing corpora are skipped, but finding none at all is a failure.
    assert run(["data", "check", "--data-dir", str(isolated / "d")]) == 1
    write_corpus(isolated / "d", "tiny", tiny["tiny"])
    assert run(["data", "check", "--data-dir", str(isolated / "d"), "--no-sha"]) == 0
    out = capsys.readouterr().out
    assert "multi30k: missing (skipped)" in out and "tiny: OK" in out
    # An unknown name is bad input, refused before any corpus is checked (the CLI's boundary: exit 2).
    with pytest.raises(C.DataError, match="unknown corpus 'nonsense'"):
        run(["data", "check", "tiny", "nonsense"])
    assert "tiny" not in capsys.readouterr().out


def test_fetch_command(isolated, tiny, capsys, monkeypatch, serving):
    served = {f"{p}.gz": gzip.compress(c) for p, c in tiny["tiny"].items()}
    real_fetch = C.fetch
    monkeypatch.setattr(C, "fetch", lambda *a, **k: real_fetch(*a, downloader=serving(served, []), **k))
    assert run(["data", "fetch", "--data-dir", str(isolated / "dest"), "tiny"]) == 0
    assert capsys.readouterr().out.strip() == f"tiny: {isolated / 'dest' / 'tiny'}"
    assert C.check_corpus("tiny", isolated / "dest").ok

    served["a.xx.gz"] = gzip.compress(b"falsch\nfalsch\n")
    assert run(["data", "fetch", "--force", "--data-dir", str(isolated / "other"), "tiny"]) == 1
    assert "nothing was installed" in capsys.readouterr().err


def test_subcommand_is_required():
    with pytest.raises(SystemExit):
        run(["data"])
