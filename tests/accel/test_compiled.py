"""The compiled decoding step gives the eager model's logits and tokens (qkv.accel.compiled)."""

import pytest
import torch
import torch._dynamo

from qkv import GPT, preset
from qkv.accel.compiled import CompiledStep, SlotCache, cpu_compiler_available
from qkv.generation.completer import Completer
from qkv.generation.decode import generate, left_pad
from qkv.modules.attention import KVCache
from qkv.tokenizers.char import CharTokenizer

pytestmark = pytest.mark.skipif(not cpu_compiler_available(),
                                reason="torch.compile's CPU backend needs a C++ compiler")


@pytest.fixture(autouse=True)
def fresh_dynamo():
    # Every test compiles its own model; without a reset, Dynamo's limit on recompilations would
    # quietly send later tests down the eager path and they would test nothing.
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield
    torch._dynamo.reset()


def compiled_frames() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


@pytest.mark.parametrize("positional", ["learned", "rope", "sinusoidal"])
def test_compiled_steps_give_the_uncached_logits_for_left_padded_prompts(positional):
    m = GPT(preset("tiny-gpt", positional=positional)).eval()
    ids, real = left_pad([[5, 6, 7, 8, 9], [11, 12]], pad_id=0)  # (2, 5) each
    new = torch.randint(1, 64, (2, 4))
    positions = real.long().cumsum(-1) - 1  # (2, 5): -1 on the pads
    with torch.no_grad():
        m.setup_cache(2, 12)
        m(ids, mask=real[:, None, None, :], positions=positions.clamp(min=0))  # prefill slots 0..4
        step = CompiledStep(m, real)
        pos = positions[:, -1:]
        got = []
        for i in range(4):
            pos = pos + 1
            got.append(step(new[:, i:i + 1], pos, 5 + i))  # (2, 1, V)
        m.clear_cache()
        # The reference: every row alone, uncached, without padding.
        for row, prompt in enumerate([[5, 6, 7, 8, 9], [11, 12]]):
            full = m(torch.tensor([prompt + new[row].tolist()]))[0, -4:]  # (4, V)
            torch.testing.assert_close(torch.cat(got, 1)[row], full, atol=1e-5, rtol=0)
    assert compiled_frames() == 1  # one graph for every step


def test_generate_compiled_equals_eager_greedy_and_sampled():
    m = GPT(preset("tiny-gpt")).eval()
    prompt = [[3, 1, 4, 1, 5]]
    assert generate(m, prompt, 20, temperature=0, compile=True) == generate(m, prompt, 20, temperature=0)
    seeded = lambda c: generate(m, prompt, 20, temperature=1.0, top_k=20, compile=c,  # noqa: E731
                                generator=torch.Generator().manual_seed(7))
    assert seeded(True) == seeded(False)
    assert compiled_frames() == 1
    # A batch of several prompts stays eager (oneDNN's packed weights are faster there).
    prompts = [[3, 1, 4], [1, 5, 9, 2, 6]]
    assert generate(m, prompts, 10, temperature=0, compile=True) == generate(m, prompts, 10, temperature=0)
    assert compiled_frames() == 1


def test_generations_of_other_lengths_reuse_the_graph_of_the_first():
    m = GPT(preset("tiny-gpt")).eval()
    for prompt, n in (([3, 1, 4], 5), ([3, 1, 4, 1, 5], 9), ([2, 7], 3)):
        assert generate(m, [prompt], n, temperature=0, compile=True) == generate(m, [prompt], n, temperature=0)
    assert compiled_frames() == 1  # a graph per length would be 3, and seconds of compiling each


def test_compile_needs_the_cache_and_a_compiler(monkeypatch):
    m = GPT(preset("tiny-gpt")).eval()
    with pytest.raises(ValueError, match="needs use_cache=True"):
        generate(m, [[1, 2]], 3, use_cache=False, compile=True)
    monkeypatch.setattr("shutil.which", lambda name: None)
    with pytest.raises(ValueError, match="needs a C\\+\\+ compiler"):
        generate(m, [[1, 2]], 3, compile=True)


def test_completer_compiled_equals_eager_also_when_the_window_slides():
    tok = CharTokenizer(list("abcdefghijklmnopqrstuvwxyz .,\n"))
    model = GPT(preset("tiny-gpt", vocab_size=tok.vocab_size, max_len=24))
    eager, compiled = Completer(model, tok), Completer(model, tok, compile=True)
    assert compiled.complete("the cat", max_new_tokens=15, temperature=0) == eager.complete(
        "the cat", max_new_tokens=15, temperature=0)
    long = "the quick brown fox"  # 19 tokens: the window fills after 5 compiled steps, then slides
    assert compiled.complete(long, max_new_tokens=12, temperature=0, sliding_window=True) == eager.complete(
        long, max_new_tokens=12, temperature=0, sliding_window=True)
    assert compiled_frames() >= 1


