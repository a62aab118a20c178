"""A qkv translation model as Hugging Face's ``MarianMTModel``: the paper's Transformer, exactly.

Marian (Junczys-Dowmunt et al., 2018) is the HF architecture closest to the paper: post-norm
encoder and decoder layers with no final norm, embeddings scaled by sqrt(d_model), one embedding
matrix shared by encoder, decoder and the output projection, ReLU, and sinusoidal positions. One
difference of layout: the paper (and qkv) interleave the sines and cosines, PE(pos, 2i) = sin and
PE(pos, 2i+1) = cos, where Marian puts the sines in the first half of the vector and the cosines in
the second, and computes them itself (they are not in its checkpoint). So the export reorders the
model dimension, the same permutation on every weight that reads or writes the residual stream
(embeddings, projections, layer norms): a relabelling of coordinates that changes no output, after
which qkv's positions land where Marian's are. Decoding starts from qkv's ``<bos>``
(``decoder_start_token_id``) and stops at ``<eos>``.

Options HF's Marian cannot express are refused by name (``MarianUnsupported``): RoPE or learned
positions, pre-norm, SwiGLU, a d_k other than d_model / h, untied embeddings, no biases.
``transformers`` is imported only here, and only when a model is exported.
"""

from __future__ import annotations

import torch

from qkv.config import ALPHA, BEAM, ModelConfig
from qkv.errors import QkvError, require
from qkv.models.transformer import Transformer

# qkv's activation -> Marian's activation_function.
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_new"}
MARIAN_LAYER_NORM_EPS = 1e-5  # Marian's layer norms are nn.LayerNorm's default
_SUBLAYERS = [  # qkv name in a layer -> Marian's, for both stacks (the attention projections apart)
    ("self_attn.out_proj", "self_attn.out_proj"),
    ("self_attn_sublayer.norm", "self_attn_layer_norm"),
    ("feed_forward.w_1", "fc1"),
    ("feed_forward.w_2", "fc2"),
    ("ff_sublayer.norm", "final_layer_norm"),
]
_CROSS = [
    ("cross_attn.q_proj", "encoder_attn.q_proj"),
    ("cross_attn.out_proj", "encoder_attn.out_proj"),
    ("cross_attn_sublayer.norm", "encoder_attn_layer_norm"),
]


class MarianUnsupported(QkvError, ValueError):
    """A qkv option that HF's Marian has no way to express."""


def check_marian(cfg: ModelConfig) -> None:
    """Raise :class:`MarianUnsupported` naming the first option of ``cfg`` that Marian cannot hold."""
    wanted = {"arch": "transformer", "positional": "sinusoidal", "norm": "post", "bias": True, "tie_embeddings": True,
              "d_k": None}
    for key, value in wanted.items():
        if getattr(cfg, key) != value:
            raise MarianUnsupported(f"model.{key}={getattr(cfg, key)!r}: HF's MarianMTModel (the paper's Transformer) "
                                    f"needs model.{key}={value!r}")
    if cfg.activation not in ACTIVATIONS:
        raise MarianUnsupported(f"model.activation={cfg.activation!r}: HF's MarianMTModel has "
                                f"{', '.join(ACTIVATIONS)} only")
    if cfg.use_final_norm:
        raise MarianUnsupported("model.final_norm=true: HF's MarianMTModel has no norm after the last layer")
    if cfg.layer_norm_eps != MARIAN_LAYER_NORM_EPS:
        raise MarianUnsupported(f"model.layer_norm_eps={cfg.layer_norm_eps}: HF's MarianMTModel uses "
                                f"{MARIAN_LAYER_NORM_EPS}")


