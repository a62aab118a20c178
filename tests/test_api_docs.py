"""docs/api/ is the API reference that ``make api`` writes today (pdoc, from the public names' docstrings)."""

import subprocess
import sys
from pathlib import Path

import pytest

import qkv

ROOT = Path(__file__).resolve().parents[1]


def test_docs_api_is_up_to_date(tmp_path):
    pytest.importorskip("pdoc", reason="pdoc (the dev extras) is not installed")
    bin_dir = Path(sys.executable).parent
    subprocess.run(["make", "-s", "api", f"API_OUT={tmp_path}", f"BIN={bin_dir}"], cwd=ROOT, check=True,
                   capture_output=True, timeout=300)
    committed = ROOT / "docs" / "api"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in committed.iterdir())
    for page in tmp_path.iterdir():
        assert page.read_text(encoding="utf-8") == (committed / page.name).read_text(encoding="utf-8"), \
            f"docs/api/{page.name} is stale: run `make api`"


def test_every_public_name_is_documented():
    page = (ROOT / "docs" / "api" / "qkv.html").read_text(encoding="utf-8")
    for name in qkv.__all__:
        if name != "__version__":
            assert f'id="{name}"' in page, name
            assert getattr(qkv, name).__doc__, f"{name} has no docstring"


def test_the_package_says_it_is_typed():
    assert (Path(qkv.__file__).parent / "py.typed").is_file()
