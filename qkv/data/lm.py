"""Language-modelling data: a corpus tokenized once into a memory-mapped array, cut into random windows.

A GPT is trained on raw text by next-token prediction (Radford et al., 2018): any window of ``context + 1``
consecutive tokens gives ``context`` training examples at once (input ``w[:-1]``, target ``w[1:]``).
As in nanoGPT, the text is tokenized once and stored as a flat array of uint16 ids (uint32 when the
vocabulary has more than 65,536 entries), read through ``np.memmap`` so that a corpus larger than memory
costs nothing to open. Validation text is never seen in training: no window crosses the boundary
between the splits, which is cut one of two ways (``data.split``):

- ``position`` (the default, as nanoGPT): the first 90% of the tokens train, the last 10% validate. Right
  for one long text, such as Shakespeare's plays.
- ``documents``: for a corpus of many short texts, one per paragraph (poems, articles), whose order
  means something. The last 10% of the Tang poems is the collection's supplements (gathas, fu,
  fragments), unlike the poems before them; every tenth document, spread over the whole corpus,
  validates instead. The held-out documents are tokenized after the others, so the split is again a
  position, recorded in the sidecar.

The array file carries a JSON sidecar with a fingerprint of the text and of the tokenizer: a changed
corpus or tokenizer is re-tokenized, never silently reused.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from qkv.errors import ConfigError, DataError
from qkv.files import as_os_error, atomic_paths, read_json

TOKENS_FILE = "tokens.bin"
_META_SUFFIX = ".json"
SPLITS = ("position", "documents")  # how a corpus is cut into training and validation text
_BLANK_LINES = re.compile(r"\n[ \t]*\n\s*")  # what separates documents: a blank line, or several


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned integer type that holds every id: uint16 up to 65,536 entries, else uint32."""
    if vocab_size <= 0:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def fingerprint(text: str, tokenizer_id: str, valid_text: str | None = None) -> str:
    """sha256 over the text, a string naming the tokenizer (its saved JSON) and the held-out documents if
    any, to key the token cache."""
    h = hashlib.sha256()
    h.update(tokenizer_id.encode("utf-8"))
    h.update(b"\0")
    h.update(text.encode("utf-8"))
    if valid_text is not None:
        h.update(b"\0valid\0")
        h.update(valid_text.encode("utf-8"))
    return h.hexdigest()


def check_split(split: str, valid_fraction: float) -> None:
    """``split`` must be one of :data:`SPLITS` and ``valid_fraction`` in (0, 1)."""
    if split not in SPLITS:
        raise ConfigError(f"data.split must be one of {', '.join(SPLITS)}, got {split!r}")
    if not 0.0 < valid_fraction < 1.0:
        raise ConfigError(f"data.valid_fraction must be in (0, 1), got {valid_fraction}")


def split_documents(text: str, valid_fraction: float = 0.1) -> tuple[str, str]:
    """The training and validation text of a corpus of documents separated by blank lines.

    Document i validates where ``(i + 1) * valid_fraction`` passes a whole number: with 0.1, documents
    9, 19, 29... (every tenth, from all over the corpus), ``floor(n * valid_fraction)`` of the n. Each
    part is its documents in their order, each ending with one blank line, as a document ends in the
    corpus.

    Raises:
        ValueError: if that holds out no document, or all of them.
    """
    check_split("documents", valid_fraction)
    docs = [d for d in _BLANK_LINES.split(text.strip("\n")) if d.strip()]
    held_out = [math.floor((i + 1) * valid_fraction + 1e-9) > math.floor(i * valid_fraction + 1e-9)
                for i in range(len(docs))]
    if not any(held_out) or all(held_out):
        raise ValueError(f"data.split=documents: the corpus has {len(docs)} document(s) (paragraphs separated by a "
                         f"blank line), too few to hold out a fraction {valid_fraction} of them; use data.split=position")
    train = "".join(d + "\n\n" for d, out in zip(docs, held_out) if not out)
    valid = "".join(d + "\n\n" for d, out in zip(docs, held_out) if out)
    return train, valid


