"""Decoding's CPU speed-ups (qkv.accel.kernels) compute F.linear's function, in a decoding copy of the model that
leaves the model as it was."""

import json
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from qkv import GPT, Transformer, preset
from qkv.accel import kernels as K
from qkv.accel.kernels import PackedLinear, TransposedLinear, compiled_linear, decoding_model, step_linears
from qkv.devices import cpu_identity

needs_onednn = pytest.mark.skipif(not K.available("onednn"), reason="this torch has no oneDNN linear")
needs_mkl = pytest.mark.skipif(not K.available("mkl"), reason="this torch has no MKL packed GEMM")
needs_all = pytest.mark.skipif(not all(K.available(k) for k in K.PACKED), reason="this torch lacks a packed kernel")
# The kernels that lay a weight out anew, each where this torch runs it.
LAID_OUT = [pytest.param("onednn", marks=needs_onednn), pytest.param("mkl", marks=needs_mkl), "transposed"]


@pytest.fixture
def backend_afterwards():
    yield
    K.set_backend("auto")


@pytest.fixture
def onednn(backend_afterwards):
    """Every step's weights packed, without measuring."""
    K.set_backend("onednn")


@pytest.fixture
def fresh_choices(tmp_path, monkeypatch):
    """An empty cache of measured choices; the fake timings ``measure`` gives are set by the test."""
    monkeypatch.setenv(K.CACHE_ENV, str(tmp_path / "kernels.json"))
    K.forget_choices()
    yield tmp_path / "kernels.json"
    K.forget_choices()


def _packed(layer: nn.Linear, rows: int, kernel: str) -> nn.Linear:
    return K.lay_out(layer, kernel, rows)


def _kernel_of(layer: nn.Linear) -> str:
    if isinstance(layer, PackedLinear):
        return layer.kernel
    return "transposed" if isinstance(layer, TransposedLinear) else "aten"


def _only_linears(model: nn.Module) -> bool:
    """Whether no linear map of ``model`` is laid out anew."""
    return not any(isinstance(m, (PackedLinear, TransposedLinear)) for m in model.modules())


@needs_onednn
def test_the_kernel_is_measured_by_default():
    assert K.backend() == "auto"


def _timings(linears, by_kernel):
    """What a fake ``measure`` returns: the same seconds per kernel for every shape of ``linears``."""
    return {f"{m.in_features},{m.out_features}": dict(by_kernel) for m in linears}


@needs_all
@pytest.mark.parametrize("faster", K.KERNELS)
def test_each_product_gets_the_kernel_measured_fastest_on_this_machine(fresh_choices, monkeypatch, faster):
    measured = []

    def fake(linears, rows):
        measured.append((rows, [(m.in_features, m.out_features) for m in linears]))
        return _timings(linears, {kernel: 1.0 if kernel == faster else 2.0 for kernel in K.KERNELS})

    monkeypatch.setattr(K, "measure", fake)
    model = GPT(preset("tiny-gpt")).eval()
    twin = decoding_model(model, 3, 16)
    assert {_kernel_of(m) for m in step_linears(twin)} == {faster}
    # Measured once, at 4 rows (3 rounded up), on the step's own linear maps in the step's order.
    assert measured == [(4, [(m.in_features, m.out_features) for m in step_linears(model)])]
    # Kept for the next process on this machine: no measuring again.
    saved = json.loads(fresh_choices.read_text())
    assert set(saved) == {K.machine()} and K.machine().startswith(cpu_identity() + " | ")  # kept per CPU
    assert set(saved[K.machine()]) == {f"4,{m.in_features},{m.out_features}" for m in step_linears(model)}
    assert set(saved[K.machine()].values()) == {faster}
    K.forget_choices()
    decoding_model(model, 4, 16)
    assert len(measured) == 1


@needs_onednn
def test_a_damaged_choices_file_is_measured_again(fresh_choices, monkeypatch):
    fresh_choices.write_text("{not json")
    monkeypatch.setattr(K, "measure", lambda linears, rows: _timings(linears, {"onednn": 1.0, "aten": 2.0}))
    assert K.choose([nn.Linear(8, 16)], 1) == ["onednn"]
    assert json.loads(fresh_choices.read_text())[K.machine()] == {"1,8,16": "onednn"}


