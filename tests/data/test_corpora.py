"""The corpus registry: figures as in the data README, lookup order, strict reading, checks, fetch."""

from __future__ import annotations

import gzip
import json
import re

import pytest

from qkv.data import corpora as C

def _data_root():
    """The folder that holds the real corpora, looked up as qkv looks them up: $QKV_DATA first, then
    ../shared/data beside the checkout, then the user cache (the README sits beside the corpora)."""
    found = C.locate_corpus("multi30k")
    return found.parent if found is not None else C.checkout_data_root()


SHARED = _data_root()
README = SHARED / "README.md"


# -- the registry --------------------------------------------------------------------------------


@pytest.mark.skipif(not README.is_file(), reason="the data README is not in $QKV_DATA nor beside the checkout")
def test_registry_matches_the_data_readme():
    rows = re.findall(r"^\| `([^`]+)` \| (\d+) \| (\d+) \| `([0-9a-f]{64})` \|$", README.read_text(), re.M)
    assert len(rows) == 24
    readme = {path: (int(lines), int(size), sha) for path, lines, size, sha in rows}
    registry = {f"{c.name}/{f.path}": (f.lines, f.bytes, f.sha256) for c in C.list_corpora() for f in c.files}
    assert registry == readme


def test_registry_shape():
    names = [c.name for c in C.list_corpora()]
    assert names == ["multi30k", "cmn-eng", "iwslt15-zh-en", "tinyshakespeare", "tang-poems"]
    m = C.get_corpus("multi30k")
    assert m.splits == ("train", "val", "test2016") and m.languages == ("de", "en")
    assert m.split_lines("train") == 29000 and m.split_path("test2016", "de") == "test2016.de"
    assert C.get_corpus("iwslt15-zh-en").eval_only
    for c in C.list_corpora():
        assert c.downloads, c.name
        assert all(d.url.startswith("https://") for d in c.downloads)
    assert all("a3d2e0d26b56f3846f66a952536ffed4e401d05a" in d.url for d in m.downloads)
    assert {d.name for d in m.downloads} == {f.path + ".gz" for f in m.files}


def test_unknown_names_are_clear_errors():
    with pytest.raises(C.DataError, match="did you mean 'multi30k'"):
        C.get_corpus("multi30")
    with pytest.raises(C.DataError, match="no split 'valid'.*did you mean 'val'"):
        C.get_corpus("multi30k").split_path("valid", "de")
    with pytest.raises(C.DataError, match="no language 'fr'"):
        C.get_corpus("multi30k").split_path("train", "fr")
    with pytest.raises(C.DataError, match="parallel corpus; use read_parallel"):
        C.read_text("multi30k")


# -- lookup order ---------------------------------------------------------------------------------


def test_lookup_order(isolated, tiny, monkeypatch, write_corpus):
    explicit, env, shared, cache = (isolated / n for n in ("explicit", "env", "checkout-shared", "cache/qkv/data"))
    with pytest.raises(C.DataError, match="data directory not found"):  # named, so it must be there
        C.search_roots(explicit)
    explicit.mkdir()
    assert C.search_roots(explicit)[0] == explicit
    assert C.search_roots()[-1] == cache  # the user cache honours $XDG_CACHE_HOME
    monkeypatch.setenv(C.ENV_VAR, str(env))
    assert C.search_roots(explicit) == [explicit, env, shared, cache]

    write_corpus(cache, "tiny", tiny["tiny"])
    assert C.find_corpus("tiny") == cache / "tiny"
    write_corpus(shared, "tiny", tiny["tiny"])
    assert C.find_corpus("tiny") == shared / "tiny"
    write_corpus(env, "tiny", tiny["tiny"])
    assert C.find_corpus("tiny") == env / "tiny"
    write_corpus(explicit, "tiny", tiny["tiny"])
    assert C.find_corpus("tiny", explicit) == explicit / "tiny"
    # --data-dir may also name the corpus directory itself.
    assert C.find_corpus("tiny", explicit / "tiny") == explicit / "tiny"


