"""Byte-pair encoding (Sennrich et al., 2016) on the ``tokenizers`` library: a joint source-target BPE for
translation, or a byte-level BPE for a GPT.

The paper (Section 5.1) encodes source and target with one shared vocabulary, which also lets the
encoder, decoder and output projection share one embedding matrix (Section 3.4). Two kinds:

- ``kind="bpe"``: text is NFC-normalized and cut only at spaces (kept as ``▁``, Metaspace) and around
  punctuation, never elsewhere, so Chinese needs no word segmentation: BPE merges characters into
  words itself. ``decode(encode(x)) == x`` for NFC text whose characters were seen in training
  (spacing and case exact); an unseen character becomes ``<unk>`` (decoded as the text ``<unk>``).
- ``kind="bytelevel"``: GPT-2's scheme. Text is UTF-8 bytes, each byte one of 256 base symbols, so
  every string is encoded, nothing is ever ``<unk>``, and ``decode(encode(x)) == x`` for every ``x``.

``<pad> <bos> <eos> <unk>`` are ids 0-3 in both. The ``tokenizers`` library is imported only when a
BPE tokenizer is trained or loaded.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterable, Sequence

from qkv.files import as_os_error, atomic_path, valid_text
from qkv.tokenizers import (
    BOS, EOS, PAD, SPECIAL_TOKENS, TOKENIZER_FILE, UNK, TokenizerError, as_int_list, check_id,
)

KINDS = ("bpe", "bytelevel")
_META = "\u2581"  # "▁", the Metaspace stand-in for a space (as in SentencePiece)


def _hf() -> Any:
    try:
        import tokenizers
    except ImportError as e:  # pragma: no cover - it is a dependency of qkv
        raise TokenizerError("BPE tokenizers need the `tokenizers` package (pip install tokenizers)") from e
    return tokenizers


def _build(kind: str, words: Sequence[str] = ()) -> Any:
    """An untrained ``tokenizers.Tokenizer`` of the given kind, with its normalizer, pre-tokenizer, decoder."""
    tk = _hf()
    from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers

    if kind == "bpe":
        tok = tk.Tokenizer(models.BPE(unk_token=UNK))
        tok.normalizer = normalizers.NFC()
        # prepend_scheme="never": no space is invented before the first word, so decoding gives back
        # the text exactly (a word at the start of a line and after a space are different tokens).
        steps = [
            pre_tokenizers.Metaspace(replacement=_META, prepend_scheme="never", split=True),
            pre_tokenizers.Punctuation(behavior="isolated"),
        ]
        if words:
            # Each known word is a piece of its own, so no merge joins two words: text without spaces
            # (Chinese) keeps the boundaries of a lexicon, longest word first.
            ordered = sorted(set(words), key=lambda w: (-len(w), w))
            steps.insert(0, pre_tokenizers.Split(Regex("|".join(map(re.escape, ordered))), behavior="isolated"))
        tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
        tok.decoder = decoders.Metaspace(replacement=_META, prepend_scheme="never", split=True)
    elif kind == "bytelevel":
        tok = tk.Tokenizer(models.BPE())
        # No normalizer: byte-level BPE must give back the exact bytes (GPT-2 does not normalize).
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
    else:
        raise TokenizerError(f"BPE kind must be one of {list(KINDS)}, got {kind!r}")
    return tok


def _kind_of(data: dict) -> str:
    """``bytelevel`` if the saved pre-tokenizer (or one in its sequence) is ByteLevel, else ``bpe``."""
    pre = data.get("pre_tokenizer") or {}
    parts = pre.get("pretokenizers", [pre]) if isinstance(pre, dict) else []
    return "bytelevel" if any(isinstance(p, dict) and p.get("type") == "ByteLevel" for p in parts) else "bpe"


class BPETokenizer:
    """A trained BPE tokenizer (build one with :meth:`train` or :meth:`load`).

    Args:
        tokenizer: a ``tokenizers.Tokenizer``.
        kind: ``"bpe"`` or ``"bytelevel"`` (see the module docstring).
    """

    def __init__(self, tokenizer: Any, kind: str):
        if kind not in KINDS:
            raise TokenizerError(f"BPE kind must be one of {list(KINDS)}, got {kind!r}")
        self._tok = tokenizer
        self.kind = kind
        self._pad = tokenizer.token_to_id(PAD)
        # A GPT-2 tokenizer file has one special token, <|endoftext|>, which ends and starts documents.
        eot = tokenizer.token_to_id("<|endoftext|>")
        self._bos = tokenizer.token_to_id(BOS) if tokenizer.token_to_id(BOS) is not None else eot
        self._eos = tokenizer.token_to_id(EOS) if tokenizer.token_to_id(EOS) is not None else eot
        self._unk = tokenizer.token_to_id(UNK)
        self._drop = {i for i in (self._pad, self._bos, self._eos) if i is not None}

    @classmethod
    def train(
        cls,
        texts: Iterable[str],
        vocab_size: int,
        kind: str = "bpe",
        min_frequency: int = 2,
        show_progress: bool = False,
        words: Sequence[str] = (),
    ) -> BPETokenizer:
        """Learn merges from ``texts`` until the vocabulary has ``vocab_size`` entries.

        For a joint vocabulary pass the source and the target sentences together. The vocabulary
        can end up smaller (the corpus has no more merges of ``min_frequency``), or larger for
        ``kind="bpe"`` when the corpus has more distinct characters than ``vocab_size``: every
        character seen is kept, so training text always round-trips.

        ``words`` (``kind="bpe"``): a lexicon whose words are never merged with what is around them,
        for text whose words no space separates (the demo's Chinese: 他 and 想 stay two tokens).
        """
        if vocab_size <= len(SPECIAL_TOKENS):
            raise TokenizerError(f"vocab_size must exceed the {len(SPECIAL_TOKENS)} special tokens, got {vocab_size}")
        if words and kind != "bpe":
            raise TokenizerError("words= keeps a lexicon's boundaries for kind='bpe' only")
        tok = _build(kind, words)
        from tokenizers import pre_tokenizers, trainers

        extra = {"initial_alphabet": pre_tokenizers.ByteLevel.alphabet()} if kind == "bytelevel" else {}
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=list(SPECIAL_TOKENS),
            show_progress=show_progress,
            **extra,
        )
        tok.train_from_iterator(texts, trainer)
        ids = [tok.token_to_id(t) for t in SPECIAL_TOKENS]
        if ids != list(range(len(SPECIAL_TOKENS))):  # models and batching rely on these ids
            raise TokenizerError(f"special tokens got ids {ids}, expected 0..{len(SPECIAL_TOKENS) - 1}")
        return cls(tok, kind)

    # -- ids of the special tokens -------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def pad_id(self) -> int | None:
        return self._pad

    @property
    def bos_id(self) -> int | None:
        return self._bos

    @property
    def eos_id(self) -> int | None:
        return self._eos

    @property
    def unk_id(self) -> int | None:
        return self._unk

    def __len__(self) -> int:
        return self.vocab_size

    # -- encoding and decoding -----------------------------------------------------------------

    def _wrap(self, ids: list[int], add_bos: bool, add_eos: bool) -> list[int]:
        if add_bos:
            if self._bos is None:
                raise TokenizerError("this tokenizer has no <bos> token")
            ids = [self._bos] + ids
        if add_eos:
            if self._eos is None:
                raise TokenizerError("this tokenizer has no <eos> token")
            ids = ids + [self._eos]
        return ids

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """Token ids of ``text``, optionally behind ``<bos>`` and before ``<eos>``."""
        if not isinstance(text, str):
            raise TokenizerError(f"encode expects a string, got {type(text).__name__}")
        return self._wrap(self._tok.encode(valid_text(text), add_special_tokens=False).ids, add_bos, add_eos)

    def encode_batch(self, texts: Sequence[str], add_bos: bool = False, add_eos: bool = False) -> list[list[int]]:
        """Ids of each text (the library encodes a batch on several threads)."""
        encodings = self._tok.encode_batch([valid_text(t) for t in texts], add_special_tokens=False)
        return [self._wrap(e.ids, add_bos, add_eos) for e in encodings]

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        """The text of ``ids``.

        With ``skip_special`` the ``<pad> <bos> <eos>`` ids are dropped; ``<unk>`` stays visible as the
        text ``<unk>`` so a lost character is never silent.
        """
        ids = as_int_list(ids, self.vocab_size)
        if skip_special:
            ids = [i for i in ids if i not in self._drop]
        return self._tok.decode(ids, skip_special_tokens=False)

    def decode_batch(self, batch: Iterable[Iterable[int]], skip_special: bool = True) -> list[str]:
        return [self.decode(ids, skip_special) for ids in batch]

    def id_to_token(self, i: int) -> str:
        """The vocabulary entry of id ``i`` (raw: ``▁`` for a space, or GPT-2's byte symbols)."""
        return self._tok.id_to_token(check_id(int(i), self.vocab_size))

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def tokens(self, text: str) -> list[str]:
        """Readable token strings of ``text`` (for attention plots): each id decoded on its own.

        A byte-level token holding part of a multi-byte character shows as U+FFFD.
        """
        return [self._tok.decode([i], skip_special_tokens=False) for i in self.encode(text)]

    # -- persistence ---------------------------------------------------------------------------

    def save(self, directory: str | Path) -> Path:
        """Write ``directory/tokenizer.json`` (the ``tokenizers`` library's format); returns its path."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / TOKENIZER_FILE
        with atomic_path(path) as tmp, as_os_error(tmp):  # a kill while saving leaves the old file or the new
            self._tok.save(str(tmp), pretty=True)
        return path

    @classmethod
    def load(cls, path: str | Path) -> BPETokenizer:
        """Read ``tokenizer.json`` (``path``: the file or its directory), as written by :meth:`save`."""
        path = Path(path)
        if path.is_dir():
            path = path / TOKENIZER_FILE
        if not path.is_file():
            raise TokenizerError(f"no tokenizer file at {path}")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            tok = _hf().Tokenizer.from_str(json.dumps(data))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise TokenizerError(f"{path}: not a JSON file: {e}") from None
        except Exception as e:  # the library raises a bare Exception for a malformed file
            raise TokenizerError(f"{path}: not a `tokenizers` file the library can read: {e}") from None
        return cls(tok, _kind_of(data))

    def to_json(self) -> str:
        """The ``tokenizers`` library's JSON of this tokenizer (what ``save`` writes, and what it reads back)."""
        return self._tok.to_str()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BPETokenizer) and self.to_json() == other.to_json()

    def __repr__(self) -> str:
        return f"BPETokenizer(kind={self.kind!r}, vocab_size={self.vocab_size})"
