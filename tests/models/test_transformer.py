import pytest
import torch

from qkv import ModelConfig, Transformer, preset
from qkv.models import count_parameters
from qkv.modules.attention import KVCache, StaticKV, padding_mask


def small_cfg(**kw):
    base = dict(vocab_size=50, d_model=32, n_heads=4, d_ff=64, n_layers=2, dropout=0.0, max_len=64)
    return ModelConfig(**{**base, **kw})


def test_paper_presets_have_table_3_sizes():
    with torch.device("meta"):  # sizes only: no memory, no initialization time
        assert count_parameters(Transformer(preset("transformer-base"))) == 63_082_496
        assert count_parameters(Transformer(preset("transformer-big"))) == 214_245_376


def test_embeddings_shared_and_scaled():
    m = Transformer(small_cfg(positional="none")).eval()
    assert m.lm_head.weight is m.token_embedding.weight
    tok = torch.tensor([[5, 6]])
    torch.testing.assert_close(m.embed(tok), m.token_embedding(tok) * 32 ** 0.5)


def _to_torch_transformer(ours: Transformer) -> torch.nn.Transformer:
    cfg = ours.cfg
    ref = torch.nn.Transformer(
        d_model=cfg.d_model, nhead=cfg.n_heads, num_encoder_layers=cfg.n_layers,
        num_decoder_layers=cfg.decoder_layers, dim_feedforward=cfg.d_ff, dropout=0.0,
        activation="relu", batch_first=True, norm_first=cfg.norm == "pre",
    )
    mapping = {}
    for i in range(cfg.n_layers):
        e, r = f"encoder_layers.{i}.", f"encoder.layers.{i}."
        mapping.update({
            r + "self_attn.in_proj_weight": e + "self_attn.in_proj.weight",
            r + "self_attn.in_proj_bias": e + "self_attn.in_proj.bias",
            r + "self_attn.out_proj.weight": e + "self_attn.out_proj.weight",
            r + "self_attn.out_proj.bias": e + "self_attn.out_proj.bias",
            r + "linear1.weight": e + "feed_forward.w_1.weight", r + "linear1.bias": e + "feed_forward.w_1.bias",
            r + "linear2.weight": e + "feed_forward.w_2.weight", r + "linear2.bias": e + "feed_forward.w_2.bias",
            r + "norm1.weight": e + "self_attn_sublayer.norm.weight", r + "norm1.bias": e + "self_attn_sublayer.norm.bias",
            r + "norm2.weight": e + "ff_sublayer.norm.weight", r + "norm2.bias": e + "ff_sublayer.norm.bias",
        })
    for i in range(cfg.decoder_layers):
        d, r = f"decoder_layers.{i}.", f"decoder.layers.{i}."
        for attn, theirs in (("self_attn", "self_attn"), ("cross_attn", "multihead_attn")):
            mapping.update({
                r + f"{theirs}.in_proj_weight": d + f"{attn}.in_proj.weight",
                r + f"{theirs}.in_proj_bias": d + f"{attn}.in_proj.bias",
                r + f"{theirs}.out_proj.weight": d + f"{attn}.out_proj.weight",
                r + f"{theirs}.out_proj.bias": d + f"{attn}.out_proj.bias",
            })
        mapping.update({
            r + "linear1.weight": d + "feed_forward.w_1.weight", r + "linear1.bias": d + "feed_forward.w_1.bias",
            r + "linear2.weight": d + "feed_forward.w_2.weight", r + "linear2.bias": d + "feed_forward.w_2.bias",
            r + "norm1.weight": d + "self_attn_sublayer.norm.weight", r + "norm1.bias": d + "self_attn_sublayer.norm.bias",
            r + "norm2.weight": d + "cross_attn_sublayer.norm.weight", r + "norm2.bias": d + "cross_attn_sublayer.norm.bias",
            r + "norm3.weight": d + "ff_sublayer.norm.weight", r + "norm3.bias": d + "ff_sublayer.norm.bias",
        })
    for part in ("encoder", "decoder"):
        mapping[f"{part}.norm.weight"] = f"{part}_norm.weight"
        mapping[f"{part}.norm.bias"] = f"{part}_norm.bias"
    ours_state = dict(ours.state_dict())
    for i in range(cfg.decoder_layers):  # torch stacks cross-attention's [W^Q; W^K; W^V] too
        c = f"decoder_layers.{i}.cross_attn."
        for part in ("weight", "bias"):
            ours_state[c + f"in_proj.{part}"] = torch.cat([ours_state[c + f"q_proj.{part}"],
                                                         ours_state[c + f"kv_proj.{part}"]])
    ref.load_state_dict({k: ours_state[v] for k, v in mapping.items()}, strict=True)
    return ref.eval()


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_matches_torch_nn_transformer(norm):
    # torch.nn.Transformer always has a final LayerNorm per stack: build ours with one too.
    ours = Transformer(small_cfg(norm=norm, final_norm=True)).eval()
    ref = _to_torch_transformer(ours)
    src = torch.tensor([[5, 6, 7, 8, 9, 10, 11], [5, 6, 7, 8, 0, 0, 0]])
    tgt = torch.tensor([[1, 12, 13, 14, 15], [1, 12, 13, 0, 0]])
    logits = ours(src, tgt)
    src_pad = src == 0
    t = tgt.shape[1]
    ref_hidden = ref(
        ours.embed(src), ours.embed(tgt),
        tgt_mask=torch.nn.Transformer.generate_square_subsequent_mask(t, dtype=torch.bool),
        src_key_padding_mask=src_pad, memory_key_padding_mask=src_pad,
    )
    ref_logits = ours.lm_head(ref_hidden)
    real = tgt != 0  # logits at padding positions are meaningless (qkv does not compute them)
    torch.testing.assert_close(logits[real], ref_logits[real], atol=1e-5, rtol=0)
    # The encoder alone: its padding positions come back as zeros.
    memory = ours.encode(src)
    ref_memory = ref.encoder(ours.embed(src), src_key_padding_mask=src_pad)
    torch.testing.assert_close(memory[~src_pad], ref_memory[~src_pad], atol=1e-5, rtol=0)
    assert bool((memory[src_pad] == 0).all())


