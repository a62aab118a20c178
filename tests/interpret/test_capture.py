import torch

from qkv import GPT, Transformer, preset
from qkv.interpret.capture import capture_attention
from qkv.modules import attention as attention_module


def test_transformer_maps_per_kind_and_layer_rows_sum_to_one():
    m = Transformer(preset("tiny-transformer")).eval()
    src = torch.tensor([[5, 6, 7, 8], [5, 6, 0, 0]])
    tgt = torch.tensor([[1, 9, 10], [1, 11, 12]])
    with capture_attention(m) as maps:
        logits = m(src, tgt)
    assert set(maps) == {"encoder_self", "decoder_self", "cross"}
    n_layers, h = m.cfg.n_layers, m.cfg.n_heads
    assert [w.shape for w in maps["encoder_self"]] == [(2, h, 4, 4)] * n_layers
    assert [w.shape for w in maps["decoder_self"]] == [(2, h, 3, 3)] * n_layers
    assert [w.shape for w in maps["cross"]] == [(2, h, 3, 4)] * n_layers
    for kind in maps:
        for w in maps[kind]:
            torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]))
    # Padding gets no attention; the decoder does not look ahead.
    assert bool((maps["cross"][0][1, :, :, 2:] == 0).all())
    assert bool((maps["decoder_self"][0].triu(1) == 0).all())
    # Capturing does not change the output.
    torch.testing.assert_close(m(src, tgt), logits, atol=1e-5, rtol=0)


def test_nothing_is_recorded_when_off():
    m = GPT(preset("tiny-gpt")).eval()
    with capture_attention(m) as maps:
        m(torch.tensor([[3, 4, 5]]))
    assert attention_module.attention_observer.get() is None
    m(torch.tensor([[3, 4, 5]]))
    assert len(maps["self"]) == m.cfg.n_layers  # the call after the context added nothing
    assert not any(hasattr(mod, "weights") or hasattr(mod, "attn_weights") for mod in m.modules())


def test_cached_steps_concatenate_into_one_map():
    from qkv.generation import generate

    m = GPT(preset("tiny-gpt")).eval()
    with capture_attention(m) as maps:
        generate(m, [[3, 4, 5]], 4, temperature=0)
    w = maps["self"][0]
    # 3 prompt positions + 3 fed-back tokens as queries (the 4th token is never fed back).
    assert w.shape == (1, m.cfg.n_heads, 6, 6)
    torch.testing.assert_close(w.sum(-1), torch.ones(1, m.cfg.n_heads, 6))
