"""The benchmarks' peers run the task they are timed on.

A benchmark that raises for one peer times nothing for it; the beam benchmark's HF branch once read a
name that a refactor had removed, and no test noticed. Each implementation of bench/beam_mt.py runs
one search here (the small model: about a second each), and bench/poem_form.py's count of a regular line
is held to real ones.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "bench"


def bench_module(name: str):
    """bench/NAME.py as a module (the benchmarks import their siblings from bench/ itself)."""
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module


@pytest.mark.parametrize("impl, needs", [("qkv", None), ("qkv-int8", None), ("marian", "transformers"),
                                         ("ct2", "ctranslate2")])
def test_every_beam_search_peer_decodes_the_benchmarks_sources(impl, needs, tmp_path, monkeypatch):
    if needs:
        pytest.importorskip(needs)
    monkeypatch.setenv("QKV_KERNEL_CACHE", str(tmp_path / "kernels.json"))
    beam_mt = bench_module("beam_mt")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run = beam_mt.searches(impl, "small")
        with torch.inference_mode():
            run()  # each peer asserts its own output: 16 sources, 30 tokens each
    finally:
        torch.set_num_threads(n)


def test_a_regular_line_of_a_tang_poem_is_two_halves_of_five_or_seven():
    form = bench_module("poem_form").form
    assert form(["春眠不覺曉，處處聞啼鳥。", "夜來風雨聲，花落知多少。"]) == {"regular": True, "even": True}
    assert form(["朝辭白帝彩雲間，千里江陵一日還。", "兩岸猿聲啼不住，輕舟已過萬重山。"])["regular"]
    assert form(["白日依山盡，黃河入海流。", "欲窮千里目，更上一層樓。", ""])["regular"]  # a blank line is no line
    assert not form(["白日依山盡，黃河入海流。", "欲窮千里目，更上一層樓"])["regular"]  # no 。
    assert not form(["白日依山盡，千里江陵一日還。"])["regular"]  # halves of two lengths
    assert form(["春風正暖，秋日欲歸。"]) == {"regular": False, "even": True}  # four characters a half
    assert not form([])["regular"] and not form([])["even"]
