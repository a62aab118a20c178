"""Text in, text out: a trained translation model and its tokenizer behind one call.

    from qkv.generation.api import Translator
    translator = Translator.from_run("runs/demo")
    translator.translate("小明累了，他想睡觉。")  # -> "Xiaoming is tired, he wants to sleep."

A run directory (written by ``qkv train mt``) holds everything needed: ``config.json`` (the resolved
training config, with the model under ``model``), ``tokenizer.json`` and ``model.safetensors``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Sequence, overload

import torch

CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.json"
WEIGHTS_FILE = "model.safetensors"


class RunError(ValueError):
    """A run directory whose files do not belong together (a config, tokenizer and weights of different runs)."""


class InputTooLongError(ValueError):
    """A source sentence with more tokens than the model has positions."""

    def __init__(self, message: str, index: int, n_tokens: int, limit: int) -> None:
        super().__init__(message)
        self.index, self.n_tokens, self.limit = index, n_tokens, limit


def load_run_config(run_dir: str | Path) -> dict:
    """The JSON of ``run_dir/config.json``; errors say what is missing."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run directory not found: {run_dir} (create one with `qkv train mt` or `qkv demo`)")
    path = run_dir / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir}: missing {CONFIG_FILE} (the resolved config `qkv train mt` writes); "
                                "is this a qkv run directory?")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RunError(f"{path}: not a JSON config ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        raise RunError(f"{path}: no 'model' section; not a config written by `qkv train mt`")
    return data


class Translator:
    """Translate sentences with an encoder-decoder and its tokenizer.

    Args:
        model: a :class:`~qkv.models.transformer.Transformer` (moved to eval mode).
        tokenizer: the joint tokenizer it was trained with (``<pad> <bos> <eos> <unk>`` = 0..3).
        max_tokens: token budget of one decoding batch (sources are sorted by length and batched).
    """

    def __init__(self, model, tokenizer, max_tokens: int = 4000) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens
        if tokenizer.vocab_size != model.cfg.vocab_size:
            raise RunError(f"the tokenizer has {tokenizer.vocab_size} entries but the model's vocab_size is "
                           f"{model.cfg.vocab_size}: they come from different runs")
        for name in ("pad_id", "bos_id", "eos_id"):
            if getattr(tokenizer, name) is None:
                raise RunError(f"the tokenizer has no {name[:-3]} token; translation needs <pad>, <bos> and <eos>")
        if tokenizer.pad_id != model.cfg.pad_id:
            raise RunError(f"the tokenizer's <pad> is {tokenizer.pad_id}, the model's pad_id is {model.cfg.pad_id}")

    @classmethod
    def from_run(cls, run_dir: str | Path, weights: str | Path | None = None, device: str | torch.device = "cpu",
                 max_tokens: int = 4000) -> Translator:
        """Load the model of a run directory.

        Args:
            run_dir: written by ``qkv train mt``.
            weights: ``model``, ``best``, ``last``, ``average`` (files of the run) or a weights file
                (default: ``model.safetensors``, else ``best``, else ``last``).
            device: where to run.

        Raises:
            FileNotFoundError: the directory or one of its files is missing (each is named).
            RunError: files that do not belong together.
        """
        from qkv.config import ConfigError, ModelConfig, from_dict
        from qkv.models.transformer import Transformer
        from qkv.tokenizers import TokenizerError, load_tokenizer
        from qkv.training.checkpoint import CheckpointError, load_weights, run_weights

        run_dir = Path(run_dir)
        data = load_run_config(run_dir)
        weights_path = run_weights(run_dir, weights)
        missing = []
        if not (run_dir / TOKENIZER_FILE).is_file():
            missing.append(TOKENIZER_FILE)
        if weights_path is None or not weights_path.is_file():
            missing.append(str(weights_path) if weights is not None else f"{WEIGHTS_FILE} (nor best/last.safetensors)")
        if missing:
            raise FileNotFoundError(f"{run_dir}: missing {' and '.join(missing)}; a translation run holds "
                                    f"{CONFIG_FILE}, {TOKENIZER_FILE} and {WEIGHTS_FILE}")
        try:
            cfg = from_dict(ModelConfig, data["model"], where=f"{run_dir / CONFIG_FILE}: model")
        except ConfigError as e:
            raise RunError(str(e)) from None
        if cfg.arch != "transformer":
            raise RunError(f"{run_dir} holds a {cfg.arch!r} model, not an encoder-decoder; `qkv translate` needs a "
                           "run of `qkv train mt`")
        try:
            tokenizer = load_tokenizer(run_dir)
        except TokenizerError as e:
            raise RunError(str(e)) from None
        if tokenizer.vocab_size != cfg.vocab_size:
            raise RunError(f"{run_dir / TOKENIZER_FILE} has {tokenizer.vocab_size} entries but {run_dir / CONFIG_FILE} "
                           f"says vocab_size {cfg.vocab_size}: the files come from different runs")
        model = Transformer(cfg)
        try:
            load_weights(weights_path, model)
        except CheckpointError as e:
            raise RunError(f"{e}\n(the weights do not match {run_dir / CONFIG_FILE}: "
                           "files from different runs?)") from None
        return cls(model.to(device), tokenizer, max_tokens=max_tokens)

    # ------------------------------------------------------------------------------------------

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def max_source_tokens(self) -> int:
        """Longest source the encoder takes, in tokens, its ``<eos>`` included."""
        return self.model.cfg.max_len

    def encode_sources(self, texts: Sequence[str], truncate: bool = False) -> list[list[int]]:
        """Source ids with their ``<eos>``; an empty (or blank) text gives []. Unknown characters become ``<unk>``.

        Raises:
            InputTooLongError: a source longer than the model's positions, unless ``truncate``.
        """
        out = []
        limit = self.max_source_tokens
        for i, text in enumerate(texts):
            if not text.strip():
                out.append([])
                continue
            ids = self.tokenizer.encode(text.strip()) + [self.tokenizer.eos_id]
            if len(ids) > limit:
                if not truncate:
                    raise InputTooLongError(
                        f"input {i + 1} has {len(ids)} tokens (with <eos>) but the model reads at most {limit}; "
                        "split the sentence, or pass truncate=True (--truncate) to keep its first tokens",
                        i, len(ids), limit)
                print(f"warning: input {i + 1} truncated from {len(ids)} to {limit} tokens", file=sys.stderr)
                ids = ids[: limit - 1] + [self.tokenizer.eos_id]
            out.append(ids)
        return out

    def _batches(self, sources: list[list[int]]) -> list[list[int]]:
        """Indices of the non-empty sources, sorted by length, cut into batches under the token budget."""
        order = sorted((i for i, s in enumerate(sources) if s), key=lambda i: len(sources[i]))
        batches, current, longest = [], [], 0
        for i in order:
            grown = max(longest, len(sources[i]))
            if current and grown * (len(current) + 1) > self.max_tokens:
                batches.append(current)
                current, grown = [], len(sources[i])
            current.append(i)
            longest = grown
        return batches + ([current] if current else [])

    def _pad(self, rows: list[list[int]]) -> torch.Tensor:
        src = torch.full((len(rows), max(len(r) for r in rows)), self.tokenizer.pad_id, dtype=torch.long)
        for j, r in enumerate(rows):
            src[j, : len(r)] = torch.as_tensor(r)
        return src.to(self.device)

    def translate_nbest(self, texts: Sequence[str], beam: int = 4, n_best: int | None = None, alpha: float = 0.6,
                        extra: int = 50, truncate: bool = False) -> list[list[tuple[str, float]]]:
        """The ``n_best`` translations of each text with their scores (log P / length penalty), best first.

        ``beam=1`` is greedy search (score: the log-probability). An empty text gives ``[("", 0.0)]``.
        """
        from qkv.generation.beam import beam_search, greedy_search

        n_best = n_best or 1
        if beam < 1:
            raise ValueError(f"beam must be >= 1, got {beam}")
        if n_best > beam:
            raise ValueError(f"n_best ({n_best}) cannot exceed the beam size ({beam})")
        sources = self.encode_sources(texts, truncate)
        out: list[list[tuple[str, float]]] = [[("", 0.0)] for _ in texts]
        tok = self.tokenizer
        for idx in self._batches(sources):
            src = self._pad([sources[i] for i in idx])
            if beam == 1 and n_best == 1:
                outputs = greedy_search(self.model, src, tok.bos_id, tok.eos_id, extra)
                results = [[(ids, float("nan"))] for ids in outputs]
            else:
                hyps = beam_search(self.model, src, tok.bos_id, tok.eos_id, beam, alpha, n_best, extra)
                results = [[(h.tokens, h.score) for h in hs] for hs in hyps]
            for i, res in zip(idx, results):
                # A translation is one line: a newline the tokenizer could produce would break the pipe.
                out[i] = [(tok.decode(ids).replace("\n", " ").strip(), score) for ids, score in res]
        return out

    @overload
    def translate(self, texts: str, beam: int = ..., alpha: float = ..., extra: int = ...,
                  truncate: bool = ...) -> str: ...

    @overload
    def translate(self, texts: Sequence[str], beam: int = ..., alpha: float = ..., extra: int = ...,
                  truncate: bool = ...) -> list[str]: ...

    def translate(self, texts, beam=4, alpha=0.6, extra=50, truncate=False):
        """Translate one text (returns a string) or a list of texts (returns a list, same order).

        Args:
            texts: a sentence or sentences; an empty one translates to "".
            beam: beam size (1: greedy search).
            alpha: length penalty exponent (the paper: 0.6).
            extra: maximum output length = source length + ``extra`` (the paper: 50).
            truncate: cut sources longer than the model's positions instead of raising.
        """
        single = isinstance(texts, str)
        batch = [texts] if single else list(texts)
        best = [hyps[0][0] for hyps in self.translate_nbest(batch, beam, 1, alpha, extra, truncate)]
        return best[0] if single else best


__all__ = ["Translator", "RunError", "InputTooLongError", "load_run_config",
           "CONFIG_FILE", "TOKENIZER_FILE", "WEIGHTS_FILE"]
