"""The attention maps of a trained model on a given text, with their tokens: for plots and the explorer.

A translation run: the text is translated (greedy or beam), then the model reads the source and its own
translation once more under :func:`capture_attention`, which gives every encoder self-attention,
decoder self-attention and cross-attention map of that translation. A GPT run: the text is continued
and the maps cover prompt and continuation.

The result is the explorer's payload: ``{"text", "output", "model_name", "maps": [{"name", "kind",
"layer", "query_tokens", "key_tokens", "weights" (H, T, L)}]}``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Sequence

import torch

from qkv.generation.api import Translator
from qkv.generation.decode import generate
from qkv.interpret.ablation import Head, heads_off
from qkv.interpret.capture import capture_attention
from qkv.interpret.explorer.payload import MAX_TEXT_CHARS
from qkv.devices import evaluating, model_device
from qkv.files import valid_text
from qkv.runs import PRONOUNS_JSON, Run, load_model



def token_strings(tokenizer, ids: list[int]) -> list[str]:
    out = []
    for i in ids:
        tok = tokenizer.id_to_token(int(i))
        # BPE word-start markers read better as a space; keep a visible symbol for a bare space.
        tok = tok.replace("▁", " ").replace("Ġ", " ").replace("Ċ", "\\n")
        out.append(tok.strip() or ("␣" if tok else "∅"))
    return out


def _maps_list(maps, kinds_tokens: dict[str, tuple[list[str], list[str]]]) -> list[dict]:
    entries = []
    for kind, (queries, keys) in kinds_tokens.items():
        for layer, w in enumerate(maps.get(kind, [])):
            entries.append({
                "name": f"{kind.replace('_', ' ')} · layer {layer}", "kind": kind, "layer": layer,
                "query_tokens": queries, "key_tokens": keys, "weights": w[0].float(),  # (H, T, L), first row
            })
    return entries


@torch.no_grad()
def translation_maps(translator, text: str, beam: int = 1) -> dict:
    """Translate ``text`` and capture every attention map of the model producing that translation.

    The decoder reads ``<bos> y_1 ... y_n`` and produces ``y_1 ... y_n <eos>``: row t of a decoder map
    (self or cross) is labeled with the token produced there, so a cross-attention row shows where
    in the source the model looked while writing that word; the decoder's own keys are the tokens it
    read (``<bos>`` first), so each row's last key is the token before its label.
    """
    tok, model = translator.tokenizer, translator.model
    src_ids = translator.encode_sources([text])[0]
    if not src_ids:
        raise ValueError("the text is empty")
    output = translator.translate(text, beam=beam)
    produced = tok.encode(output) + [tok.eos_id]  # y_1 ... y_n <eos>
    read = [tok.bos_id] + produced[:-1]           # <bos> y_1 ... y_n: teacher forcing on the translation
    src = torch.tensor([src_ids], device=translator.device)
    tgt_in = torch.tensor([read], device=translator.device)
    with evaluating(model), capture_attention(model) as maps:
        model(src, tgt_in)
    src_tokens = token_strings(tok, src_ids)
    read_tokens, produced_tokens = token_strings(tok, read), token_strings(tok, produced)
    return {
        "text": text, "output": output, "model_name": "encoder-decoder",
        "maps": _maps_list(maps, {
            "encoder_self": (src_tokens, src_tokens),
            "decoder_self": (produced_tokens, read_tokens),
            "cross": (produced_tokens, src_tokens),
        }),
    }


@torch.no_grad()
def completion_maps(model, tokenizer, text: str, max_new_tokens: int = 32) -> dict:
    """Continue ``text`` greedily and capture the self-attention over prompt and continuation."""
    ids = tokenizer.encode(text)
    if not ids:
        ids = [tokenizer.bos_id if tokenizer.bos_id is not None else 0]
    room = model.cfg.max_len - len(ids)
    if room < 0:
        raise ValueError(f"the text has {len(ids)} tokens; the model reads at most {model.cfg.max_len}")
    # Eager: a few dozen tokens for a page, where a step compiled (or built in the background) would not repay itself.
    new = generate(model, [ids], min(max_new_tokens, room), temperature=0, eos_id=tokenizer.eos_id, compile=False)[0]
    seq = ids + new
    with capture_attention(model) as maps:
        model(torch.tensor([seq], device=model_device(model)))
    tokens = token_strings(tokenizer, seq)
    return {"text": text, "output": tokenizer.decode(new), "model_name": "GPT",
            "maps": _maps_list(maps, {"self": (tokens, tokens)})}


Loaded = Translator | tuple  # a translation run's Translator, or a GPT run's (model, tokenizer)


def load_run(run: Run | str | Path, device: str | torch.device | None = "cpu") -> Loaded:
    """A run loaded for the views of it (maps, traces): one load that several providers share."""
    run = Run.of(run)
    if run.arch == "transformer":
        return Translator.from_run(run, device=device)
    return load_model(run, device=device)


def make_attention_provider(run: Run | str | Path | None, beam: int = 1, max_new_tokens: int = 32,
                            device: str | torch.device | None = "cpu", loaded: Loaded | None = None
                            ) -> Callable[..., dict]:
    """Load a run once (or take ``loaded``, :func:`load_run`'s, and then ``run`` may be None); return
    ``(text, off=()) -> payload`` (the explorer's model figure and ``qkv plot attention``). ``off``: heads to switch off
    (``ablation.heads_off``) while the model translates or continues ``text``; the payload then says
    which, and what the model wrote with every head on."""
    loaded = load_run(run, device) if loaded is None else loaded
    default_beam = beam
    if isinstance(loaded, Translator):
        translator = loaded
        model = translator.model

        def maps_of(text: str, size: int) -> dict:
            return translation_maps(translator, text, size)

        def all_on(text: str, size: int) -> str:
            return translator.translate(text, beam=size)
    else:
        model, tokenizer = loaded

        def maps_of(text: str, size: int) -> dict:
            return completion_maps(model, tokenizer, text, max_new_tokens)

        def all_on(text: str, size: int) -> str:
            return completion_maps(model, tokenizer, text, max_new_tokens)["output"]

    def provide(text: str, off: Sequence[Head] = (), beam: int | None = None) -> dict:
        """``beam``: this request's beam size (None: the provider's); a GPT continues greedily either way."""
        text = checked_text(text)
        size = default_beam if beam is None else beam
        with heads_off(model, off):
            payload = maps_of(text, size)
        if off:
            payload["off"] = [list(head) for head in off]
            payload["output_all_heads"] = all_on(text, size)
        return payload

    return provide


def pronoun_head(run: Run | str | Path) -> dict | None:
    """The head ``qkv explain`` found resolving pronouns best in ``run`` (None if it was not run there), and
    the sentence it is seen at work on (小明累了，他想睡觉。 from 他, or without 他 from the "he" it writes).

    Raises:
        LookupError: a ``pronouns.json`` that is not what ``qkv explain`` writes.
    """
    path = Run.of(run).file(PRONOUNS_JSON)
    if not path.is_file():
        return None
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
        best = results["best"]
        head = {key: best[key] for key in ("kind", "layer", "head", "share", "n", "share_two")}
        head["sentence"] = (results.get("seed_sentence") or {}).get("sentence")
        return head
    except (ValueError, KeyError, TypeError) as err:
        raise LookupError(f"{path}: not what `qkv explain` writes ({err}); run it again") from None


def checked_text(text: str) -> str:
    """``text`` as the maps are made of it: within the explorer's limit, not blank, and encodable (lone
    surrogates, which a JSON escape can carry, become U+FFFD: the payload echoes the text as UTF-8)."""
    if len(text) > MAX_TEXT_CHARS:
        raise ValueError(f"text of {len(text)} characters; at most {MAX_TEXT_CHARS}")
    if not text.strip():
        raise ValueError("the text is empty")
    return valid_text(text)
