"""Text in, text out: a trained translation model and its tokenizer behind one call.

    from qkv.generation.api import Translator
    translator = Translator.from_run("runs/demo")
    translator.translate("小明累了，他想睡觉。")  # -> "Xiaoming is tired, he wants to sleep."

A run directory (written by ``qkv train mt`` or ``qkv demo``, see :mod:`qkv.runs`) holds everything needed.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence, overload

import torch

from qkv.config import ALPHA, BEAM, EXTRA, MAX_TOKENS
from qkv.errors import ConfigError, QkvError
from qkv.generation.beam import beam_search, check_alpha, greedy_search
from qkv.accel.quantize import check_quantize, quantized
from qkv.devices import DEVICE_DEFAULT, model_device, resolve_device
from qkv.runs import Run, RunError, load_model, require_arch

class InputError(QkvError, ValueError):
    """Text a model cannot take as it is given (a prompt without a start token, one too long)."""


class InputTooLongError(InputError):
    """A source sentence or a prompt with more tokens than the model has positions."""

    def __init__(self, message: str, index: int, n_tokens: int, limit: int) -> None:
        super().__init__(message)
        self.index, self.n_tokens, self.limit = index, n_tokens, limit


class Translator:
    """Translate sentences with an encoder-decoder and its tokenizer.

    Args:
        model: a :class:`~qkv.models.transformer.Transformer` (moved to eval mode).
        tokenizer: the joint tokenizer it was trained with (``<pad> <bos> <eos> <unk>`` = 0..3).
        max_tokens: token budget of one decoding batch (sources are sorted by length and batched).
    """

    def __init__(self, model, tokenizer, max_tokens: int = MAX_TOKENS) -> None:
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
    def from_run(cls, run: Run | str | Path, weights: str | Path | None = None,
                 device: str | torch.device | None = DEVICE_DEFAULT, max_tokens: int = MAX_TOKENS,
                 quantize: str | None = None) -> Translator:
        """Load the model of a run directory (see :mod:`qkv.runs`).

        Args:
            run: written by ``qkv train mt`` or ``qkv demo``.
            weights: ``model``, ``best``, ``last``, ``average`` (files of the run) or a weights file
                (default: ``model.safetensors``, else ``best``, else ``last``).
            device: where to run (``auto``: CUDA when present).
            quantize: ``"int8"``: the linear maps quantized as they are loaded (CPU only; qkv.accel.quantize).

        Raises:
            FileNotFoundError: the directory or one of its files is missing (each is named).
            RunError: files that do not belong together, or a run of a GPT.
        """
        check_quantize(quantize, resolve_device(device))
        run = Run.of(run)
        require_arch(run, "transformer", "translation", instead="qkv generate")
        model, tokenizer = load_model(run, weights, device)
        return cls(quantized(model, quantize) if quantize else model, tokenizer, max_tokens=max_tokens)

    # ------------------------------------------------------------------------------------------

    @property
    def device(self) -> torch.device:
        return model_device(self.model)

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

    def translate_nbest(self, texts: Sequence[str], beam: int = BEAM, n_best: int | None = None, alpha: float = ALPHA,
                        extra: int = EXTRA, truncate: bool = False) -> list[list[tuple[str, float]]]:
        """The ``n_best`` translations of each text with their scores (log P / length penalty), best first.

        ``beam=1`` is greedy search (score: the log-probability). An empty text gives ``[("", 0.0)]``.
        """
        n_best = n_best or 1
        if beam < 1:
            raise ConfigError(f"beam must be >= 1, got {beam}")
        check_alpha(alpha)
        if n_best > beam:
            raise ConfigError(f"n_best ({n_best}) cannot exceed the beam size ({beam})")
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

    def translate(self, texts, beam=BEAM, alpha=ALPHA, extra=EXTRA, truncate=False):
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


__all__ = ["Translator", "RunError", "InputError", "InputTooLongError"]
