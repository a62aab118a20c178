"""A translation run exported to Hugging Face, decoded by both: how many outputs are token for token equal.

The run is exported with ``qkv export hf``, loaded back with ``MarianMTModel.from_pretrained`` and
``AutoTokenizer``, and the first N validation sentences are decoded by qkv (``greedy_search``,
``beam_search``) and by HF's ``generate`` with the same limit of new tokens. Beam 4 is compared with
no length penalty (both rank by log-probability) and with alpha 0.6, where HF's penalty |Y|^alpha
is not GNMT's ((5 + |Y|) / 6)^alpha that qkv and the paper use. Also the largest logit difference.

    python bench/hf_export.py --run runs/table3/base_seed1 --src ../shared/data/multi30k/val.de -n 200
"""

from __future__ import annotations

import argparse
import json
import tempfile

import torch

from qkv.interop.export import export_hf
from qkv.generation.beam import beam_search, greedy_search
from qkv.runs import load_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True)
    ap.add_argument("--src", required=True, help="source sentences, one per line")
    ap.add_argument("-n", type=int, default=200)
    ap.add_argument("--limit", type=int, default=80, help="new tokens at most, both sides")
    ap.add_argument("--out", help="write the figures as JSON here")
    args = ap.parse_args()
    from transformers import AutoTokenizer, MarianMTModel

    torch.set_num_threads(1)
    folder = export_hf(args.run, tempfile.mkdtemp() + "/hf")
    model, tokenizer = load_model(args.run, device="cpu")
    hf, auto = MarianMTModel.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)
    with open(args.src, encoding="utf-8") as f:
        sources = [line.strip() for line in f][: args.n]
    settings = {"greedy": (1, 0.0), "beam 4, alpha 0": (4, 0.0), "beam 4, alpha 0.6": (4, 0.6)}
    same = dict.fromkeys(settings, 0)
    worst = 0.0
    specials = (tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id)
    for i in range(0, len(sources), 10):
        batch = auto(sources[i:i + 10], return_tensors="pt", padding=True)
        src = batch["input_ids"]  # (B, S)
        with torch.no_grad():
            tgt = torch.full((src.shape[0], 1), tokenizer.bos_id)
            worst = max(worst, float((model(src, tgt) - hf(**batch, decoder_input_ids=tgt).logits).abs().max()))
        for name, (beam, alpha) in settings.items():
            if beam == 1:
                ours = greedy_search(model, src, tokenizer.bos_id, tokenizer.eos_id, limit=args.limit)
            else:
                ours = [h[0].tokens for h in beam_search(model, src, tokenizer.bos_id, tokenizer.eos_id, beam, alpha,
                                                          limit=args.limit)]
            out = hf.generate(**batch, num_beams=beam, length_penalty=alpha, max_new_tokens=args.limit + 1)
            theirs = [[t for t in row.tolist() if t not in specials] for row in out]
            same[name] += sum(o == t[:args.limit] for o, t in zip(ours, theirs))
    result = {"run": args.run, "sentences": len(sources), "identical": same, "max_logit_difference": worst}
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
