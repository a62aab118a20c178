"""What a trained model does on one sentence, step by step: the explorer's training-and-generating
figure and GPT's practice problems (the first article's last section, the second article's section 5).

``translation_trace``: one teacher-forced pass over the model's own greedy translation (the target
shifted right behind ``<bos>``, every position's prediction at once, the causal table of the
decoder's first self-attention layer), then the same translation generated one token at a time, each
step with its top candidates and its cross-attention row. ``practice_trace``: a sentence cut into
next-token problems for a GPT, each with the probability of its answer and its negative
log-likelihood. Both are plain JSON-ready dicts; the explorer serves them (``/api/trace``), and its page
computes the same ones from the in-page model (``static/decoding.js``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

import torch

from qkv.generation.api import Translator
from qkv.generation.beam import max_new_tokens
from qkv.interpret.capture import capture_attention
from qkv.interpret.model_maps import Loaded, checked_text, load_run, token_strings
from qkv.devices import evaluating, model_device
from qkv.runs import Run

TOP_K = 5  # candidates shown for each position or step
DECIMALS = 6


def _top(probs: torch.Tensor, tokenizer, k: int) -> list[list]:
    """The ``k`` most probable tokens of ``probs`` (V,) as [[token, p], ...], most probable first."""
    p, ids = probs.topk(min(k, probs.numel()))
    return [[tok, round(float(x), DECIMALS)] for tok, x in zip(token_strings(tokenizer, ids.tolist()), p)]


def model_sizes(cfg) -> dict:
    """A model's sizes as the encoder-decoder figure shows them (a ModelConfig, or a run's)."""
    if isinstance(cfg, (Run, str, Path)):
        cfg = Run.of(cfg).model_config
    return {"arch": cfg.arch, "d_model": cfg.d_model, "n_heads": cfg.n_heads, "d_k": cfg.d_model // cfg.n_heads
            if cfg.d_k is None else cfg.d_k, "d_ff": cfg.d_ff, "n_layers": cfg.n_layers,
            "n_decoder_layers": cfg.n_layers if cfg.n_decoder_layers is None else cfg.n_decoder_layers}


@torch.no_grad()
def translation_trace(translator, text: str, top_k: int = TOP_K) -> dict:
    """Training at once against generating one token at a time, on ``text``.

    The target is the model's own greedy translation (``qkv translate --beam 1``'s): the decoder reads
    ``<bos> y_1 ... y_n`` and predicts ``y_1 ... y_n <eos>``.

    Returns:
        ``{"source", "source_tokens", "output", "read", "target", "teacher": [{"top", "p_answer"}] per
        position, "self_log_weights": (T, T) log w of decoder layer 0's mean head (None above the
        diagonal: the mask's -inf), "self_weights": (T, T), "steps": [{"top", "chosen", "cross"}] until
        <eos>, "model": sizes}``.
    """
    tok, model = translator.tokenizer, translator.model
    src_ids = translator.encode_sources([text])[0]
    if not src_ids:
        raise ValueError("the text is empty")
    device = translator.device
    src = torch.tensor([src_ids], device=device)  # (1, S)
    with evaluating(model):
        # Generating: every step recomputes the whole prefix, so each step's maps are those of that
        # step alone (the cache would give the same numbers; this reads plainer).
        limit = int(max_new_tokens(src, model.cfg.pad_id, model.cfg.max_len)[0])
        prefix = [tok.bos_id]
        steps = []
        for t in range(limit + 1):  # t tokens generated so far
            with capture_attention(model) as maps:
                logits = model(src, torch.tensor([prefix], device=device))[0, -1]  # (V,)
            probs = logits.float().softmax(-1)
            # At the length limit (source + 50) the search ends with <eos>, as greedy_search does.
            chosen = tok.eos_id if t == limit else int(probs.argmax())
            cross = maps["cross"][-1][0, :, -1, :].mean(0)  # last layer, mean head, this step's row: (S,)
            steps.append({"top": _top(probs, tok, top_k), "chosen": token_strings(tok, [chosen])[0],
                          "cross": [round(float(w), DECIMALS) for w in cross]})
            if chosen == tok.eos_id:
                break
            prefix.append(chosen)
        produced = prefix[1:] + [tok.eos_id]  # y_1 ... y_n <eos>
        read = prefix  # <bos> y_1 ... y_n
        # Training: the same target in one pass, every position at once under the causal mask.
        with capture_attention(model) as maps:
            logits = model(src, torch.tensor([read], device=device))[0]  # (T, V)
        probs = logits.float().softmax(-1)
        self_w = maps["decoder_self"][0][0].mean(0)  # layer 0, mean head: (T, T)
    teacher = [{"top": _top(probs[t], tok, top_k), "p_answer": round(float(probs[t, y]), DECIMALS)}
               for t, y in enumerate(produced)]
    log_w = [[round(math.log(float(w)), 4) if j <= i and w > 0 else None for j, w in enumerate(row)]
             for i, row in enumerate(self_w)]
    return {
        "source": text, "source_tokens": token_strings(tok, src_ids),
        "output": tok.decode(prefix[1:]).replace("\n", " ").strip(),
        "read": token_strings(tok, read), "target": token_strings(tok, produced),
        "teacher": teacher, "self_log_weights": log_w,
        "self_weights": [[round(float(w), DECIMALS) for w in row] for row in self_w],
        "steps": steps, "model": model_sizes(model.cfg),
    }


@torch.no_grad()
def practice_trace(model, tokenizer, text: str, top_k: int = 3) -> dict:
    """``text`` cut into next-token problems for a GPT: each prefix, its answer, p(answer) and -log p.

    One forward pass over the tokens answers every problem at once (the causal mask keeps each prefix
    from seeing its answer), as pretraining scores them.

    Returns:
        ``{"text", "tokens", "problems": [{"prefix", "answer", "p", "nll", "top", "unknown"}],
        "mean_nll", "model": sizes}``.
    """
    ids = tokenizer.encode(text)
    if len(ids) < 2:
        raise ValueError("the text needs at least two tokens: a prefix and its answer")
    if len(ids) > model.cfg.max_len:
        raise ValueError(f"the text has {len(ids)} tokens; the model reads at most {model.cfg.max_len}")
    tokens = token_strings(tokenizer, ids)
    unk = tokenizer.unk_id
    with evaluating(model):
        logits = model(torch.tensor([ids], device=model_device(model)))[0]  # (T, V)
    logp = logits.float().log_softmax(-1)
    problems = []
    for t in range(1, len(ids)):
        lp = float(logp[t - 1, ids[t]])
        problems.append({"prefix": tokens[:t], "answer": tokens[t], "p": round(math.exp(lp), DECIMALS),
                         "nll": round(-lp, DECIMALS), "top": _top(logp[t - 1].exp(), tokenizer, top_k),
                         "unknown": unk is not None and ids[t] == unk})
    mean = sum(p["nll"] for p in problems) / len(problems)
    return {"text": text, "tokens": tokens, "problems": problems, "mean_nll": round(mean, DECIMALS),
            "model": model_sizes(model.cfg)}


def make_trace_provider(run: Run | str | Path, device: str | torch.device | None = "cpu",
                        loaded: Loaded | None = None) -> tuple[Callable[[str], dict], str]:
    """Load a run once (or take ``loaded``, ``model_maps.load_run``'s); return (text -> trace, the trace's
    kind): ``translation`` for an encoder-decoder, ``practice`` for a GPT."""
    loaded = load_run(run, device) if loaded is None else loaded
    if isinstance(loaded, Translator):
        return (lambda text: translation_trace(loaded, checked_text(text))), "translation"
    model, tokenizer = loaded
    return (lambda text: practice_trace(model, tokenizer, checked_text(text))), "practice"


__all__ = ["translation_trace", "practice_trace", "make_trace_provider", "model_sizes", "TOP_K"]
