"""Generation: sampling rules and autoregressive decoding with a KV cache."""

from qkv.generation.decode import generate
from qkv.generation.sampling import filter_logits, next_token

__all__ = ["generate", "filter_logits", "next_token"]
