"""Parallel data for translation: which corpus and splits (``DataConfig``), reading them, the joint BPE, ids.

A corpus is one of:

- ``demo``: the embedded synthetic zh->en corpus (:mod:`qkv.data.synthetic`), no files needed;
- a registered corpus name (``multi30k``, ``cmn-eng``...), looked up as :mod:`qkv.data.corpora` says;
- a directory holding ``{split}.{lang}`` files (any corpus of your own).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from qkv.errors import ConfigError
from qkv.data.batching import Example
from qkv.data.corpora import read_parallel, read_parallel_files
from qkv.data.synthetic import DEMO, ZH_WORDS, demo_corpus
from qkv.tokenizers.bpe import BPETokenizer


@dataclass(frozen=True)
class DataConfig:
    """Where the sentence pairs come from and how they are cut into tokens.

    Attributes:
        corpus: ``demo``, a registered corpus name, or a directory of ``{split}.{lang}`` files.
        src_lang, tgt_lang: language codes (file suffixes).
        train, valid, test: split names.
        data_dir: a data root searched first (as ``--data-dir``).
        vocab_size: size of the joint source-target BPE vocabulary (Section 5.1).
        max_tokens: token budget of one batch (per side, padding included).
        max_src_len, max_tgt_len: training pairs longer than this (in tokens) are left out.
        demo_seed, demo_train, demo_valid, demo_test: the synthetic corpus's seed and split sizes.
    """

    corpus: str = DEMO
    src_lang: str = "zh"
    tgt_lang: str = "en"
    train: str = "train"
    valid: str = "valid"
    test: str = "test"
    data_dir: str | None = None
    vocab_size: int = 8000
    max_tokens: int = 4000
    max_src_len: int = 128
    max_tgt_len: int = 128
    demo_seed: int = 0
    demo_train: int = 20000
    demo_valid: int = 500
    demo_test: int = 500

    def __post_init__(self) -> None:
        # The batcher puts a pair that overflows the budget in a batch of its own: a budget smaller than
        # one sentence trains on batches of one pair, which is never what was meant.
        longest = max(self.max_src_len, self.max_tgt_len) + 1  # + <eos> (source) / <bos> (target)
        if self.max_tokens < longest:
            raise ConfigError(f"data.max_tokens={self.max_tokens} does not fit one sentence (max_src_len "
                              f"{self.max_src_len} / max_tgt_len {self.max_tgt_len} tokens, + 1): give at least "
                              f"{longest}; a batch holds max_tokens tokens per side")


def load_split(cfg: DataConfig, split: str) -> tuple[list[str], list[str]]:
    """(source lines, target lines) of one split named in ``cfg`` (``cfg.train``, ``cfg.valid``...)."""
    if cfg.corpus == DEMO:
        splits = demo_corpus(cfg.demo_seed, cfg.demo_train, cfg.demo_valid, cfg.demo_test)
        if split not in splits:
            raise ValueError(f"the demo corpus has splits {sorted(splits)}, not {split!r}")
        if (cfg.src_lang, cfg.tgt_lang) != ("zh", "en"):
            raise ValueError(f"the demo corpus is zh->en, got src_lang={cfg.src_lang!r}, tgt_lang={cfg.tgt_lang!r}")
        src, tgt = splits[split]
        return list(src), list(tgt)
    directory = Path(cfg.corpus).expanduser()
    if "/" in cfg.corpus or directory.is_dir():
        if not directory.is_dir():
            raise FileNotFoundError(f"corpus directory not found: {directory}")
        return read_parallel_files(directory / f"{split}.{cfg.src_lang}", directory / f"{split}.{cfg.tgt_lang}")
    return read_parallel(cfg.corpus, split, cfg.src_lang, cfg.tgt_lang, cfg.data_dir)


def train_joint_bpe(src: Sequence[str], tgt: Sequence[str], vocab_size: int, corpus: str | None = None):
    """One BPE vocabulary for both languages (Section 5.1), trained on the training pairs only.

    The demo corpus's Chinese words are kept whole (synthetic.ZH_WORDS): a token is a word or a piece
    of one, never two words merged."""
    words = ZH_WORDS if corpus == DEMO else ()
    return BPETokenizer.train(list(src) + list(tgt), vocab_size, words=words)


def encode_pairs(tokenizer, src: Sequence[str], tgt: Sequence[str]) -> list[Example]:
    """Token ids of each pair, without special tokens (batching adds them)."""
    if len(src) != len(tgt):
        raise ValueError(f"encode_pairs: {len(src)} source lines but {len(tgt)} target lines")
    return list(zip(tokenizer.encode_batch(list(src)), tokenizer.encode_batch(list(tgt))))


def filter_by_length(examples: Sequence[Example], max_src_len: int,
                     max_tgt_len: int) -> tuple[list[Example], list[int]]:
    """Drop pairs with an empty side or a side longer than the limits.

    Returns:
        (kept examples, indices of the dropped ones).
    """
    kept, dropped = [], []
    for i, (s, t) in enumerate(examples):
        if 0 < len(s) <= max_src_len and 0 < len(t) <= max_tgt_len:
            kept.append((s, t))
        else:
            dropped.append(i)
    return kept, dropped


__all__ = ["DataConfig", "load_split", "train_joint_bpe", "encode_pairs", "filter_by_length"]
