import math

import pytest
import torch

from qkv.modules.attention import CrossAttention, SelfAttention, causal_mask, combine, padding_mask, scaled_dot_product_attention


def rand_qkv(b=2, h=3, t=5, l=7, dh=8):
    return torch.randn(b, h, t, dh), torch.randn(b, h, l, dh), torch.randn(b, h, l, dh)


def random_mask(b, t, l):
    m = torch.rand(b, 1, t, l) > 0.3
    m[..., 0] = True  # at least one key per row
    return m


@pytest.mark.parametrize("masked", [False, True])
def test_fused_equals_explicit(masked):
    q, k, v = rand_qkv()
    mask = random_mask(2, 5, 7) if masked else None
    fused, _ = scaled_dot_product_attention(q, k, v, mask=mask)
    explicit, w = scaled_dot_product_attention(q, k, v, mask=mask, need_weights=True)
    torch.testing.assert_close(fused, explicit, atol=1e-5, rtol=0)
    assert w.shape == (2, 3, 5, 7)


def test_explicit_is_the_formula():
    q, k, v = rand_qkv()
    ref = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), -1) @ v
    out, _ = scaled_dot_product_attention(q, k, v, need_weights=True)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=0)


def test_causal_with_offset_matches_full():
    # The last T queries of a causal attention over L positions: the cache situation.
    q, k, v = rand_qkv(t=7, l=7)
    full, _ = scaled_dot_product_attention(q, k, v, is_causal=True)
    tail, _ = scaled_dot_product_attention(q[:, :, 4:], k, v, is_causal=True)
    torch.testing.assert_close(tail, full[:, :, 4:], atol=1e-6, rtol=0)
    tail_w, _ = scaled_dot_product_attention(q[:, :, 4:], k, v, is_causal=True, need_weights=True)
    torch.testing.assert_close(tail_w, full[:, :, 4:], atol=1e-5, rtol=0)


def test_rows_sum_to_one_and_output_in_value_range():
    q, k, v = rand_qkv()
    mask = random_mask(2, 5, 7)
    out, w = scaled_dot_product_attention(q, k, v, mask=mask, need_weights=True)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 3, 5))
    assert bool((w[~mask.expand_as(w)] == 0).all()), "masked keys got weight"
    # A weighted average of the values: each coordinate between their min and max.
    vmin, vmax = v.min(dim=2, keepdim=True).values, v.max(dim=2, keepdim=True).values
    assert bool((out >= vmin - 1e-6).all() and (out <= vmax + 1e-6).all())


@pytest.mark.parametrize("need_weights", [False, True])
def test_fully_masked_row_gives_zeros_not_nan(need_weights):
    q, k, v = rand_qkv(b=1, t=3, l=4)
    mask = torch.ones(1, 1, 3, 4, dtype=torch.bool)
    mask[0, 0, 1] = False  # query 1 may attend nothing
    out, w = scaled_dot_product_attention(q, k, v, mask=mask, need_weights=need_weights)
    assert not torch.isnan(out).any()
    assert torch.equal(out[0, :, 1], torch.zeros_like(out[0, :, 1]))
    if need_weights:
        assert torch.equal(w[0, :, 1], torch.zeros_like(w[0, :, 1]))


def test_score_variance_grows_with_dk_and_scaling_fixes_it():
    # Section 3.2.1 footnote 4: for unit-variance q and k, q.k has variance d_k; dividing by sqrt(d_k)
    # brings it back to 1, keeping the softmax out of its saturated, vanishing-gradient regime.
    g = torch.Generator().manual_seed(0)
    for dk in (4, 64, 512):
        q, k = torch.randn(20000, dk, generator=g), torch.randn(20000, dk, generator=g)
        dots = (q * k).sum(-1)
        assert abs(dots.var().item() / dk - 1) < 0.05
        assert abs((dots / math.sqrt(dk)).var().item() - 1) < 0.05


def test_mask_errors_are_clear():
    q, k, v = rand_qkv()
    with pytest.raises(TypeError, match="torch.bool"):
        scaled_dot_product_attention(q, k, v, mask=torch.ones(2, 1, 5, 7))
    with pytest.raises(ValueError, match="does not broadcast"):
        scaled_dot_product_attention(q, k, v, mask=torch.ones(2, 1, 5, 6, dtype=torch.bool))
    with pytest.raises(ValueError, match="4 dims"):
        scaled_dot_product_attention(q, k, v, mask=torch.ones(5, 7, dtype=torch.bool))


