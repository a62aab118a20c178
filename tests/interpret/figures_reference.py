"""Python reference for the numbers the explorer page draws in its attention figures (1, 2, 3, 5 and 7).

The page computes every figure in the browser (``static/figures.js``); this module holds the same
formulas in numpy so that the tests can check the JavaScript against them (within 1e-6) and so that
the claims the captions make (a row of weights sums to 1, the output stays in the convex hull of
the values, a clock turns by the same angle at every position, ...) are asserted in Python.

The constants live once, in ``static/constants.js``, which the page loads and this module reads
(:mod:`qkv.interpret.explorer.constants`).

The sentence of all figures is 小明累了，他想睡觉 ("Xiaoming is tired, he wants to sleep"): the query
of 他 ("he") should find 小明, the classic coreference example.
"""

from __future__ import annotations

import math

import numpy as np

from qkv.interpret.explorer.constants import CONSTANTS

# The constants (static/constants.js, shared with the page's JavaScript), as numpy arrays.
_C = CONSTANTS
TOKENS: tuple[str, ...] = tuple(_C["TOKENS"])
QUERY_TOKEN: int = _C["QUERY_TOKEN"]  # 他: the token whose query figure 1 drags.

# One toy world for figures 1, 3, 4 and 5's word order: embeddings X (5, d_model 4) and projections
# (4, d_k 2). Figure 1's keys and values are rows of XW^K and XW^V, its query x(他)W^Q; figure 3's
# table is built from the same Q and K, so its row 3 is figure 1's 他.
TOY_EMBEDDINGS = np.array(_C["TOY_EMBEDDINGS"], dtype=np.float64)  # X: (5, d_model=4)
TOY_W_Q = np.array(_C["TOY_W_Q"], dtype=np.float64)  # (4, d_k=2)
TOY_W_K = np.array(_C["TOY_W_K"], dtype=np.float64)  # (4, d_k=2)
TOY_W_V = np.array(_C["TOY_W_V"], dtype=np.float64)  # (4, d_v=2)
TOY_W_V2 = np.array(_C["TOY_W_V2"], dtype=np.float64)  # (4, d_v=2): figure 4's second head

# Figure 1: one query against five 2-D keys (Section 3.2.1).
FIG1_KEYS = TOY_EMBEDDINGS @ TOY_W_K  # (5, 2)
FIG1_VALUES = TOY_EMBEDDINGS @ TOY_W_V  # (5, 2)
FIG1_QUERY = TOY_EMBEDDINGS[QUERY_TOKEN] @ TOY_W_Q  # (2,): 他's query, the starting arrow
FIG1_MAX_QUERY_NORM: float = _C["FIG1_MAX_QUERY_NORM"]  # the arrow can be dragged this far (the plot spans +-4)

# Figure 2: why divide by sqrt(d_k) (Section 3.2.1, footnote 4): one draw of a query and keys of
# FIG2_MAX_DK components; a d_k takes the first d_k of each.
FIG2_DEFAULT_SEED: int = _C["FIG2_DEFAULT_SEED"]
FIG2_N_KEYS: int = _C["FIG2_N_KEYS"]
FIG2_KEY_TOKENS: tuple[int, ...] = tuple(_C["FIG2_KEY_TOKENS"])  # each key's label, a token index
FIG2_MAX_DK: int = _C["FIG2_MAX_DK"]
FIG2_DK_CHOICES: tuple[int, ...] = tuple(_C["FIG2_DK_CHOICES"])
FIG2_DEFAULT_DK: int = _C["FIG2_DEFAULT_DK"]

