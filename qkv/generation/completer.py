"""Completer: text in, text out for a GPT, with tokens streamed as they come, stop strings and a seed.

    completer = Completer.from_run("runs/shakespeare")
    completer.complete("ROMEO:", max_new_tokens=200, temperature=0.8, seed=1, stream=sys.stdout)

Generation is a prefill of the prompt, then one cached step per new token (:mod:`qkv.modules.kv_cache`).
An empty prompt starts from the run's start text (a newline for Shakespeare, as nanoGPT samples) or
the ``<bos>`` token. A prompt that does not fit the context is an error, unless ``sliding_window``:
then the model sees the last ``max_len`` tokens, and once the window is full each step recomputes it
(nanoGPT's crop; learned positions cannot be shifted inside a cache).

Streaming writes only text that is final: a byte-level token may end in the middle of a UTF-8
character, and text that could be the start of a stop string is held back until it is not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence, TextIO

import torch

from qkv.config import COMPILE_AFTER, PRECOMPILED_AFTER, ConfigError
from qkv.generation.api import InputError, InputTooLongError
from qkv.generation.compiled import CompiledStep, check_can_compile, cpu_compiler_available
from qkv.generation.decode import generate
from qkv.generation.kernels import end_decoding, start_decoding, step_linears
from qkv.generation.precompiled import LoadedStep, cache_slots, can_precompile, find, precompile
from qkv.generation.sampling import check_sampling_args, next_token
from qkv.generation.quantize import check_quantize, quantized
from qkv.io import DEVICE_DEFAULT, model_device, resolve_device
from qkv.runs import Run, load_model, require_arch


class Completer:
    """Continue text with a GPT and its tokenizer.

    Args:
        model: A :class:`qkv.models.gpt.GPT` (put in eval mode here).
        tokenizer: Its tokenizer (``encode``, ``decode``, ``eos_id``, ``bos_id``).
        start_text: What an empty prompt starts from; ``""`` means the ``<bos>`` token.
        compile: Run batch-1 decoding steps as one compiled graph (``qkv.generation.compiled``): True
            always, False never, None (the default) where it repays its cost (:meth:`compiles`).
    """

    def __init__(self, model: Any, tokenizer: Any, start_text: str = "\n", compile: bool | None = None) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.start_text = start_text
        self.compile = compile
        self.device = model_device(model)
        if compile:
            check_can_compile(self.device)
        self._packages: dict[int, Path | None] = {}  # the steps compiled ahead of time found, by batch size

    def package(self, rows: int = 1) -> Path | None:
        """The package of this model's step for ``rows`` prompts compiled ahead of time
        (qkv.generation.precompiled), if one was built on this machine for these weights; looked for once
        (finding one reads every weight), and again if the one found is gone (pruned by another process's
        build, or the user cache cleared): a long-lived Completer then decodes eagerly."""
        found = self._packages.get(rows)
        if rows not in self._packages or (found is not None and not found.is_file()):
            self._packages[rows] = find(self.model, rows)
        return self._packages[rows]

    def precompile(self, rows: int = 1) -> tuple[Path, float]:
        """Compile this model's step for ``rows`` prompts ahead of time, unless it was
        (:func:`~qkv.generation.precompiled.precompile`)."""
        path, seconds = precompile(self.model, rows)
        self._packages[rows] = path
        return path, seconds

    def loads(self, max_new_tokens: int, rows: int = 1) -> bool:
        """Whether a generation runs the step compiled ahead of time: by default (``compile=None``; True
        asks for torch.compile's, False for none), for ``config.PRECOMPILED_AFTER`` new tokens or more,
        where a package for these weights and this many prompts was built on this machine (loading it
        takes ~0.1 s; the step runs faster than torch.compile's, which it then replaces)."""
        return self.compile is None and max_new_tokens >= PRECOMPILED_AFTER and self.package(rows) is not None

    def would_load(self, max_new_tokens: int, rows: int = 1) -> bool:
        """Whether a generation would run a step compiled ahead of time if one were built (:meth:`precompile`),
        and none is: what ``qkv generate`` suggests building."""
        return (self.compile is None and max_new_tokens >= PRECOMPILED_AFTER and not self.loads(max_new_tokens, rows)
                and can_precompile(self.model) and cpu_compiler_available())

    def compiles(self, max_new_tokens: int, rows: int = 1) -> bool:
        """Whether a generation of ``max_new_tokens`` for ``rows`` prompts runs compiled steps.

        Only one prompt's steps are compiled (larger batches decode eagerly, where the weight products
        dominate). By default (``compile=None``) they are where the generation is long enough to repay
        compiling (``config.COMPILE_AFTER`` tokens), on a CPU with a C++ compiler, for a model whose
        steps run fp32 linear maps (not an int8 one), unless a step compiled ahead of time runs instead
        (:meth:`loads`).
        """
        if rows != 1 or self.compile is False:
            return False
        if self.compile:
            return True
        return (max_new_tokens >= COMPILE_AFTER and not self.loads(max_new_tokens, rows) and self.device.type == "cpu"
                and bool(step_linears(self.model)) and cpu_compiler_available())

    @classmethod
    def from_run(cls, run: Run | str | Path, device: str | torch.device | None = DEVICE_DEFAULT,
                 weights: str | Path | None = None, compile: bool | None = None,
                 quantize: str | None = None) -> Completer:
        """Load the model, tokenizer and start text of a run directory (``qkv train lm``, ``qkv finetune``,
        ``qkv convert gpt2``); ``weights`` as in :mod:`qkv.runs` (``model``, ``best``, ``last``, ``average``, a path);
        ``quantize="int8"``: the linear maps quantized as they are loaded (CPU only; qkv.generation.quantize)."""
        check_quantize(quantize, resolve_device(device), compile)
        run = Run.of(run)
        require_arch(run, "gpt", "text generation", instead="qkv translate")
        model, tokenizer = load_model(run, weights, device)
        return cls(quantized(model, quantize) if quantize else model, tokenizer, start_text=run.start_text,
                   compile=compile)

    @property
    def context(self) -> int:
        return self.model.cfg.max_len

    def encode_prompt(self, prompt: str) -> list[int]:
        """Token ids of ``prompt``; an empty prompt becomes the start text's ids, or ``<bos>``."""
        if not isinstance(prompt, str):
            raise TypeError(f"prompt must be a string, got {type(prompt).__name__}")
        if prompt:
            return self.tokenizer.encode(prompt)
        if self.start_text:
            return self.tokenizer.encode(self.start_text)
        if self.tokenizer.bos_id is None:
            raise InputError("an empty prompt needs a start token, and this tokenizer has no <bos>; give a prompt")
        return [self.tokenizer.bos_id]

    def _check(self, n_prompt: int, max_new_tokens: int, sliding_window: bool) -> None:
        if max_new_tokens < 0:
            raise ConfigError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        if not sliding_window and n_prompt + max_new_tokens > self.context:
            raise InputTooLongError(
                f"the prompt ({n_prompt} tokens) + max_new_tokens ({max_new_tokens}) exceeds the model's context of "
                f"{self.context} tokens; shorten the prompt, ask for fewer tokens, or use a sliding window "
                "(--sliding-window)", index=0, n_tokens=n_prompt, limit=self.context - max_new_tokens)

    def _generator(self, seed: int | None) -> torch.Generator | None:
        return None if seed is None else torch.Generator(device=self.device).manual_seed(seed)

    @torch.no_grad()
    def complete(
        self,
        prompt: str,
        max_new_tokens: int = 200,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        stop: Sequence[str] = (),
        stream: TextIO | None = None,
        sliding_window: bool = False,
        echo: bool = False,
    ) -> str:
        """The continuation of ``prompt`` (without the prompt).

        Args:
            prompt: Text to continue; empty starts from the start text.
            max_new_tokens: Most tokens to generate.
            temperature: 0 is greedy; otherwise sample from softmax(logits / temperature).
            top_k: Sample among the k most likely tokens (0 or None: all).
            top_p: Sample within the smallest set of tokens whose probability reaches top_p, in (0, 1].
            seed: Makes sampling reproducible.
            stop: Strings that end the completion; the first one found is cut off with what follows.
            stream: Write the text there as it is generated (e.g. ``sys.stdout``), flushed per token.
            sliding_window: Let the prompt and the output exceed the context (see the module docstring).
            echo: Write the prompt to ``stream`` first (once the arguments are known to be valid).

        Returns:
            The generated text, cut before the first stop string; ``<eos>`` ends it too.
        """
        check_sampling_args(temperature, top_k, top_p)
        stop = [s for s in stop if s]
        ids = self.encode_prompt(prompt)
        self._check(len(ids), max_new_tokens, sliding_window)
        gen = self._generator(seed)
        model, ctx, eos = self.model, self.context, self.tokenizer.eos_id
        out: list[int] = []
        text, emitted = "", 0
        window = ids[-ctx:]
        if echo and stream is not None:
            stream.write(prompt)
            stream.flush()
        if max_new_tokens == 0:
            return ""
        step: CompiledStep | None = None
        compiled, loaded = self.compiles(max_new_tokens), self.loads(max_new_tokens)
        try:
            # The caches (a package's step runs on caches of cache_slots); compiled steps use no packing.
            start_decoding(model, 1, cache_slots(model) if loaded else ctx, packed=not (compiled or loaded))
            logits = model(torch.tensor([window], device=self.device))[:, -1]  # prefill: (1, V)
            cached = len(window)
            prompt = torch.ones(1, cached, dtype=torch.bool, device=self.device)  # (1, T): no padding
            if compiled:
                step = CompiledStep(model, prompt)
            elif loaded:
                step = LoadedStep(model, prompt, self.package())
            for i in range(max_new_tokens):
                tok = int(next_token(logits, temperature, top_k, top_p, gen)[0])
                if eos is not None and tok == eos:
                    break
                out.append(tok)
                text = self.tokenizer.decode(out)
                cut = _first_stop(text, stop)
                if cut is not None:
                    text = text[:cut]
                    break
                if stream is not None:
                    safe = _safe_length(text, stop)
                    if safe > emitted:
                        stream.write(text[emitted:safe])
                        stream.flush()
                        emitted = safe
                if i == max_new_tokens - 1:
                    break
                if cached < ctx:  # one cached step; the token goes to cache slot `cached`, its position
                    new = torch.tensor([[tok]], device=self.device)  # (1, 1)
                    if step is None:
                        logits = model(new)[:, -1]
                    else:
                        logits = step(new, torch.tensor([[cached]], device=self.device), cached)[:, -1]
                    cached += 1
                else:
                    # The window is full: drop the cache and recompute the last ctx tokens each step.
                    model.clear_cache()
                    if step is not None:
                        step.close()
                    step = None
                    window = (ids + out)[-ctx:]
                    logits = model(torch.tensor([window], device=self.device))[:, -1]
        finally:
            if step is not None:
                step.close()
            end_decoding(model)
        if stream is not None and len(text) > emitted:
            stream.write(text[emitted:])
            stream.flush()
        return text

    @torch.no_grad()
    def complete_batch(
        self,
        prompts: Sequence[str],
        max_new_tokens: int = 200,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        stop: Sequence[str] = (),
    ) -> list[str]:
        """Complete several prompts in one batch (left-padded, one cached step per token for all rows).

        The same as :meth:`complete` for each prompt with greedy decoding; sampled rows draw from one
        generator, so they differ from one-at-a-time sampling with the same seed.
        """
        check_sampling_args(temperature, top_k, top_p)
        if not prompts:
            return []
        encoded = [self.encode_prompt(p) for p in prompts]
        for p in encoded:
            self._check(len(p), max_new_tokens, False)
        pad = self.tokenizer.pad_id if self.tokenizer.pad_id is not None else 0
        loaded = self.loads(max_new_tokens, len(encoded))
        rows = generate(self.model, encoded, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                        eos_id=self.tokenizer.eos_id, pad_id=pad, generator=self._generator(seed),
                        compile=self.compiles(max_new_tokens, len(encoded)),
                        package=self.package(len(encoded)) if loaded else None)
        eos = self.tokenizer.eos_id
        texts = []
        for row in rows:
            if eos is not None and eos in row:
                row = row[: row.index(eos)]
            text = self.tokenizer.decode(row)
            cut = _first_stop(text, [s for s in stop if s])
            texts.append(text if cut is None else text[:cut])
        return texts


def _first_stop(text: str, stop: Sequence[str]) -> int | None:
    """Index of the earliest stop string in ``text``, or None."""
    found = [i for i in (text.find(s) for s in stop) if i >= 0]
    return min(found) if found else None


def _safe_length(text: str, stop: Sequence[str]) -> int:
    """How much of ``text`` can be written now: not a trailing partial character (U+FFFD from a cut UTF-8
    sequence), and not a tail that could still grow into a stop string."""
    n = len(text)
    while n > 0 and text[n - 1] == "\ufffd":
        n -= 1
    hold = 0
    for s in stop:
        for k in range(min(len(s) - 1, n), 0, -1):
            if text[n - k:n] == s[:k]:
                hold = max(hold, k)
                break
    return n - hold