def test_attention_input_shape_errors():
    with pytest.raises(ValueError, match=r"expected input \(B, T, D\) with D=16"):
        SelfAttention(16, 4)(torch.randn(2, 3, 8))
    cross = CrossAttention(16, 4)
    with pytest.raises(ValueError, match="memory must be"):
        cross(torch.randn(2, 3, 16), memory=torch.randn(3, 4, 8))
    with pytest.raises(ValueError, match="needs the encoder output"):
        cross(torch.randn(2, 3, 16), memory=None)


def _stacked(ours: SelfAttention | CrossAttention, part: str) -> torch.Tensor:
    """[W^Q; W^K; W^V] (or their biases) as torch.nn.MultiheadAttention stores them."""
    if isinstance(ours, SelfAttention):
        return getattr(ours.in_proj, part)
    return torch.cat([getattr(ours.q_proj, part), getattr(ours.kv_proj, part)])


def _copy_to_torch_mha(ours: SelfAttention | CrossAttention, bias: bool) -> torch.nn.MultiheadAttention:
    ref = torch.nn.MultiheadAttention(ours.d_model, ours.n_heads, bias=bias, batch_first=True)
    with torch.no_grad():
        ref.in_proj_weight.copy_(_stacked(ours, "weight"))
        ref.out_proj.weight.copy_(ours.out_proj.weight)
        if bias:
            ref.in_proj_bias.copy_(_stacked(ours, "bias"))
            ref.out_proj.bias.copy_(ours.out_proj.bias)
    return ref.eval()


@pytest.mark.parametrize("bias, d_k", [(True, None), (False, None), (True, 8)])  # d_k 8 = d_model / h
def test_self_attention_matches_torch_mha_with_padding_and_causal_masks(bias, d_k):
    d, h, b, t = 32, 4, 3, 6
    ours = SelfAttention(d, h, bias=bias, d_k=d_k).eval()
    ref = _copy_to_torch_mha(ours, bias)
    x = torch.randn(b, t, d)
    tokens = torch.tensor([[5, 6, 7, 8, 9, 1], [5, 6, 7, 0, 0, 0], [5, 6, 7, 8, 0, 0]])
    pad = padding_mask(tokens, 0)  # (B, 1, 1, T)
    mask = combine(pad, causal_mask(t))
    out, w = ours(x, mask=mask, need_weights=True)
    ref_out, ref_w = ref(x, x, x, key_padding_mask=~pad[:, 0, 0], attn_mask=~causal_mask(t)[0, 0],
                         need_weights=True, average_attn_weights=False)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=0)
    torch.testing.assert_close(w, ref_w, atol=1e-5, rtol=0)
    fused, _ = ours(x, mask=mask)
    torch.testing.assert_close(fused, ref_out, atol=1e-5, rtol=0)


def test_cross_attention_matches_torch_mha():
    d, h = 32, 8
    ours = CrossAttention(d, h).eval()
    ref = _copy_to_torch_mha(ours, True)
    x, memory = torch.randn(2, 4, d), torch.randn(2, 9, d)
    src = torch.tensor([[3] * 9, [3] * 5 + [0] * 4])
    pad = padding_mask(src, 0)
    out, _ = ours(x, memory=memory, mask=pad)
    ref_out, _ = ref(x, memory, memory, key_padding_mask=~pad[:, 0, 0])
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=0)


@pytest.mark.parametrize("need_weights", [False, True])
def test_grouped_cross_attention_equals_repeating_the_memory(need_weights):
    # Beam search: g consecutive query rows (a sentence's hypotheses) share one row of memory.
    d, h, g = 32, 4, 3
    ours = CrossAttention(d, h).eval()
    x, memory = torch.randn(2 * g, 4, d), torch.randn(2, 9, d)
    pad = padding_mask(torch.tensor([[3] * 9, [3] * 5 + [0] * 4]), 0)  # (2, 1, 1, 9)
    out, w = ours(x, memory=memory, mask=pad, need_weights=need_weights)
    ref_out, ref_w = ours(x, memory=memory.repeat_interleave(g, 0), mask=pad.repeat_interleave(g, 0),
                          need_weights=need_weights)
    torch.testing.assert_close(out, ref_out, atol=1e-6, rtol=0)
    if need_weights:
        torch.testing.assert_close(w, ref_w, atol=1e-6, rtol=0)
        assert w[g:, :, :, 5:].abs().max() == 0  # the second sentence's padding, in all its rows
    with pytest.raises(ValueError, match="5 query rows but 2 sources"):
        ours(torch.randn(5, 4, d), memory=memory, mask=pad)


def test_causality_future_token_does_not_change_the_past():
    mha = SelfAttention(16, 2).eval()
    x = torch.randn(1, 6, 16)
    y = x.clone()
    y[:, 4] += 1.0
    a, _ = mha(x, is_causal=True)
    b, _ = mha(y, is_causal=True)
    torch.testing.assert_close(a[:, :4], b[:, :4], atol=1e-6, rtol=0)
    assert not torch.allclose(a[:, 4:], b[:, 4:])


