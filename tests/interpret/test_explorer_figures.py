"""The explorer's Python reference formulas (figures 1-5) and the claims the page's captions make."""

import itertools
import math

import figures_reference as F  # tests/interpret/figures_reference.py (conftest.py makes it importable)
import numpy as np
import pytest
import torch

import qkv.interpret.explorer


def test_softmax_rows_sum_to_one_and_match_torch():
    scores = np.random.default_rng(0).normal(size=(6, 7)) * 10
    w = F.softmax(scores)
    np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-12)
    np.testing.assert_allclose(w, torch.softmax(torch.tensor(scores), dim=-1).numpy(), atol=1e-12)


@pytest.mark.parametrize("seed", range(20))
def test_round_percents_sum_to_exactly_100(seed):
    w = F.softmax(np.random.default_rng(seed).normal(size=1 + seed % 9) * 3)
    shown = F.round_percents(w, 1)
    assert round(sum(shown) * 10) == 1000
    assert all(abs(s - 100 * x) <= 0.1 + 1e-9 for s, x in zip(shown, w))


def test_round_percents_thirds():
    assert F.round_percents([1 / 3, 1 / 3, 1 / 3], 1) == [33.4, 33.3, 33.3]


def test_mulberry32_uniform_and_gaussians_standard():
    rand = F.mulberry32(123)
    u = np.array([rand() for _ in range(20000)])
    assert u.min() >= 0.0 and u.max() < 1.0
    assert abs(u.mean() - 0.5) < 0.01
    z = F.gaussians(7, 20000)
    assert abs(z.mean()) < 0.03 and abs(z.var() - 1.0) < 0.05
    # Same seed, same numbers; another seed, other numbers.
    np.testing.assert_array_equal(F.gaussians(7, 10), z[:10])
    assert not np.allclose(F.gaussians(8, 10), z[:10])


# ---------------------------------------------------------------- figure 1


def test_figure1_default_query_points_at_xiaoming_with_the_articles_57_percent():
    r = F.figure1()
    assert F.TOKENS[int(np.argmax(r["weights"]))] == "小明"
    assert F.round_percents(r["weights"], 1)[0] == 57.0  # the first article: 小明 gets 57%
    np.testing.assert_allclose(r["weights"].sum(), 1.0, atol=1e-12)
    np.testing.assert_allclose(r["scores"], F.FIG1_KEYS @ F.FIG1_QUERY / math.sqrt(2))
    # 他's own value lies near the origin; the output is pulled to 小明's value, inside the hull.
    he = F.QUERY_TOKEN
    assert np.linalg.norm(F.FIG1_VALUES[he]) < 0.25
    dists = np.linalg.norm(F.FIG1_VALUES - r["output"], axis=1)
    assert int(np.argmin(dists)) == 0
    assert F.in_convex_hull(r["output"], F.convex_hull(F.FIG1_VALUES))


def test_one_toy_world_figure3_row_3_is_figure1s_he():
    """Figures 1 and 3 share the embeddings and projections: row 3 of the table is figure 1's 他."""
    fig3 = F.figure3()
    he = F.QUERY_TOKEN
    assert he == 2 and F.TOKENS[he] == "他"
    np.testing.assert_allclose(fig3["Q"][he], F.FIG1_QUERY, atol=1e-12)
    np.testing.assert_allclose(fig3["K"], F.FIG1_KEYS, atol=1e-12)
    np.testing.assert_allclose(fig3["weights"][he], F.figure1()["weights"], atol=1e-12)
    # Figure 4's head 1 values are figure 1's values of 小明 and 累了.
    np.testing.assert_allclose(F.FIG4_HEAD_VALUES[0], F.FIG1_VALUES[:2], atol=1e-12)
    np.testing.assert_allclose(F.FIG4_ONE_HEAD_VALUES, F.FIG1_VALUES[:2], atol=1e-12)


def test_figure1_output_never_leaves_hull_of_values():
    hull = F.convex_hull(F.FIG1_VALUES)
    # Hull vertices are value points, and every value lies in the hull.
    assert all(any(np.allclose(h, v) for v in F.FIG1_VALUES) for h in hull)
    assert all(F.in_convex_hull(v, hull) for v in F.FIG1_VALUES)
    rng = np.random.default_rng(0)
    for _ in range(500):
        q = rng.normal(size=2) * rng.choice([0.1, 1.0, 5.0, 50.0])
        assert F.in_convex_hull(F.figure1(q)["output"], hull)


def test_in_convex_hull_rejects_outside_point():
    hull = F.convex_hull(F.FIG1_VALUES)
    assert not F.in_convex_hull([3.0, 3.0], hull)
    assert not F.in_convex_hull(F.FIG1_VALUES.mean(axis=0) + [0, 5], hull)


def test_longer_query_sharpens_shorter_flattens():
    base = F.figure1(F.FIG1_QUERY)["weights"].max()
    assert F.figure1(2 * F.FIG1_QUERY)["weights"].max() > base
    assert F.figure1(0.5 * F.FIG1_QUERY)["weights"].max() < base
    np.testing.assert_allclose(F.figure1(np.zeros(2))["weights"], 0.2)


