"""Completer: text in, text out for a GPT, with tokens streamed as they come, stop strings and a seed.

    completer = Completer.from_run("runs/shakespeare")
    completer.complete("ROMEO:", max_new_tokens=200, temperature=0.8, seed=1, stream=sys.stdout)

Generation is :func:`qkv.generation.decode.generate`, the one decoding loop, its step chosen once a generation
by the Completer's policy (:class:`~qkv.generation.policy.StepPolicy`) unless the caller passes one, as
``qkv generate`` chooses it: a step compiled ahead of time where one was built for the model, and, after an eager
generation that such a step would have run, one built in the background for the next generation (a
:class:`~qkv.generation.policy.PrecompileNotice` says so). The Completer adds the text around it. An empty prompt starts from the run's start text (a newline for
Shakespeare, as nanoGPT samples) or the ``<bos>`` token. A prompt that does not fit the context is an error, unless ``sliding_window``.

Streaming writes only text that is final: a byte-level token may end in the middle of a UTF-8
character, and text that could be the start of a stop string is held back until it is not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence, TextIO

import torch

from qkv.accel.quantize import check_quantize, quantized
from qkv.config import NEW_TOKENS, TEMPERATURE
from qkv.errors import ConfigError
from qkv.generation.api import InputError, InputTooLongError
from qkv.generation.decode import generate
from qkv.generation.policy import Step, StepPolicy
from qkv.generation.sampling import check_sampling_args
from qkv.devices import DEVICE_DEFAULT, model_device, resolve_device
from qkv.runs import Run, load_model, require_arch


class Completer:
    """Continue text with a GPT and its tokenizer.

    Args:
        model: A :class:`qkv.models.gpt.GPT` (put in eval mode here).
        tokenizer: Its tokenizer (``encode``, ``decode``, ``eos_id``, ``bos_id``).
        start_text: What an empty prompt starts from; ``""`` means the ``<bos>`` token.
        compile: How decoding steps run (:class:`qkv.generation.policy.StepPolicy`, held as ``policy``): None (the
            default) as every generation does by default, True compiled, False eager.
    """

    def __init__(self, model: Any, tokenizer: Any, start_text: str = "\n", compile: bool | None = None) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.start_text = start_text
        self.device = model_device(model)
        self.policy = StepPolicy(self.model, compile)

    @classmethod
    def from_run(cls, run: Run | str | Path, device: str | torch.device | None = DEVICE_DEFAULT,
                 weights: str | Path | None = None, compile: bool | None = None,
                 quantize: str | None = None) -> Completer:
        """Load the model, tokenizer and start text of a run directory (``qkv train lm``, ``qkv finetune``,
        ``qkv convert gpt2``); ``weights`` as in :mod:`qkv.runs` (``model``, ``best``, ``last``, ``average``, a path);
        ``quantize="int8"``: the linear maps quantized as they are loaded (CPU only; qkv.accel.quantize)."""
        check_quantize(quantize, resolve_device(device), compile)
        run = Run.of(run)
        require_arch(run, "gpt", "text generation", instead="qkv translate")
        model, tokenizer = load_model(run, weights, device)
        return cls(quantized(model, quantize) if quantize else model, tokenizer, start_text=run.start_text,
                   compile=compile)

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
        max_len = self.model.cfg.max_len
        if not sliding_window and n_prompt + max_new_tokens > max_len:
            raise InputTooLongError(
                f"the prompt ({n_prompt} tokens) + max_new_tokens ({max_new_tokens}) exceeds the model's context of "
                f"{max_len} tokens; shorten the prompt, ask for fewer tokens, or use a sliding window "
                "(--sliding-window)", index=0, n_tokens=n_prompt, limit=max_len - max_new_tokens)

    def _generator(self, seed: int | None) -> torch.Generator | None:
        return None if seed is None else torch.Generator(device=self.device).manual_seed(seed)

    @torch.no_grad()
    def complete(
        self,
        prompt: str,
        max_new_tokens: int = NEW_TOKENS,
        temperature: float = TEMPERATURE,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        stop: Sequence[str] = (),
        stream: TextIO | None = None,
        sliding_window: bool = False,
        echo: bool = False,
        step: Step | None = None,
    ) -> str:
        """The continuation of ``prompt`` (without the prompt).

        Args:
            prompt: Text to continue; empty starts from the start text.
            max_new_tokens: Most tokens to generate.
            temperature: 0 is greedy; otherwise sample from softmax(logits / temperature) (by default 0.8,
                ``qkv.config.TEMPERATURE``, as `qkv generate`).
            top_k: Sample among the k most likely tokens (0 or None: all).
            top_p: Sample within the smallest set of tokens whose probability reaches top_p, in (0, 1].
            seed: Makes sampling reproducible.
            stop: Strings that end the completion; the first one found is cut off with what follows.
            stream: Write the text there as it is generated (e.g. ``sys.stdout``), flushed per token.
            sliding_window: Let the prompt and the output exceed the context (see :func:`~qkv.generation.decode.generate`).
            echo: Write the prompt to ``stream`` first (once the arguments are known to be valid).
            step: The decoding step, chosen for one prompt (``self.policy.choose``); by default chosen here.

        Returns:
            The generated text, cut before the first stop string; ``<eos>`` ends it too.
        """
        check_sampling_args(temperature, top_k, top_p)
        stop = [s for s in stop if s]
        ids = self.encode_prompt(prompt)
        self._check(len(ids), max_new_tokens, sliding_window)
        if echo and stream is not None:
            stream.write(prompt)
            stream.flush()
        eos = self.tokenizer.eos_id
        out: list[int] = []
        text, emitted = "", 0

        def on_step(tok: torch.Tensor) -> bool:  # tok: (1,); True stops at a stop string
            nonlocal text, emitted
            token = int(tok[0])
            if token == eos:
                return False  # generate ends the row there
            out.append(token)
            text = self.tokenizer.decode(out)
            cut = _first_stop(text, stop)
            if cut is not None:
                text = text[:cut]
                return True
            if stream is not None:
                safe = _safe_length(text, stop)
                if safe > emitted:
                    stream.write(text[emitted:safe])
                    stream.flush()
                    emitted = safe
            return False

        chosen = self.policy.choose(max_new_tokens) if step is None else None  # chosen here: it builds what it calls for
        generate(self.model, [ids], max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, eos_id=eos,
                 generator=self._generator(seed), on_step=on_step, sliding_window=sliding_window,
                 step=step if chosen is None else chosen)
        if stream is not None and len(text) > emitted:
            stream.write(text[emitted:])
            stream.flush()
        if chosen is not None:
            self.policy.notify(chosen)
        return text

    @torch.no_grad()
    def complete_batch(
        self,
        prompts: Sequence[str],
        max_new_tokens: int = NEW_TOKENS,
        temperature: float = TEMPERATURE,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        stop: Sequence[str] = (),
        step: Step | None = None,
    ) -> list[str]:
        """Complete several prompts in one batch (left-padded, one cached step per token for all rows).

        The same as :meth:`complete` for each prompt with greedy decoding; sampled rows draw from one
        generator, so they differ from one-at-a-time sampling with the same seed. ``step``: the decoding step,
        chosen for as many prompts (``self.policy.choose``); by default chosen here.
        """
        check_sampling_args(temperature, top_k, top_p)
        if not prompts:
            return []
        encoded = [self.encode_prompt(p) for p in prompts]
        for p in encoded:
            self._check(len(p), max_new_tokens, False)
        pad = self.tokenizer.pad_id if self.tokenizer.pad_id is not None else 0
        chosen = self.policy.choose(max_new_tokens, len(encoded)) if step is None else None
        rows = generate(self.model, encoded, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                        eos_id=self.tokenizer.eos_id, pad_id=pad, generator=self._generator(seed),
                        step=step if chosen is None else chosen)
        if chosen is not None:
            self.policy.notify(chosen)
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
