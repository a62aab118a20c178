"""int8 decoding (qkv.accel.quantize): the linear maps in int8, everything else as it was.

A quantized model computes nearly the logits of its fp32 self and so decodes nearly the same words;
the fp32 model it was made from is untouched; what cannot run (a GPU, int8 with --compile, an
unknown kind) is one line before any work; the commands take ``--quantize int8``.
"""

import warnings

import pytest
import torch
from torch import nn

from qkv import GPT, Transformer, preset
from qkv.cli import main
from qkv.errors import ConfigError
from qkv.generation import generate
from qkv.generation.api import Translator
from qkv.generation.beam import greedy_search
from qkv.accel.quantize import Int8Linear, check_quantize, quantized

needs_int8 = pytest.mark.skipif(not torch.backends.quantized.supported_engines, reason="no quantized engine")


@pytest.fixture(scope="module")
def mt_run(trained_runs):
    return trained_runs["mt"]


@needs_int8
def test_every_linear_map_is_int8_and_the_rest_stays():
    model = GPT(preset("tiny-gpt", dropout=0.0)).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # PyTorch's deprecation notice is silenced, nothing else
        q = quantized(model)
    assert not any(type(m) is nn.Linear for m in q.modules())
    assert sum(isinstance(m, Int8Linear) for m in q.modules()) == sum(type(m) is nn.Linear for m in model.modules())
    assert all(type(m) is nn.Linear for m in model.modules() if isinstance(m, nn.Linear))  # the original is untouched
    torch.testing.assert_close(q.token_embedding.weight, model.token_embedding.weight)  # still fp32, tied or not


@needs_int8
def test_each_linear_map_calls_the_kernel_its_module_would_with_the_same_result():
    q = quantized(Transformer(preset("tiny-transformer", dropout=0.0)).eval())
    linears = [m for m in q.modules() if isinstance(m, Int8Linear)]
    assert linears and not any("forward" in m.__dict__ for m in q.modules())  # modules swapped, none patched
    g = torch.Generator().manual_seed(0)
    for m in linears:
        x = torch.randn(3, 2, m.in_features, generator=g) * 4
        assert torch.equal(m(x), m.quantized(x))  # the quantized module's own forward, bit for bit


@needs_int8
@pytest.mark.parametrize("arch", ["gpt", "transformer"])
def test_int8_logits_are_close_to_fp32(arch):
    torch.manual_seed(0)
    if arch == "gpt":
        model = GPT(preset("tiny-gpt", dropout=0.0)).eval()
        x = torch.randint(1, model.cfg.vocab_size, (2, 12))
        run = lambda m: m(x)  # noqa: E731
    else:
        model = Transformer(preset("tiny-transformer", dropout=0.0)).eval()
        src, tgt = torch.randint(4, model.cfg.vocab_size, (2, 9)), torch.randint(4, model.cfg.vocab_size, (2, 7))
        run = lambda m: m(src, tgt)  # noqa: E731
    with torch.no_grad():
        want, got = torch.log_softmax(run(model), -1), torch.log_softmax(run(quantized(model)), -1)
    err = (got - want).abs().max()
    assert 0 < err < 0.05 * want.abs().max()  # int8, and near fp32 (0 would mean nothing was quantized)


@needs_int8
def test_a_quantized_gpt_decodes_with_and_without_the_cache_alike():
    model = quantized(GPT(preset("tiny-gpt", dropout=0.0)).eval())
    prompt = torch.randint(1, model.cfg.vocab_size, (2, 5))
    assert generate(model, prompt, 8, temperature=0) == generate(model, prompt, 8, temperature=0, use_cache=False)


@needs_int8
def test_a_trained_translation_model_says_nearly_the_same_in_int8(mt_run):
    fp32, int8 = Translator.from_run(mt_run, device="cpu"), Translator.from_run(mt_run, device="cpu", quantize="int8")
    assert any(isinstance(m, Int8Linear) for m in int8.model.modules())
    sources = ["小明累了，他想睡觉。", "他想睡觉。", "小明累了。", "我们去公园吧。", "他们在学校。", "我饿了。"]
    src = torch.nn.utils.rnn.pad_sequence([torch.tensor(s) for s in fp32.encode_sources(sources)], batch_first=True)
    a = greedy_search(fp32.model, src, fp32.tokenizer.bos_id, fp32.tokenizer.eos_id)
    b = greedy_search(int8.model, src, fp32.tokenizer.bos_id, fp32.tokenizer.eos_id)
    same = sum(x == y for x, y in zip(a, b))
    assert same >= len(sources) - 1 and any(len(x) > 2 for x in a)


@needs_int8
def test_translate_and_eval_take_quantize(mt_run, tmp_path, capsys):
    src = tmp_path / "in.txt"
    src.write_text("小明累了，他想睡觉。\n\n我们去公园吧。\n", encoding="utf-8")
    assert main(["translate", "--run", str(mt_run), "--input", str(src), "--quantize", "int8", "--device", "cpu"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and lines[1] == "" and lines[0]


def test_what_cannot_run_is_one_line_before_any_work():
    check_quantize(None, torch.device("cuda"))  # nothing asked, nothing checked
    with pytest.raises(ConfigError, match="--quantize int8 runs on CPUs"):
        check_quantize("int8", torch.device("cuda"))
    with pytest.raises(ConfigError, match="do not combine"):
        check_quantize("int8", torch.device("cpu"), compile=True)
    with pytest.raises(ConfigError, match="expected one of int8"):
        check_quantize("int4", torch.device("cpu"))


def test_generate_refuses_int8_with_compile(tmp_path, capsys):
    assert main(["generate", "--run", str(tmp_path), "--quantize", "int8", "--compile", "--device", "cpu", "x"]) == 2
    err = capsys.readouterr().err
    assert "do not combine" in err and "Traceback" not in err