def test_clamp_norm():
    np.testing.assert_allclose(np.hypot(*F.clamp_norm([30.0, 40.0])), F.FIG1_MAX_QUERY_NORM)
    np.testing.assert_array_equal(F.clamp_norm([1.0, 1.0]), [1.0, 1.0])


# ---------------------------------------------------------------- figure 2


def test_figure2_default_draw_gives_the_articles_numbers_at_dk64():
    r = F.figure2(F.FIG2_DEFAULT_SEED, 64)
    assert r["max_unscaled"] >= 0.99  # the article: 99% on one key, unscaled
    top3 = sorted(r["scaled"], reverse=True)[:3]
    assert [round(100 * w) for w in top3] == [39, 22, 16]  # the article: 39%, 22%, 16%, ... scaled
    assert int(np.argmax(r["scaled"])) == int(np.argmax(r["unscaled"]))  # the same key leads both
    assert r["expected_std"] == 8.0  # sqrt(64)
    np.testing.assert_allclose(r["unscaled"].sum(), 1.0, atol=1e-12)
    np.testing.assert_allclose(r["scaled"].sum(), 1.0, atol=1e-12)
    # The keys are named by tokens; the leading one is 小明.
    assert F.TOKENS[F.FIG2_KEY_TOKENS[int(np.argmax(r["scaled"]))]] == "小明"


def test_figure2_a_larger_dk_grows_the_same_vectors_and_the_spike_never_falls():
    previous = None
    for d in F.FIG2_DK_CHOICES:
        q, k = F.random_qk(F.FIG2_DEFAULT_SEED, d)
        if previous is not None:
            np.testing.assert_array_equal(q[: len(previous[0])], previous[0])  # the same vectors, more dims
            np.testing.assert_array_equal(k[:, : previous[1].shape[1]], previous[1])
        previous = (q, k)
    spikes = [F.figure2(F.FIG2_DEFAULT_SEED, d)["max_unscaled"] for d in F.FIG2_DK_CHOICES]
    assert all(b >= a for a, b in zip(spikes, spikes[1:])), spikes


def test_figure2_scaling_statistics_over_seeds():
    # The footnote's argument: q.k has variance d_k; divided by sqrt(d_k) it has variance 1.
    for d_k in (16, 64, 512):
        dots = np.concatenate([F.figure2(s, d_k)["dots"] for s in range(100)])
        assert abs(dots.var() / d_k - 1.0) < 0.2
    mean_max = lambda key: np.mean([F.figure2(s, 64)[key] for s in range(60)])  # noqa: E731
    assert mean_max("max_unscaled") > 0.8 > 0.5 > mean_max("max_scaled")


def test_random_qk_shapes_and_order():
    q, k = F.random_qk(3, 16)
    assert q.shape == (16,) and k.shape == (F.FIG2_N_KEYS, 16)
    z = F.gaussians(3, F.FIG2_MAX_DK * (F.FIG2_N_KEYS + 1))
    np.testing.assert_array_equal(q, z[:16])
    np.testing.assert_array_equal(k[1], z[2 * F.FIG2_MAX_DK: 2 * F.FIG2_MAX_DK + 16])


# ---------------------------------------------------------------- figure 3


def test_figure3_matches_torch_attention_weights():
    x = torch.tensor(F.TOY_EMBEDDINGS)
    q, k = x @ torch.tensor(F.TOY_W_Q), x @ torch.tensor(F.TOY_W_K)
    expected = torch.softmax(q @ k.T / math.sqrt(2), dim=-1).numpy()
    fig = F.figure3()
    np.testing.assert_allclose(fig["weights"], expected, atol=1e-12)
    np.testing.assert_allclose(fig["weights"].sum(axis=1), 1.0, atol=1e-12)


def test_figure3_story_and_asymmetry():
    fig = F.figure3()
    he, xiaoming = F.TOKENS.index("他"), F.TOKENS.index("小明")
    assert int(np.argmax(fig["weights"][he])) == xiaoming
    assert abs(fig["weights"][he, xiaoming] - fig["weights"][xiaoming, he]) > 0.2
    assert not np.allclose(fig["scores"], fig["scores"].T)


def test_dot_product_terms_add_up_to_the_score():
    fig = F.figure3()
    for i, j in itertools.product(range(5), repeat=2):
        t = F.dot_product_terms(i, j)
        np.testing.assert_allclose(t["products"], t["q"] * t["k"])
        np.testing.assert_allclose(t["score"], fig["scores"][i, j], atol=1e-12)


# ---------------------------------------------------------------- figure 4


def test_one_head_output_stays_on_the_segment():
    v1, v2 = F.FIG4_ONE_HEAD_VALUES
    span = np.linalg.norm(v1 - v2)
    for a in np.linspace(0, 1, 21):
        o = F.one_head_output(a)
        # On the segment: the two distances add up to its length, so o is never near both values.
        np.testing.assert_allclose(np.linalg.norm(o - v1) + np.linalg.norm(o - v2), span, atol=1e-12)
        assert max(np.linalg.norm(o - v1), np.linalg.norm(o - v2)) >= span / 2 - 1e-12


