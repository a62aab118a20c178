"""A GPT run directory: the recipe that describes it, the files it holds, and loading a model from it.

One directory holds everything needed to use or continue a language model (DESIGN, "Contracts"):

    config.json         the resolved recipe (model, data, train), vocab_size set from the tokenizer
    tokenizer.json      the tokenizer
    tokens.bin(.json)   the corpus tokenized once (memory-mapped uint16/uint32, see qkv.data.lm)
    last.safetensors    \\ the latest checkpoint: weights, and trainer state for an exact --resume
    last.pt             /
    best.safetensors    weights at the best validation loss so far
    model.safetensors   the weights to use (written at the end; the best ones unless keep_best=false)
    metrics.jsonl       one JSON object per logged event
    curves.png          loss and learning rate against step

A fine-tuning run (``qkv finetune``) has the same layout plus ``finetune.json``. A run converted from
GPT-2 (``qkv convert gpt2``) holds config.json, tokenizer.json (+ tokenizer.bpe) and model.safetensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qkv.config import ModelConfig, load_json

CONFIG_FILE = "config.json"
MODEL_WEIGHTS = "model.safetensors"
BEST_WEIGHTS = "best.safetensors"
LAST = "last"
METRICS_FILE = "metrics.jsonl"
CURVES_FILE = "curves.png"


def _gpt() -> ModelConfig:
    # nanoGPT's shakespeare-char model; vocab_size is replaced by the tokenizer's size.
    return ModelConfig(arch="gpt", vocab_size=65, d_model=384, n_heads=6, d_ff=1536, n_layers=6, dropout=0.2,
                       max_len=256, positional="learned", norm="pre", activation="gelu", bias=False)


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
        valid_fraction: The last this fraction of the tokens is the validation split.
        start: Text an empty prompt starts from (nanoGPT samples from a newline).
    """

    corpus: str = "tinyshakespeare"
    path: str = ""
    data_dir: str = ""
    tokenizer: str = "char"
    vocab_size: int = 0
    vocab_extra: list[str] = field(default_factory=list)
    valid_fraction: float = 0.1
    start: str = "\n"

    def __post_init__(self) -> None:
        if self.tokenizer not in ("char", "bytelevel", "gpt2"):
            from qkv.config import ConfigError

            raise ConfigError(f"data.tokenizer must be 'char', 'bytelevel' or 'gpt2', got {self.tokenizer!r}")


