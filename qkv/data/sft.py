"""Supervised fine-tuning data: (prompt, response) pairs, tokenized with a mask that keeps the loss on the response.

In supervised fine-tuning the model reads the prompt but is trained only to produce the response: the
sequence is ``prompt + response + <eos>``, every position predicts the next token as in pretraining,
and only the targets that belong to the response (and the final ``<eos>``, so the model learns to stop)
count in the loss.

Pairs come from a JSON-lines file, one ``{"prompt": ..., "response": ...}`` object per line (a
malformed line is an error naming the file and line), or from a registered parallel corpus written
as instructions, e.g. ``cmn-eng:train`` gives ``"Chinese: 我累了。\\nEnglish:"`` -> ``" I'm tired."``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from qkv.errors import DataError, QkvError
from qkv.files import write_text
from qkv.data.corpora import get_corpus, read_parallel
from qkv.data.synthetic import DEMO, demo_corpus

# Language codes of the registered corpora, as words for the instruction format.
LANGUAGE_NAMES = {"zh": "Chinese", "en": "English", "de": "German", "fr": "French"}


class SFTDataError(QkvError, ValueError):
    """A fine-tuning file that cannot be read; the message names the file and line."""


@dataclass(frozen=True)
class Pair:
    """One supervised example; ``where`` is ``FILE:LINE`` (for error messages)."""

    prompt: str
    response: str
    where: str = ""


def fingerprint(pairs: Sequence[Pair]) -> str:
    """A short sha256 of the examples' text, in order (not of where they were read): what a fine-tuning
    run records of its data, so that a resume notices a file edited in place under the same name."""
    text = json.dumps([[p.prompt, p.response] for p in pairs], ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def read_jsonl_pairs(path: str | Path) -> list[Pair]:
    """Read ``{"prompt": str, "response": str}`` objects, one per line; blank lines are skipped.

    Raises:
        SFTDataError: ``FILE:LINE: what is wrong`` for the first bad record; FileNotFoundError if absent.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such fine-tuning file")
    pairs = []
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            where = f"{path}:{n}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise SFTDataError(f"{where}: not UTF-8 (byte {e.start})") from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise SFTDataError(f"{where}: not a JSON object ({e.msg} at column {e.colno})") from None
            if not isinstance(record, dict):
                raise SFTDataError(f"{where}: expected an object with 'prompt' and 'response', got {type(record).__name__}")
            for key in ("prompt", "response"):
                if key not in record:
                    raise SFTDataError(f"{where}: missing key {key!r} (keys: {sorted(record)})")
                if not isinstance(record[key], str):
                    raise SFTDataError(f"{where}: {key!r} must be a string, got {type(record[key]).__name__}")
            if not record["response"]:
                raise SFTDataError(f"{where}: empty 'response' (nothing to learn from this record)")
            pairs.append(Pair(record["prompt"], record["response"], where))
    if not pairs:
        raise SFTDataError(f"{path}: no records")
    return pairs


def write_jsonl_pairs(pairs: Sequence[Pair], path: str | Path) -> Path:
    """Write pairs as JSON lines (UTF-8, characters unescaped)."""
    return write_text(path, "".join(json.dumps({"prompt": p.prompt, "response": p.response}, ensure_ascii=False)
                                    + "\n" for p in pairs))


def instruction_prompt(source: str, src_lang: str = "zh", tgt_lang: str = "en") -> str:
    """``"Chinese: 我累了。\\nEnglish:"``: the prompt of a translation instruction."""
    s, t = LANGUAGE_NAMES.get(src_lang, src_lang), LANGUAGE_NAMES.get(tgt_lang, tgt_lang)
    return f"{s}: {source}\n{t}:"


def instruction_pairs(sources: Sequence[str], targets: Sequence[str], src_lang: str = "zh",
                      tgt_lang: str = "en", where: str = "") -> list[Pair]:
    """Translation pairs as instructions: prompt ``"Chinese: X\\nEnglish:"``, response ``" Y"``."""
    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} sources but {len(targets)} targets")
    return [Pair(instruction_prompt(s, src_lang, tgt_lang), " " + t, f"{where}:{i + 1}")
            for i, (s, t) in enumerate(zip(sources, targets))]


