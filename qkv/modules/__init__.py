"""The Transformer's building blocks, a file for each of the paper's parts: attention and its masks (Section 3.2),
the layers and their feed-forward network (3.1, 3.3), positions (3.5); and what decoding, padded batches and
fine-tuning add to them: the KV cache, the packed layout of real tokens, LoRA."""

from qkv.modules.attention import (
    Attention,
    CrossAttention,
    SelfAttention,
    causal_mask,
    combine,
    lengths_mask,
    padding_mask,
    scaled_dot_product_attention,
)
from qkv.modules.kv_cache import KVCache, StaticKV
from qkv.modules.layers import DecoderLayer, EncoderLayer, FeedForward, Sublayer
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