# Figure 4: one head or two (Section 3.2.2): 小明 and 累了's values, in head 1 (figure 1's) and head 2.
FIG4_ONE_HEAD_VALUES = FIG1_VALUES[:2]  # (2 tokens, 2)
FIG4_HEAD_VALUES = np.stack([FIG1_VALUES[:2], (TOY_EMBEDDINGS @ TOY_W_V2)[:2]])  # (H=2, 2 tokens, 2)
FIG4_DEFAULT_SPLIT: float = _C["FIG4_DEFAULT_SPLIT"]  # one head: share of attention on 小明
FIG4_DEFAULT_HEAD_SPLITS: tuple[float, ...] = tuple(_C["FIG4_DEFAULT_HEAD_SPLITS"])  # head 1 on 小明, head 2 on 累了

# Figure 5: positions as clocks (Section 3.5).
FIG5_D_MODEL: int = _C["FIG5_D_MODEL"]  # 8 (sin, cos) pairs = 8 clocks
FIG5_MAX_POS: int = _C["FIG5_MAX_POS"]
FIG5_WORD_ORDER_D_MODEL: int = TOY_EMBEDDINGS.shape[1]  # the toy world's width

# The table's cost.
COST_BYTES_PER_SCORE: int = _C["COST_BYTES_PER_SCORE"]


# ----------------------------------------------------------------------------------------------
# Shared pieces
# ----------------------------------------------------------------------------------------------


def softmax(scores: np.ndarray) -> np.ndarray:
    """Softmax over the last axis, stable (the maximum is subtracted first).

    Args:
        scores: Array (..., n) of real scores.

    Returns:
        Array of the same shape whose last axis sums to 1.
    """
    s = np.asarray(scores, dtype=np.float64)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def round_percents(weights, decimals: int = 1) -> list[float]:
    """Round weights to percentages that add up to exactly 100 (largest remainder).

    Rounding each weight on its own can show 33.3 + 33.3 + 33.3 = 99.9; the page labels bars with
    these numbers, so they are made to sum to 100 by giving the leftover units to the largest
    remainders (ties go to the earlier token).

    Args:
        weights: Non-negative weights summing to 1.
        decimals: Decimals shown.

    Returns:
        Percentages, one per weight, summing to 100 (in units of 10**-decimals).
    """
    unit = 10**decimals
    scaled = [float(w) * 100.0 * unit for w in weights]
    floors = [math.floor(x) for x in scaled]
    left = 100 * unit - sum(floors)
    order = sorted(range(len(scaled)), key=lambda i: (-(scaled[i] - floors[i]), i))
    for i in order[: max(0, left)]:
        floors[i] += 1
    return [f / unit for f in floors]


def mulberry32(seed: int):
    """The mulberry32 generator, bit for bit as in ``figures.js`` (32-bit integer arithmetic).

    Args:
        seed: Any integer; only its low 32 bits are used.

    Returns:
        A function that returns the next float in [0, 1) on each call.
    """
    state = seed & 0xFFFFFFFF
    mask = 0xFFFFFFFF

    def nxt() -> float:
        nonlocal state
        state = (state + 0x6D2B79F5) & mask
        t = ((state ^ (state >> 15)) * (1 | state)) & mask
        t = ((t + (((t ^ (t >> 7)) * (61 | t)) & mask)) & mask) ^ t
        return ((t ^ (t >> 14)) & mask) / 4294967296.0

    return nxt


def gaussians(seed: int, n: int) -> np.ndarray:
    """n standard normal numbers from mulberry32 through Box-Muller (one normal per pair of draws).

    Args:
        seed: PRNG seed.
        n: How many numbers.

    Returns:
        Array (n,) of float64.
    """
    rand = mulberry32(seed)
    out = np.empty(n, dtype=np.float64)
    for i in range(n):
        u1 = 1.0 - rand()  # In (0, 1]: log(0) is avoided.
        u2 = rand()
        out[i] = math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)
    return out


# ----------------------------------------------------------------------------------------------
# Figure 1
# ----------------------------------------------------------------------------------------------