def test_measure_times_every_kernel_this_torch_runs_on_every_shape(monkeypatch):
    monkeypatch.setattr(K, "ROUND_SECONDS", 2e-3)  # a test needs no exact timings
    seconds = K.measure([nn.Linear(64, 96), nn.Linear(96, 64), nn.Linear(64, 96)], 2)
    assert list(seconds) == ["64,96", "96,64"]
    for by_kernel in seconds.values():
        assert set(by_kernel) == {k for k in K.KERNELS if k not in K.PACKED or K.available(k)}
        assert all(0 < s < 1 for s in by_kernel.values())


def test_a_choices_file_naming_an_unknown_kernel_is_measured_again(fresh_choices, monkeypatch):
    fresh_choices.write_text(json.dumps({K.machine(): {"1,8,16": "mkl-jit"}}))
    monkeypatch.setattr(K, "measure", lambda linears, rows: _timings(linears, {"aten": 2.0, "transposed": 1.0}))
    assert K.choose([nn.Linear(8, 16)], 1) == ["transposed"]


def test_only_shapes_not_yet_chosen_get_a_choice_from_a_new_measurement(fresh_choices, monkeypatch):
    fresh_choices.write_text(json.dumps({K.machine(): {"1,8,16": "aten"}}))
    monkeypatch.setattr(K, "measure", lambda linears, rows: _timings(linears, {"aten": 2.0, "transposed": 1.0}))
    assert K.choose([nn.Linear(8, 16), nn.Linear(16, 8)], 1) == ["aten", "transposed"]


@pytest.mark.parametrize("transposed, chosen", [(0.95, "aten"), (0.85, "transposed")])
def test_another_kernel_is_chosen_only_where_it_beats_f_linear_by_the_margin(fresh_choices, monkeypatch,
                                                                             transposed, chosen):
    # Laying a weight out anew costs a copy: 5% faster is not worth it, 15% is.
    monkeypatch.setattr(K, "measure", lambda linears, rows: _timings(
        linears, {"aten": 1.0, "transposed": transposed, "onednn": 2.0}))
    assert K.choose([nn.Linear(8, 16)], 1) == [chosen]


@pytest.mark.parametrize("timings, chosen", [
    ({"aten": 1.0, "transposed": 0.8, "mkl": 0.78, "onednn": 0.70}, "onednn"),  # clearly the fastest
    ({"aten": 1.0, "transposed": 0.8, "mkl": 0.72, "onednn": 0.70}, "mkl"),  # within 5%: the plainer first
    ({"aten": 1.0, "transposed": 0.72, "mkl": 0.71, "onednn": 0.70}, "transposed"),
])
def test_of_kernels_timed_close_to_the_fastest_the_first_in_order_is_chosen(fresh_choices, monkeypatch,
                                                                              timings, chosen):
    monkeypatch.setattr(K, "measure", lambda linears, rows: _timings(linears, timings))
    assert K.choose([nn.Linear(8, 16)], 1) == [chosen]


def test_measure_times_the_steps_own_maps_laid_out_for_each_kernel_and_leaves_them_as_they_were(monkeypatch):
    laid = []
    real = K.lay_out
    monkeypatch.setattr(K, "lay_out", lambda m, kernel, rows: laid.append((m, kernel, rows)) or real(m, kernel, rows))
    monkeypatch.setattr(K, "ROUND_SECONDS", 2e-3)
    model = GPT(preset("tiny-gpt")).eval()
    linears = step_linears(model)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    K.measure(linears, 2)
    assert {kernel for _, kernel, _ in laid} == set(K._kernels()) and {rows for _, _, rows in laid} == {2}
    assert {id(m) for m, _, _ in laid} == {id(m) for m in linears}
    assert _only_linears(model) and set(step_linears(model)) == set(linears)
    assert all(p.is_contiguous() and torch.equal(p, before[name]) for name, p in model.named_parameters())