def test_permutation_equivariance_without_positions():
    # Without positional information self-attention is a bag of words: permuting the input permutes
    # the output the same way.
    mha = SelfAttention(16, 4).eval()
    x = torch.randn(1, 7, 16)
    perm = torch.randperm(7)
    out, _ = mha(x)
    out_perm, _ = mha(x[:, perm])
    torch.testing.assert_close(out_perm, out[:, perm], atol=1e-6, rtol=0)


# ------------------------------------------------------------------------------------------------
# d_k decoupled from d_model / h (Table 3, row (B))


def test_d_k_sets_the_queries_and_keys_alone_and_is_the_formula():
    """SelfAttention with d_k = 2 (d_model 16, 4 heads, so d_v = 4): W^Q, W^K are (h d_k, D), W^V is (D, D),
    and the output is Concat_i softmax(Q_i K_i^T / sqrt(d_k)) V_i, then W^O."""
    torch.manual_seed(0)
    attn = SelfAttention(16, 4, d_k=2)
    assert attn.in_proj.weight.shape == (2 * 4 * 2 + 16, 16)
    x = torch.randn(2, 5, 16)
    out, weights = attn(x, is_causal=True, need_weights=True)
    q, k, v = (x @ w.T + b for w, b in zip(attn.in_proj.weight.split([8, 8, 16]), attn.in_proj.bias.split([8, 8, 16])))
    q, k, v = (z.view(2, 5, 4, -1).transpose(1, 2) for z in (q, k, v))  # (B, H, T, d_k | d_v)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(2) + torch.triu(torch.full((5, 5), float("-inf")), 1)
    expected_w = scores.softmax(-1)
    expected = attn.out_proj((expected_w @ v).transpose(1, 2).reshape(2, 5, 16))
    torch.testing.assert_close(weights, expected_w, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)
    fused, _ = attn(x, is_causal=True)  # the fused kernel, with d_v != d_k
    torch.testing.assert_close(fused, expected, atol=1e-6, rtol=1e-5)


def test_d_k_of_d_model_over_h_is_the_paper_model():
    torch.manual_seed(0)
    plain = CrossAttention(16, 4)
    torch.manual_seed(0)
    same = CrossAttention(16, 4, d_k=4)
    assert {k: v.shape for k, v in plain.state_dict().items()} == {k: v.shape for k, v in same.state_dict().items()}
    x, memory = torch.randn(2, 3, 16), torch.randn(2, 6, 16)
    torch.testing.assert_close(plain(x, memory)[0], same(x, memory)[0], atol=0, rtol=0)
    small = CrossAttention(16, 4, d_k=2)
    assert small.q_proj.weight.shape == (8, 16) and small.kv_proj.weight.shape == (8 + 16, 16)
    assert small(x, memory)[0].shape == (2, 3, 16)


@pytest.mark.parametrize("positional", ["sinusoidal", "rope"])
def test_models_with_a_small_d_k_decode_the_same_with_and_without_the_cache(positional):
    from qkv.config import ModelConfig
    from qkv.generation.beam import beam_search, greedy_search
    from qkv.generation.decode import generate
    from qkv.models import GPT, Transformer, count_parameters

    torch.manual_seed(0)
    cfg = dict(vocab_size=30, d_model=16, n_heads=2, d_ff=32, n_layers=2, dropout=0.0, max_len=40, d_k=4,
               positional=positional)
    gpt = GPT(ModelConfig(arch="gpt", **cfg)).eval()
    prompts = [[3, 4, 5], [6, 7]]
    assert generate(gpt, prompts, 6, temperature=0) == generate(gpt, prompts, 6, temperature=0, use_cache=False)
    mt = Transformer(ModelConfig(**cfg)).eval()
    src = torch.tensor([[5, 6, 7, 8], [9, 10, 0, 0]])
    assert greedy_search(mt, src, 1, 2, extra=5) == greedy_search(mt, src, 1, 2, extra=5, use_cache=False)
    beam = beam_search(mt, src, 1, 2, beam_size=1, extra=5)
    assert [h[0].tokens for h in beam] == greedy_search(mt, src, 1, 2, extra=5)
    # Smaller keys, fewer parameters: each of W^Q and W^K loses (d_model - h d_k) d_model weights + biases.
    full = count_parameters(Transformer(ModelConfig(**{**cfg, "d_k": None})))
    assert full - count_parameters(mt) == 2 * (16 - 2 * 4) * 17 * (2 + 2 * 2)  # 2 enc self, 2 dec self + 2 cross