def split_text(text: str, split: str = "position", valid_fraction: float = 0.1) -> tuple[str, str | None]:
    """A corpus's training text and held-out documents, for ``data.split``: by position the whole text and
    None (its tokens are cut later, :func:`split_by_position`), by document :func:`split_documents`."""
    check_split(split, valid_fraction)
    return split_documents(text, valid_fraction) if split == "documents" else (text, None)


def tokenize_to_file(text: str, tokenizer: Any, path: str | Path, tokenizer_id: str = "",
                     valid_text: str | None = None) -> np.memmap:
    """Encode ``text`` once and write the ids to ``path`` (plus ``path.json``); reuse it if it matches.

    Args:
        text: The whole corpus, or its training documents when ``valid_text`` is given.
        tokenizer: Anything with ``encode(text) -> list[int]`` and ``vocab_size``.
        path: The array file (``RUN/tokens.bin``); written atomically (temp file, then rename).
        tokenizer_id: A string that changes when the tokenizer does (e.g. its ``tokenizer.json``); with
            the text it forms the fingerprint that decides whether an existing file can be reused.
        valid_text: The held-out documents (:func:`split_documents`): encoded on their own and written
            after ``text``'s ids, where the sidecar's ``valid_start`` says the validation split begins.

    Returns:
        The ids, memory-mapped read-only, shape (N,).
    """
    path = Path(path)
    meta_path = path.with_suffix(path.suffix + _META_SUFFIX)
    key = fingerprint(text, tokenizer_id, valid_text)
    dtype = token_dtype(tokenizer.vocab_size)
    if path.is_file() and meta_path.is_file():
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            meta = {}
        if meta.get("fingerprint") == key and meta.get("dtype") == dtype.name:
            return load_tokens(path)
    ids = np.asarray(tokenizer.encode(text), dtype=np.int64)
    meta = {"fingerprint": key, "dtype": dtype.name}
    if valid_text is not None:  # encoded apart, so that no token spans the two splits
        meta["valid_start"] = int(ids.size)
        ids = np.concatenate([ids, np.asarray(tokenizer.encode(valid_text), dtype=np.int64)])
    if ids.size < 2:
        raise ValueError(f"{path}: the corpus has {ids.size} tokens; a language model needs at least 2")
    if ids.size and (ids.min() < 0 or ids.max() >= tokenizer.vocab_size):
        raise ValueError(f"tokenizer produced ids outside [0, {tokenizer.vocab_size})")
    meta.update(length=int(ids.size), vocab_size=tokenizer.vocab_size)
    # The tokens and their fingerprint, as a set: a kill leaves both old or both new.
    with atomic_paths(path, meta_path) as (tmp_ids, tmp_meta), as_os_error(tmp_ids):
        # Through a file, not ndarray.tofile: a full disk is then ENOSPC naming the file, where tofile says
        # only "103680 requested and 73728 written".
        with open(tmp_ids, "wb") as f:
            f.write(memoryview(ids.astype(dtype, copy=False)))
        tmp_meta.write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    return load_tokens(path)


def load_tokens(path: str | Path) -> np.memmap:
    """Open a token file written by :func:`tokenize_to_file`, read-only and memory-mapped."""
    return _open(path)[0]


def _open(path: str | Path) -> tuple[np.memmap, dict]:
    """A token file, memory-mapped read-only, and its sidecar."""
    path = Path(path)
    meta_path = path.with_suffix(path.suffix + _META_SUFFIX)
    if not path.is_file() or not meta_path.is_file():
        raise FileNotFoundError(f"{path}: no token file (and {meta_path.name}); tokenize the corpus first")
    try:
        meta = read_json(meta_path, "token file's sidecar")
    except DataError as e:
        raise DataError(f"{e}: `qkv train lm --resume` on its run tokenizes the corpus again") from None
    arr = np.memmap(path, dtype=np.dtype(meta["dtype"]), mode="r")
    if arr.shape[0] != meta["length"]:
        raise ValueError(f"{path}: holds {arr.shape[0]} tokens, {meta_path.name} says {meta['length']} (truncated?)")
    return arr, meta


