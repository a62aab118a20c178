"""A GPT recipe (model, data, train) as it is read from YAML and saved in a run, and a run converted from GPT-2.

The run directory itself (its files, weights and loading) is :mod:`qkv.runs`. A GPT run also holds
``tokens.bin(.json)``, the corpus tokenized once (memory-mapped, see :mod:`qkv.data.lm`); a
fine-tuning run (``qkv finetune``) holds ``finetune.json``; a run converted from GPT-2 (``qkv convert
gpt2``) holds config.json, tokenizer.json (+ tokenizer.bpe) and model.safetensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from qkv.config import PRESETS, ModelConfig
from qkv.errors import ConfigError, require
from qkv.settings import load_json, save_json
from qkv.data.lm import check_split
from qkv.training.loop import LoopConfig, check_adam, check_rates
from qkv.interop.gpt2 import gpt_from_hf
from qkv.runs import CONFIG_FILE, MODEL_WEIGHTS_NAME, Run, RunError, one_writer
from qkv.tokenizers.gpt2 import GPT2Tokenizer
from qkv.weights import save_weights



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
    """The ``train:`` section of a GPT recipe: :class:`~qkv.training.loop.LoopConfig`'s knobs (with nanoGPT's
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


def load_run_recipe(run_dir: str | Path) -> LMRecipe:
    """The resolved recipe saved in a run directory."""
    path = Path(run_dir) / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir}: not a qkv GPT run directory (no {CONFIG_FILE})")
    return load_json(path, LMRecipe)


@one_writer("run_dir")
def convert_gpt2_run(source: str | Path, run_dir: str | Path, tokenizer: str | Path | None = None) -> Path:
    """Write a run directory holding a Hugging Face GPT-2 (``GPT2LMHeadModel``) and GPT-2's tokenizer.

    ``qkv generate`` and ``qkv eval lm --text FILE`` then use it as any run. It holds no pretraining
    corpus, which ``qkv finetune`` needs for its before/after scores. The tokenizer comes from
    ``merges.txt`` and ``vocab.json`` in ``tokenizer`` (a folder), else in ``source`` when it is a
    folder that has them, else from tiktoken (``qkv.tokenizers.gpt2``, which may download them).

    Args:
        source: a model name Hugging Face can load (downloads it) or a folder saved by ``save_pretrained``.
        run_dir: the new run directory (it must not hold a run yet).
        tokenizer: a folder with GPT-2's ``merges.txt`` and ``vocab.json``, when they are not beside the weights.
    """
    transformers = require("transformers", "hf", "qkv convert gpt2")
    run_dir, folder = Path(run_dir), Path(source)
    if Run(run_dir).exists:
        raise RunError(f"{run_dir} already holds a run; pick another --run")
    if not folder.is_dir() and (folder.is_absolute() or str(source).startswith(".")):
        raise FileNotFoundError(f"{source}: no such folder (--from takes a folder saved by save_pretrained, or "
                                "a model name to download such as gpt2)")
    files = ("merges.txt", "vocab.json")
    if tokenizer is not None:
        missing = [name for name in files if not (Path(tokenizer) / name).is_file()]
        if missing:
            raise FileNotFoundError(f"{tokenizer}: no {' or '.join(missing)} (GPT-2's tokenizer files, as "
                                    "save_pretrained writes them)")
    # The weights first: a wrong --from is named before the tokenizer (which may need a download) is sought.
    try:
        hf_model = transformers.GPT2LMHeadModel.from_pretrained(str(source))
    except OSError as e:  # not a folder of weights, and no such model (or no network to fetch it)
        raise FileNotFoundError(f"{source}: no GPT-2 weights there ({str(e).splitlines()[0][:200]})") from None
    folder = Path(tokenizer) if tokenizer is not None else folder
    if all((folder / name).is_file() for name in files):
        gpt2_tokenizer = GPT2Tokenizer.from_files(folder / "merges.txt", folder / "vocab.json")
    else:
        gpt2_tokenizer = GPT2Tokenizer.from_tiktoken()
    model = gpt_from_hf(hf_model)
    if model.cfg.vocab_size != gpt2_tokenizer.vocab_size:
        raise ValueError(f"{source}: the model has {model.cfg.vocab_size} token embeddings, GPT-2's tokenizer "
                         f"{gpt2_tokenizer.vocab_size} ids")
    recipe = LMRecipe(model=model.cfg, data=LMDataConfig(corpus="", tokenizer="gpt2", start=""))
    run_dir.mkdir(parents=True, exist_ok=True)
    gpt2_tokenizer.save(run_dir)
    save_json(recipe, run_dir / CONFIG_FILE)
    save_weights(run_dir / MODEL_WEIGHTS_NAME, model, metadata={"converted_from": str(source)})
    return run_dir