def attend(query, keys, values) -> dict:
    """One query attends over keys and values: scores q.k / sqrt(d), softmax, weighted average.

    Args:
        query: Vector (d,).
        keys: Array (n, d).
        values: Array (n, d_v).

    Returns:
        Dict with ``scores`` (n,), ``weights`` (n,) summing to 1 and ``output`` (d_v,).
    """
    q = np.asarray(query, dtype=np.float64)
    k = np.asarray(keys, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    scores = k @ q / math.sqrt(q.shape[0])  # (n,)
    weights = softmax(scores)
    return {"scores": scores, "weights": weights, "output": weights @ v}


def figure1(query=FIG1_QUERY) -> dict:
    """Figure 1's numbers for a given query of 他 (defaults to the starting arrow)."""
    return attend(query, FIG1_KEYS, FIG1_VALUES)


def clamp_norm(vec, max_norm: float = FIG1_MAX_QUERY_NORM) -> np.ndarray:
    """Shorten ``vec`` to ``max_norm`` if it is longer (the dragged arrow stays on the plot)."""
    v = np.asarray(vec, dtype=np.float64)
    n = float(np.hypot(*v))
    return v * (max_norm / n) if n > max_norm else v


def convex_hull(points) -> np.ndarray:
    """Convex hull by Andrew's monotone chain, counter-clockwise, no repeated first point.

    Args:
        points: Array (n, 2).

    Returns:
        Array (m, 2) of hull vertices in counter-clockwise order.
    """
    pts = sorted(map(tuple, np.asarray(points, dtype=np.float64)))
    if len(pts) <= 2:
        return np.array(pts)

    def cross(o, a, b):
        return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])

    lower: list = []
    for p in pts:
        while len(lower) >= 2 and cross(lower[-2], lower[-1], p) <= 0:
            lower.pop()
        lower.append(p)
    upper: list = []
    for p in reversed(pts):
        while len(upper) >= 2 and cross(upper[-2], upper[-1], p) <= 0:
            upper.pop()
        upper.append(p)
    return np.array(lower[:-1] + upper[:-1])


def in_convex_hull(point, hull, tol: float = 1e-9) -> bool:
    """Whether ``point`` lies inside (or on) a counter-clockwise convex polygon."""
    x, y = float(point[0]), float(point[1])
    h = np.asarray(hull, dtype=np.float64)
    for i in range(len(h)):
        (x0, y0), (x1, y1) = h[i], h[(i + 1) % len(h)]
        if (x1 - x0) * (y - y0) - (y1 - y0) * (x - x0) < -tol:
            return False
    return True


# ----------------------------------------------------------------------------------------------
# Figure 2
# ----------------------------------------------------------------------------------------------


def random_qk(seed: int, d_k: int, n_keys: int = FIG2_N_KEYS) -> tuple[np.ndarray, np.ndarray]:
    """A query and n keys with independent N(0, 1) components (the footnote's assumption).

    One draw of FIG2_MAX_DK components per vector (the query first, then the keys), of which d_k are
    used: a larger d_k adds dimensions to the same vectors instead of drawing new ones, as
    ``figures.js`` does.

    Returns:
        (q, K): arrays (d_k,) and (n_keys, d_k).
    """
    if not 1 <= d_k <= FIG2_MAX_DK:
        raise ValueError(f"d_k must be in 1..{FIG2_MAX_DK}, got {d_k}")
    z = gaussians(seed, FIG2_MAX_DK * (n_keys + 1)).reshape(n_keys + 1, FIG2_MAX_DK)
    return z[0, :d_k], z[1:, :d_k]  # (d_k,), (n_keys, d_k)


