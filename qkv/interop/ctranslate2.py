"""A qkv model as a CTranslate2 model: the C++ engine people deploy Transformers with on CPUs.

CTranslate2 describes a model by a *spec* (``ctranslate2.specs``): the paper's Transformer is its
``TransformerSpec`` and a GPT its ``TransformerDecoderModelSpec``, with the same parts qkv has, so
each weight is copied to its place and nothing is recomputed: the fused [W^Q; W^K; W^V] of
self-attention and the [W^K; W^V] of cross-attention are CTranslate2's fused projections in the
same order; each sublayer's LayerNorm is the norm CTranslate2 applies after the residual (post-norm,
the paper) or before the sublayer (pre-norm); embeddings are scaled by sqrt(d_model) where qkv
scales them (the encoder-decoder) and not in a GPT; the position table (the paper's interleaved
sines and cosines, or a GPT's learned one) is written as it is, so CTranslate2 adds what qkv adds.

The vocabulary is the tokenizer's tokens in id order (CTranslate2 speaks in token strings); a
translation model appends ``<eos>`` to each source itself (``add_source_eos``) and starts the
decoder from ``<bos>``, as ``Translator`` does. Options CTranslate2's specs cannot hold here are
refused by name (:class:`CTranslate2Unsupported`): RoPE, SwiGLU, a d_k other than d_model / h, a
final norm after post-norm layers. ``ctranslate2`` is imported only when a model is converted.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from qkv.config import ModelConfig
from qkv.errors import QkvError, require
from qkv.models.gpt import GPT
from qkv.models.transformer import Transformer

ACTIVATIONS = {"relu": "RELU", "gelu": "GELU", "gelu_tanh": "GELUTanh"}  # qkv -> common_spec.Activation


class CTranslate2Unsupported(QkvError, ValueError):
    """A qkv option that CTranslate2's specs have no way to express."""


def check_ctranslate2(cfg: ModelConfig) -> None:
    """Raise :class:`CTranslate2Unsupported` naming the first option of ``cfg`` CTranslate2 cannot hold."""
    if cfg.positional == "rope":
        raise CTranslate2Unsupported("model.positional='rope': the export writes a table of positions; "
                                     "use sinusoidal or learned positions")
    if cfg.activation not in ACTIVATIONS:
        raise CTranslate2Unsupported(f"model.activation={cfg.activation!r}: the export has {', '.join(ACTIVATIONS)}")
    if cfg.d_k is not None and cfg.d_k * cfg.n_heads != cfg.d_model:
        raise CTranslate2Unsupported(f"model.d_k={cfg.d_k}: CTranslate2's heads split d_model={cfg.d_model} "
                                     f"into {cfg.n_heads} heads of {cfg.d_model // cfg.n_heads}")
    if cfg.norm == "post" and cfg.use_final_norm:
        raise CTranslate2Unsupported("model.final_norm=true with post-norm layers: CTranslate2 has a final norm "
                                     "only after pre-norm layers")


def _array(t: torch.Tensor) -> Any:
    return t.detach().to("cpu", torch.float32).contiguous().numpy()


def _linear(spec: Any, m: nn.Linear) -> None:
    spec.weight = _array(m.weight)
    if m.bias is not None:
        spec.bias = _array(m.bias)


def _norm(spec: Any, m: nn.LayerNorm) -> None:
    spec.gamma = _array(m.weight)
    spec.beta = _array(m.bias)


def _positions(spec: Any, positional: nn.Module | None, cfg: ModelConfig) -> None:
    """The table of positions qkv adds (sinusoidal: the paper's interleaved sines and cosines; or learned)."""
    if positional is None:
        raise CTranslate2Unsupported(f"model.positional={cfg.positional!r}: the export writes a table of positions")
    table = positional.pe if hasattr(positional, "pe") else positional.weight  # (max_len, D)
    spec.position_encodings.encodings = _array(table)


def _layer(spec: Any, layer: nn.Module, cross: bool) -> None:
    """One layer: self-attention (and cross-attention), the feed-forward network, each with its norm."""
    _linear(spec.self_attention.linear[0], layer.self_attn.in_proj)  # [W^Q; W^K; W^V] (3D, D)
    _linear(spec.self_attention.linear[1], layer.self_attn.out_proj)
    _norm(spec.self_attention.layer_norm, layer.self_attn_sublayer.norm)
    if cross:
        _linear(spec.attention.linear[0], layer.cross_attn.q_proj)
        _linear(spec.attention.linear[1], layer.cross_attn.kv_proj)  # [W^K; W^V] (2D, D)
        _linear(spec.attention.linear[2], layer.cross_attn.out_proj)
        _norm(spec.attention.layer_norm, layer.cross_attn_sublayer.norm)
    _linear(spec.ffn.linear_0, layer.feed_forward.w_1)
    _linear(spec.ffn.linear_1, layer.feed_forward.w_2)
    _norm(spec.ffn.layer_norm, layer.ff_sublayer.norm)


