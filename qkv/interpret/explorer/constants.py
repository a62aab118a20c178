"""The explorer's figure constants, read from ``static/constants.js``: one file for Python and JavaScript.

The page loads ``constants.js`` as a script (an exported page must work from ``file://``, where
``fetch()`` does not); Python reads the same file as JSON, the text between its first opening brace
and its last closing one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CONSTANTS_FILE = Path(__file__).resolve().parent / "static" / "constants.js"


def load_constants(path: Path = CONSTANTS_FILE) -> dict[str, Any]:
    """The object ``constants.js`` assigns to ``globalThis.QKVConstants``."""
    text = path.read_text(encoding="utf-8")
    return json.loads(text[text.index("{"): text.rindex("}") + 1])


CONSTANTS = load_constants()

__all__ = ["CONSTANTS", "CONSTANTS_FILE", "load_constants"]
