"""A decoding step compiled ahead of time is kept, found again only for the same weights, and gives the eager
model's tokens (qkv.accel.precompiled)."""

import os
import re
import sys
import time
import warnings

import pytest
import torch

from qkv import GPT, preset
from qkv.accel import precompiled
from qkv.accel.compiled import CompiledStep, cpu_compiler_available
from qkv.accel.kernels import decoding_model
from qkv.errors import DataError
from qkv.generation.policy import COMPILE_AFTER, PRECOMPILED_AFTER, PrecompileNotice, StepPolicy
from qkv.accel.precompiled import PACKAGES_KEPT
from qkv.generation import decode, generate
from qkv.generation.completer import Completer
from qkv.modules.attention import SelfAttention
from qkv.tokenizers.char import CharTokenizer

pytestmark = pytest.mark.skipif(not cpu_compiler_available(), reason="AOTInductor builds C++: it needs a compiler")


def loads(completer: Completer, n: int, rows: int = 1) -> bool:
    """Whether the completer's generation of ``n`` tokens for ``rows`` prompts runs the step compiled ahead of time."""
    return completer.policy.choose(n, rows).how == "loaded"


def compiles(completer: Completer, n: int) -> bool:
    return completer.policy.choose(n).how == "compiled"


@pytest.fixture(autouse=True)
def user_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def test_the_step_export_traces_is_given_its_caches_and_installs_none():
    # The package's step writes the keys and values it is given, through caches passed to the model's
    # forward: the step model's own caches are neither replaced nor written.
    model = GPT(preset("tiny-gpt", max_len=16)).eval()
    step = CompiledStep(decoding_model(model, 1, precompiled.cache_slots(model), packed=False),
                        torch.ones(1, 1, dtype=torch.bool))
    own = [m.cache for m in step.model.modules() if isinstance(m, SelfAttention)]
    kv = [torch.zeros_like(t) for cache in own for t in (cache.k, cache.v)]  # (1, H, 17, d_k | d_v) each
    mask = torch.ones(1, 1, 1, 5, dtype=torch.bool)  # the span: slots 0..4
    with torch.no_grad():
        logits = precompiled._Step(step.model)(torch.tensor([[7]]), torch.tensor([[3]]), mask, torch.tensor([3]), *kv)
    assert logits.shape == (1, 1, model.cfg.vocab_size)
    assert [m.cache for m in step.model.modules() if isinstance(m, SelfAttention)] == own
    assert all(not cache.k.any() and not cache.v.any() for cache in own)
    written = [t[:, :, 3].abs().sum() > 0 for t in kv]
    assert all(written) and not any(t[:, :, 4:].any() or t[:, :, :3].any() for t in kv)


def test_a_loaded_step_gives_the_eager_tokens_and_only_for_the_weights_it_was_built_for():
    tok = CharTokenizer(list("abcdefghijklmnopqrstuvwxyz .,\n"))
    torch.manual_seed(0)
    model = GPT(preset("tiny-gpt", vocab_size=tok.vocab_size, max_len=48)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3)  # greedy tokens that vary, so that a step reading a wrong cache slot shows
    eager = Completer(model, tok, compile=False)
    n = PRECOMPILED_AFTER + 4
    expected = eager.complete("the cat", max_new_tokens=n, temperature=0)
    assert len(set(expected)) > 3, expected

    auto = Completer(model, tok)
    assert auto.policy.package() is None and not loads(auto, n)  # nothing built yet: eager
    path, seconds = auto.policy.precompile()
    assert path.is_file() and seconds > 0 and path.parent.name == "steps"
    assert precompiled.precompile(model) == (path, 0.0)  # built once

    later = Completer(model, tok)  # another Completer, as another process would be
    assert loads(later, n) and not loads(later, PRECOMPILED_AFTER - 1) and not loads(later, n, rows=2)
    assert not loads(Completer(model, tok, compile=False), n)
    assert not compiles(later, 10 * COMPILE_AFTER)  # long generations too run the package, not torch.compile's
    assert compiles(Completer(model, tok, compile=True), n) and not loads(Completer(model, tok, compile=True), n)
    assert later.complete("the cat", max_new_tokens=n, temperature=0) == expected
    # The window slides past the context: the loaded step gives way to recomputing, as the compiled one does.
    long = "the quick brown fox jumps over"
    assert later.complete(long, max_new_tokens=n, temperature=0, sliding_window=True) == eager.complete(
        long, max_new_tokens=n, temperature=0, sliding_window=True)
    assert all(type(m) is torch.nn.Linear for m in model.modules() if isinstance(m, torch.nn.Linear))  # put back
    # The package gone while a Completer holds its path (pruned by another process's build, or the cache
    # cleared): the next generation decodes eagerly, to the same tokens, instead of failing.
    built = path.read_bytes()
    path.unlink()
    assert later.complete("the cat", max_new_tokens=n, temperature=0) == expected and not loads(later, n)
    path.write_bytes(built)

    with torch.no_grad():
        model.lm_head.weight[0, 0] += 1e-3  # one weight changed: the package is another model's
    assert Completer(model, tok).policy.package() is None