def figure2(seed: int = FIG2_DEFAULT_SEED, d_k: int = FIG2_DEFAULT_DK) -> dict:
    """Softmax of q.k with and without the 1/sqrt(d_k) scaling.

    q.k is a sum of d_k products of unit variance, so its variance is d_k (Section 3.2.1, footnote
    4): unscaled, the scores spread by sqrt(d_k) and the softmax saturates on one key.

    Returns:
        Dict with ``dots`` (n,), ``unscaled`` and ``scaled`` weights (n,), their maxima
        ``max_unscaled`` and ``max_scaled``, ``dot_std`` (standard deviation of the n dots) and
        ``expected_std`` (sqrt(d_k), the footnote's).
    """
    q, k = random_qk(seed, d_k)
    dots = k @ q  # (n,)
    unscaled = softmax(dots)
    scaled = softmax(dots / math.sqrt(d_k))
    return {
        "dots": dots,
        "unscaled": unscaled,
        "scaled": scaled,
        "max_unscaled": float(unscaled.max()),
        "max_scaled": float(scaled.max()),
        "dot_std": float(dots.std()),
        "expected_std": math.sqrt(d_k),
    }


# ----------------------------------------------------------------------------------------------
# Figure 3
# ----------------------------------------------------------------------------------------------


def figure3() -> dict:
    """The sentence's query, key, score and weight matrices.

    Returns:
        Dict with ``Q`` (5, 2), ``K`` (5, 2), ``scores`` = QK^T / sqrt(d_k) (5, 5) with rows =
        queries and columns = keys, and ``weights`` (5, 5), each row softmaxed. Row QUERY_TOKEN is
        figure 1's starting query against figure 1's keys.
    """
    q = TOY_EMBEDDINGS @ TOY_W_Q  # (5, d_k)
    k = TOY_EMBEDDINGS @ TOY_W_K  # (5, d_k)
    scores = q @ k.T / math.sqrt(q.shape[1])  # (5 queries, 5 keys)
    return {"Q": q, "K": k, "scores": scores, "weights": softmax(scores)}


def dot_product_terms(i: int, j: int) -> dict:
    """What clicking cell (i, j) of figure 3 shows: the products q_i[c] * k_j[c] and their sum."""
    fig = figure3()
    q, k = fig["Q"][i], fig["K"][j]
    products = q * k
    dot = float(products.sum())
    return {
        "q": q,
        "k": k,
        "products": products,
        "dot": dot,
        "score": dot / math.sqrt(q.shape[0]),
    }


# ----------------------------------------------------------------------------------------------
# Figure 4
# ----------------------------------------------------------------------------------------------


def one_head_output(split: float, values=FIG4_ONE_HEAD_VALUES) -> np.ndarray:
    """One head's output with weight ``split`` on the first value: a point on the segment v1-v2."""
    v = np.asarray(values, dtype=np.float64)
    return split * v[0] + (1.0 - split) * v[1]


def two_head_output(split1: float, split2: float, head_values=FIG4_HEAD_VALUES) -> dict:
    """Two heads, each with its own split and values; the outputs are concatenated (Section 3.2.2).

    Returns:
        Dict with ``heads`` (2, 2): each head's 2-D output, and ``concat`` (4,): [o_1; o_2].
    """
    hv = np.asarray(head_values, dtype=np.float64)
    heads = np.stack([one_head_output(split1, hv[0]), one_head_output(split2, hv[1])])  # (2, 2)
    return {"heads": heads, "concat": heads.reshape(-1)}  # (4,)


# ----------------------------------------------------------------------------------------------
# Figure 5
# ----------------------------------------------------------------------------------------------