def test_padding_invariance():
    m = Transformer(small_cfg()).eval()
    src = torch.tensor([[5, 6, 7]])
    tgt = torch.tensor([[1, 8, 9]])
    alone = m(src, tgt)
    padded = m(torch.tensor([[5, 6, 7, 0, 0, 0]]), torch.tensor([[1, 8, 9, 0]]))
    torch.testing.assert_close(padded[:, :3], alone, atol=1e-5, rtol=0)
    # Batching with a longer sentence changes nothing either.
    batch = m(torch.tensor([[5, 6, 7, 0, 0], [5, 6, 7, 8, 9]]), torch.tensor([[1, 8, 9, 0], [1, 8, 9, 10]]))
    torch.testing.assert_close(batch[:1, :3], alone, atol=1e-5, rtol=0)


def test_scoring_only_kept_positions_equals_selecting_them():
    m = Transformer(small_cfg()).eval()
    src = torch.tensor([[5, 6, 7, 0], [5, 6, 7, 8]])
    tgt = torch.tensor([[1, 8, 0], [1, 9, 10]])
    keep = tgt != 0
    torch.testing.assert_close(m(src, tgt, keep=keep), m(src, tgt)[keep], atol=1e-6, rtol=0)


def test_decoder_is_causal():
    m = Transformer(small_cfg()).eval()
    src = torch.tensor([[5, 6, 7]])
    a = m(src, torch.tensor([[1, 8, 9, 10]]))
    b = m(src, torch.tensor([[1, 8, 9, 30]]))
    torch.testing.assert_close(a[:, :3], b[:, :3])
    assert not torch.allclose(a[:, 3], b[:, 3])


@pytest.mark.parametrize("positional", ["sinusoidal", "learned", "rope"])
@pytest.mark.parametrize("passed", [False, True], ids=["own caches", "caches passed in"])
def test_cached_decoding_equals_uncached(positional, passed):
    m = Transformer(small_cfg(positional=positional)).eval()
    src = torch.tensor([[5, 6, 7, 8, 9], [5, 6, 7, 0, 0]])
    tgt = torch.tensor([[1, 12, 13, 14, 15, 16], [1, 17, 18, 19, 20, 21]])
    with torch.no_grad():
        full = m(src, tgt)
        memory, src_mask = m.encode(src), padding_mask(src, 0)
        caches = None
        if passed:  # their owner's, as a step compiled ahead of time passes them: the layers get none
            attention = m.decoder_layers[0].self_attn
            caches = [(KVCache(2, attention.n_heads, 16, attention.d_v, d_k=attention.d_k), StaticKV())
                      for _ in m.decoder_layers]
        else:
            m.setup_cache(batch_size=2, max_len=16)
        steps = [m.decode(tgt[:, :2], memory, src_mask, caches=caches)]  # a 2-token prefill, then one at a time
        # The sources' keys and values are cached by the first step: the memory is not needed again.
        steps += [m.decode(tgt[:, i:i + 1], None, src_mask, caches=caches) for i in range(2, tgt.shape[1])]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)
    if passed:
        assert all(own.length == 6 and cross.filled for own, cross in caches)
        assert all(layer.self_attn.cache is None and layer.cross_attn.cache is None for layer in m.decoder_layers)


