"""The explorer's figure constants, read from ``static/constants.js``: one file for Python and JavaScript.

The page loads ``constants.js`` as a script (an exported page must work from ``file://``, where
``fetch()`` does not); Python reads the same file as JSON: the object from the line that assigns it
(``globalThis.QKVConstants = {``) to the last closing brace. The other data files of the page
(catalog.js, practice.js, table3.js) are read the same way.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

STATIC_DIR = Path(__file__).resolve().parent / "static"  # the page's files
CONSTANTS_FILE = STATIC_DIR / "constants.js"
_ASSIGNMENT = re.compile(r"^globalThis\.\w+ = (?=\{)", re.MULTILINE)  # the line the object starts on


def load_constants(path: Path = CONSTANTS_FILE) -> dict[str, Any]:
    """The object a page file such as ``constants.js`` assigns to its global (``globalThis.QKVConstants``)."""
    text = path.read_text(encoding="utf-8")
    start = _ASSIGNMENT.search(text)
    if start is None:
        raise ValueError(f"{path}: no line 'globalThis.NAME = {{...}};' to read")
    return json.loads(text[start.end(): text.rindex("}") + 1])


CONSTANTS = load_constants()

__all__ = ["CONSTANTS", "CONSTANTS_FILE", "STATIC_DIR", "load_constants"]
