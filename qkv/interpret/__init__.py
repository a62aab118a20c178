"""Seeing attention: capture maps from a model, plot them, and explore them in the browser."""

from qkv.interpret.capture import AttentionMaps, capture_attention

__all__ = ["AttentionMaps", "capture_attention"]