def test_a_loaded_step_for_a_batch_gives_the_eager_tokens_of_left_padded_prompts_up_to_the_context(tmp_path,
                                                                                                   monkeypatch):
    tok = CharTokenizer(list("abcdefghijklmnopqrstuvwxyz .,\n"))
    torch.manual_seed(0)
    model = GPT(preset("tiny-gpt", vocab_size=tok.vocab_size, max_len=PRECOMPILED_AFTER + 12)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3)
    prompts = ["the cat", "a", "dogs, cats"]  # left-padded to the longest
    n = model.cfg.max_len - len(prompts[2])  # the longest row fills the context
    expected = Completer(model, tok, compile=False).complete_batch(prompts, max_new_tokens=n, temperature=0)
    assert len(set("".join(expected))) > 3, expected

    steps = tmp_path / "cache" / "qkv" / "steps"
    steps.mkdir(parents=True)
    for i in range(PACKAGES_KEPT):  # packages built before, the first the oldest: it goes when one more is built
        old = steps / f"{i:032x}-1.pt2"
        old.write_bytes(b"")
        os.utime(old, ns=(10**18 + i, 10**18 + i))
    path, _ = precompiled.precompile(model, batch=3)
    assert not (steps / f"{0:032x}-1.pt2").exists() and len(list(steps.glob("*.pt2"))) == PACKAGES_KEPT
    assert path.name.endswith("-3.pt2") and precompiled.find(model, 3) == path and precompiled.find(model, 1) is None
    completer = Completer(model, tok)
    assert loads(completer, n, rows=3) and not loads(completer, n, rows=1) and not loads(completer, n, rows=2)
    assert completer.complete_batch(prompts, max_new_tokens=n, temperature=0) == expected
    # qkv.generate's default is the command's: the package where one was built for the batch, eager otherwise.
    loaded = []
    monkeypatch.setattr(decode, "LoadedStep", lambda *a: loaded.append(a[2]) or precompiled.LoadedStep(*a))
    ids = [tok.encode(p) for p in prompts]
    assert generate(model, ids, n, temperature=0) == generate(model, ids, n, temperature=0, compile=False)
    assert loaded == [path]
    assert generate(model, ids[:2], n, temperature=0) == generate(model, ids[:2], n, temperature=0, compile=False)
    assert generate(model, ids, PRECOMPILED_AFTER - 1, temperature=0) and loaded == [path]  # too short to load


