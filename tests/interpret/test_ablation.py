"""Switching heads off (qkv.interpret.ablation): the same as zeroing the head's columns of W^O, on every
kind of attention, in one pass and in cached decoding; gone when the context closes."""

import copy

import pytest
import torch

from qkv.generation.api import Translator
from qkv.interpret.ablation import heads_off, parse_heads
from qkv.interpret.capture import attention_modules
from qkv.runs import load_model

SEED = "小明累了，他想睡觉。"


def columns_zeroed(model, kind, layer, head):
    """A copy of ``model`` whose W^O of (kind, layer) has the head's columns zeroed."""
    twin = copy.deepcopy(model)
    places = {place: m for m in twin.modules() for i, place in attention_modules(twin).items() if id(m) == i}
    module = places[kind, layer]
    width = module.d_v
    with torch.no_grad():
        module.out_proj.weight[:, head * width:(head + 1) * width] = 0
    return twin


@pytest.mark.parametrize("kind,layer,head", [("encoder_self", 0, 1), ("decoder_self", 1, 0), ("cross", 1, 1)])
def test_a_head_off_equals_its_columns_of_w_o_zeroed(mt_run, kind, layer, head):
    tr = Translator.from_run(mt_run, device="cpu")
    model = tr.model.eval()
    src = torch.tensor([tr.encode_sources([SEED])[0]])
    tgt = torch.tensor([[tr.tokenizer.bos_id] + tr.tokenizer.encode("Xiaoming is tired")])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        plain = model(src, tgt)
        with heads_off(model, [(kind, layer, head)]):
            off = model(src, tgt)
        expected = columns_zeroed(model, kind, layer, head)(src, tgt)
        after = model(src, tgt)
    torch.testing.assert_close(off, expected, atol=1e-6, rtol=0)
    assert (off - plain).abs().max() > 1e-4  # the head did something
    torch.testing.assert_close(after, plain, atol=0, rtol=0)  # the model afterwards is the model before
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not any(m._forward_pre_hooks for m in model.modules())


def test_cached_decoding_with_a_head_off_is_the_zeroed_models(mt_run):
    tr = Translator.from_run(mt_run, device="cpu")
    plain = tr.translate(SEED, beam=1)
    with heads_off(tr.model, [("cross", 0, 0), ("cross", 0, 1), ("cross", 1, 0), ("cross", 1, 1)]):
        blind = tr.translate(SEED, beam=4)
    twin = Translator(columns_zeroed(columns_zeroed(tr.model, "cross", 0, 0), "cross", 0, 1), tr.tokenizer)
    twin = Translator(columns_zeroed(columns_zeroed(twin.model, "cross", 1, 0), "cross", 1, 1), tr.tokenizer)
    assert blind == twin.translate(SEED, beam=4)
    assert tr.translate(SEED, beam=1) == plain


def test_a_gpt_head_off(gpt_run):
    model, tok = load_model(gpt_run, device="cpu")
    ids = torch.tensor([tok.encode("Xiaoming is tired")])
    with torch.no_grad(), heads_off(model, [("self", 2, 1)]):
        off = model(ids)
    torch.testing.assert_close(off, columns_zeroed(model, "self", 2, 1)(ids), atol=1e-6, rtol=0)


def test_heads_that_are_not_there_are_one_line(mt_run):
    model = Translator.from_run(mt_run, device="cpu").model
    with pytest.raises(ValueError, match="no attention self:0 in this model"):
        with heads_off(model, [("self", 0, 0)]):
            pass
    with pytest.raises(ValueError, match="has heads 0..1, not 2"):
        with heads_off(model, [("cross", 0, 2)]):
            pass
    assert parse_heads("cross:1:0, encoder_self:0:3") == [("cross", 1, 0), ("encoder_self", 0, 3)]
    assert parse_heads("") == []
    with pytest.raises(ValueError, match="KIND:LAYER:HEAD"):
        parse_heads("cross:1")