def clock_frequencies(d_model: int = FIG5_D_MODEL) -> np.ndarray:
    """Angular speed of each (sin, cos) pair: 1 / 10000^(2i / d_model), i = 0 .. d_model/2 - 1."""
    i = np.arange(d_model // 2, dtype=np.float64)
    return 1.0 / np.power(10000.0, 2.0 * i / d_model)


def steps_per_turn(d_model: int = FIG5_D_MODEL) -> np.ndarray:
    """How many positions each hand needs for one whole turn: its wavelength 2 pi * 10000^(2i / d_model).

    At d_model 16 the fastest hand turns in 6.3 steps and the slowest in about 19,869 (Section 3.5:
    "wavelengths form a geometric progression from 2 pi to 10000 * 2 pi").
    """
    return 2.0 * np.pi / clock_frequencies(d_model)


def sinusoidal_pe(pos: int, d_model: int = FIG5_D_MODEL) -> np.ndarray:
    """The paper's encoding: PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...)."""
    angles = pos * clock_frequencies(d_model)
    pe = np.empty(d_model, dtype=np.float64)
    pe[0::2] = np.sin(angles)
    pe[1::2] = np.cos(angles)
    return pe


def clock_angles(pos: int, d_model: int = FIG5_D_MODEL) -> np.ndarray:
    """Each clock hand's angle in radians, clockwise from 12 o'clock, in [0, 2 pi).

    The hand of pair i is the point (x, y) = (sin, cos) of pos * w_i: at pos = 0 every hand points
    up, and it turns clockwise as pos grows.
    """
    pe = sinusoidal_pe(pos, d_model)
    return np.mod(np.arctan2(pe[0::2], pe[1::2]), 2.0 * np.pi)


def shift_angles(k: int, d_model: int = FIG5_D_MODEL) -> np.ndarray:
    """How far each hand turns when the position moves by k, in radians in [0, 2 pi).

    It is k * w_i and does not depend on pos: PE(pos + k) is a rotation of PE(pos) (Section 3.5,
    "PE_{pos+k} can be represented as a linear function of PE_pos").
    """
    return np.mod(k * clock_frequencies(d_model), 2.0 * np.pi)


def self_attention(x, w_q=TOY_W_Q, w_k=TOY_W_K, w_v=TOY_W_V) -> np.ndarray:
    """softmax(QK^T / sqrt(d_k)) V for one sequence x (T, d_model); returns (T, d_v)."""
    x = np.asarray(x, dtype=np.float64)
    q, k, v = x @ w_q, x @ w_k, x @ w_v  # (T, d_k), (T, d_k), (T, d_v)
    return softmax(q @ k.T / math.sqrt(q.shape[1])) @ v


def word_order_outputs(order, use_pe: bool) -> np.ndarray:
    """Self-attention outputs for the tokens in ``order`` (indices into TOKENS), with or without PE.

    Args:
        order: Token indices, one per position.
        use_pe: Add the sinusoidal encoding of each position to its embedding (Section 3.5).

    Returns:
        Array (T, 2): the output at each position.
    """
    x = TOY_EMBEDDINGS[list(order)].copy()  # (T, d_model)
    if use_pe:
        x += np.stack([sinusoidal_pe(p, FIG5_WORD_ORDER_D_MODEL) for p in range(len(order))])
    return self_attention(x)


def swapped(order, i: int, j: int) -> list[int]:
    """``order`` with positions i and j exchanged."""
    out = list(order)
    out[i], out[j] = out[j], out[i]
    return out


def word_order_change(i: int, j: int, use_pe: bool) -> float:
    """Largest change of any token's output when positions i and j are swapped.

    Each token's output after the swap is compared with the same token's output before it. Without
    PE self-attention is permutation-equivariant, so this is 0 (the outputs only move rows); with PE
    it is not.
    """
    order = list(range(len(TOKENS)))
    after_order = swapped(order, i, j)
    before = word_order_outputs(order, use_pe)
    after = word_order_outputs(after_order, use_pe)
    # Row p of `after` holds token after_order[p]; compare it with that token's row of `before`.
    return float(np.abs(after - before[after_order]).max())


# ----------------------------------------------------------------------------------------------
# The table's cost
# ----------------------------------------------------------------------------------------------


def table_cost(n_tokens: int, heads: int = 1) -> dict:
    """What the QK^T table of ``n_tokens`` costs: n^2 scores per head, 4 bytes each in fp32."""
    scores = n_tokens * n_tokens * heads
    return {"scores": scores, "bytes": scores * COST_BYTES_PER_SCORE}