def test_qkv_generate_compiles_in_the_background_then_loads_and_says_so(tiny_lm_run, tmp_path, capsys, monkeypatch):
    from qkv.cli import main

    run = tiny_lm_run(max_len=48)  # room for the prompt and PRECOMPILED_AFTER new tokens
    capsys.readouterr()
    argv = ["generate", "--run", str(run), "-n", str(PRECOMPILED_AFTER), "--temperature", "0", "--device", "cpu"]
    assert main([*argv, "--no-compile", "ab"]) == 0
    eager = capsys.readouterr()
    assert "ahead of time" not in eager.err and "--precompile" not in eager.err
    assert main([*argv, "ab"]) == 0  # the default, nothing built yet: eager, and says how to be faster
    suggested = capsys.readouterr()
    assert "decoded eagerly; --precompile once" in suggested.err and suggested.out == eager.out
    assert main([*argv, "-n", str(PRECOMPILED_AFTER - 1), "ab"]) == 0  # too short for it to matter
    assert "--precompile" not in capsys.readouterr().err
    # By default the package is built in the background after an eager generation, once.
    monkeypatch.setenv(precompiled.BACKGROUND_ENV, "1")
    assert main([*argv, "ab"]) == 0
    started = capsys.readouterr()
    assert "compiling this model's step for this machine and batch size in the background" in started.err, started.err
    assert started.out == eager.out
    pid = int(re.search(r"pid (\d+)", started.err).group(1))
    assert main([*argv, "ab"]) == 0  # the builder is still importing torch: no second one
    assert f"being compiled in the background (pid {pid})" in capsys.readouterr().err
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    steps = tmp_path / "cache" / "qkv" / "steps"
    assert [p.suffix for p in steps.iterdir()] == [".pt2"]  # the builder's marker and log are gone
    assert main([*argv, "ab"]) == 0  # later: found and loaded by default
    loaded = capsys.readouterr()
    assert "running the decoding step compiled ahead of time" in loaded.err
    assert eager.out == loaded.out
    assert main([*argv, "--precompile", "ab"]) == 0
    assert "compiled ahead of time before" in capsys.readouterr().err
    assert main([*argv, "--no-compile", "ab"]) == 0 and "ahead of time" not in capsys.readouterr().err
    # A damaged package: one line naming the file and what to do, the model left as it was.
    package = next((tmp_path / "cache" / "qkv" / "steps").glob("*.pt2"))
    package.write_bytes(b"not a package")
    assert main([*argv, "ab"]) == 2
    err = capsys.readouterr().err
    error = err.splitlines()[-1]  # after the notice that it would run the package
    assert error.startswith("qkv generate: error: " + str(package)) and "delete the file" in error, err
    assert "Traceback" not in err
    # An int8 model has no fp32 step to compile: one line saying so.
    assert main([*argv, "--precompile", "--quantize", "int8", "ab"]) == 2
    assert "drop --quantize" in capsys.readouterr().err


def test_a_background_build_starts_once_and_a_failed_one_is_reported_not_retried(tiny_lm_run, tmp_path, capsys,
                                                                                monkeypatch):
    from qkv.cli import main

    path = tmp_path / "cache" / "qkv" / "steps" / f"{0:032x}-1.pt2"
    assert precompiled.background_build(path) is None
    fails = [sys.executable, "-c", "import sys, time; time.sleep(1); sys.exit('the compiler crashed')"]
    pid = precompiled.build_in_background(path, fails)
    assert pid and precompiled.build_in_background(path, fails) is None  # one build per package
    assert precompiled.background_build(path) == (pid, True, path.with_suffix(".log"))
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 1
    failed = precompiled.background_build(path)
    assert failed == (pid, False, path.with_suffix(".log")) and "the compiler crashed" in failed.log.read_text()
    assert precompiled.build_in_background(path, fails) is None  # not retried by itself
    marker = path.with_suffix(".building")
    marker.write_text(str(os.getpid()))  # a live process, but marked so long ago that it is not the builder
    os.utime(marker, (time.time() - precompiled.BACKGROUND_TIMEOUT - 1,) * 2)
    assert not precompiled.background_build(path).running

    # qkv generate says where the failed build's log is, and starts no other.
    run = tiny_lm_run(max_len=48)
    model = Completer.from_run(run, device="cpu").model
    package = precompiled.package_path(model)
    package.with_suffix(".building").write_text(str(pid))  # the failed builder's, long gone
    package.with_suffix(".log").write_text("error: the compiler crashed\n")
    monkeypatch.setenv(precompiled.BACKGROUND_ENV, "1")
    capsys.readouterr()
    assert main(["generate", "--run", str(run), "-n", str(PRECOMPILED_AFTER), "--temperature", "0", "--device", "cpu",
                 "ab"]) == 0
    err = capsys.readouterr().err
    assert f"failed or was stopped (its log: {package.with_suffix('.log')})" in err and "pid" not in err

    # A user cache that cannot be written (here a file where its folder should be): no build, no traceback.
    unwritable = tmp_path / "not-a-folder"
    unwritable.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(unwritable))
    assert precompiled.build_in_background(precompiled.package_path(model), fails) is None
    assert main(["generate", "--run", str(run), "-n", str(PRECOMPILED_AFTER), "--temperature", "0", "--device", "cpu",
                 "ab"]) == 0
    err = capsys.readouterr().err
    assert "decoded eagerly; --precompile once compiles" in err and "Traceback" not in err, err


