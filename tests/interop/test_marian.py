"""A qkv Transformer as HF's MarianMTModel: the same logits, and every option Marian cannot hold named."""

import pytest
import torch

from qkv.config import ModelConfig
from qkv.models import Transformer
from qkv.interop.marian import MarianUnsupported, check_marian, marian_order, transformer_to_marian

pytest.importorskip("transformers", reason="the hf extra is not installed")

CFG = dict(vocab_size=61, d_model=24, n_heads=3, d_ff=40, n_layers=2, n_decoder_layers=3, max_len=40, dropout=0.0)


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_logits_match_with_padding_and_an_asymmetric_stack(activation):
    torch.manual_seed(0)
    ours = Transformer(ModelConfig(**CFG, activation=activation)).eval()
    with torch.no_grad():
        for p in ours.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)  # biases and norms away from 0 and 1
    hf = transformer_to_marian(ours, bos_id=1, eos_id=2)
    src = torch.randint(4, 61, (3, 9))
    src[1, 6:] = 0
    tgt = torch.randint(4, 61, (3, 7))
    tgt[:, 0] = 1
    with torch.no_grad():
        theirs = hf(input_ids=src, attention_mask=src != 0, decoder_input_ids=tgt).logits
    torch.testing.assert_close(theirs, ours(src, tgt), atol=1e-4, rtol=0)


def test_the_reordering_puts_qkv_sines_where_marian_computes_them():
    from qkv.modules.layers import sinusoidal_table
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

    marian = MarianSinusoidalPositionalEmbedding(40, 24).create_weight()
    torch.testing.assert_close(sinusoidal_table(40, 24)[:, marian_order(24)], marian, atol=1e-6, rtol=0)


@pytest.mark.parametrize("option, value", [("positional", "rope"), ("positional", "learned"), ("norm", "pre"),
                                           ("activation", "swiglu"), ("bias", False), ("tie_embeddings", False),
                                           ("d_k", 4), ("layer_norm_eps", 1e-6), ("final_norm", True)])
def test_what_marian_cannot_hold_is_named(option, value):
    with pytest.raises(MarianUnsupported, match=f"model.{option}="):
        check_marian(ModelConfig(**{**CFG, option: value}))
