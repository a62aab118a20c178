"""Seeing attention: capture maps from a model, plot them, explore them in the browser, show them in a notebook."""

from qkv.interpret.capture import AttentionMaps, capture_attention
from qkv.interpret.notebook import AttentionView, show

__all__ = ["AttentionMaps", "capture_attention", "AttentionView", "show"]
