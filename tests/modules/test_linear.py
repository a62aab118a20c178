"""qkv's Linear computes F.linear's function: on oneDNN with packed weights in decoding, F.linear otherwise."""

import math

import pytest
import torch
import torch.nn.functional as F

from qkv import GPT, Transformer, preset
from qkv.modules import linear as L
from qkv.modules.linear import Linear, linear, pack_linears, unpack_linears

needs_onednn = pytest.mark.skipif(not L.available(), reason="this torch has no oneDNN linear")


@pytest.fixture
def aten_afterwards():
    yield
    L.set_backend("onednn")


@needs_onednn
def test_backend_is_onednn_by_default():
    assert L.backend() == "onednn"


@needs_onednn
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(5, 24), (2, 3, 24), (1, 1, 24), (0, 24)])
def test_packed_matches_f_linear(bias, shape):
    g = torch.Generator().manual_seed(0)
    layer = Linear(24, 40, bias=bias)
    x = torch.randn(*shape, generator=g)
    layer.pack(math.prod(shape[:-1]))  # the rows of the product
    with torch.no_grad():
        y = layer(x)
    ref = F.linear(x, layer.weight, layer.bias)
    assert y.shape == ref.shape
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)


@needs_onednn
def test_onednn_runs_only_with_a_packing_and_without_autograd(monkeypatch):
    calls = []
    real = L._onednn_linear
    monkeypatch.setattr(L, "_onednn_linear", lambda *a: calls.append(1) or real(*a))
    layer, x = Linear(5, 4), torch.randn(3, 5)
    with torch.inference_mode():
        layer(x)  # not packed: F.linear
        assert calls == []
        layer.pack(3)
        layer(x)
        assert calls == [1]
        layer(x[:2])  # another row count than the packing's: F.linear, no new oneDNN kernel
        assert calls == [1]
    y = layer(x)  # autograd needs F.linear's graph
    assert calls == [1] and y.requires_grad


def test_gradients_are_f_linears():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(8, 4, generator=g, requires_grad=True)
    b = torch.randn(8, generator=g, requires_grad=True)
    x = torch.randn(2, 3, 4, generator=g, requires_grad=True)
    got = torch.autograd.grad(linear(x, w, b).square().sum(), [x, w, b])
    want = torch.autograd.grad(F.linear(x, w, b).square().sum(), [x, w, b])
    for a, e in zip(got, want):
        assert torch.equal(a, e)


def test_module_is_an_nn_linear_with_the_same_state_dict():
    torch.manual_seed(0)
    ours = Linear(6, 10)
    theirs = torch.nn.Linear(6, 10)
    theirs.load_state_dict(ours.state_dict())
    assert isinstance(ours, torch.nn.Linear)
    x = torch.randn(7, 6)
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-5, atol=1e-5)


@needs_onednn
def test_packed_weights_give_the_same_products_for_any_row_count():
    torch.manual_seed(0)
    layer = Linear(32, 48)
    with torch.no_grad():
        dense = {m: layer(torch.ones(m, 32) * m) for m in (1, 3, 8, 20)}
        layer.pack(8)
        assert layer._packed is not None
        for m, want in dense.items():
            torch.testing.assert_close(layer(torch.ones(m, 32) * m), want, rtol=1e-5, atol=1e-5)
        layer.unpack()
        assert layer._packed is None


