"""The wheel carries what an installed qkv needs: its recipes, the explorer's page, py.typed."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation",
                           "-q", "-w", str(out)], capture_output=True, text=True)
    if proc.returncode:
        pytest.skip(f"cannot build a wheel here: {proc.stderr.strip()[-300:]}")
    return next(out.glob("qkv-*.whl"))


def test_the_wheel_ships_the_recipes_and_the_page(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for recipe in sorted((ROOT / "qkv" / "recipes").rglob("*.yaml")):
        assert str(recipe.relative_to(ROOT)) in names, recipe.name
    for page in sorted((ROOT / "qkv" / "interpret" / "explorer" / "static").iterdir()):
        assert str(page.relative_to(ROOT)) in names, page.name
    assert "qkv/py.typed" in names  # type checkers read qkv's annotations (PEP 561)
    assert "qkv/cli/__init__.py" in names and not any(n.startswith(("tests/", "bench/")) for n in names)
