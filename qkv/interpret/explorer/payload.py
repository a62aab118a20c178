"""Check and normalise the attention data that the explorer page's model figure draws.

Both ways a model's maps reach the page go through here: the server's ``/api/attention`` (the
output of an ``attention_provider``) and ``export_page(attention_data=...)``. The format is::

    {
      "text": "the input text",                 # optional
      "output": "the translation",              # optional: translation or continuation
      "off": [["cross", 1, 0]],                 # optional: the heads switched off (kind, layer, head)
      "output_all_heads": "...",                # optional, with "off": the output with every head on
      "pronoun_head": {"kind": "cross", "layer": 1, "head": 0, "share": 1.0, "n": 600, "share_two": 1.0},
                                                # optional: the head `qkv explain` found; the view opens on it
      "model_name": "runs/demo",                # optional
      "maps": [
        {
          "name": "encoder self · layer 1",     # a readable label
          "kind": "encoder_self",               # optional: encoder_self, decoder_self, cross or self
          "layer": 1,                           # optional: the layer's index (>= 0)
          "query_tokens": ["小明", ...],          # T strings (rows)
          "key_tokens": ["小明", ...],            # L strings (columns)
          "weights": [[[...L floats] x T] x H]  # (H, T, L), rows sum to 1 (or are all 0)
        },
        ...
      ]
    }

``weights`` may be a nested list, a numpy array or a torch tensor (anything with ``tolist()``).
The page groups maps by ``kind`` and ``layer``; without them it reads both from ``name``.
"""

from __future__ import annotations

import math
from typing import Any

from qkv.errors import QkvError
from qkv.interpret.explorer.constants import CONSTANTS

MAX_TEXT_CHARS = 500  # Longest text a model's maps are computed for (server, CLI and model_maps alike).
MAX_WEIGHTS = 2_000_000  # Floats in one payload: a page that draws more would freeze the browser.
MAX_MAPS = 512
MAX_LAYER = 10_000
MAX_STRING_CHARS = 20_000  # text, output, model_name: far above any input the server accepts.
ROW_SUM_TOL = 1e-3
# float32 weights carry ~7 significant digits: 7 decimals keep what the model computed (the page
# draws line opacities equal to the weights) at ~10 characters a number.
DECIMALS = 7
KINDS: tuple[str, ...] = tuple(CONSTANTS["KINDS"])  # static/constants.js, which the page reads too
TEXT_KEYS = ("text", "output", "model_name", "output_all_heads")


class AttentionDataError(QkvError, ValueError):
    """The attention data does not have the documented format."""


def _as_list(value: Any) -> Any:
    if hasattr(value, "detach"):  # torch tensor: avoid importing torch here.
        value = value.detach().cpu()
    if hasattr(value, "tolist"):
        return value.tolist()
    return value


def _tokens(value: Any, where: str) -> list[str]:
    value = _as_list(value)
    if not isinstance(value, (list, tuple)) or not all(isinstance(t, str) for t in value):
        raise AttentionDataError(f"{where} must be a list of strings")
    return list(value)