def test_a_compiled_generation_leaves_the_model_as_it_was():
    """The compiled step transforms the model from outside (its products, its attention) and puts it back."""
    from torch import nn

    from qkv.modules.attention import Attention, SelfAttention

    m = GPT(preset("tiny-gpt")).eval()
    generate(m, [[3, 1, 4]], 6, temperature=0, compile=True)
    assert all(type(x) is nn.Linear for x in m.modules() if isinstance(x, nn.Linear))
    attention = [x for x in m.modules() if isinstance(x, Attention)]
    assert attention and all(type(x) is SelfAttention and x.cache is None for x in attention)
    with torch.no_grad():  # and it trains again: the explicit formula and compiled products are gone
        m.train()(torch.tensor([[3, 1, 4]])).sum()


def test_by_default_only_a_long_enough_generation_of_one_prompt_compiles(monkeypatch):
    from qkv.generation import policy as P
    from qkv.accel.quantize import quantized

    model, tok = GPT(preset("tiny-gpt")).eval(), CharTokenizer(list("abcdefgh \n"))
    how = lambda completer, n, rows=1: completer.policy.choose(n, rows).how
    auto = Completer(model, tok)
    assert how(auto, P.COMPILE_AFTER - 1) == "eager" and how(auto, P.COMPILE_AFTER) == "compiled"
    assert auto.policy.choose(P.COMPILE_AFTER) == P.Step("compiled", 1)
    assert how(auto, P.COMPILE_AFTER, rows=2) == "eager"  # batches decode eagerly
    assert how(Completer(quantized(model), tok), P.COMPILE_AFTER) == "eager"  # int8 steps are not compiled
    assert how(Completer(model, tok, compile=False), 10 * P.COMPILE_AFTER) == "eager"
    assert how(Completer(model, tok, compile=True), 1) == "compiled"
    monkeypatch.setattr(P, "cpu_compiler_available", lambda: False)
    assert how(auto, P.COMPILE_AFTER) == "eager"  # no compiler: eager, silently


def test_a_step_chosen_for_other_prompts_is_refused():
    from qkv.generation import generate
    from qkv.generation.policy import Step

    model = GPT(preset("tiny-gpt")).eval()
    with pytest.raises(ValueError, match="chosen for 1 prompt"):
        generate(model, [[1, 2], [3]], 2, temperature=0, step=Step("eager", 1))
    with pytest.raises(ValueError, match="without a cache"):
        generate(model, [[1, 2]], 2, temperature=0, use_cache=False, step=Step("compiled", 1))
    given = generate(model, [[1, 2], [3]], 4, temperature=0, step=Step("eager", 2))
    assert given == generate(model, [[1, 2], [3]], 4, temperature=0, compile=False)


def test_qkv_generate_compiles_by_default_when_it_pays_and_says_so(tiny_lm_run, monkeypatch, capsys):
    from qkv.generation import policy as P
    from qkv.cli import main

    run = tiny_lm_run()
    capsys.readouterr()
    monkeypatch.setattr(P, "COMPILE_AFTER", 8)
    argv = ["generate", "--run", str(run), "-n", "8", "--temperature", "0", "--device", "cpu", "ab"]
    assert main(argv) == 0
    compiled = capsys.readouterr()
    assert "compiling the decoding step" in compiled.err and compiled_frames() >= 1
    torch._dynamo.utils.counters.clear()
    assert main([*argv[:-1], "--no-compile", "ab"]) == 0
    eager = capsys.readouterr()
    assert "compiling" not in eager.err and compiled_frames() == 0
    assert eager.out == compiled.out  # the same continuation


def test_a_slot_writes_there_and_returns_every_slot():
    # A compiled decoding step's cache: the new position goes where ``slot`` says, into the buffers of the
    # cache it stands in for, and attention gets all max_len slots (the caller's mask hides the unwritten ones),
    # or the first ``span``.
    own = KVCache(1, 2, 6, 4)
    first = torch.randn(1, 2, 3, 4)
    own.update(first, first)
    c = SlotCache.over(own, torch.tensor([3]))
    new = torch.randn(1, 2, 1, 4)
    k, v = c.update(new, -new)
    assert k.shape == (1, 2, 6, 4) and c.length == 3
    torch.testing.assert_close(k[:, :, :3], first)
    torch.testing.assert_close(k[:, :, 3:4], new)
    torch.testing.assert_close(v[:, :, 3:4], -new)
    assert not k[:, :, 4:].any() and torch.equal(own.k[:, :, 3:4], new)
    c.span = 4
    assert c.update(new, new)[0].shape == (1, 2, 4, 4)
