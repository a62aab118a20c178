"""Parallel data for translation: which corpus and splits (``DataConfig``), reading them, the joint BPE, ids,
and the token-budget batches the model is trained on.

A corpus is one of:

- ``demo``: the embedded synthetic zh->en corpus (:mod:`qkv.data.synthetic`), no files needed;
- a registered corpus name (``multi30k``, ``cmn-eng``...), looked up as :mod:`qkv.data.corpora` says;
- a directory holding ``{split}.{lang}`` files (any corpus of your own).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import torch
from torch import Tensor

from qkv.data.corpora import read_parallel, read_parallel_files
from qkv.data.synthetic import DEMO, ZH_WORDS, demo_corpus
from qkv.devices import to_device
from qkv.errors import ConfigError
from qkv.tokenizers.bpe import BPETokenizer

Example = tuple[Sequence[int], Sequence[int]]  # (source ids, target ids), neither with <bos>/<eos>


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


# Batches: length-bucketed token budgets, reshuffled each epoch by seed, resumable, DDP-aware.
#
# "Sentence pairs were batched together by approximate sequence length. Each training batch contained a
# set of sentence pairs containing approximately 25000 source tokens and 25000 target tokens"
# (Section 5.1). A batch is therefore a token budget, not a sentence count: many short sentences or
# few long ones. Sorting by length before cutting batches keeps the padding low (sentences of a batch
# have similar lengths); shuffling within equal lengths and shuffling the order of the batches, with a
# generator seeded by ``(seed, epoch)``, gives a different but reproducible pass every epoch, so a
# resumed run sees exactly the batches an uninterrupted one would have.
#
# Targets are shifted right behind ``<bos>`` (Section 3.1, teacher forcing): the decoder reads
# ``<bos> y1 .. yn`` and is trained to predict ``y1 .. yn <eos>``.


@dataclass
class Batch:
    """One padded batch of sentence pairs.

    Attributes:
        src: (B, S) source ids, right-padded.
        tgt_in: (B, T) decoder input: ``<bos> y1 .. yn``, right-padded.
        tgt_out: (B, T) what each position must predict: ``y1 .. yn <eos>``, right-padded.
        indices: the examples' positions in the dataset.
        src_tokens: real (non-padding) source tokens.
        tgt_tokens: real target tokens (the ones the loss counts).
        padded_tokens: all cells of ``src`` and ``tgt_in``, padding included.
    """

    src: Tensor
    tgt_in: Tensor
    tgt_out: Tensor
    indices: list[int]
    src_tokens: int
    tgt_tokens: int
    padded_tokens: int

    @property
    def size(self) -> int:
        return self.src.shape[0]

    @property
    def padding_fraction(self) -> float:
        """Share of the cells of ``src`` and ``tgt_in`` that are padding."""
        return 1.0 - (self.src_tokens + self.tgt_tokens) / max(self.padded_tokens, 1)

    def to(self, device: torch.device) -> Batch:
        return Batch(to_device(self.src, device), to_device(self.tgt_in, device), to_device(self.tgt_out, device),
                     self.indices, self.src_tokens, self.tgt_tokens, self.padded_tokens)

    def rows(self, rows: slice, pad_id: int) -> Batch:
        """The pairs ``rows`` of this batch (a data-parallel rank's block), without the padding columns they
        no longer need (the batch itself when ``rows`` are all of them: one process)."""
        if range(*rows.indices(self.size)) == range(self.size):
            return self
        src, tgt_in, tgt_out = self.src[rows], self.tgt_in[rows], self.tgt_out[rows]
        src_real, tgt_real = src != pad_id, tgt_out != pad_id  # (b, S), (b, T)
        s = int(src_real.sum(1).max()) if len(src) else 0
        t = int(tgt_real.sum(1).max()) if len(src) else 0
        src, tgt_in, tgt_out = src[:, :s], tgt_in[:, :t], tgt_out[:, :t]
        return Batch(src, tgt_in, tgt_out, self.indices[rows], int(src_real.sum()), int(tgt_real.sum()),
                     src.numel() + tgt_in.numel())


def collate(examples: Sequence[Example], pad_id: int, bos_id: int, eos_id: int,
            indices: Sequence[int] | None = None, src_eos: bool = True) -> Batch:
    """Pad a list of (source, target) id sequences into a :class:`Batch`.

    Args:
        examples: (source ids, target ids) pairs, without special tokens.
        pad_id, bos_id, eos_id: the tokenizer's special ids.
        indices: dataset positions of the examples (default 0..n-1).
        src_eos: end every source with ``<eos>`` (so the encoder sees where the sentence stops, as
            fairseq and Marian do).

    Returns:
        The batch; target length T = longest target + 1.
    """
    if not examples:
        raise ValueError("collate: no examples")
    srcs = [list(s) + ([eos_id] if src_eos else []) for s, _ in examples]
    tgts = [list(t) for _, t in examples]
    b, s_len, t_len = len(examples), max(len(s) for s in srcs), max(len(t) for t in tgts) + 1
    src = torch.full((b, s_len), pad_id, dtype=torch.long)
    tgt_in = torch.full((b, t_len), pad_id, dtype=torch.long)
    tgt_out = torch.full((b, t_len), pad_id, dtype=torch.long)
    for i, (s, t) in enumerate(zip(srcs, tgts)):
        src[i, : len(s)] = torch.as_tensor(s, dtype=torch.long)
        tgt_in[i, : len(t) + 1] = torch.as_tensor([bos_id] + t, dtype=torch.long)  # shifted right
        tgt_out[i, : len(t) + 1] = torch.as_tensor(t + [eos_id], dtype=torch.long)
    n_src = sum(len(s) for s in srcs)
    n_tgt = sum(len(t) + 1 for t in tgts)
    return Batch(src, tgt_in, tgt_out, list(indices) if indices is not None else list(range(b)),
                 n_src, n_tgt, src.numel() + tgt_in.numel())


def _epoch_generator(seed: int, epoch: int) -> torch.Generator:
    # One generator per (seed, epoch): an epoch's batches depend on nothing else, so a resumed run
    # rebuilds them without replaying earlier epochs.
    return torch.Generator().manual_seed(int(seed) * 1_000_003 + int(epoch))


def token_budget_batches(
    src_lengths: Sequence[int],
    tgt_lengths: Sequence[int],
    max_tokens: int,
    seed: int = 0,
    epoch: int = 0,
    bucketed: bool = True,
    shuffle: bool = True,
    max_sentences: int | None = None,
) -> list[list[int]]:
    """Group example indices into batches of at most ``max_tokens`` padded tokens per side.

    A batch of n sentences costs ``n * max(longest source, longest target)`` tokens (the padded size of
    its larger tensor); a single sentence longer than the budget gets a batch of its own.

    Args:
        src_lengths, tgt_lengths: token counts of each example as collated (source with its ``<eos>``,
            target with its ``<bos>``/``<eos>`` shift).
        max_tokens: the token budget of a batch.
        seed, epoch: the shuffle is a function of both.
        bucketed: sort by length before cutting (low padding); False cuts batches in random order
            (for comparison).
        shuffle: shuffle ties and the order of batches (False: sorted, deterministic; for evaluation).
        max_sentences: optional cap on sentences per batch.

    Returns:
        Lists of indices, one per batch.
    """
    n = len(src_lengths)
    if len(tgt_lengths) != n:
        raise ValueError(f"token_budget_batches: {n} source lengths but {len(tgt_lengths)} target lengths")
    if max_tokens < 1:
        raise ValueError(f"token_budget_batches: max_tokens must be >= 1, got {max_tokens}")
    if n == 0:
        return []
    gen = _epoch_generator(seed, epoch)
    order = torch.randperm(n, generator=gen).tolist() if shuffle else list(range(n))
    if bucketed:
        # Stable sort of a random permutation: equal lengths come out in a fresh order every epoch.
        order.sort(key=lambda i: (src_lengths[i], tgt_lengths[i]))
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        size = max(src_lengths[i], tgt_lengths[i])
        grown = max(longest, size)
        full = max_sentences is not None and len(current) >= max_sentences
        if current and (grown * (len(current) + 1) > max_tokens or full):
            batches.append(current)
            current, grown = [], size
        current.append(i)
        longest = grown
    if current:
        batches.append(current)
    if shuffle:
        perm = torch.randperm(len(batches), generator=gen).tolist()
        batches = [batches[j] for j in perm]
    return batches


def padding_fraction(batches: Sequence[Sequence[int]], src_lengths: Sequence[int],
                     tgt_lengths: Sequence[int]) -> float:
    """Share of padding in the ``src`` and ``tgt_in`` tensors these batches would collate to."""
    real = padded = 0
    for idx in batches:
        s = [src_lengths[i] for i in idx]
        t = [tgt_lengths[i] for i in idx]
        real += sum(s) + sum(t)
        padded += len(idx) * (max(s) + max(t))
    return 1.0 - real / padded if padded else 0.0


class BatchStream:
    """Endless training batches, epoch after epoch, with a position that can be saved and restored.

    Example:
        >>> stream = BatchStream(examples, max_tokens=4000, pad_id=0, bos_id=1, eos_id=2, seed=1)  # doctest: +SKIP
        >>> batch = next(stream)  # doctest: +SKIP
        >>> state = stream.state_dict()  # doctest: +SKIP  (resume: stream.load_state_dict(state))

    Args:
        examples: (source ids, target ids) pairs without special tokens.
        max_tokens: token budget per batch (see :func:`token_budget_batches`).
        pad_id, bos_id, eos_id: special ids.
        seed: shuffling seed.
        bucketed: length bucketing (see :func:`token_budget_batches`).
        src_eos: end sources with ``<eos>`` (see :func:`collate`).
    """

    def __init__(self, examples: Sequence[Example], max_tokens: int, pad_id: int, bos_id: int, eos_id: int,
                 seed: int = 0, bucketed: bool = True,
                 src_eos: bool = True, max_sentences: int | None = None) -> None:
        if not examples:
            raise ValueError("BatchStream: no training examples")
        self.examples = examples
        self.max_tokens, self.seed = max_tokens, seed
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id
        self.bucketed, self.src_eos, self.max_sentences = bucketed, src_eos, max_sentences
        self.src_lengths = [len(s) + int(src_eos) for s, _ in examples]
        self.tgt_lengths = [len(t) + 1 for _, t in examples]
        self.epoch, self.index = 0, 0
        self._batches = self._epoch_batches(0)

    def _epoch_batches(self, epoch: int) -> list[list[int]]:
        return token_budget_batches(self.src_lengths, self.tgt_lengths, self.max_tokens, self.seed, epoch,
                                    bucketed=self.bucketed, max_sentences=self.max_sentences)

    @property
    def batches_per_epoch(self) -> int:
        return len(self._batches)

    def epoch_padding_fraction(self) -> float:
        """Padding share of the current epoch's batches (a property of the bucketing, reported at start)."""
        return padding_fraction(self._batches, self.src_lengths, self.tgt_lengths)

    def __iter__(self) -> Iterator[Batch]:
        return self

    def __next__(self) -> Batch:
        if self.index >= len(self._batches):
            self.epoch, self.index = self.epoch + 1, 0
            self._batches = self._epoch_batches(self.epoch)
        idx = self._batches[self.index]
        self.index += 1
        return collate([self.examples[i] for i in idx], self.pad_id, self.bos_id, self.eos_id, idx, self.src_eos)

    def state_dict(self) -> dict[str, int]:
        """The position in the stream: all a resume needs (batches are a function of seed and epoch)."""
        return {"epoch": self.epoch, "index": self.index, "seed": self.seed, "n_examples": len(self.examples)}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if int(state["n_examples"]) != len(self.examples) or int(state["seed"]) != self.seed:
            raise ValueError(
                f"BatchStream.load_state_dict: the saved position is for {state['n_examples']} examples with "
                f"seed {state['seed']}, this stream has {len(self.examples)} with seed {self.seed} "
                "(the data or the config changed since the checkpoint)"
            )
        self.epoch, self.index = int(state["epoch"]), int(state["index"])
        self._batches = self._epoch_batches(self.epoch)


def eval_batches(examples: Sequence[Example], max_tokens: int, pad_id: int, bos_id: int, eos_id: int,
                 src_eos: bool = True) -> Iterator[Batch]:
    """Every example once, in length order (no shuffle): for validation loss."""
    src_lengths = [len(s) + int(src_eos) for s, _ in examples]
    tgt_lengths = [len(t) + 1 for _, t in examples]
    for idx in token_budget_batches(src_lengths, tgt_lengths, max_tokens, shuffle=False):
        yield collate([examples[i] for i in idx], pad_id, bos_id, eos_id, idx, src_eos)


__all__ = [
    "DataConfig", "Example", "load_split", "train_joint_bpe", "encode_pairs", "filter_by_length",
    "Batch", "BatchStream", "collate", "token_budget_batches", "padding_fraction", "eval_batches",
]
