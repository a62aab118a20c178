"""qkv: the Transformer of "Attention Is All You Need", complete, correct and fast.

    from qkv import Transformer, GPT, ModelConfig
"""

from qkv.config import ModelConfig, preset
from qkv.models import GPT, Transformer, build_model, count_parameters

__version__ = "0.1.0"

__all__ = ["ModelConfig", "preset", "GPT", "Transformer", "build_model", "count_parameters", "__version__"]
