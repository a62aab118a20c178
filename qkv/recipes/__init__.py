"""What a recipe is: the types a recipe's YAML file (the ones shipped here, in ``mt/`` and ``lm/``) and a
run's ``config.json`` are read into, each section a dataclass whose fields hold its defaults, once.

- :class:`LoopConfig`: the ``train:`` knobs every recipe has, with one name and one meaning in every
  job (``steps``, ``warmup``, ``accumulate``, ``clip_norm``, ``eval_every``, ``log_every``, ``seed``,
  ``device``, ``dtype``, ``threads``, ``max_minutes``...). A job changes a default only where its recipe
  differs (a GPT warms up for 100 steps, the paper's Transformer for 4,000).
- :class:`MTRecipe` (a translation run: :class:`ModelConfig`, :class:`DataConfig`, :class:`MTTrainConfig`)
  and :class:`LMRecipe` (a GPT run: :class:`LMDataConfig`, :class:`LMTrainConfig`); :data:`RUN_RECIPES`,
  the recipe of each kind of run, by its ``model.arch``.

They live below the trainers (``qkv.training``) so that whatever reads a run (``qkv.runs``, and every command
through it) reads its ``config.json`` as strictly as a recipe is read: through :func:`qkv.settings.from_dict`,
an unknown key or section is an error that names the file, the key and the nearest known one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from qkv.config import ALPHA, BEAM, PRESETS, ModelConfig
from qkv.data.lm import check_split
from qkv.data.translation import DataConfig
from qkv.devices import DEVICE_DEFAULT, DTYPES
from qkv.errors import ConfigError

LOGGERS = ("jsonl", "tensorboard")  # train.logger: metrics.jsonl always; tensorboard adds its events

NONFINITE_POLICIES = ("stop", "skip")


@dataclass(frozen=True)
class LoopConfig:
    """The knobs of a training loop that every recipe has (its ``train:`` section).

    Attributes:
        steps: Optimizer updates (the paper: 100,000 for the base model).
        max_minutes: Also stop once this much training time has gone by, with the same final
            evaluation and export as at ``steps`` (None: no limit).
        warmup: Steps of linear warmup of the learning rate (the paper: 4,000).
        accumulate: Batches whose gradients are summed into one update (a bigger effective batch).
        clip_norm: Clip the gradient's global norm to this (0: no clipping).
        eval_every: Validate (and checkpoint) every this many steps, and at the end.
        log_every: Write a training line to metrics.jsonl every this many steps.
        seed: Seeds the initial weights, dropout and the order of the data.
        device: ``auto`` (CUDA when present, else the CPU), ``cpu``, ``cuda`` or ``cuda:N``.
        dtype: ``auto`` (bf16 autocast on CUDA, fp16 with a gradient scaler on GPUs without bf16, fp32 on
            CPU), ``fp32``, ``bf16`` or ``fp16`` (CUDA only).
        threads: CPU threads for torch (0: torch's default). On a shared machine 1 can be faster than
            2: a busy core stalls every multi-threaded operation.
        compile: ``torch.compile`` the training step's model (pays on GPUs; gains little on CPUs; the
            first steps wait for the compiler).
        on_nonfinite: What a NaN or infinite loss or gradient norm does: ``stop`` the run (the last
            checkpoint is kept, and resumes), or ``skip`` the batch (no update; the step still counts, as
            fairseq and mixed-precision scalers skip a step) and go on.
        max_skips: With ``skip``, stop anyway after this many skipped batches in a row: a model that
            diverged is not rescued by skipping, and a run should not spend its budget doing nothing.
        logger: ``jsonl`` (metrics.jsonl, always written), or ``tensorboard``: its numbers as TensorBoard
            events in the run's ``tensorboard/`` as well (``pip install 'qkv[tensorboard]'``).
    """

    steps: int = 20000
    max_minutes: float | None = None
    warmup: int = 4000
    accumulate: int = 1
    clip_norm: float = 1.0
    eval_every: int = 1000
    log_every: int = 100
    seed: int = 1
    device: str = DEVICE_DEFAULT
    dtype: str = "auto"
    threads: int = 0
    compile: bool = False
    on_nonfinite: str = "stop"
    max_skips: int = 10
    logger: str = LOGGERS[0]

    def __post_init__(self) -> None:
        for name in ("steps", "accumulate", "eval_every", "log_every", "max_skips"):
            if getattr(self, name) < 1:
                raise ConfigError(f"train.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("warmup", "threads", "clip_norm"):
            if getattr(self, name) < 0:
                raise ConfigError(f"train.{name} must be >= 0, got {getattr(self, name)}")
        if self.max_minutes is not None and self.max_minutes <= 0:
            raise ConfigError(f"train.max_minutes must be > 0 (or null), got {self.max_minutes}")
        if not 0 <= self.seed < 2**63:
            raise ConfigError(f"train.seed must be in [0, 2^63), got {self.seed}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"train.dtype must be one of {list(DTYPES)}, got {self.dtype!r}")
        if self.logger not in LOGGERS:
            raise ConfigError(f"train.logger must be one of {list(LOGGERS)}, got {self.logger!r}")
        if self.on_nonfinite not in NONFINITE_POLICIES:
            raise ConfigError(f"train.on_nonfinite must be one of {list(NONFINITE_POLICIES)}, got "
                              f"{self.on_nonfinite!r}")


def check_rates(lr: float, min_lr: float) -> None:
    """A cosine schedule's rates, checked as a recipe is read: a finite peak > 0 and 0 <= min_lr <= lr (an
    infinite rate would pass a plain comparison and end the run at its second step)."""
    if not (0 < lr < math.inf and 0 <= min_lr <= lr):
        raise ConfigError(f"train: need a finite lr > 0 and 0 <= min_lr <= lr, got lr={lr}, min_lr={min_lr}")


def check_adam(weight_decay: float, betas: Sequence[float]) -> None:
    """Adam's and AdamW's knobs, checked as a recipe is read: decay >= 0, two betas in [0, 1)."""
    if not weight_decay >= 0:
        raise ConfigError(f"train.weight_decay must be >= 0, got {weight_decay}")
    if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
        raise ConfigError(f"train: Adam's betas must be two numbers in [0, 1), got {list(betas)}")


# ----------------------------------------------------------------------------------------------
# Translation


def _default_model() -> ModelConfig:
    # vocab_size and pad_id are set from the tokenizer when a run starts.
    return ModelConfig(arch="transformer", d_model=256, n_heads=4, d_ff=1024, n_layers=3, dropout=0.1, max_len=256)


@dataclass(frozen=True)
class MTTrainConfig(LoopConfig):
    """The ``train:`` section of a translation recipe: :class:`LoopConfig`'s knobs plus these.

    Attributes:
        peak_lr: the learning rate at the end of warmup; None uses the paper's formula,
            ``lr_factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)``.
        lr_factor: multiplier of the paper's formula (when ``peak_lr`` is None).
        adam_betas, adam_eps: the paper's Adam (0.9, 0.98), 1e-9.
        weight_decay: L2 penalty (the paper: none).
        label_smoothing: epsilon_ls (the paper: 0.1).
        eval_bleu_sentences: validation sentences translated for BLEU at each evaluation (0: loss only).
        eval_beam: beam size of those translations (1: greedy, fast).
        best_metric: ``loss`` (validation NLL) or ``bleu`` picks the best checkpoint and drives early stopping.
        patience: stop after this many evaluations without improvement (0: never).
        keep_checkpoints: step checkpoints kept for averaging.
        average_last: average the last K step checkpoints at the end (0 or 1: no averaging).
        test_beam: beam size for the test set at the end.
        test_alpha: length penalty for the test set at the end.
    """

    peak_lr: float | None = None
    lr_factor: float = 1.0
    adam_betas: tuple[float, float] = (0.9, 0.98)
    adam_eps: float = 1e-9
    weight_decay: float = 0.0
    label_smoothing: float = 0.1
    eval_bleu_sentences: int = 200
    eval_beam: int = 1
    best_metric: str = "loss"
    patience: int = 0
    keep_checkpoints: int = 5
    average_last: int = 5
    test_beam: int = BEAM
    test_alpha: float = ALPHA

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.best_metric not in ("loss", "bleu"):
            raise ConfigError(f"train.best_metric must be 'loss' or 'bleu', got {self.best_metric!r}")
        if self.best_metric == "bleu" and self.eval_bleu_sentences < 1:
            raise ConfigError("train.best_metric='bleu' needs train.eval_bleu_sentences > 0")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ConfigError(f"train.label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if self.warmup < 1:
            raise ConfigError(f"train.warmup must be >= 1 (the schedule divides by it), got {self.warmup}")
        if self.peak_lr is not None and not 0 <= self.peak_lr < math.inf:
            raise ConfigError(f"train.peak_lr must be a finite number >= 0 (or null: the paper's formula), got "
                              f"{self.peak_lr}")
        if not 0 < self.lr_factor < math.inf or not self.adam_eps > 0:
            raise ConfigError(f"train: need lr_factor > 0 and adam_eps > 0, got {self.lr_factor}, {self.adam_eps}")
        check_adam(self.weight_decay, self.adam_betas)
        for name in ("eval_beam", "test_beam", "keep_checkpoints"):
            if getattr(self, name) < 1:
                raise ConfigError(f"train.{name} must be >= 1, got {getattr(self, name)}")
        if self.patience < 0 or self.average_last < 0 or self.eval_bleu_sentences < 0:
            raise ConfigError("train.patience, average_last and eval_bleu_sentences must be >= 0")
        if not (self.test_alpha >= 0 and math.isfinite(self.test_alpha)):
            raise ConfigError(f"train.test_alpha must be a finite number >= 0, got {self.test_alpha}")


@dataclass(frozen=True)
class MTRecipe:
    """Everything a translation run needs: the ``model:``, ``data:`` and ``train:`` sections of a recipe
    (``qkv/recipes/mt/*.yaml``).

    ``model.vocab_size`` and ``model.pad_id`` come from the tokenizer when a run starts.
    """

    model: ModelConfig = field(default_factory=_default_model)
    data: DataConfig = field(default_factory=DataConfig)
    train: MTTrainConfig = field(default_factory=MTTrainConfig)

    def __post_init__(self) -> None:
        if self.model.arch != "transformer":
            raise ConfigError(f"model.arch must be 'transformer' for translation, got {self.model.arch!r}")


# ----------------------------------------------------------------------------------------------
# GPT


def _gpt() -> ModelConfig:
    # nanoGPT's shakespeare-char model (the preset); vocab_size is replaced by the tokenizer's size.
    return PRESETS["nanogpt-shakespeare-char"]


@dataclass(frozen=True)
class LMDataConfig:
    """Where the text comes from and how it becomes tokens.

    Attributes:
        corpus: A registered text corpus (``qkv data list``), used when ``path`` is empty.
        path: A UTF-8 text file to train on instead of a registered corpus.
        data_dir: Where to look for corpora first (see ``qkv.data.corpora``).
        tokenizer: ``"char"`` (one id per character), ``"bytelevel"`` (byte-level BPE trained on the
            corpus) or ``"gpt2"`` (GPT-2's own BPE, ``qkv.tokenizers.gpt2``; e.g. to keep training a
            model converted from GPT-2).
        vocab_size: BPE vocabulary size (``bytelevel`` only).
        vocab_extra: More text the vocabulary must cover without training on it, e.g. the fine-tuning
            corpus: registered corpus names, ``NAME:SPLIT`` for both sides of a parallel corpus, or
            paths of text files.
        valid_fraction: This fraction of the corpus validates.
        split: How: ``"position"``, the last ``valid_fraction`` of the tokens (one long text, as
            nanoGPT splits Shakespeare), or ``"documents"``, every ``1 / valid_fraction``-th paragraph
            (a corpus of many short texts in an order that means something; see :mod:`qkv.data.lm`).
        start: Text an empty prompt starts from (nanoGPT samples from a newline).
    """

    corpus: str = "tinyshakespeare"
    path: str = ""
    data_dir: str = ""
    tokenizer: str = "char"
    vocab_size: int = 0
    vocab_extra: list[str] = field(default_factory=list)
    valid_fraction: float = 0.1
    split: str = "position"
    start: str = "\n"

    def __post_init__(self) -> None:
        if self.tokenizer not in ("char", "bytelevel", "gpt2"):
            raise ConfigError(f"data.tokenizer must be 'char', 'bytelevel' or 'gpt2', got {self.tokenizer!r}")
        check_split(self.split, self.valid_fraction)


@dataclass(frozen=True)
class LMTrainConfig(LoopConfig):
    """The ``train:`` section of a GPT recipe: :class:`LoopConfig`'s knobs (with nanoGPT's
    ``train_shakespeare_char.py`` defaults) plus these.

    Attributes:
        batch_size: Windows per micro-batch.
        context: Tokens per window; 0 means the model's ``max_len``.
        lr, min_lr: Peak and final learning rate of the cosine schedule.
        decay_steps: Step at which the cosine reaches ``min_lr``; 0 means ``steps``. With
            ``max_minutes`` the cosine still runs to it: set ``steps`` so it ends near the budget.
        weight_decay: AdamW decay of matrices and embeddings (biases and LayerNorm gains get none).
        beta1, beta2: AdamW betas (nanoGPT uses 0.99 for beta2 on its small Shakespeare model).
        eval_iters: Batches per loss estimate (every ``eval_every`` steps).
        checkpoint_every: Save ``last`` every this many steps (0: only at evaluations and the end).
        keep_best: ``model.safetensors`` gets the weights of the best validation estimate, not the last.
    """

    steps: int = 5000
    warmup: int = 100
    eval_every: int = 250
    log_every: int = 10
    seed: int = 1337
    batch_size: int = 64
    context: int = 0
    lr: float = 1e-3
    min_lr: float = 1e-4
    decay_steps: int = 0
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.99
    eval_iters: int = 200
    checkpoint_every: int = 0
    keep_best: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("batch_size", "eval_iters"):
            if getattr(self, name) < 1:
                raise ConfigError(f"train.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("context", "decay_steps", "checkpoint_every"):
            if getattr(self, name) < 0:
                raise ConfigError(f"train.{name} must be >= 0, got {getattr(self, name)}")
        check_rates(self.lr, self.min_lr)
        check_adam(self.weight_decay, (self.beta1, self.beta2))

    @property
    def decay_end(self) -> int:
        """The step at which the cosine reaches ``min_lr``."""
        return self.decay_steps or self.steps


@dataclass(frozen=True)
class LMRecipe:
    """A whole GPT pretraining recipe: the ``model:``, ``data:`` and ``train:`` sections of a recipe
    (``qkv/recipes/lm/*.yaml``)."""

    model: ModelConfig = field(default_factory=_gpt)
    data: LMDataConfig = field(default_factory=LMDataConfig)
    train: LMTrainConfig = field(default_factory=LMTrainConfig)

    def __post_init__(self) -> None:
        if self.model.arch != "gpt":
            raise ConfigError(f"model.arch must be 'gpt' for a language model, got {self.model.arch!r}")
        if self.train.context > self.model.max_len:
            raise ConfigError(
                f"train.context={self.train.context} exceeds model.max_len={self.model.max_len} (the positions "
                "the model has); raise model.max_len or shorten the context"
            )

    @property
    def context(self) -> int:
        return self.train.context or self.model.max_len

# The recipe a run's config.json holds, by the kind of its model (model.arch; qkv.models.KINDS names the same).
RUN_RECIPES: dict[str, type] = {"transformer": MTRecipe, "gpt": LMRecipe}


__all__ = ["LOGGERS", "NONFINITE_POLICIES", "LoopConfig", "check_rates", "check_adam", "MTTrainConfig", "MTRecipe",
           "LMDataConfig", "LMTrainConfig", "LMRecipe", "RUN_RECIPES"]
