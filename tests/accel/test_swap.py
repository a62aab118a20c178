"""A generation decodes on a copy of the model's modules and leaves the model exactly as it was
(qkv.accel.swap): the same modules, weights in the same memory, the same mode, no caches, and the tools
that hook the model (heads switched off, attention captured) still see every step."""

import re
from pathlib import Path

import pytest
import torch
import torch._dynamo
from torch import nn

from qkv import GPT, Transformer, preset
from qkv.accel import kernels as K
from qkv.accel.compiled import cpu_compiler_available
from qkv.accel.swap import decoding_copy, rebuilt, swap_modules
from qkv.generation import generate
from qkv.generation.beam import beam_search, greedy_search
from qkv.generation.policy import COMPILE_AFTER, Step, StepPolicy
from qkv.interpret.ablation import heads_off
from qkv.interpret.capture import capture_attention

ROOT = Path(__file__).resolve().parents[2]
needs_compiler = pytest.mark.skipif(not cpu_compiler_available(), reason="torch.compile's CPU backend needs a C++ compiler")


@pytest.fixture
def onednn():
    """Every step's weights packed for oneDNN where this torch has it (the default measures)."""
    if K.available("onednn"):
        K.set_backend("onednn")
    yield
    K.set_backend("auto")


def state(model: nn.Module) -> dict:
    """What a generation must leave as it found: every module (the object and its class), every tensor's
    object, memory and strides, the mode, the caches and the hooks."""
    return {
        "modules": [(name, id(m), type(m)) for name, m in model.named_modules()],
        "tensors": [(name, id(t), t.data_ptr(), t.stride(), t.dtype)
                    for name, t in [*model.named_parameters(), *model.named_buffers()]],
        "training": [m.training for m in model.modules()],
        "caches": [getattr(m, "cache", None) for m in model.modules()],
        "dicts": [sorted(m.__dict__) for m in model.modules()],
        "hooks": [(len(m._forward_hooks), len(m._forward_pre_hooks)) for m in model.modules()],
    }


def test_a_copy_shares_every_tensor_and_cache_and_keeps_the_hooks():
    model = GPT(preset("tiny-gpt")).train()
    model.setup_cache(1, 8)
    def hook(module, args):
        return None

    model.layers[0].self_attn.out_proj.register_forward_pre_hook(hook)
    twin = decoding_copy(model)
    assert not twin.training and model.training
    assert all(a is b for a, b in zip(twin.parameters(), model.parameters()))
    assert all(a is b for a, b in zip(twin.buffers(), model.buffers()))
    assert all(a.self_attn.cache is b.self_attn.cache for a, b in zip(twin.layers, model.layers))
    assert not any(a is b for a, b in zip(twin.modules(), model.modules()))  # the modules are the copy's
    assert list(twin.layers[0].self_attn.out_proj._forward_pre_hooks.values()) == [hook]


def test_a_module_swapped_in_takes_over_the_hooks_of_the_one_it_replaces():
    model = nn.Sequential(nn.Linear(3, 3), nn.Sequential(nn.Linear(3, 3)))
    seen = []
    model[1][0].register_forward_pre_hook(lambda m, args: seen.append(type(m)))

    class Twice(nn.Linear):
        def forward(self, x):
            return 2 * super().forward(x)

    swapped = swap_modules(model, lambda m: rebuilt(m, Twice) if type(m) is nn.Linear else None)
    assert swapped is model and [type(m) for m in model.modules()] == [nn.Sequential, Twice, nn.Sequential, Twice]
    model(torch.ones(1, 3))
    assert seen == [Twice]


