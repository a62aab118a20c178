"""The Transformer's building blocks: attention, masks, KV cache, positions, feed-forward, layers."""

from qkv.modules.attention import Attention, CrossAttention, SelfAttention, scaled_dot_product_attention
from qkv.modules.feed_forward import FeedForward
from qkv.modules.kv_cache import KVCache, StaticKV
from qkv.modules.layers import DecoderLayer, EncoderLayer, Sublayer
from qkv.modules.masks import causal_mask, combine, lengths_mask, padding_mask
from qkv.modules.positional import (
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    sinusoidal_table,
)

__all__ = [
    "Attention", "SelfAttention", "CrossAttention", "scaled_dot_product_attention", "FeedForward", "KVCache", "StaticKV",
    "EncoderLayer", "DecoderLayer", "Sublayer", "causal_mask", "combine", "lengths_mask", "padding_mask",
    "LearnedPositionalEmbedding", "RotaryEmbedding", "SinusoidalPositionalEncoding", "sinusoidal_table",
]