@needs_all
def test_forced_backends_do_not_measure(fresh_choices, monkeypatch, backend_afterwards):
    monkeypatch.setattr(K, "measure", lambda *args: pytest.fail("measured"))
    for kernel in K.KERNELS:
        K.set_backend(kernel)
        assert K.choose([nn.Linear(8, 16), nn.Linear(16, 8)], 1) == [kernel, kernel]
    assert not fresh_choices.exists()


@pytest.mark.parametrize("backend", ["auto", *K.KERNELS])
def test_every_kernel_choice_decodes_the_same(backend, backend_afterwards):
    from qkv.generation import generate

    K.set_backend(backend)
    torch.manual_seed(0)
    model = GPT(preset("tiny-gpt", dropout=0.0)).eval()
    prompt = torch.randint(1, model.cfg.vocab_size, (2, 5))
    assert generate(model, prompt, 8, temperature=0) == generate(model, prompt, 8, temperature=0, use_cache=False)


@pytest.mark.parametrize("kernel", LAID_OUT)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(5, 24), (2, 3, 24), (1, 1, 24), (0, 24)])
def test_packed_matches_f_linear(kernel, bias, shape):
    g = torch.Generator().manual_seed(0)
    layer = _packed(nn.Linear(24, 40, bias=bias), math.prod(shape[:-1]), kernel)  # the rows of the product
    x = torch.randn(*shape, generator=g)
    with torch.no_grad():
        y = layer(x)
    ref = F.linear(x, layer.weight, layer.bias)
    assert y.shape == ref.shape
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kernel", [pytest.param("onednn", marks=needs_onednn), pytest.param("mkl", marks=needs_mkl)])
def test_a_packed_kernel_runs_only_for_the_packed_rows_and_without_autograd(monkeypatch, kernel):
    calls = []
    op = {"onednn": "_onednn_linear", "mkl": "_mkl_linear"}[kernel]
    real = getattr(K, op)
    monkeypatch.setattr(K, op, lambda *a: calls.append(1) or real(*a))
    layer, x = nn.Linear(5, 4), torch.randn(3, 5)
    with torch.inference_mode():
        layer(x)  # not packed: nn.Linear's own forward
        assert calls == []
        packed = _packed(layer, 3, kernel)
        packed(x)
        assert calls == [1]
        packed(x[:2])  # another row count than the packing's: F.linear, no new oneDNN kernel
        assert calls == [1]
    y = packed(x)  # autograd needs F.linear's graph
    assert calls == [1] and y.requires_grad


@pytest.mark.parametrize("kernel", LAID_OUT)
def test_packed_weights_give_the_same_products_for_any_row_count(kernel):
    torch.manual_seed(0)
    layer = nn.Linear(32, 48)
    with torch.no_grad():
        dense = {m: layer(torch.ones(m, 32) * m) for m in (1, 3, 8, 20)}
        layer = _packed(layer, 8, kernel)
        for m, want in dense.items():
            torch.testing.assert_close(layer(torch.ones(m, 32) * m), want, rtol=1e-5, atol=1e-5)


def test_a_transposed_linear_has_the_values_and_parameters_of_its_linear_in_other_memory():
    torch.manual_seed(0)
    layer = nn.Linear(5, 4)
    values, x = layer.weight.detach().clone(), torch.randn(3, 2, 5)
    want = layer(x)
    t = TransposedLinear.of(layer)
    assert t.weight is layer.weight and t.bias is layer.bias  # the linear's own Parameters
    assert t.weight_in_out.shape == (4, 5) and t.weight_in_out.stride() == (1, 4)
    assert torch.equal(t.weight_in_out, values) and layer.weight.is_contiguous()  # the linear as it was
    with torch.no_grad():
        torch.testing.assert_close(t(x), want, rtol=1e-6, atol=1e-6)  # any rows
    t(x).sum().backward()  # and a gradient reaches the weight itself
    assert layer.weight.grad.shape == (4, 5)