def test_incomplete_directory_is_skipped_and_the_error_lists_every_place(isolated, tiny, write_corpus):
    partial = write_corpus(isolated / "explicit", "tiny", {"a.xx": tiny["tiny"]["a.xx"]})
    with pytest.raises(C.DataError) as e:
        C.find_corpus("tiny", isolated / "explicit")
    msg = str(e.value)
    assert str(partial) in msg and "missing a.yy, b.xx, b.yy" in msg
    assert str(isolated / "checkout-shared" / "tiny") in msg and str(isolated / "cache/qkv/data/tiny") in msg
    assert "qkv data fetch tiny" in msg
    # A complete copy further down the list is found instead.
    full = write_corpus(isolated / "cache/qkv/data", "tiny", tiny["tiny"])
    assert C.find_corpus("tiny", isolated / "explicit") == full


@pytest.mark.skipif(not (SHARED / "multi30k").is_dir(), reason="no shared data in $QKV_DATA nor beside the checkout")
def test_shared_data_is_found(monkeypatch):
    monkeypatch.setenv(C.ENV_VAR, str(SHARED))  # wherever it was found, $QKV_DATA pointing there finds it
    assert C.find_corpus("multi30k") == SHARED / "multi30k"
    src, tgt = C.read_parallel("multi30k", "val", "de", "en")
    assert len(src) == len(tgt) == 1014
    assert src[0].startswith("Eine Gruppe von Männern") and tgt[0].startswith("A group of men")
    text = C.read_text("tinyshakespeare")
    assert len(text) == 1115394 and text.startswith("First Citizen:")


# -- strict reading -------------------------------------------------------------------------------


def test_read_parallel_on_a_registered_corpus(isolated, tiny, write_corpus):
    write_corpus(isolated / "d", "tiny", tiny["tiny"])
    assert C.read_parallel("tiny", "a", "xx", "yy", isolated / "d") == (["eins", "zwei"], ["one", "two"])
    assert C.read_parallel("tiny", "b", "yy", "xx", isolated / "d") == (["three"], ["drei"])
    assert C.read_text("tinytext", write_corpus(isolated / "d", "tinytext", tiny["tinytext"])) == "To be, or not to be\n学\n"


def test_line_count_mismatch_names_both_files(tmp_path):
    (tmp_path / "x.de").write_text("a\nb\nc\n", encoding="utf-8")
    (tmp_path / "x.en").write_text("a\nb\n", encoding="utf-8")
    with pytest.raises(C.DataError) as e:
        C.read_parallel_files(tmp_path / "x.de", tmp_path / "x.en")
    assert f"{tmp_path / 'x.de'} has 3 lines" in str(e.value) and f"{tmp_path / 'x.en'} has 2" in str(e.value)


def test_bad_utf8_names_file_and_line(tmp_path):
    (tmp_path / "x.de").write_bytes("gut\nschön\n".encode() + b"kaputt \xff hier\n")
    (tmp_path / "x.en").write_text("good\nnice\nbroken\n", encoding="utf-8")
    with pytest.raises(C.DataError, match=re.escape(f"{tmp_path / 'x.de'}:3: not valid UTF-8") + ".*0xff at column 8"):
        C.read_parallel_files(tmp_path / "x.de", tmp_path / "x.en")


def test_only_newline_ends_a_line(tmp_path):
    # U+2028 and U+0085 inside a sentence must not split it (str.splitlines would).
    (tmp_path / "s").write_text("a\u2028b\nc\u0085d\r\ne\n", encoding="utf-8")
    assert C.read_lines(tmp_path / "s") == ["a\u2028b", "c\u0085d", "e"]
    (tmp_path / "t").write_text("no final newline\n\nx", encoding="utf-8")
    assert C.read_lines(tmp_path / "t") == ["no final newline", "", "x"]


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(C.DataError, match="file not found: .*nope.de"):
        C.read_parallel_files(tmp_path / "nope.de", tmp_path / "nope.en")


# -- check ---------------------------------------------------------------------------------------


