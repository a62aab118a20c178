"""``figures_reference``, the Python reference of the page's figures.js (only tests use it, so it lives here
and not in the package), importable by that name in these tests. The tiny runs they use (``mt_run``,
``gpt_run``) are tests/conftest.py's."""

import importlib.util
import sys
from pathlib import Path

_spec = importlib.util.spec_from_file_location("figures_reference", Path(__file__).with_name("figures_reference.py"))
sys.modules["figures_reference"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sys.modules["figures_reference"])
