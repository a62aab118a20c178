"""Token-budget batches for translation: length-bucketed, reshuffled each epoch by seed, resumable, DDP-aware.

"Sentence pairs were batched together by approximate sequence length. Each training batch contained a
set of sentence pairs containing approximately 25000 source tokens and 25000 target tokens"
(Section 5.1). A batch is therefore a token budget, not a sentence count: many short sentences or
few long ones. Sorting by length before cutting batches keeps the padding low (sentences of a batch
have similar lengths); shuffling within equal lengths and shuffling the order of the batches, with a
generator seeded by ``(seed, epoch)``, gives a different but reproducible pass every epoch, so a
resumed run sees exactly the batches an uninterrupted one would have.

Targets are shifted right behind ``<bos>`` (Section 3.1, teacher forcing): the decoder reads
``<bos> y1 .. yn`` and is trained to predict ``y1 .. yn <eos>``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import torch
from torch import Tensor

from qkv.devices import to_device

Example = tuple[Sequence[int], Sequence[int]]  # (source ids, target ids), neither with <bos>/<eos>


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
    "Batch", "BatchStream", "collate", "token_budget_batches", "padding_fraction", "eval_batches",
]