def test_cached_decoding_with_shared_sources_equals_repeating_them():
    # Beam search's layout: rows i * g .. i * g + g - 1 decode sentence i; the cache holds its source once.
    m = Transformer(small_cfg()).eval()
    src = torch.tensor([[5, 6, 7, 8, 9], [5, 6, 7, 0, 0]])
    tgt = torch.randint(4, 30, (6, 5))
    tgt[:, 0] = 1
    with torch.no_grad():
        full = m(src.repeat_interleave(3, 0), tgt)  # (6, 5, V)
        memory, src_mask = m.encode(src), padding_mask(src, 0)  # one row per sentence
        m.setup_cache(batch_size=6, max_len=8)
        steps = [m.decode(tgt[:, i:i + 1], memory if i == 0 else None, src_mask) for i in range(5)]
        assert m.decoder_layers[0].cross_attn.cache.k.shape[0] == 2
        m.clear_cache()
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)


def test_cross_attention_kv_computed_once():
    m = Transformer(small_cfg()).eval()
    memory = m.encode(torch.tensor([[5, 6, 7]]))
    m.setup_cache(1, 8)
    layer = m.decoder_layers[0].cross_attn
    with torch.no_grad():
        m.decode(torch.tensor([[1]]), memory, None)
        k_first = layer.cache.k
        m.decode(torch.tensor([[9]]), None, None)  # memory not needed any more
        assert layer.cache.k is k_first
    m.clear_cache()


def test_bad_input_errors():
    m = Transformer(small_cfg(max_len=8))
    with pytest.raises(ValueError, match="longer than the positional table"):
        m(torch.ones(1, 9, dtype=torch.long), torch.ones(1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="token ids of shape"):
        m(torch.ones(9, dtype=torch.long), torch.ones(1, 3, dtype=torch.long))
    m.setup_cache(1, 4)
    m.decode(torch.ones(1, 4, dtype=torch.long), m.encode(torch.ones(1, 3, dtype=torch.long)), None)
    with pytest.raises(ValueError, match="KVCache is full"):
        m.decode(torch.ones(1, 1, dtype=torch.long), None, None)


def test_a_few_steps_lower_the_loss():
    m = Transformer(small_cfg())
    opt = torch.optim.Adam(m.parameters(), lr=3e-3, betas=(0.9, 0.98), eps=1e-9)
    src = torch.randint(4, 50, (8, 6))
    tgt_out = src.flip(1)  # learn to reverse
    tgt_in = torch.cat([torch.ones(8, 1, dtype=torch.long), tgt_out[:, :-1]], 1)
    losses = []
    for _ in range(30):
        loss = torch.nn.functional.cross_entropy(m(src, tgt_in).reshape(-1, 50), tgt_out.reshape(-1), label_smoothing=0.1)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]


def test_weights_saved_with_earlier_names_still_load(tmp_path):
    """Runs written before cross-attention had its own W^Q and [W^K; W^V] stored one (3D, D) in_proj, and before
    the embedding and the output projection were named as the GPT names them (embedding, generator)."""
    from safetensors.torch import save_file

    from qkv.weights import load_weights

    ours = Transformer(small_cfg()).eval()
    old = {k: v.clone() for k, v in ours.state_dict().items() if not any(p in k for p in (".q_proj.", ".kv_proj."))}
    for i in range(ours.cfg.decoder_layers):
        c = f"decoder_layers.{i}.cross_attn."
        for part in ("weight", "bias"):
            old[c + f"in_proj.{part}"] = torch.cat([ours.state_dict()[c + f"q_proj.{part}"],
                                                  ours.state_dict()[c + f"kv_proj.{part}"]])
    old["embedding.weight"] = old.pop("token_embedding.weight")  # the name before the models named parts alike
    old.pop("lm_head.weight", None)  # tied to the embedding: stored once
    save_file(old, tmp_path / "old.safetensors")
    loaded = Transformer(small_cfg()).eval()
    load_weights(tmp_path / "old.safetensors", loaded)
    src, tgt = torch.randint(4, 50, (2, 5)), torch.randint(4, 50, (2, 4))
    torch.testing.assert_close(loaded(src, tgt), ours(src, tgt))