def normalize_attention_data(data: Any) -> dict:
    """Validate attention data and return a JSON-ready copy (plain lists, rounded floats).

    Args:
        data: A dict in the format of this module's docstring.

    Returns:
        A new dict with ``maps`` (and ``text`` / ``model_name`` when given) ready for ``json.dumps``.

    Raises:
        AttentionDataError: naming the first offending key (e.g. ``maps[2].weights[0][3]``).
    """
    if not isinstance(data, dict):
        raise AttentionDataError(f"attention data must be a dict, got {type(data).__name__}")
    unknown = set(data) - {*TEXT_KEYS, "maps", "off", "pronoun_head"}
    if unknown:
        raise AttentionDataError(
            f"unknown key(s) in attention data: {sorted(unknown)}; expected {', '.join(TEXT_KEYS)}, maps"
        )
    out: dict = {}
    for key in TEXT_KEYS:
        if key in data and data[key] is not None:
            if not isinstance(data[key], str):
                raise AttentionDataError(f"{key} must be a string")
            if len(data[key]) > MAX_STRING_CHARS:
                raise AttentionDataError(f"{key} has {len(data[key])} characters; the limit is {MAX_STRING_CHARS}")
            out[key] = data[key]
    if data.get("off"):
        out["off"] = _heads(data["off"])
    if data.get("pronoun_head") is not None:
        out["pronoun_head"] = _pronoun_head(data["pronoun_head"])
    maps = data.get("maps")
    if not isinstance(maps, (list, tuple)) or not maps:
        raise AttentionDataError("maps must be a non-empty list")
    if len(maps) > MAX_MAPS:
        raise AttentionDataError(f"too many maps ({len(maps)}, limit {MAX_MAPS})")
    total = 0
    out["maps"] = []
    for m_idx, m in enumerate(maps):
        where = f"maps[{m_idx}]"
        if not isinstance(m, dict):
            raise AttentionDataError(f"{where} must be a dict")
        missing = {"name", "query_tokens", "key_tokens", "weights"} - set(m)
        if missing:
            raise AttentionDataError(f"{where} is missing {sorted(missing)}")
        if not isinstance(m["name"], str):
            raise AttentionDataError(f"{where}.name must be a string")
        extra = _kind_and_layer(m, where)
        q_tok = _tokens(m["query_tokens"], f"{where}.query_tokens")
        k_tok = _tokens(m["key_tokens"], f"{where}.key_tokens")
        weights = _as_list(m["weights"])
        if not isinstance(weights, list) or not weights:
            raise AttentionDataError(f"{where}.weights must be a non-empty (H, T, L) nested list")
        total += len(weights) * len(q_tok) * len(k_tok)
        if total > MAX_WEIGHTS:
            raise AttentionDataError(
                f"attention data too large (over {MAX_WEIGHTS} weights): use a shorter text"
            )
        heads = []
        for h_idx, head in enumerate(weights):
            hw = f"{where}.weights[{h_idx}]"
            if not isinstance(head, list) or len(head) != len(q_tok):
                raise AttentionDataError(f"{hw} must have {len(q_tok)} rows (one per query token)")
            rows = []
            for r_idx, row in enumerate(head):
                rw = f"{hw}[{r_idx}]"
                if not isinstance(row, list) or len(row) != len(k_tok):
                    raise AttentionDataError(f"{rw} must have {len(k_tok)} weights (one per key)")
                clean = []
                for x in row:
                    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
                        raise AttentionDataError(f"{rw} holds a non-finite or non-number value {x!r}")
                    if x < -1e-6 or x > 1 + 1e-6:
                        raise AttentionDataError(f"{rw} holds {x}, outside [0, 1]")
                    clean.append(round(float(x), DECIMALS))
                row_sum = sum(row)
                # A fully masked row is all zeros (qkv.modules.attention: masks never give NaN); others sum to 1.
                if abs(row_sum - 1.0) > ROW_SUM_TOL and abs(row_sum) > ROW_SUM_TOL:
                    raise AttentionDataError(f"{rw} sums to {row_sum:.6f}, not 1 (softmax rows)")
                rows.append(clean)
            heads.append(rows)
        out["maps"].append(
            {"name": m["name"], **extra, "query_tokens": q_tok, "key_tokens": k_tok, "weights": heads}
        )
    return out


def _heads(value: Any) -> list[list]:
    """``off``: a list of [kind, layer, head]."""
    out = []
    for i, item in enumerate(_as_list(value) if isinstance(value, (list, tuple)) else [None]):
        kind, layer, head = item if isinstance(item, (list, tuple)) and len(item) == 3 else (None, None, None)
        if kind not in KINDS or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in (layer, head)):
            raise AttentionDataError(f"off[{i}] must be [kind, layer, head] with kind one of {', '.join(KINDS)}")
        out.append([kind, layer, head])
    return out


def _pronoun_head(value: Any) -> dict:
    """``pronoun_head``: the head `qkv explain` found, as ``pronouns.json`` names it."""
    wrong = AttentionDataError("pronoun_head must be {kind, layer, head, share, n, share_two} as qkv explain writes")
    if not isinstance(value, dict):
        raise wrong
    try:
        kind, layer, head = _heads([[value.get("kind"), value.get("layer"), value.get("head")]])[0]
    except AttentionDataError:
        raise wrong from None
    share, two = value.get("share"), value.get("share_two")
    if not isinstance(value.get("n"), int) or not all(
            isinstance(x, (int, float)) and 0 <= x <= 1 for x in (share, 0 if two is None else two)):
        raise wrong
    return {"kind": kind, "layer": layer, "head": head, "share": float(share), "n": value["n"],
            "share_two": None if two is None else float(two)}


def _kind_and_layer(m: dict, where: str) -> dict:
    """The optional ``kind`` and ``layer`` of one map, checked (None counts as absent)."""
    extra: dict = {}
    kind = m.get("kind")
    if kind is not None:
        if kind not in KINDS:
            raise AttentionDataError(f"{where}.kind is {kind!r}; expected one of {', '.join(KINDS)}")
        extra["kind"] = kind
    layer = _as_list(m.get("layer"))  # a 0-d tensor or numpy integer becomes a Python int
    if layer is not None:
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer <= MAX_LAYER:
            raise AttentionDataError(f"{where}.layer must be an integer in 0..{MAX_LAYER}, got {layer!r}")
        extra["layer"] = layer
    return extra