def test_check_corpus(isolated, tiny, write_corpus):
    d = write_corpus(isolated / "d", "tiny", tiny["tiny"])
    report = C.check_corpus("tiny", isolated / "d")
    assert report.ok and report.directory == d and report.problems == []

    (d / "b.yy").write_bytes(b"thr\xe9e\n")  # same size and line count, different content, not UTF-8
    report = C.check_corpus("tiny", isolated / "d")
    assert not report.ok
    assert any(p.startswith(f"{d / 'b.yy'}: sha256") for p in report.problems)
    assert any(f"{d / 'b.yy'}:1: not valid UTF-8" in p for p in report.problems)
    assert C.check_corpus("tiny", isolated / "d", verify_sha=False).problems == [
        p for p in report.problems if "sha256" not in p
    ]

    (d / "b.yy").write_bytes(b"three\nfour\n")
    problems = C.check_corpus("tiny", isolated / "d", verify_sha=False).problems
    assert f"{d / 'b.yy'}: 2 lines, expected 1" in problems
    assert any("different line counts" in p and str(d / "b.xx") in p and str(d / "b.yy") in p for p in problems)

    missing = C.check_corpus("tinytext", isolated / "d")
    assert not missing.ok and missing.directory is None and "not found" in missing.problems[0]


# -- fetch ---------------------------------------------------------------------------------------


def test_fetch_gunzips_verifies_and_installs(isolated, tiny, serving):
    served = {f"{p}.gz": gzip.compress(c) for p, c in tiny["tiny"].items()}
    calls: list[str] = []
    target = C.fetch("tiny", isolated / "dest", downloader=serving(served, calls))
    assert target == isolated / "dest" / "tiny"
    assert {p.name: p.read_bytes() for p in target.iterdir()} == tiny["tiny"]
    assert len(calls) == 4
    assert C.find_corpus("tiny", isolated / "dest") == target
    # Already there and verified: nothing is downloaded again, unless forced.
    C.fetch("tiny", isolated / "dest", downloader=serving(served, calls))
    assert len(calls) == 4
    C.fetch("tiny", isolated / "dest", downloader=serving(served, calls), force=True)
    assert len(calls) == 8


def test_fetch_defaults_to_the_user_cache(isolated, tiny, serving):
    target = C.fetch("tinytext", downloader=serving(tiny["tinytext"], []))
    assert target == isolated / "cache" / "qkv" / "data" / "tinytext"
    assert C.find_corpus("tinytext") == target


def test_fetch_refuses_files_that_do_not_verify(isolated, tiny, serving):
    served = {f"{p}.gz": gzip.compress(c.upper()) for p, c in tiny["tiny"].items()}
    with pytest.raises(C.DataError) as e:
        C.fetch("tiny", isolated / "dest", downloader=serving(served, []))
    assert "sha256" in str(e.value) and "nothing was installed" in str(e.value)
    assert str(isolated / "dest" / "tiny" / "a.xx") in str(e.value)
    assert not (isolated / "dest" / "tiny").exists()
    assert [p.name for p in (isolated / "dest").iterdir()] == []  # no temporary folder left behind


def test_fetch_names_the_url_that_failed(isolated, tiny):
    def offline(url, dest):
        raise OSError("network is unreachable")

    with pytest.raises(C.DataError, match=r"could not download https://example\.invalid/a\.xx\.gz: network"):
        C.fetch("tiny", isolated / "dest", downloader=offline)


@pytest.mark.skipif(not (SHARED / "tinyshakespeare").is_dir(), reason="no shared data in $QKV_DATA nor beside the checkout")
def test_fetch_of_a_real_corpus_from_a_fake_server(isolated, serving):
    """Tiny Shakespeare, served from the shared copy: the registry's sha256 accepts the real bytes."""
    real = (SHARED / "tinyshakespeare" / "input.txt").read_bytes()
    calls: list[str] = []
    target = C.fetch("tinyshakespeare", isolated / "dest", downloader=serving({"input.txt": real}, calls))
    assert calls == ["https://raw.githubusercontent.com/karpathy/char-rnn/6f9487a6fe5b420b7ca9afb0d7c078e37c1d1b4e"
                     "/data/tinyshakespeare/input.txt"]
    assert C.check_corpus("tinyshakespeare", isolated / "dest").ok
    assert (target / "input.txt").read_bytes() == real