def marian_order(d_model: int) -> torch.Tensor:
    """Marian's coordinate j is qkv's ``marian_order(D)[j]``: the even (sine) ones, then the odd (cosine) ones."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])  # (D,)


def _reorder(name: str, w: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """One weight in Marian's order of the model dimension: its columns if it reads the residual
    stream, its rows if it writes it; the attention heads and the feed-forward layer stay as they are."""
    if name == "model.shared.weight" or name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight",
                                                         "fc1.weight")):
        return w[:, order]  # (out, D): reads the residual stream
    if name.endswith(("out_proj.weight", "fc2.weight")):
        return w[order, :]  # (D, in): writes it
    if name.endswith(("out_proj.bias", "fc2.bias", "layer_norm.weight", "layer_norm.bias")):
        return w[order]  # (D,)
    return w


def _state(model: Transformer) -> dict:
    """Marian's state dict of ``model``'s weights."""
    cfg, ours = model.cfg, model.state_dict()
    d = cfg.d_model
    state = {"model.shared.weight": ours["token_embedding.weight"]}
    stacks = [("encoder", "encoder_layers", cfg.n_layers), ("decoder", "decoder_layers", cfg.decoder_layers)]
    for stack, layers, n in stacks:
        for i in range(n):
            src, dst = f"{layers}.{i}.", f"model.{stack}.layers.{i}."
            pairs = _SUBLAYERS + (_CROSS if stack == "decoder" else [])
            for part in ("weight", "bias"):
                for qkv_name, marian_name in pairs:
                    state[f"{dst}{marian_name}.{part}"] = ours[f"{src}{qkv_name}.{part}"]
                # [W^Q; W^K; W^V] (3D, D) and the cross-attention's [W^K; W^V] (2D, D), one matrix each
                q, k, v = ours[f"{src}self_attn.in_proj.{part}"].split(d)
                state.update({f"{dst}self_attn.q_proj.{part}": q, f"{dst}self_attn.k_proj.{part}": k,
                              f"{dst}self_attn.v_proj.{part}": v})
                if stack == "decoder":
                    k, v = ours[f"{src}cross_attn.kv_proj.{part}"].split(d)
                    state.update({f"{dst}encoder_attn.k_proj.{part}": k, f"{dst}encoder_attn.v_proj.{part}": v})
    order = marian_order(d)
    return {k: _reorder(k, v, order).detach().clone().contiguous() for k, v in state.items()}


def transformer_to_marian(model: Transformer, bos_id: int, eos_id: int):
    """A HF ``MarianMTModel`` (eval mode) with the weights of a qkv ``Transformer``: the same logits.

    Args:
        model: the translation model (its config passes :func:`check_marian`).
        bos_id, eos_id: its tokenizer's ``<bos>`` (Marian's decoder start) and ``<eos>``.
    """
    cfg = model.cfg
    check_marian(cfg)
    transformers = require("transformers", "hf", "exporting a translation model to Hugging Face")
    hf_cfg = transformers.MarianConfig(
        vocab_size=cfg.vocab_size, decoder_vocab_size=cfg.vocab_size, d_model=cfg.d_model,
        encoder_layers=cfg.n_layers, decoder_layers=cfg.decoder_layers,
        encoder_attention_heads=cfg.n_heads, decoder_attention_heads=cfg.n_heads,
        encoder_ffn_dim=cfg.d_ff, decoder_ffn_dim=cfg.d_ff, activation_function=ACTIVATIONS[cfg.activation],
        dropout=cfg.dropout, attention_dropout=cfg.attn_dropout, activation_dropout=0.0,
        max_position_embeddings=cfg.max_len, scale_embedding=True, share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True, pad_token_id=cfg.pad_id, eos_token_id=eos_id, bos_token_id=bos_id,
        decoder_start_token_id=bos_id, forced_eos_token_id=None,
    )
    hf_model = transformers.MarianMTModel(hf_cfg)
    state = _state(model)
    missing, unexpected = hf_model.load_state_dict(state, strict=False)
    # The tied copies (encoder/decoder embed_tokens, lm_head), the zero final_logits_bias and the
    # positions (computed by Marian) are HF's own.
    tied = ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight",
            "final_logits_bias", "model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight")
    missing = [k for k in missing if k not in tied]
    if missing or unexpected:
        raise RuntimeError(f"transformer_to_marian: missing {missing}, unexpected {unexpected}")
    hf_model.tie_weights()
    hf_model.final_logits_bias.zero_()
    # generate()'s defaults, as near qkv's as HF's search allows: beam 4, the whole hypothesis set
    # searched (early_stopping=True would end at the first four finished, before a better one can
    # come). HF's length penalty is |Y|^alpha, not GNMT's ((5 + |Y|) / 6)^alpha: with alpha > 0 the
    # two rank some hypotheses differently; with length_penalty=0 both rank by log-probability.
    # HF has no "source length + 50", so the limit is the model's positions.
    hf_model.generation_config.update(
        decoder_start_token_id=bos_id, bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=cfg.pad_id,
        num_beams=BEAM, length_penalty=ALPHA, early_stopping=False, max_length=cfg.max_len,
        forced_eos_token_id=None)
    return hf_model.eval()


__all__ = ["ACTIVATIONS", "MarianUnsupported", "check_marian", "marian_order", "transformer_to_marian"]
