"""Check and normalise the attention data that figure 6 of the explorer page draws.

Both ways a model's maps reach the page go through here: the server's ``/api/attention`` (the
output of an ``attention_provider``) and ``export_page(attention_data=...)``. The format is::

    {
      "text": "the input text",                 # optional
      "model_name": "runs/demo",                # optional
      "maps": [
        {
          "name": "encoder self · layer 1",     # shown in a drop-down
          "query_tokens": ["小明", ...],          # T strings (rows)
          "key_tokens": ["小明", ...],            # L strings (columns)
          "weights": [[[...L floats] x T] x H]  # (H, T, L), rows sum to 1 (or are all 0)
        },
        ...
      ]
    }

``weights`` may be a nested list, a numpy array or a torch tensor (anything with ``tolist()``).
"""

from __future__ import annotations

import math
from typing import Any

MAX_WEIGHTS = 2_000_000  # Floats in one payload: a page that draws more would freeze the browser.
MAX_MAPS = 512
ROW_SUM_TOL = 1e-3
DECIMALS = 5  # Enough for a heat map; keeps the JSON small.


class AttentionDataError(ValueError):
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
    unknown = set(data) - {"text", "model_name", "maps"}
    if unknown:
        raise AttentionDataError(
            f"unknown key(s) in attention data: {sorted(unknown)}; expected text, model_name, maps"
        )
    out: dict = {}
    for key in ("text", "model_name"):
        if key in data and data[key] is not None:
            if not isinstance(data[key], str):
                raise AttentionDataError(f"{key} must be a string")
            out[key] = data[key]
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
                # A fully masked row is all zeros (DESIGN: masks never give NaN); others sum to 1.
                if abs(row_sum - 1.0) > ROW_SUM_TOL and abs(row_sum) > ROW_SUM_TOL:
                    raise AttentionDataError(f"{rw} sums to {row_sum:.6f}, not 1 (softmax rows)")
                rows.append(clean)
            heads.append(rows)
        out["maps"].append(
            {"name": m["name"], "query_tokens": q_tok, "key_tokens": k_tok, "weights": heads}
        )
    return out