@needs_onednn
@pytest.mark.parametrize("bias", [True, False])
def test_first_outputs_packed_alone(bias):
    # Cross-attention's W^Q, the first D rows of the stacked [W^Q; W^K; W^V], packed on its own.
    torch.manual_seed(0)
    layer = Linear(16, 48, bias=bias)
    x = torch.randn(5, 16)
    with torch.no_grad():
        want_first = F.linear(x, layer.weight[:16], None if layer.bias is None else layer.bias[:16])
        want_all = F.linear(x, layer.weight, layer.bias)
        layer.pack(5, outputs=16)
        assert layer._packed_for(x, 16) is not None and layer._packed_for(x, 48) is None
        torch.testing.assert_close(layer.first_outputs(x, 16), want_first, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(layer(x), want_all, rtol=1e-5, atol=1e-5)  # whole: not from the packing
        torch.testing.assert_close(layer.first_outputs(x[:3], 16), want_first[:3], rtol=1e-5, atol=1e-5)


@needs_onednn
def test_a_changed_weight_is_never_computed_from_a_stale_packing():
    layer = Linear(16, 16, bias=False)
    x = torch.randn(2, 16)
    with torch.no_grad():
        layer.pack(2)
        layer.weight.mul_(2.0)  # an optimizer step or load_state_dict changes it in place
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight), rtol=1e-5, atol=1e-5)
    assert layer._packed is None


def test_packing_is_not_used_when_gradients_are_needed():
    layer = Linear(8, 8)
    layer.pack(4)
    x = torch.randn(4, 8)
    layer(x).sum().backward()
    assert layer.weight.grad is not None


def test_aten_backend_and_bad_name(aten_afterwards):
    L.set_backend("aten")
    assert L.backend() == "aten"
    x, w = torch.randn(3, 5), torch.randn(4, 5)
    assert torch.equal(linear(x, w), F.linear(x, w))
    with pytest.raises(ValueError, match="unknown linear backend 'mkl'"):
        L.set_backend("mkl")


def test_bf16_takes_f_linear():
    x, w = torch.randn(3, 5, dtype=torch.bfloat16), torch.randn(4, 5, dtype=torch.bfloat16)
    assert torch.equal(linear(x, w), F.linear(x, w))


def test_decoding_packs_and_frees_every_linear():
    model = GPT(preset("tiny-gpt")).eval()
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    assert len(linears) == 1 + 4 * model.cfg.n_layers  # lm_head + in/out_proj, w_1, w_2 per layer
    model.setup_cache(2, 16)
    if L.available():
        assert all(m._packed is not None for m in linears)
    model.clear_cache()
    assert all(m._packed is None for m in linears)
    pack_linears(linears, 3)
    unpack_linears(linears)
    assert all(m._packed is None for m in linears)


@needs_onednn
def test_translation_decoding_packs_only_what_each_step_runs():
    model = Transformer(preset("tiny-transformer")).eval()
    model.setup_cache(2, 16)
    # name -> the output features packed
    packed = {name: m._packed[2] for name, m in model.named_modules()
              if isinstance(m, Linear) and m._packed is not None}
    model.clear_cache()
    assert "generator" in packed
    assert not any(name.startswith("encoder_layers") for name in packed)
    assert {"decoder_layers.0.self_attn.in_proj", "decoder_layers.0.cross_attn.out_proj",
            "decoder_layers.0.feed_forward.w_1"} <= set(packed)
    # Cross-attention's [W^Q; W^K; W^V]: a step uses W^Q only (K and V once per source).
    assert packed["decoder_layers.0.cross_attn.in_proj"] == model.cfg.d_model
    assert not any(m._packed is not None for m in model.modules() if isinstance(m, Linear))


def test_a_model_made_under_inference_mode_decodes():
    # Inference tensors keep no version counter; packing them must still work.
    from qkv.generation import generate

    torch.manual_seed(0)
    with torch.inference_mode():
        model = GPT(preset("tiny-gpt", dropout=0.0)).eval()
        prompt = torch.randint(1, model.cfg.vocab_size, (2, 5))
        cached = generate(model, prompt, 6, temperature=0)
        uncached = generate(model, prompt, 6, temperature=0, use_cache=False)
    assert cached == uncached


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 24), (1, 1, 24), (3, 24), (2, 3, 24)])
def test_the_compiled_form_computes_f_linear(bias, shape):
    # What Linear traces to under torch.compile: multiply-and-sum for one row, F.linear otherwise.
    m = Linear(24, 10, bias=bias)
    x = torch.randn(shape)
    torch.testing.assert_close(L.compiled_linear(x, m.weight, m.bias), F.linear(x, m.weight, m.bias), atol=1e-6, rtol=0)