def split_by_position(tokens: np.ndarray, valid_fraction: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    """The first ``1 - valid_fraction`` of the tokens for training, the rest for validation (views, no copy)."""
    check_split("position", valid_fraction)
    n = int(len(tokens) * (1.0 - valid_fraction))
    return tokens[:n], tokens[n:]


def load_splits(path: str | Path, valid_fraction: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    """The training and validation tokens of a token file: cut where its sidecar says the held-out documents
    begin (``data.split=documents``), else by position."""
    tokens, meta = _open(path)
    start = meta.get("valid_start")
    return split_by_position(tokens, valid_fraction) if start is None else (tokens[:start], tokens[start:])


def windows_at(tokens: np.ndarray, starts: torch.Tensor, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-token targets of the windows starting at ``starts``.

    Returns:
        x, y: (B, context) int64 each, ``y[:, t] == x[:, t + 1]`` shifted by one token.
    """
    rows = np.stack([np.asarray(tokens[int(i): int(i) + context + 1], dtype=np.int64) for i in starts.tolist()])
    w = torch.from_numpy(rows)  # (B, context + 1)
    return w[:, :-1], w[:, 1:]


@dataclass
class LMData:
    """Train and validation token arrays of one corpus, and random windows of them.

    Batches are drawn with this object's own ``torch.Generator`` (not the global one), whose state is
    saved in a checkpoint (:meth:`state_dict`), so a resumed run draws exactly the windows the
    uninterrupted run would have drawn.

    Args:
        train: (N_train,) token ids.
        valid: (N_valid,) token ids.
        seed: Seed of the window sampler.
    """

    train: np.ndarray
    valid: np.ndarray
    seed: int = 0

    def __post_init__(self) -> None:
        self.generator = torch.Generator().manual_seed(self.seed)

    @classmethod
    def from_tokens(cls, tokens: np.ndarray, valid_fraction: float = 0.1, seed: int = 0) -> LMData:
        """Split by position."""
        train, valid = split_by_position(tokens, valid_fraction)
        return cls(train, valid, seed)

    @classmethod
    def from_file(cls, path: str | Path, valid_fraction: float = 0.1, seed: int = 0) -> LMData:
        """A token file, split as it was written (:func:`load_splits`)."""
        train, valid = load_splits(path, valid_fraction)
        return cls(train, valid, seed)

    def split(self, name: str) -> np.ndarray:
        if name not in ("train", "valid"):
            raise ValueError(f"split must be 'train' or 'valid', got {name!r}")
        return self.train if name == "train" else self.valid

    def check_context(self, context: int) -> None:
        """Both splits must hold at least one window of ``context + 1`` tokens."""
        for name in ("train", "valid"):
            n = len(self.split(name))
            if n < context + 1:
                raise ValueError(
                    f"the {name} split has {n} tokens, fewer than one window of context {context} + 1; "
                    "use a shorter context or a larger corpus"
                )

    def get_batch(
        self, split: str, batch_size: int, context: int, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``batch_size`` windows at uniformly random positions of ``split`` (nanoGPT's ``get_batch``).

        Args:
            split: ``"train"`` or ``"valid"``.
            batch_size: Windows per batch.
            context: Tokens per window (the model reads ``context``, predicts ``context``).
            generator: The sampler to draw from; this object's own by default.

        Returns:
            x, y: (B, context) int64 inputs and targets (on CPU).
        """
        data = self.split(split)
        high = len(data) - context
        if high < 1:
            self.check_context(context)
        starts = torch.randint(high, (batch_size,), generator=generator or self.generator)  # (B,)
        return windows_at(data, starts, context)

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint needs to continue the same sequence of windows."""
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])
