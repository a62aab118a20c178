"""Training infrastructure shared by the translation and GPT trainers.

optimizers (``optim``), learning-rate schedules (``schedules``), token losses (``losses``),
atomic checkpoints (``checkpoint``; weights files are :mod:`qkv.weights`), metrics and progress (``logging``) and curves (``plots``).
"""

from qkv.files import atomic_path, atomic_paths
from qkv.training.checkpoint import capture_rng_state, list_checkpoints, load_checkpoint, restore_rng_state, save_checkpoint
from qkv.training.logging import MetricsLogger, NonFiniteLossError, Progress, check_finite, read_metrics
from qkv.evaluation.losses import TokenLoss, label_smoothed_nll, masked_nll
from qkv.training.optim import build_adam, build_adamw
from qkv.training.plots import plot_curves
from qkv.training.schedules import cosine_lr, inverse_sqrt_lr, noam_lr, noam_peak_lr, set_lr
from qkv.weights import (
    CheckpointError, average_checkpoints, load_state_dict_into, load_weights, save_weights, unwrap_model,
)

__all__ = [
    "CheckpointError",
    "MetricsLogger",
    "NonFiniteLossError",
    "Progress",
    "TokenLoss",
    "atomic_path",
    "atomic_paths",
    "average_checkpoints",
    "build_adam",
    "build_adamw",
    "capture_rng_state",
    "check_finite",
    "cosine_lr",
    "inverse_sqrt_lr",
    "label_smoothed_nll",
    "list_checkpoints",
    "load_checkpoint",
    "load_state_dict_into",
    "load_weights",
    "masked_nll",
    "noam_lr",
    "noam_peak_lr",
    "plot_curves",
    "read_metrics",
    "restore_rng_state",
    "save_checkpoint",
    "save_weights",
    "set_lr",
    "unwrap_model",
]
