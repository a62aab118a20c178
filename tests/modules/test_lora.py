"""LoRA: starts as the base model, trains only the adapters, and merges into plain weights exactly."""

import pytest
import torch
from torch import nn

from qkv import GPT, preset
from qkv.modules.lora import LoRALinear, apply_lora, lora_state_dict, merge_lora


@pytest.fixture
def gpt():
    torch.manual_seed(0)
    return GPT(preset("tiny-gpt", dropout=0.0)).eval()


def _randomize_b(model):
    # B starts at zero (so the adapted model starts as the base); give it values, as training would.
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, LoRALinear):
                m.lora_B.normal_(0, 0.1)


def test_a_fresh_adapter_computes_the_base_model(gpt):
    x = torch.randint(0, 64, (2, 10))
    before = gpt(x)
    names = apply_lora(gpt, rank=4)
    assert len(names) == 4 * gpt.cfg.n_layers  # in_proj, out_proj, w_1, w_2 in every layer
    torch.testing.assert_close(gpt(x), before, atol=0, rtol=0)  # B starts at zero


def test_only_adapter_parameters_get_gradients(gpt):
    apply_lora(gpt, rank=4, targets=["in_proj", "w_2"])
    trainable = {n for n, p in gpt.named_parameters() if p.requires_grad}
    assert trainable and all(n.endswith(("lora_A", "lora_B")) for n in trainable)
    assert len(trainable) == 2 * 2 * gpt.cfg.n_layers
    _randomize_b(gpt)
    gpt.train()
    gpt(torch.randint(0, 64, (2, 10))).logsumexp(-1).mean().backward()
    for name, p in gpt.named_parameters():
        if name.endswith(("lora_A", "lora_B")):
            assert p.grad is not None and p.grad.abs().sum() > 0, name
        else:
            assert p.grad is None, name
    from qkv.training.optim import build_adamw

    opt = build_adamw(gpt, lr=1e-3)
    assert sum(len(g["params"]) for g in opt.param_groups) == len(trainable)


def test_merged_equals_unmerged_and_is_a_plain_model(gpt):
    x = torch.randint(0, 64, (3, 12))
    base_out = gpt(x)
    apply_lora(gpt, rank=3, alpha=6)
    _randomize_b(gpt)
    adapted = gpt(x)
    assert (adapted - base_out).abs().max() > 1e-3  # the adapters do change the output
    merged = merge_lora(gpt)
    assert not any(isinstance(m, LoRALinear) for m in merged.modules())
    torch.testing.assert_close(merged(x), adapted, atol=1e-5, rtol=1e-5)
    fresh = GPT(preset("tiny-gpt", dropout=0.0)).eval()
    fresh.load_state_dict(merged.state_dict())  # the original names: loads into a plain GPT
    torch.testing.assert_close(fresh(x), adapted, atol=1e-5, rtol=1e-5)


def test_merged_is_the_effective_matrix():
    torch.manual_seed(1)
    lin = nn.Linear(5, 7)
    lora = LoRALinear(lin, rank=2, alpha=4)
    with torch.no_grad():
        lora.lora_B.normal_()
    x = torch.randn(3, 5)
    merged = lora.merged()
    assert type(merged) is nn.Linear
    torch.testing.assert_close(lora(x), merged(x))
    assert set(lora_state_dict(nn.Sequential(lora))) == {"0.lora_A", "0.lora_B"}


def test_lora_adapts_every_projection_of_the_encoder_decoder():
    """Cross-attention's W^Q and [W^K; W^V] included: every adapter gets a gradient, and merging keeps the outputs."""
    from qkv import Transformer, preset

    torch.manual_seed(0)
    model = Transformer(preset("tiny-transformer"))
    names = apply_lora(model, rank=2)
    kinds = {n.rsplit(".", 1)[-1] for n in names}
    assert kinds == {"in_proj", "q_proj", "kv_proj", "out_proj", "w_1", "w_2"}
    assert sum(n.endswith("cross_attn.kv_proj") for n in names) == model.cfg.decoder_layers
    _randomize_b(model)
    src, tgt = torch.randint(4, 64, (2, 6)), torch.randint(4, 64, (2, 5))
    model.train()
    model(src, tgt).logsumexp(-1).mean().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for n, p in model.named_parameters()
               if n.endswith(("lora_A", "lora_B")))
    model.eval()
    with torch.no_grad():
        adapted = model(src, tgt)
        merge_lora(model)
        torch.testing.assert_close(model(src, tgt), adapted, atol=1e-5, rtol=0)


def test_bad_targets_and_ranks_are_clear_errors(gpt):
    with pytest.raises(ValueError, match="match no nn.Linear.*in_proj"):
        apply_lora(gpt, rank=4, targets=["q_proj"])
    with pytest.raises(ValueError, match="rank must be >= 1"):
        LoRALinear(nn.Linear(3, 3), rank=0, alpha=1)
    apply_lora(gpt, rank=2)
    with pytest.raises(ValueError, match="already has LoRA"):
        apply_lora(gpt, rank=2)