def test_two_heads_each_sit_near_their_own_value_and_survive_concat():
    out = F.two_head_output(*F.FIG4_DEFAULT_HEAD_SPLITS)
    hv = F.FIG4_HEAD_VALUES
    assert np.linalg.norm(out["heads"][0] - hv[0, 0]) < 0.2  # head 1 on 小明
    assert np.linalg.norm(out["heads"][1] - hv[1, 1]) < 0.2  # head 2 on 累了
    np.testing.assert_array_equal(out["concat"], np.concatenate(out["heads"]))


# ---------------------------------------------------------------- figure 5


def test_sinusoidal_pe_matches_paper_formula_in_torch():
    d = F.FIG5_D_MODEL
    pos = torch.arange(50, dtype=torch.float64)[:, None]
    div = torch.exp(torch.arange(0, d, 2, dtype=torch.float64) * (-math.log(10000.0) / d))
    pe = torch.zeros(50, d, dtype=torch.float64)
    pe[:, 0::2], pe[:, 1::2] = torch.sin(pos * div), torch.cos(pos * div)
    ours = np.stack([F.sinusoidal_pe(p) for p in range(50)])
    np.testing.assert_allclose(ours, pe.numpy(), atol=1e-12)


@pytest.mark.parametrize("k", [0, 1, 5, 17])
def test_clock_turn_is_independent_of_position(k):
    shift = F.shift_angles(k)
    for pos in (0, 3, 11, 42, 99):
        turned = F.clock_angles(pos + k) - F.clock_angles(pos)
        # Compare angles on the circle (wrap-around safe).
        np.testing.assert_allclose(np.cos(turned), np.cos(shift), atol=1e-9)
        np.testing.assert_allclose(np.sin(turned), np.sin(shift), atol=1e-9)
    # The same rotation matrix maps every (sin, cos) pair at pos to pos + k (Section 3.5).
    w = F.clock_frequencies()
    for i, wi in enumerate(w):
        c, s = math.cos(k * wi), math.sin(k * wi)
        rot = np.array([[c, s], [-s, c]])  # acts on (sin, cos)
        for pos in (0, 7, 63):
            pair = F.sinusoidal_pe(pos)[2 * i : 2 * i + 2]
            np.testing.assert_allclose(rot @ pair, F.sinusoidal_pe(pos + k)[2 * i : 2 * i + 2], atol=1e-9)


def test_clock_steps_per_turn_are_the_articles_6_and_twenty_thousand_odd():
    steps = F.steps_per_turn()
    assert round(steps[0], 1) == 6.3  # "6 steps a turn"
    assert round(steps[-1]) == 19869  # "twenty thousand-odd steps a turn" at d_model 16
    np.testing.assert_allclose(steps, 2 * np.pi / F.clock_frequencies())
    assert all(abs(x) <= 1 for p in range(100) for x in F.sinusoidal_pe(p))  # values in [-1, 1]


def test_table_cost_is_n_squared():
    assert F.table_cost(1000) == {"scores": 1_000_000, "bytes": 4_000_000}
    assert F.table_cost(10, heads=48)["scores"] == 4800


def test_clock_angles_start_at_twelve_and_turn_clockwise():
    np.testing.assert_allclose(F.clock_angles(0), 0.0)
    assert 0 < F.clock_angles(1)[0] < math.pi  # sin > 0: the hand moved right (clockwise)


@pytest.mark.parametrize("i,j", list(itertools.combinations(range(5), 2)))
def test_swapping_tokens_only_reorders_without_pe(i, j):
    assert F.word_order_change(i, j, use_pe=False) < 1e-12
    assert F.word_order_change(i, j, use_pe=True) > 0.05


def test_word_order_outputs_are_a_permutation_without_pe():
    order = list(range(5))
    after = F.swapped(order, 0, 2)
    before_out = F.word_order_outputs(order, False)
    np.testing.assert_allclose(F.word_order_outputs(after, False), before_out[after], atol=1e-12)
    assert not np.allclose(F.word_order_outputs(after, True), F.word_order_outputs(order, True)[after])


def test_the_figure_constants_live_once_in_constants_js():
    """Python's figures and the page read one file; neither holds a copy of its numbers."""
    import re
    from pathlib import Path

    from qkv.interpret.capture import KINDS as capture_kinds
    from qkv.interpret.explorer.constants import CONSTANTS
    from qkv.interpret.explorer.payload import KINDS

    static = Path(qkv.interpret.explorer.__file__).parent / "static"
    for name, value in CONSTANTS.items():
        if hasattr(F, name):
            assert np.asarray(getattr(F, name)).tolist() == value, name
    assert list(KINDS) == list(capture_kinds) == CONSTANTS["KINDS"]
    for js in ("figures.js", "paper.js", "article.js", "model_view.js", "draw.js", "explorer.js"):
        text = (static / js).read_text(encoding="utf-8")
        assert not re.search(r"var (FIG\d|TOY)_\w+ = \[[\s\[]*-?\d", text), js  # a literal array: a second copy
    assert re.search(r"TOY_EMBEDDINGS = np\.array\(_C\[", Path(F.__file__).read_text(encoding="utf-8"))
