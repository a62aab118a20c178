"""Character-level tokenizer: one id per character, the vocabulary being the sorted characters of a corpus.

This is nanoGPT's Shakespeare tokenizer (65 characters, no special tokens, with ``specials=False``)
and the natural one for classical Chinese, where a character is a word. With ``specials=True`` (the
default) ids 0-3 are ``<pad> <bos> <eos> <unk>`` as in every qkv tokenizer and the characters follow.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Sequence

from qkv.files import write_text
from qkv.tokenizers import (
    BOS_ID, EOS_ID, PAD_ID, SPECIAL_TOKENS, TOKENIZER_FILE, UNK, UNK_ID, TokenizerError, as_int_list, check_id,
)

_FORMAT_VERSION = 1


class CharTokenizer:
    """Maps each character to an id.

    Args:
        chars: the alphabet, one character per entry, no repeats; ids follow this order (after the
            special tokens, if any).
        specials: put ``<pad> <bos> <eos> <unk>`` at ids 0-3.
        on_unknown: what ``encode`` does with a character outside the alphabet: ``"unk"`` maps it to
            ``<unk>`` (needs ``specials``), ``"error"`` raises a :class:`TokenizerError` naming the
            character and its position. Default: ``"unk"`` with specials, ``"error"`` without.
    """

    def __init__(self, chars: Sequence[str], specials: bool = True, on_unknown: str | None = None):
        on_unknown = on_unknown or ("unk" if specials else "error")
        if on_unknown not in ("unk", "error"):
            raise TokenizerError(f"CharTokenizer: on_unknown must be 'unk' or 'error', got {on_unknown!r}")
        if on_unknown == "unk" and not specials:
            raise TokenizerError("CharTokenizer: on_unknown='unk' needs specials=True (there is no <unk> id)")
        chars = list(chars)
        for c in chars:
            if not isinstance(c, str) or len(c) != 1:
                raise TokenizerError(f"CharTokenizer: vocabulary entries must be single characters, got {c!r}")
        if len(set(chars)) != len(chars):
            dup = sorted({c for c in chars if chars.count(c) > 1})
            raise TokenizerError(f"CharTokenizer: repeated characters in the vocabulary: {dup!r}")
        self.specials = specials
        self.on_unknown = on_unknown
        self.chars = chars
        self.itos: list[str] = (list(SPECIAL_TOKENS) if specials else []) + chars
        offset = len(SPECIAL_TOKENS) if specials else 0
        self.stoi: dict[str, int] = {c: i + offset for i, c in enumerate(chars)}

    @classmethod
    def train(cls, texts: str | Iterable[str], specials: bool = True, on_unknown: str | None = None) -> CharTokenizer:
        """The tokenizer whose alphabet is every character of ``texts`` (a string or strings), sorted."""
        if isinstance(texts, str):
            texts = [texts]
        alphabet: set[str] = set()
        for t in texts:
            alphabet.update(t)
        return cls(sorted(alphabet), specials=specials, on_unknown=on_unknown)

    # -- ids of the special tokens (None when the tokenizer has none) --------------------------------

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    @property
    def pad_id(self) -> int | None:
        return PAD_ID if self.specials else None

    @property
    def bos_id(self) -> int | None:
        return BOS_ID if self.specials else None

    @property
    def eos_id(self) -> int | None:
        return EOS_ID if self.specials else None

    @property
    def unk_id(self) -> int | None:
        return UNK_ID if self.specials else None

    def __len__(self) -> int:
        return self.vocab_size

    # -- encoding and decoding -----------------------------------------------------------------

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """Token ids of ``text``, optionally behind ``<bos>`` and before ``<eos>``."""
        ids = [self.stoi.get(c, -1) for c in text]
        if -1 in ids:
            if self.on_unknown == "error":
                pos = ids.index(-1)
                raise TokenizerError(
                    f"character {text[pos]!r} (U+{ord(text[pos]):04X}) at position {pos} is not in the "
                    f"vocabulary of {len(self.chars)} characters; build the tokenizer on text that has it, "
                    "or use specials=True, on_unknown='unk'"
                )
            ids = [UNK_ID if i == -1 else i for i in ids]
        if add_bos or add_eos:
            if not self.specials:
                raise TokenizerError("CharTokenizer: add_bos/add_eos need specials=True")
            ids = ([BOS_ID] if add_bos else []) + ids + ([EOS_ID] if add_eos else [])
        return ids

    def encode_batch(self, texts: Sequence[str], add_bos: bool = False, add_eos: bool = False) -> list[list[int]]:
        return [self.encode(t, add_bos, add_eos) for t in texts]

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        """The text of ``ids``.

        With ``skip_special`` the ``<pad> <bos> <eos>`` ids are dropped; ``<unk>`` stays visible as
        the text ``<unk>`` so a lost character is never silent.
        """
        out = []
        for i in as_int_list(ids, len(self.itos)):
            if skip_special and self.specials and i in (PAD_ID, BOS_ID, EOS_ID):
                continue
            out.append(self.itos[i])
        return "".join(out)

    def decode_batch(self, batch: Iterable[Iterable[int]], skip_special: bool = True) -> list[str]:
        return [self.decode(ids, skip_special) for ids in batch]

    def id_to_token(self, i: int) -> str:
        return self.itos[check_id(i, len(self.itos))]

    def token_to_id(self, token: str) -> int | None:
        if self.specials and token in SPECIAL_TOKENS:
            return SPECIAL_TOKENS.index(token)
        return self.stoi.get(token)

    def tokens(self, text: str) -> list[str]:
        """The token strings of ``text`` (for attention plots): its characters, or ``<unk>``."""
        return [c if c in self.stoi else UNK for c in text]

    # -- persistence ---------------------------------------------------------------------------

    def save(self, directory: str | Path) -> Path:
        """Write ``directory/tokenizer.json``; returns its path."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / TOKENIZER_FILE
        data = {
            "qkv_tokenizer": "char",
            "version": _FORMAT_VERSION,
            "specials": list(SPECIAL_TOKENS) if self.specials else [],
            "on_unknown": self.on_unknown,
            "chars": self.chars,
        }
        return write_text(path, json.dumps(data, ensure_ascii=False, indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> CharTokenizer:
        """Read a tokenizer written by :meth:`save` (``path``: the directory or the JSON file)."""
        path = Path(path)
        if path.is_dir():
            path = path / TOKENIZER_FILE
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise TokenizerError(f"{path}: cannot read a char tokenizer: {e}") from None
        if not isinstance(data, dict) or data.get("qkv_tokenizer") != "char":
            raise TokenizerError(f"{path}: not a qkv char tokenizer (key 'qkv_tokenizer' is not 'char')")
        for key in ("specials", "chars"):
            if key not in data:
                raise TokenizerError(f"{path}: missing key {key!r}")
        specials = data["specials"]
        if specials not in ([], list(SPECIAL_TOKENS)):
            raise TokenizerError(f"{path}: key 'specials' must be [] or {list(SPECIAL_TOKENS)}, got {specials!r}")
        try:
            return cls(data["chars"], specials=bool(specials), on_unknown=data.get("on_unknown"))
        except TokenizerError as e:
            raise TokenizerError(f"{path}: {e}") from None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CharTokenizer) and (self.itos, self.on_unknown) == (other.itos, other.on_unknown)

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size}, specials={self.specials}, on_unknown={self.on_unknown!r})"