# -- rebuilding corpora that the source ships in another form -------------------------------------


def test_build_cmn_eng_follows_the_readme_procedure(tmp_path):
    lines = ["\ufeffHello.\t\u4f60\u597d\u3002\tCC-BY 2.0 (France) Attribution: tatoeba.org #1 (a) & #2 (b)"]
    lines += [f" Sentence {i}.\u200b \t句子{i}。\tattribution" for i in range(3200)]
    lines += ["Sentence 5.\t句子5。\tduplicate of an earlier pair", ""]
    (tmp_path / "cmn.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    C.build_cmn_eng(tmp_path / "cmn.txt", tmp_path)
    split = {s: C.read_parallel_files(tmp_path / f"{s}.zh", tmp_path / f"{s}.en") for s in ("train", "valid", "test")}
    assert [len(split[s][0]) for s in ("train", "valid", "test")] == [201, 1000, 1000]  # 3201 unique - 1000 reserved
    pairs = [p for s in split.values() for p in zip(*s)]
    assert len(set(pairs)) == len(pairs)
    assert all(en == en.strip() and "\u200b" not in en and "\ufeff" not in en for _, en in pairs)
    assert not any("\ufeff" in zh or "\ufeff" in en for zh, en in pairs)
    # Shuffled (not in file order), deterministically.
    assert split["valid"][1][:5] != [f"Sentence {i}." for i in range(5)]
    C.build_cmn_eng(tmp_path / "cmn.txt", tmp_path / ".")
    assert C.read_lines(tmp_path / "valid.en") == split["valid"][1]


def test_build_cmn_eng_drops_pairs_sharing_a_sentence_with_a_reserved_pair(tmp_path):
    # Every pair has the English "Yes.", so all pairs after the 1000 reserved ones must be dropped.
    (tmp_path / "cmn.txt").write_text("".join(f"Yes.\t是{i}\tx\n" for i in range(1500)), encoding="utf-8")
    C.build_cmn_eng(tmp_path / "cmn.txt", tmp_path)
    assert all((tmp_path / f"{s}.en").read_text() == "" for s in ("train", "valid", "test"))


def test_extract_segments(tmp_path):
    xml = ('<?xml version="1.0" encoding="UTF-8"?>\n<mteval><doc docid="1">\n<title>not a seg</title>\n'
           '<seg id="1"> Tom &amp; Jerry said &quot;hi&quot;. </seg>\n<seg id="2">两行\n文字 </seg>\n</doc></mteval>\n')
    (tmp_path / "a.xml").write_text(xml, encoding="utf-8")
    assert C.extract_segments(tmp_path / "a.xml") == [("1", 'Tom & Jerry said "hi".'), ("2", "两行\n文字")]


def test_build_tang_poems_format(tmp_path):
    corpus = C.Corpus(
        name="t", kind="text", languages=("zh",), splits=(), files=(), description="", source="", license="",
        downloads=(C.Download("u0", "poet.tang.0.json"), C.Download("u1", "poet.tang.1000.json")), build="tang",
    )
    raw, out = tmp_path / "raw", tmp_path / "out"
    raw.mkdir(), out.mkdir()
    poems0 = [{"title": " 靜夜思 ", "author": "李白", "paragraphs": ["床前明月光，疑是地上霜。 ", "舉頭望明月，低頭思故鄉。"]},
              {"title": "空", "author": "無名", "paragraphs": []}]
    poems1 = [{"title": "春曉", "author": "孟浩然", "paragraphs": ["春眠不覺曉，處處聞啼鳥。"]}]
    (raw / "poet.tang.0.json").write_text(json.dumps(poems0, ensure_ascii=False), encoding="utf-8")
    (raw / "poet.tang.1000.json").write_text(json.dumps(poems1, ensure_ascii=False), encoding="utf-8")
    C._BUILDERS["tang"](corpus, raw, out)
    assert (out / "input.txt").read_text(encoding="utf-8") == (
        "靜夜思\n李白\n床前明月光，疑是地上霜。\n舉頭望明月，低頭思故鄉。\n\n春曉\n孟浩然\n春眠不覺曉，處處聞啼鳥。\n"
    )