def load_pairs(spec: str | Path, data_dir: str | None = None) -> list[Pair]:
    """Pairs from a JSONL file, or from ``CORPUS:SPLIT`` (a registered parallel corpus, first language to second,
    or ``demo``: the embedded demo corpus of :mod:`qkv.data.synthetic`, Chinese to English)."""
    path = Path(spec)
    if path.is_file() or str(spec).endswith((".jsonl", ".json")):
        return read_jsonl_pairs(path)
    name, _, split = str(spec).partition(":")
    if not split:
        raise FileNotFoundError(f"{spec}: neither a JSONL file nor CORPUS:SPLIT (e.g. cmn-eng:train)")
    if name == DEMO:
        splits = demo_corpus()
        if split not in splits:
            raise DataError(f"{spec}: the demo corpus has the splits {sorted(splits)}")
        return instruction_pairs(*splits[split], "zh", "en", where=spec)
    corpus = get_corpus(name)
    src_lang, tgt_lang = corpus.languages[0], corpus.languages[1]
    src, tgt = read_parallel(name, split, src_lang, tgt_lang, data_dir)
    return instruction_pairs(src, tgt, src_lang, tgt_lang, where=f"{name}:{split}")


# ----------------------------------------------------------------------------------------------
# Tokens and batches.


@dataclass(frozen=True)
class SFTExample:
    """Token ids of ``prompt + response + <eos>`` and where the response starts."""

    ids: tuple[int, ...]
    n_prompt: int


def encode_pairs(pairs: Sequence[Pair], tokenizer: Any, max_len: int, truncate: bool = False) -> list[SFTExample]:
    """Tokenize pairs: the prompt and the response separately (as generation will see them), then ``<eos>``.

    Args:
        pairs: The examples.
        tokenizer: Needs ``encode`` and an ``eos_id``.
        max_len: The model's context; a longer example is an error naming its record, unless ``truncate``.
        truncate: Cut long examples at ``max_len + 1`` tokens instead (the response tail is lost).
    """
    if tokenizer.eos_id is None:
        raise ValueError("fine-tuning needs a tokenizer with an <eos> token (so the model learns to stop)")
    out = []
    for p in pairs:
        prompt = tokenizer.encode(p.prompt)
        ids = prompt + tokenizer.encode(p.response) + [tokenizer.eos_id]
        # A sequence of max_len + 1 tokens gives max_len (input, target) positions.
        if len(ids) > max_len + 1:
            if not truncate:
                raise SFTDataError(f"{p.where or 'a record'}: {len(ids)} tokens (prompt {len(prompt)}) do not fit the "
                                   f"model's context of {max_len}; shorten it or pass truncate")
            ids = ids[: max_len + 1]
        if len(prompt) >= len(ids):
            raise SFTDataError(f"{p.where or 'a record'}: the prompt alone fills the context; no response token is left")
        out.append(SFTExample(tuple(ids), len(prompt)))
    return out


def collate(examples: Sequence[SFTExample], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded inputs, targets and the loss mask of a batch.

    Right padding needs no attention mask: with causal attention, real tokens never see the pads after
    them, and the pads' own predictions are masked out of the loss.

    Returns:
        x, y: (B, T) int64, ``y[:, t]`` the token after ``x[:, t]``; mask: (B, T) bool, True where the
        target ``y[:, t]`` is a response token (or the final ``<eos>``).
    """
    t = max(len(e.ids) for e in examples) - 1
    x = torch.full((len(examples), t), pad_id, dtype=torch.long)
    y = torch.full((len(examples), t), pad_id, dtype=torch.long)
    mask = torch.zeros((len(examples), t), dtype=torch.bool)
    for i, e in enumerate(examples):
        ids = torch.tensor(e.ids, dtype=torch.long)
        n = len(e.ids) - 1
        x[i, :n], y[i, :n] = ids[:-1], ids[1:]
        # y[t] = ids[t + 1] belongs to the response when t + 1 >= n_prompt.
        mask[i, max(e.n_prompt - 1, 0):n] = True
    return x, y, mask


class PairSampler:
    """Random batches of examples, drawn with its own generator so a resumed run draws the same ones."""

    def __init__(self, examples: Sequence[SFTExample], batch_size: int, pad_id: int, seed: int = 0) -> None:
        if not examples:
            raise ValueError("no fine-tuning examples")
        self.examples, self.batch_size, self.pad_id = list(examples), batch_size, pad_id
        self.generator = torch.Generator().manual_seed(seed)

    def next(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        idx = torch.randint(len(self.examples), (self.batch_size,), generator=self.generator)
        return collate([self.examples[i] for i in idx.tolist()], self.pad_id)

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])