def _stack(spec: Any, layers: nn.ModuleList, final_norm: nn.Module, cross: bool) -> None:
    for layer_spec, layer in zip(spec.layer, layers):
        _layer(layer_spec, layer, cross)
    if hasattr(spec, "layer_norm"):  # pre-norm with a final norm
        _norm(spec.layer_norm, final_norm)


def vocabulary(tokenizer: Any) -> list[str]:
    """The tokenizer's tokens in id order, each a distinct string (CTranslate2 speaks in tokens)."""
    tokens = [tokenizer.id_to_token(i) for i in range(tokenizer.vocab_size)]
    if len(set(tokens)) != len(tokens):
        raise CTranslate2Unsupported(f"{type(tokenizer).__name__}: two ids have the same token string, and "
                                     "CTranslate2 names tokens by their strings")
    return tokens


def to_ctranslate2(model: nn.Module, tokenizer: Any) -> Any:
    """The CTranslate2 spec of a qkv ``Transformer`` or ``GPT`` and its tokenizer, ready to ``save``."""
    cfg = model.cfg
    check_ctranslate2(cfg)
    ct2 = require("ctranslate2", "ctranslate2", "exporting a model to CTranslate2")
    specs = ct2.specs
    activation = getattr(specs.Activation, ACTIVATIONS[cfg.activation])
    pre = cfg.norm == "pre"
    tokens = vocabulary(tokenizer)
    if isinstance(model, Transformer):
        spec = specs.TransformerSpec.from_config((cfg.n_layers, cfg.decoder_layers), cfg.n_heads, pre_norm=pre,
                                                 no_final_norm=not cfg.use_final_norm, activation=activation)
        stacks = ((spec.encoder, spec.encoder.embeddings[0]), (spec.decoder, spec.decoder.embeddings))
        for stack, embedding_spec in stacks:  # one embedding matrix, shared as in qkv
            embedding_spec.weight = _array(model.token_embedding.weight)
            stack.scale_embeddings = True  # x * sqrt(d_model), Section 3.4
            _positions(stack, model.positional, cfg)
        _stack(spec.encoder, model.encoder_layers, model.encoder_norm, cross=False)
        _stack(spec.decoder, model.decoder_layers, model.decoder_norm, cross=True)
        _linear(spec.decoder.projection, model.lm_head)
        if tokenizer.bos_id is None or tokenizer.eos_id is None:
            raise CTranslate2Unsupported("a translation tokenizer without <bos> and <eos>")
        spec.config.add_source_eos = True
        spec.config.decoder_start_token = tokens[tokenizer.bos_id]
        spec.register_source_vocabulary(tokens)
        spec.register_target_vocabulary(tokens)
    elif isinstance(model, GPT):
        spec = specs.TransformerDecoderModelSpec.from_config(cfg.n_layers, cfg.n_heads, pre_norm=pre,
                                                             no_final_norm=not cfg.use_final_norm,
                                                             activation=activation)
        spec.decoder.embeddings.weight = _array(model.token_embedding.weight)
        spec.decoder.scale_embeddings = False
        _positions(spec.decoder, model.positional, cfg)
        _stack(spec.decoder, model.layers, model.final_norm, cross=False)
        _linear(spec.decoder.projection, model.lm_head)
        spec.register_vocabulary(tokens)
    else:
        raise CTranslate2Unsupported(f"cannot export a {type(model).__name__}")
    for name in ("bos", "eos", "unk"):  # the tokenizer's specials; one without them keeps CTranslate2's names
        i = getattr(tokenizer, f"{name}_id", None)
        if i is not None:
            setattr(spec.config, f"{name}_token", tokens[i])
    spec.config.layer_norm_epsilon = cfg.layer_norm_eps
    spec.validate()
    return spec


__all__ = ["ACTIVATIONS", "CTranslate2Unsupported", "check_ctranslate2", "vocabulary", "to_ctranslate2"]