@dataclass(frozen=True)
class LMTrainConfig:
    """The optimization recipe (defaults: nanoGPT's ``train_shakespeare_char.py``).

    Attributes:
        batch_size: Windows per micro-batch.
        context: Tokens per window; 0 means the model's ``max_len``.
        grad_accum: Micro-batches per optimizer step (the effective batch is their product).
        max_iters: Optimizer steps.
        max_minutes: Also stop once this much wall time has gone into the run (evaluations included),
            with the same final evaluation and export as at ``max_iters`` (None: no limit). The cosine
            still runs to ``decay_iters``: set ``max_iters`` so it ends near the budget.
        lr, min_lr: Peak and final learning rate of the cosine schedule.
        warmup: Linear warmup steps.
        lr_decay_iters: Step at which the cosine reaches ``min_lr``; 0 means ``max_iters``.
        weight_decay: AdamW decay of matrices and embeddings (biases and LayerNorm gains get none).
        beta1, beta2: AdamW betas (nanoGPT uses 0.99 for beta2 on its small Shakespeare model).
        grad_clip: Clip the global gradient norm to this (0: off).
        eval_interval: Estimate train and valid loss every this many steps (and at the end).
        eval_iters: Batches per estimate.
        log_interval: Write the train loss to metrics.jsonl every this many steps.
        checkpoint_interval: Save ``last`` every this many steps (0: only at evaluations and the end).
        seed: Seeds the initial weights, dropout and the window sampler.
        device: ``auto`` (CUDA if present), ``cpu`` or ``cuda``.
        dtype: ``auto`` (bf16 autocast on CUDA, fp32 on CPU), ``fp32`` or ``bf16`` (CUDA only).
        compile: ``torch.compile`` the model (gains little on CPU; never required).
        keep_best: ``model.safetensors`` gets the weights of the best validation estimate, not the last.
        threads: CPU threads for torch (0: torch's default). On a shared machine 1 can be faster than
            2: a busy core stalls every multi-threaded operation.
    """

    batch_size: int = 64
    context: int = 0
    grad_accum: int = 1
    max_iters: int = 5000
    max_minutes: float | None = None
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup: int = 100
    lr_decay_iters: int = 0
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0
    eval_interval: int = 250
    eval_iters: int = 200
    log_interval: int = 10
    checkpoint_interval: int = 0
    seed: int = 1337
    device: str = "auto"
    dtype: str = "auto"
    compile: bool = False
    keep_best: bool = True
    threads: int = 0

    def __post_init__(self) -> None:
        from qkv.config import ConfigError

        for name in ("batch_size", "grad_accum", "max_iters", "eval_interval", "eval_iters", "log_interval"):
            if getattr(self, name) < 1:
                raise ConfigError(f"train.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("context", "warmup", "lr_decay_iters", "checkpoint_interval", "threads"):
            if getattr(self, name) < 0:
                raise ConfigError(f"train.{name} must be >= 0, got {getattr(self, name)}")
        if self.max_minutes is not None and self.max_minutes <= 0:
            raise ConfigError(f"train.max_minutes must be > 0 (or null), got {self.max_minutes}")
        if not 0 < self.lr or self.min_lr < 0 or self.min_lr > self.lr:
            raise ConfigError(f"train: need 0 <= min_lr <= lr and lr > 0, got lr={self.lr}, min_lr={self.min_lr}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ConfigError(f"train.device must be auto, cpu or cuda, got {self.device!r}")
        if self.dtype not in ("auto", "fp32", "bf16"):
            raise ConfigError(f"train.dtype must be auto, fp32 or bf16, got {self.dtype!r}")

    @property
    def decay_iters(self) -> int:
        return self.lr_decay_iters or self.max_iters


@dataclass(frozen=True)
class LMRecipe:
    """A whole GPT pretraining recipe: ``configs/lm/*.yaml`` has these three sections."""

    model: ModelConfig = field(default_factory=_gpt)
    data: LMDataConfig = field(default_factory=LMDataConfig)
    train: LMTrainConfig = field(default_factory=LMTrainConfig)

    def __post_init__(self) -> None:
        from qkv.config import ConfigError

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


def load_recipe(run_dir: str | Path) -> LMRecipe:
    """The resolved recipe saved in a run directory."""
    path = Path(run_dir) / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir}: not a qkv GPT run directory (no {CONFIG_FILE})")
    return load_json(path, LMRecipe)


def weights_file(run_dir: str | Path, which: str = "model") -> Path:
    """The weights to use: ``model`` (the export), ``best`` or ``last``; ``model`` falls back to best, then last."""
    from qkv.training.checkpoint import run_weights

    names = ("model", "best", "last")
    if which not in names:
        raise ValueError(f"weights must be one of {sorted(names)}, got {which!r}")
    path = run_weights(run_dir, None if which == "model" else which)
    if path is None or not path.is_file():
        tried = [f"{n}.safetensors" for n in (names if which == "model" else (which,))]
        raise FileNotFoundError(f"{run_dir}: no weights ({', '.join(tried)})")
    return path


def load_run(run_dir: str | Path, device: str | None = None, which: str = "model") -> tuple[Any, Any, LMRecipe]:
    """Build the GPT of a run directory with its weights, in eval mode, and its tokenizer.

    Returns:
        ``(model, tokenizer, recipe)``.
    """
    import torch

    from qkv.models.gpt import GPT
    from qkv.tokenizers import load_tokenizer
    from qkv.training.checkpoint import load_weights

    recipe = load_recipe(run_dir)
    tokenizer = load_tokenizer(run_dir)
    if tokenizer.vocab_size != recipe.model.vocab_size:
        raise ValueError(f"{run_dir}: tokenizer has {tokenizer.vocab_size} entries, config.json says "
                         f"vocab_size={recipe.model.vocab_size}")
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model = GPT(recipe.model).to(dev)
    load_weights(weights_file(run_dir, which), model)
    model.eval()
    return model, tokenizer, recipe


def convert_gpt2_run(source: str | Path, run_dir: str | Path) -> Path:
    """Write a run directory holding a Hugging Face GPT-2 (``GPT2LMHeadModel``) and GPT-2's tokenizer.

    ``qkv generate`` and ``qkv eval lm --text FILE`` then use it as any run. It holds no pretraining
    corpus, which ``qkv finetune`` needs for its before/after scores. The tokenizer comes from
    ``merges.txt`` and ``vocab.json`` in ``source`` when it is a folder that has them, else from
    tiktoken (``qkv.tokenizers.gpt2``).

    Args:
        source: a model name Hugging Face can load (downloads it) or a folder saved by ``save_pretrained``.
        run_dir: the new run directory (it must not hold a run yet).
    """
    from transformers import GPT2LMHeadModel

    from qkv.config import save_json
    from qkv.models.convert import gpt_from_hf
    from qkv.tokenizers.gpt2 import GPT2Tokenizer
    from qkv.training.checkpoint import save_weights

    run_dir, folder = Path(run_dir), Path(source)
    if (run_dir / CONFIG_FILE).exists():
        raise ValueError(f"{run_dir} already holds a run; pick another --run")
    if (folder / "merges.txt").is_file() and (folder / "vocab.json").is_file():
        tokenizer = GPT2Tokenizer.from_files(folder / "merges.txt", folder / "vocab.json")
    else:
        tokenizer = GPT2Tokenizer.from_tiktoken()
    model = gpt_from_hf(GPT2LMHeadModel.from_pretrained(str(source)))
    if model.cfg.vocab_size != tokenizer.vocab_size:
        raise ValueError(f"{source}: the model has {model.cfg.vocab_size} token embeddings, GPT-2's tokenizer "
                         f"{tokenizer.vocab_size} ids")
    recipe = LMRecipe(model=model.cfg, data=LMDataConfig(corpus="", tokenizer="gpt2", start=""))
    run_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(run_dir)
    save_json(recipe, run_dir / CONFIG_FILE)
    save_weights(run_dir / MODEL_WEIGHTS, model, metadata={"converted_from": str(source)})
    return run_dir
