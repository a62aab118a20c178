"""GPT-2's own byte-level BPE (50,257 tokens), through ``tiktoken``: the tokenizer of models converted from GPT-2.

A GPT-2 checkpoint only makes sense with the vocabulary it was trained on, so a converted model keeps
it (``qkv convert gpt2``). ``tiktoken`` is OpenAI's implementation of exactly this encoding. Where the
files come from:

- :meth:`GPT2Tokenizer.from_tiktoken`: tiktoken's registry, which downloads GPT-2's ``vocab.bpe`` and
  ``encoder.json`` once (or reads them from ``TIKTOKEN_CACHE_DIR``);
- :meth:`GPT2Tokenizer.from_files`: the same two files from disk, e.g. the ``merges.txt`` and
  ``vocab.json`` of a Hugging Face GPT-2 folder (no network).

``save`` writes the merges into the run directory (``tokenizer.bpe``, tiktoken's own format) beside
``tokenizer.json``, so a run loads offline. GPT-2 has one special token, ``<|endoftext|>``, which it
uses to start and to end a text; it has no padding and no unknown token (every byte has an id).
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any, Iterable, Sequence
from unittest import mock

from qkv.errors import require
from qkv.files import atomic_paths, valid_text
from qkv.tokenizers import TOKENIZER_FILE, TokenizerError, as_int_list, check_id

MERGES_FILE = "tokenizer.bpe"
ENDOFTEXT = "<|endoftext|>"
GPT2_MERGEABLE = 50256  # GPT-2's ids 0 .. 50255 come from bytes and merges; 50256 is <|endoftext|>


def _tiktoken(module: str = "tiktoken"):
    """``tiktoken`` (or one of its modules, such as ``tiktoken_ext.openai_public``, GPT-2's encoding)."""
    require("tiktoken.load", "gpt2", "GPT-2's tokenizer")
    return require(module, "gpt2", "GPT-2's tokenizer", package="tiktoken")


# The merges file is tiktoken's format, a token (base64) and its rank per line. tiktoken's own writer
# needs the blobfile package even for a local file, so these two lines of format are written here.
def _write_ranks(ranks: dict[bytes, int], path: Path) -> None:
    by_rank = sorted(ranks.items(), key=lambda kv: kv[1])
    path.write_text("".join(f"{base64.b64encode(token).decode('ascii')} {rank}\n" for token, rank in by_rank),
                    encoding="ascii")  # into a temporary file of save's atomic pair


def _read_ranks(path: Path) -> dict[bytes, int]:
    try:
        return {base64.b64decode(token): int(rank)
                for token, rank in (line.split() for line in path.read_text(encoding="ascii").splitlines() if line)}
    except ValueError as e:
        raise TokenizerError(f"{path}: not a merges file (a base64 token and a rank per line): {e}") from None


class GPT2Tokenizer:
    """GPT-2's byte-level BPE; the same interface as every qkv tokenizer (:class:`qkv.tokenizers.Tokenizer`).

    Args:
        spec: ``tiktoken.Encoding``'s arguments: ``name``, ``pat_str`` (the pre-tokenizing regex),
            ``mergeable_ranks`` (bytes -> id), ``special_tokens`` (``{"<|endoftext|>": id}``) and
            optionally ``explicit_n_vocab``.
    """

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = dict(spec)
        if ENDOFTEXT not in self.spec.get("special_tokens", {}):
            raise TokenizerError(f"a GPT-2 tokenizer needs the special token {ENDOFTEXT}")
        self.encoding = _tiktoken().Encoding(**self.spec)

    @classmethod
    def from_tiktoken(cls) -> GPT2Tokenizer:
        """tiktoken's ``gpt2`` encoding (downloads its two files once; see the module docstring)."""
        openai_public = _tiktoken("tiktoken_ext.openai_public")
        try:
            return cls(openai_public.gpt2())
        except Exception as e:  # noqa: BLE001 - network and cache errors of every kind
            raise TokenizerError(
                f"tiktoken could not load GPT-2's files ({type(e).__name__}: {e}); it downloads them once, or reads "
                "them from TIKTOKEN_CACHE_DIR; without a network, give a folder with GPT-2's merges.txt and "
                "vocab.json (a Hugging Face GPT-2 folder): qkv convert gpt2 --tokenizer FOLDER, or "
                "GPT2Tokenizer.from_files"
            ) from None

    @classmethod
    def from_files(cls, merges: str | Path, vocab: str | Path) -> GPT2Tokenizer:
        """GPT-2's encoding from its ``vocab.bpe``/``merges.txt`` and ``encoder.json``/``vocab.json`` files.

        tiktoken checks that the merges rebuild the vocabulary file; qkv checks GPT-2's size on top, since
        another BPE would load but be the wrong tokenizer.
        """
        tiktoken = _tiktoken()
        r50k_pat_str = _tiktoken("tiktoken_ext.openai_public").r50k_pat_str

        for path in (merges, vocab):
            if not Path(path).is_file():
                raise TokenizerError(f"{path}: no such file (GPT-2's merges and vocabulary are needed)")
        try:
            # tiktoken caches what it reads under a key made of the path, so a changed file at the same path
            # would be read stale from the cache; an empty cache directory turns that off.
            with mock.patch.dict(os.environ, {"TIKTOKEN_CACHE_DIR": ""}):
                ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(str(merges), str(vocab))
        except (ValueError, AssertionError, KeyError) as e:
            raise TokenizerError(f"{merges}, {vocab}: not a pair of BPE merges and vocabulary files: {e!r}") from None
        if len(ranks) != GPT2_MERGEABLE:
            raise TokenizerError(
                f"{merges}, {vocab}: {len(ranks)} tokens, where GPT-2 has {GPT2_MERGEABLE} besides {ENDOFTEXT}")
        return cls({"name": "gpt2", "pat_str": r50k_pat_str, "mergeable_ranks": ranks,
                    "special_tokens": {ENDOFTEXT: 50256}, "explicit_n_vocab": 50257})

    # -- ids of the special tokens ------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return self.encoding.n_vocab

    @property
    def pad_id(self) -> int | None:
        return None

    @property
    def bos_id(self) -> int | None:
        return self.encoding.eot_token  # GPT-2 starts a text with <|endoftext|> too

    @property
    def eos_id(self) -> int | None:
        return self.encoding.eot_token

    @property
    def unk_id(self) -> int | None:
        return None  # byte-level: every string has an encoding

    # -- text <-> ids --------------------------------------------------------------------------------

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """Ids of ``text``; ``<|endoftext|>`` written in the text is text, not the special token."""
        eot = self.encoding.eot_token
        return [eot] * add_bos + self.encoding.encode_ordinary(valid_text(text)) + [eot] * add_eos

    def encode_batch(self, texts: Sequence[str], add_bos: bool = False, add_eos: bool = False) -> list[list[int]]:
        eot = self.encoding.eot_token
        return [[eot] * add_bos + ids + [eot] * add_eos for ids in self.encoding.encode_ordinary_batch([valid_text(t) for t in texts])]

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        """The text of ``ids``; a token that ends inside a UTF-8 character decodes to U+FFFD."""
        ids = as_int_list(ids, self.vocab_size)
        if skip_special:
            ids = [i for i in ids if i != self.encoding.eot_token]
        return self.encoding.decode(ids)

    def id_to_token(self, i: int) -> str:
        return self.encoding.decode_single_token_bytes(check_id(i, self.vocab_size)).decode("utf-8", errors="replace")

    # -- files ---------------------------------------------------------------------------------------

    def save(self, directory: str | Path) -> Path:
        """Write ``tokenizer.json`` (name, regex, special tokens) and ``tokenizer.bpe`` (the merges)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        meta = {k: v for k, v in self.spec.items() if k != "mergeable_ranks"}
        path = directory / TOKENIZER_FILE
        with atomic_paths(directory / MERGES_FILE, path) as (tmp_merges, tmp_json):  # the two files as a set
            _write_ranks(self.spec["mergeable_ranks"], tmp_merges)
            tmp_json.write_text(json.dumps({"qkv_tokenizer": "tiktoken", "merges": MERGES_FILE, **meta},
                                           ensure_ascii=False, indent=1), encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: str | Path) -> GPT2Tokenizer:
        """Read what :meth:`save` wrote (``path`` is the ``tokenizer.json``)."""
        path = Path(path)
        data = json.loads(path.read_text(encoding="utf-8"))
        merges = path.parent / data.pop("merges", MERGES_FILE)
        if not merges.is_file():
            raise TokenizerError(f"{path}: its merges file {merges.name} is missing beside it")
        for key in ("name", "pat_str", "special_tokens"):
            if key not in data:
                raise TokenizerError(f"{path}: missing key {key!r}")
        data.pop("qkv_tokenizer")
        return cls({**data, "mergeable_ranks": _read_ranks(merges)})

    def __repr__(self) -> str:
        return f"GPT2Tokenizer({self.spec['name']!r}, vocab_size={self.vocab_size})"
