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
from typing import Callable

import torch

from qkv.interpret.capture import capture_attention

MAX_TEXT_CHARS = 500


def _token_strings(tokenizer, ids: list[int]) -> list[str]:
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
    """Translate ``text`` and capture every attention map of the model producing that translation."""
    tok, model = translator.tokenizer, translator.model
    src_ids = translator.encode_sources([text])[0]
    if not src_ids:
        raise ValueError("the text is empty")
    output = translator.translate(text, beam=beam)
    out_ids = tok.encode(output) + [tok.eos_id]
    src = torch.tensor([src_ids], device=translator.device)
    tgt_in = torch.tensor([[tok.bos_id] + out_ids[:-1]], device=translator.device)
    with capture_attention(model) as maps:
        model(src, tgt_in)
    src_tokens = _token_strings(tok, src_ids)
    tgt_in_tokens = _token_strings(tok, tgt_in[0].tolist())
    return {
        "text": text, "output": output, "model_name": "encoder-decoder",
        "maps": _maps_list(maps, {
            "encoder_self": (src_tokens, src_tokens),
            "decoder_self": (tgt_in_tokens, tgt_in_tokens),
            "cross": (tgt_in_tokens, src_tokens),
        }),
    }


@torch.no_grad()
def completion_maps(model, tokenizer, text: str, max_new_tokens: int = 32) -> dict:
    """Continue ``text`` greedily and capture the self-attention over prompt and continuation."""
    from qkv.generation import generate

    ids = tokenizer.encode(text)
    if not ids:
        ids = [tokenizer.bos_id if tokenizer.bos_id is not None else 0]
    room = model.cfg.max_len - len(ids)
    if room < 0:
        raise ValueError(f"the text has {len(ids)} tokens; the model reads at most {model.cfg.max_len}")
    new = generate(model, [ids], min(max_new_tokens, room), temperature=0, eos_id=tokenizer.eos_id)[0]
    seq = ids + new
    with capture_attention(model) as maps:
        model(torch.tensor([seq], device=next(model.parameters()).device))
    tokens = _token_strings(tokenizer, seq)
    return {"text": text, "output": tokenizer.decode(new), "model_name": "GPT",
            "maps": _maps_list(maps, {"self": (tokens, tokens)})}


def run_arch(run_dir: str | Path) -> str:
    """'transformer' or 'gpt', from the run's config.json; errors name what is missing."""
    run_dir = Path(run_dir)
    path = run_dir / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir}: no config.json; is this a qkv run directory (from `qkv train` or `qkv demo`)?")
    data = json.loads(path.read_text(encoding="utf-8"))
    arch = (data.get("model") or {}).get("arch")
    if arch not in ("transformer", "gpt"):
        raise ValueError(f"{path}: model.arch is {arch!r}, expected 'transformer' or 'gpt'")
    return arch


def make_attention_provider(run_dir: str | Path, beam: int = 1, max_new_tokens: int = 32) -> Callable[[str], dict]:
    """Load a run once; return text -> payload (the explorer's figure 6 and ``qkv plot attention``)."""
    if run_arch(run_dir) == "transformer":
        from qkv.generation.api import Translator

        translator = Translator.from_run(run_dir)

        def provide(text: str) -> dict:
            _check_text(text)
            return translation_maps(translator, text, beam)
    else:
        from qkv.training.lm_run import load_run

        model, tokenizer, _ = load_run(run_dir, device="cpu")

        def provide(text: str) -> dict:
            _check_text(text)
            return completion_maps(model, tokenizer, text, max_new_tokens)

    return provide


def _check_text(text: str) -> None:
    if len(text) > MAX_TEXT_CHARS:
        raise ValueError(f"text of {len(text)} characters; at most {MAX_TEXT_CHARS}")
    if not text.strip():
        raise ValueError("the text is empty")
