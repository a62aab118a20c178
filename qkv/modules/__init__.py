"""The Transformer's building blocks, the paper's Section 3 in two files: attention, its masks and the keys and
values it keeps while decoding (3.2); the layers, their feed-forward network and the positions (3.1, 3.3, 3.5).
Beside them, what padded batches and fine-tuning add: the packed layout of real tokens, LoRA."""

from qkv.modules.attention import (
    Attention,
    CrossAttention,
    KVCache,
    SelfAttention,
    StaticKV,
    causal_mask,
    combine,
    lengths_mask,
    padding_mask,
    scaled_dot_product_attention,
)
from qkv.modules.layers import (
    DecoderLayer,
    EncoderLayer,
    FeedForward,
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    Sublayer,
    sinusoidal_table,
)

__all__ = [
    "Attention", "SelfAttention", "CrossAttention", "scaled_dot_product_attention", "causal_mask", "combine",
    "lengths_mask", "padding_mask", "KVCache", "StaticKV", "FeedForward", "Sublayer", "EncoderLayer", "DecoderLayer",
    "LearnedPositionalEmbedding", "RotaryEmbedding", "SinusoidalPositionalEncoding", "sinusoidal_table",
]
