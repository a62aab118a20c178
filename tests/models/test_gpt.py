import pytest
import torch

from qkv import GPT, ModelConfig, preset
from qkv.generation import generate
from qkv.models import count_parameters
from qkv.modules.attention import KVCache

transformers = pytest.importorskip("transformers")


def hf_model(**kw):
    cfg = transformers.GPT2Config(
        vocab_size=97, n_positions=64, n_embd=48, n_layer=3, n_head=4, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, bos_token_id=0, eos_token_id=0, **kw,
    )
    torch.manual_seed(1)
    m = transformers.GPT2LMHeadModel(cfg).eval()
    # HF initializes LayerNorms to (1, 0) and biases to 0: randomize them so the test sees them.
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    return m


def test_gpt2_small_preset_size():
    with torch.device("meta"):
        assert count_parameters(GPT(preset("gpt2-small"))) == 124_439_808


def test_from_hf_logits_match():
    from qkv.interop.gpt2 import gpt_from_hf

    hf = hf_model()
    ours = gpt_from_hf(hf).eval()
    x = torch.randint(0, 97, (2, 20))
    torch.testing.assert_close(ours(x), hf(input_ids=x).logits, atol=1e-4, rtol=0)


@pytest.mark.parametrize("layout", [
    {},  # GPT-2's own
    {"activation": "gelu", "bias": False},  # nanoGPT's (the baby recipe)
    {"positional": "sinusoidal", "activation": "relu", "tie_embeddings": False},
])
def test_to_hf_logits_match(layout):
    from qkv.interop.gpt2 import gpt_to_hf

    ours = GPT(ModelConfig(arch="gpt", vocab_size=97, d_model=48, n_heads=4, d_ff=192, n_layers=3, max_len=64,
                           dropout=0.0, **{"positional": "learned", "norm": "pre", "activation": "gelu_tanh",
                                           **layout})).eval()
    with torch.no_grad():
        for p in ours.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    hf = gpt_to_hf(ours).eval()
    x = torch.randint(0, 97, (2, 20))
    torch.testing.assert_close(hf(input_ids=x).logits, ours(x), atol=1e-4, rtol=0)


def test_to_hf_refuses_a_different_layout():
    from qkv.interop.gpt2 import gpt_to_hf

    for option, value in (("positional", "rope"), ("activation", "swiglu"), ("norm", "post"), ("d_k", 8)):
        with pytest.raises(ValueError, match=f"model.{option}={value!r}"):
            gpt_to_hf(GPT(preset("tiny-gpt", **{option: value})))


def test_greedy_generation_matches_hf_token_for_token():
    from qkv.interop.gpt2 import gpt_from_hf

    hf = hf_model()
    ours = gpt_from_hf(hf).eval()
    prompt = torch.randint(1, 97, (1, 6))
    ref = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=25, do_sample=False,
                      eos_token_id=None, pad_token_id=0)
    got = generate(ours, prompt, max_new_tokens=25, temperature=0)
    assert got[0] == ref[0, 6:].tolist()


@pytest.mark.parametrize("positional", ["learned", "rope", "sinusoidal"])
def test_cached_generation_equals_uncached_with_prompts_of_different_lengths(positional):
    m = GPT(preset("tiny-gpt", positional=positional)).eval()
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15]]
    cached = generate(m, prompts, 12, temperature=0, use_cache=True)
    uncached = generate(m, prompts, 12, temperature=0, use_cache=False)
    assert cached == uncached
    # Batching changes nothing: each prompt alone gives the same continuation.
    for p, c in zip(prompts, cached):
        assert generate(m, [p], 12, temperature=0)[0] == c


@pytest.mark.parametrize("use_cache", [True, False])
def test_a_sliding_window_is_cached_until_the_context_fills_then_crops(use_cache):
    # nanoGPT's crop: every token is predicted from the last max_len tokens; a short prompt's first steps run on
    # the cache, and from the step that would overfill it each step recomputes the window.
    torch.manual_seed(0)
    m = GPT(preset("tiny-gpt", dropout=0.0)).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(3)  # weights whose greedy tokens vary, so that a wrong window shows
    window, prompt = m.cfg.max_len, [5, 6, 7, 8, 9, 10]
    new = window + 10 - len(prompt)  # past the context by 10 tokens
    got = generate(m, [prompt], new, temperature=0, sliding_window=True, use_cache=use_cache)[0]
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(new):
            ids.append(int(m(torch.tensor([ids[-window:]]))[0, -1].argmax()))
    assert got == ids[len(prompt):] and len(set(got)) > 1


def test_cached_logits_equal_uncached():
    m = GPT(preset("tiny-gpt")).eval()
    x = torch.randint(0, 64, (2, 10))
    full = m(x)
    m.setup_cache(2, 16)
    steps = [m(x[:, :4])] + [m(x[:, i:i + 1]) for i in range(4, 10)]
    m.clear_cache()
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)


@pytest.mark.parametrize("positional", ["learned", "rope"])
def test_caches_passed_in_equal_the_layers_own_and_leave_them_alone(positional):
    # The owner of the caches (a step compiled ahead of time) passes them to forward; nothing is installed.
    m = GPT(preset("tiny-gpt", positional=positional)).eval()
    x = torch.randint(0, 64, (2, 10))
    with torch.no_grad():
        full = m(x)
        caches = [KVCache(2, layer.self_attn.n_heads, 16, layer.self_attn.d_v, d_k=layer.self_attn.d_k)
                  for layer in m.layers]
        steps = [m(x[:, :4], caches=caches)] + [m(x[:, i:i + 1], caches=caches) for i in range(4, 10)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)
    assert [c.length for c in caches] == [10] * len(m.layers)
    assert all(layer.self_attn.cache is None for layer in m.layers)


def test_causality():
    m = GPT(preset("tiny-gpt")).eval()
    x = torch.randint(0, 64, (1, 12))
    y = x.clone()
    y[0, 8] = (y[0, 8] + 1) % 64
    torch.testing.assert_close(m(x)[:, :8], m(y)[:, :8])


def test_sampling_is_reproducible_with_a_seed_and_validates_arguments():
    m = GPT(preset("tiny-gpt")).eval()
    a = generate(m, [[3, 4]], 20, temperature=1.0, top_k=10, top_p=0.9, generator=torch.Generator().manual_seed(7))
    b = generate(m, [[3, 4]], 20, temperature=1.0, top_k=10, top_p=0.9, generator=torch.Generator().manual_seed(7))
    assert a == b
    with pytest.raises(ValueError, match="temperature"):
        generate(m, [[3]], 2, temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        generate(m, [[3]], 2, top_p=0.0)
    with pytest.raises(ValueError, match="top_k"):
        generate(m, [[3]], 2, top_k=-2)
    with pytest.raises(ValueError, match="exceeds the model's context"):
        generate(m, [[3] * 60], 10)


def test_eos_stops_a_row():
    m = GPT(preset("tiny-gpt")).eval()
    first = generate(m, [[3, 4]], 8, temperature=0)[0]
    eos = first[2]
    stopped = generate(m, [[3, 4]], 8, temperature=0, eos_id=eos)[0]
    assert stopped == first[:first.index(eos) + 1]
    assert stopped[-1] == eos


def test_a_few_steps_lower_the_loss():
    m = GPT(preset("tiny-gpt"))
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
    x = torch.arange(40).remainder(10)[None].repeat(4, 1) + 3  # a repeating pattern
    losses = []
    for _ in range(25):
        logits = m(x[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 64), x[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