def test_the_api_builds_its_step_in_the_background_once_and_then_loads_it(monkeypatch):
    # qkv.generate chooses as qkv generate does, and builds as it does: a model held in memory (in training mode,
    # which decoding leaves alone) is written beside the package for the builder, which deletes it.
    monkeypatch.setenv(precompiled.BACKGROUND_ENV, "1")
    torch.manual_seed(0)
    model = GPT(preset("tiny-gpt", max_len=48, dropout=0.0)).train()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3)  # weights whose greedy tokens vary
    prompt = [[3, 1, 4, 1, 5]]
    eager = generate(model, prompt, PRECOMPILED_AFTER, temperature=0, compile=False)
    with pytest.warns(PrecompileNotice, match=r"in the background, at low priority \(pid \d+") as notes:
        assert generate(model, prompt, PRECOMPILED_AFTER, temperature=0) == eager
    notice = next(str(w.message) for w in notes if w.category is PrecompileNotice)
    pid = int(re.search(r"pid (\d+)", notice).group(1))
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrecompileNotice)  # a build under way: no second one, no second notice
        assert generate(model, prompt, PRECOMPILED_AFTER, temperature=0) == eager
    _, status = os.waitpid(pid, 0)
    path = precompiled.package_path(model)
    assert os.waitstatus_to_exitcode(status) == 0, path.with_suffix(".log").read_text()
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # the model written for it, marker and log gone
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrecompileNotice)
        assert StepPolicy(model).choose(PRECOMPILED_AFTER).how == "loaded"
        assert generate(model, prompt, PRECOMPILED_AFTER, temperature=0) == eager  # loaded: the same tokens
    assert model.training


def test_the_completer_builds_what_its_own_choice_calls_for_and_the_command_its_own(monkeypatch):
    started = []
    monkeypatch.setenv(precompiled.BACKGROUND_ENV, "1")
    monkeypatch.setattr(precompiled, "build_in_background",
                        lambda path, argv, prepare=None: started.append((path, argv)) or 4242)
    tok = CharTokenizer(list("abcdefghijklmnopqrstuvwxyz .,\n"))
    model = GPT(preset("tiny-gpt", vocab_size=tok.vocab_size, max_len=48)).eval()
    completer = Completer(model, tok)
    with pytest.warns(PrecompileNotice, match=r"pid 4242"):
        completer.complete("ab", max_new_tokens=PRECOMPILED_AFTER, temperature=0)
    assert [path for path, _ in started] == [precompiled.package_path(model, 1)]
    assert "build_from_input" in started[0][1][2]  # the builder of a model held in memory
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrecompileNotice)
        completer.complete("ab", max_new_tokens=PRECOMPILED_AFTER - 1, temperature=0)  # too short: none
        # A step chosen by the caller (qkv generate, for its batch sizes): the caller builds, not the Completer.
        completer.complete("ab", max_new_tokens=PRECOMPILED_AFTER, temperature=0,
                           step=completer.policy.choose(PRECOMPILED_AFTER))
        completer.complete_batch(["ab", "cd"], max_new_tokens=4, temperature=0)
    assert len(started) == 1


def test_a_builder_refuses_a_model_that_is_not_the_one_its_package_is_for():
    torch.manual_seed(0)
    model, other = GPT(preset("tiny-gpt")).eval(), GPT(preset("tiny-gpt")).eval()
    path = precompiled.package_path(other)
    precompiled._write_input(model, path)  # the wrong model beside the package's name
    with pytest.raises(DataError, match="is not the one whose step"):
        precompiled.build_from_input(path, 1)
    assert not path.with_suffix(".input").exists()  # what it read is deleted, built or not
