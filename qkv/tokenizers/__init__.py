"""Tokenizers: text <-> token ids, the interface every tokenizer of qkv shares, and loading a saved one.

Three implementations, with the same interface (:class:`Tokenizer`):

- :class:`~qkv.tokenizers.char.CharTokenizer`: one id per character (nanoGPT's Shakespeare, Tang poems).
- :class:`~qkv.tokenizers.bpe.BPETokenizer`: a joint source/target BPE (the paper's Section 5.1 uses a
  shared source-target vocabulary of about 37,000 tokens), or byte-level BPE for a GPT; built on the
  ``tokenizers`` library, which is imported only when a BPE tokenizer is used.
- :class:`~qkv.tokenizers.gpt2.GPT2Tokenizer`: GPT-2's own BPE through ``tiktoken``, for models
  converted from GPT-2; its one special token, ``<|endoftext|>``, keeps GPT-2's id 50256.

Special tokens sit at fixed ids in every tokenizer that has them, so models and batching code can rely
on them: ``<pad>`` = 0, ``<bos>`` = 1, ``<eos>`` = 2, ``<unk>`` = 3 (GPT-2's tokenizer keeps GPT-2's ids).

All save to ``DIR/tokenizer.json``; :func:`load_tokenizer` reads the file and picks the class.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Protocol, Sequence, runtime_checkable

from qkv.errors import QkvError

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS, UNK)
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
TOKENIZER_FILE = "tokenizer.json"


class TokenizerError(QkvError, ValueError):
    """Text that cannot be encoded, ids that cannot be decoded, or a tokenizer file that cannot be read."""


@runtime_checkable
class Tokenizer(Protocol):
    """What the rest of qkv needs from a tokenizer."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def pad_id(self) -> int | None: ...

    @property
    def bos_id(self) -> int | None: ...

    @property
    def eos_id(self) -> int | None: ...

    @property
    def unk_id(self) -> int | None: ...

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]: ...

    def encode_batch(self, texts: Sequence[str], add_bos: bool = False, add_eos: bool = False) -> list[list[int]]: ...

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str: ...

    def id_to_token(self, i: int) -> str: ...

    def save(self, directory: str | Path) -> Path: ...


def load_tokenizer(directory: str | Path) -> Tokenizer:
    """Load a tokenizer saved by ``save(directory)`` (``directory`` may also be the JSON file itself).

    Raises:
        TokenizerError: no tokenizer file there, or not one qkv can read.
    """
    path = Path(directory)
    if path.is_dir():
        path = path / TOKENIZER_FILE
    if not path.is_file():
        raise TokenizerError(f"no tokenizer at {path} (expected {TOKENIZER_FILE} written by a tokenizer's save())")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TokenizerError(f"{path}: not a JSON tokenizer file: {e}") from None
    if isinstance(data, dict) and data.get("qkv_tokenizer") == "char":
        return CharTokenizer.load(path)
    if isinstance(data, dict) and data.get("qkv_tokenizer") == "tiktoken":
        return GPT2Tokenizer.load(path)
    if isinstance(data, dict) and "model" in data:  # the `tokenizers` library's format
        return BPETokenizer.load(path)
    raise TokenizerError(f"{path}: unknown tokenizer format (neither a qkv char tokenizer nor a `tokenizers` file)")


def as_int_list(ids: Iterable[int], vocab_size: int | None = None) -> list[int]:
    """Ids from a list, tuple, numpy array or torch tensor, as Python ints (a 1-D sequence expected).

    With ``vocab_size``, an id outside ``0 .. vocab_size - 1`` is an error that names it.
    """
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    out = list(ids)
    if out and isinstance(out[0], list):
        raise TokenizerError("decode expects one sequence of ids; use decode_batch for a batch")
    out = [int(i) for i in out]
    if vocab_size is not None:
        for i in out:
            check_id(i, vocab_size)
    return out


def check_id(i: int, vocab_size: int) -> int:
    """``i``, or an error that names it when it is outside ``0 .. vocab_size - 1``."""
    if not 0 <= i < vocab_size:
        raise TokenizerError(f"token id {i} is outside the vocabulary (size {vocab_size})")
    return i


# The implementations build on the interface above (and import it from here), so they come after it.
# Each imports its own library (tokenizers, tiktoken) only when it is used.
from qkv.tokenizers.bpe import BPETokenizer  # noqa: E402
from qkv.tokenizers.char import CharTokenizer  # noqa: E402
from qkv.tokenizers.gpt2 import GPT2Tokenizer  # noqa: E402

__all__ = [
    "Tokenizer", "TokenizerError", "CharTokenizer", "BPETokenizer", "GPT2Tokenizer", "load_tokenizer", "as_int_list",
    "SPECIAL_TOKENS", "PAD", "BOS", "EOS", "UNK", "PAD_ID", "BOS_ID", "EOS_ID", "UNK_ID", "TOKENIZER_FILE",
]