@pytest.mark.parametrize("how", ["eager", "uncached", pytest.param("compiled", marks=needs_compiler)])
@pytest.mark.parametrize("rows", [1, 2])
def test_a_generation_leaves_the_gpt_as_it_was(how, rows, onednn):
    torch.manual_seed(0)
    model = GPT(preset("tiny-gpt", dropout=0.1)).train()
    before = state(model)
    prompts = [[3, 1, 4, 1, 5], [2, 7]][:rows]
    got = generate(model, prompts, 6, temperature=0, use_cache=how != "uncached", compile=how == "compiled")
    assert state(model) == before
    # Decoding ran in eval mode (no dropout) although the model trains: the uncached reference agrees.
    assert got == generate(model, prompts, 6, temperature=0, use_cache=False)


def test_a_generation_stopped_by_an_exception_leaves_the_gpt_as_it_was(onednn):
    model = GPT(preset("tiny-gpt")).train()
    before = state(model)

    def fail(tokens):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        generate(model, [[3, 1, 4]], 6, temperature=0, on_step=fail)
    assert state(model) == before


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_a_translation_leaves_the_transformer_as_it_was(search, onednn):
    model = Transformer(preset("tiny-transformer")).train()
    before = state(model)
    src = torch.tensor([[5, 6, 7, 8], [5, 6, 0, 0]])
    if search == "greedy":
        greedy_search(model, src, bos_id=1, eos_id=2, limit=6)
    else:
        beam_search(model, src, bos_id=1, eos_id=2, beam_size=3, limit=6)
    assert state(model) == before


def test_a_head_switched_off_is_off_in_every_step_of_a_packed_generation(onednn):
    torch.manual_seed(0)
    model = GPT(preset("tiny-gpt", dropout=0.0)).eval()
    with torch.no_grad():  # a random tiny model's tokens barely depend on its heads; these weights make them
        for layer in model.layers:
            layer.self_attn.out_proj.weight.mul_(20)
    prompt = [[3, 1, 4, 1, 5], [2, 7]]
    heads = [("self", layer, head) for layer in range(model.cfg.n_layers) for head in range(model.cfg.n_heads - 1)]
    plain = generate(model, prompt, 12, temperature=0)
    with heads_off(model, heads):
        off = generate(model, prompt, 12, temperature=0)
        reference = generate(model, prompt, 12, temperature=0, use_cache=False)  # every position recomputed
    assert off == reference and off != plain


@needs_compiler
def test_a_model_looked_into_decodes_eagerly_and_compile_true_says_why(onednn):
    # A compiled graph would run neither a hook registered after it was compiled nor the attention observer.
    model = GPT(preset("tiny-gpt")).eval()
    policy = StepPolicy(model, compile=None)
    assert policy.choose(COMPILE_AFTER).how == "compiled"
    with heads_off(model, [("self", 0, 0)]):
        assert policy.choose(COMPILE_AFTER).how == "eager"
        with pytest.raises(ValueError, match="runs no hooks"):
            StepPolicy(model, compile=True).choose(8)
        with pytest.raises(ValueError, match="runs no hooks"):
            generate(model, [[3, 1]], 4, step=Step("compiled", 1))
    with capture_attention(model):
        assert policy.choose(COMPILE_AFTER).how == "eager"
    assert policy.choose(COMPILE_AFTER).how == "compiled"


def test_attention_is_captured_through_a_generation(onednn):
    model = GPT(preset("tiny-gpt")).eval()
    with capture_attention(model) as maps:
        generate(model, [[3, 1, 4, 1, 5]], 4, temperature=0)
    # The prompt's 5 queries, then one per step after the first token: 8 queries over 8 keys in every layer.
    assert [w.shape[-2:] for w in maps["self"]] == [(8, 8)] * model.cfg.n_layers


def test_no_code_patches_a_module_in_place():
    # Decoding swaps modules; it never rebinds a class, a forward or a tensor's storage (an object's own
    # attribute named data, self.data, is no tensor's).
    patch = re.compile(r"\.__class__\s*=[^=]|\.forward\s*=[^=]|(?<!self)\.data\s*=[^=]")
    found = [f"{path.relative_to(ROOT)}:{n}" for folder in ("qkv", "bench") for path in sorted((ROOT / folder).rglob("*.py"))
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if patch.search(line)]
    assert found == []