@pytest.mark.parametrize("backend", ["onednn", "mkl", "transposed"])
def test_a_weight_changed_after_a_generation_is_what_the_next_generation_computes_with(backend, backend_afterwards):
    # A decoding copy's layout is made for one generation; an optimizer step or load_state_dict between two
    # generations changes the weights in place, and the next generation lays the new values out.
    from qkv.generation import generate

    if backend in K.PACKED and not K.available(backend):
        pytest.skip(f"this torch has no {backend} kernel")
    K.set_backend(backend)
    torch.manual_seed(0)
    model = GPT(preset("tiny-gpt", dropout=0.0)).eval()
    prompt = torch.randint(1, model.cfg.vocab_size, (2, 5))
    before = generate(model, prompt, 8, temperature=0)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in step_linears(model):
            m.weight.add_(torch.randn(m.weight.shape, generator=g))
    after = generate(model, prompt, 8, temperature=0)
    assert after == generate(model, prompt, 8, temperature=0, use_cache=False) and after != before


@pytest.mark.parametrize("kernel", LAID_OUT)
def test_packing_is_not_used_when_gradients_are_needed(kernel):
    layer = _packed(nn.Linear(8, 8), 4, kernel)
    layer(torch.randn(4, 8)).sum().backward()
    assert layer.weight.grad is not None


def test_aten_backend_and_bad_name(backend_afterwards):
    K.set_backend("aten")
    assert K.backend() == "aten"
    model = GPT(preset("tiny-gpt")).eval()
    assert _only_linears(decoding_model(model, 2, 16))  # nothing laid out anew
    with pytest.raises(ValueError, match="unknown linear backend 'blas'"):
        K.set_backend("blas")


def test_bf16_is_never_packed():
    model = GPT(preset("tiny-gpt")).to(torch.bfloat16).eval()
    assert _only_linears(decoding_model(model, 2, 16))


def test_the_decoding_model_packs_every_step_linear_and_leaves_the_model_as_it_was(onednn):
    model = GPT(preset("tiny-gpt")).train()
    modules = dict(model.named_modules())
    linears = step_linears(model)
    assert len(linears) == 1 + 4 * model.cfg.n_layers  # lm_head + in/out_proj, w_1, w_2 per layer
    twin = decoding_model(model, 2, 16)
    assert all(layer.self_attn.cache is not None for layer in twin.layers) and not twin.training
    if K.available("onednn"):
        assert all(isinstance(m, PackedLinear) and m.rows == 2 for m in step_linears(twin))
    assert {n: p for n, p in twin.named_parameters()} == {n: p for n, p in model.named_parameters()}  # shared
    # The model: the same modules, no caches, still training, nothing laid out anew.
    assert dict(model.named_modules()) == modules and step_linears(model) == linears and model.training
    assert all(layer.self_attn.cache is None for layer in model.layers) and _only_linears(model)


def test_the_decoding_model_transposes_every_step_weight_and_leaves_the_weights_as_they_were(backend_afterwards):
    K.set_backend("transposed")
    model = GPT(preset("tiny-gpt")).eval()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    twin = decoding_model(model, 2, 16)
    assert {_kernel_of(m) for m in step_linears(twin)} == {"transposed"}
    assert all(p.is_contiguous() and torch.equal(p, before[name]) for name, p in model.named_parameters())
    assert _only_linears(model)


def test_translation_decoding_packs_only_what_each_step_runs():
    model = Transformer(preset("tiny-transformer")).eval()
    names = {name for name, m in model.named_modules() if any(m is s for s in step_linears(model))}
    assert "lm_head" in names
    assert not any(name.startswith("encoder_layers") for name in names)
    assert {"decoder_layers.0.self_attn.in_proj", "decoder_layers.0.cross_attn.q_proj",
            "decoder_layers.0.cross_attn.out_proj", "decoder_layers.0.feed_forward.w_1"} <= names
    # Cross-attention's [W^K; W^V] runs once per source, not per step.
    assert not any(name.endswith("kv_proj") for name in names)


def test_a_model_made_under_inference_mode_decodes(onednn):
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
    # What a linear map computes inside a compiled step: multiply-and-sum for one row, F.linear otherwise.
    m = nn.Linear(24, 10, bias=bias)
    x = torch.randn(shape)
    torch.testing.assert_close(compiled_linear(x, m.weight, m.bias), F.linear(x, m.weight, m.bias), atol=1e-6, rtol=0)
