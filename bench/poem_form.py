"""What a GPT trained on the Tang poems has learned: the validation loss beside n-gram baselines, and the form of
the poems it writes beside the real ones'.

    python bench/poem_form.py --run runs/tang [--poems 100] [--out bench/results/tang_poems.json]

- Loss, nats a character on the run's own validation split (every tenth poem, ``data.split=documents``): the run's
  final full pass (its ``valid_full`` line in metrics.jsonl) beside a unigram and an interpolated bigram
  model counted on its training split (add-one unigram; the bigram's weight is the best of 0.5-0.9 on the
  validation split itself, which flatters the bigram, not the GPT).
- Form: a regular line of a Tang poem is two halves of 5 or 7 characters, "，" between and "。" after (五言 and
  七言). The model writes ``--poems`` whole poems, each from a blank line (where a poem starts in the corpus),
  title and poet included (temperature 0.8, top-k 40, seeded, until a blank line or 150 characters); the share
  of bodies whose every line is regular, and whose lines all have one length, is counted beside the same
  shares of the training split's poems and of the validation split's. (A run split by position validates on
  the corpus's last 10%: its supplements, gathas, fu and fragments, mostly irregular.)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_result  # noqa: E402

REGULAR = re.compile(r"^(?:[^，。]{5}，[^，。]{5}|[^，。]{7}，[^，。]{7})。$")  # two halves of one length


def ngram_losses(run: Path, vocab_size: int, valid_fraction: float) -> dict:
    """Nats a token of the validation split under a unigram and an interpolated bigram counted on the training split."""
    from qkv.data.lm import load_splits

    train, valid = (np.asarray(part, dtype=np.int64) for part in
                    load_splits(run / "tokens.bin", valid_fraction))  # as the trainer splits
    v = vocab_size
    unigram = np.bincount(train, minlength=v).astype(np.float64) + 1.0
    unigram /= unigram.sum()
    pairs = np.bincount(train[:-1] * v + train[1:], minlength=v * v).reshape(v, v).astype(np.float32)  # (V, V)
    seen = pairs[valid[:-1], valid[1:]].astype(np.float64)
    total = pairs.sum(1)[valid[:-1]].astype(np.float64)
    bigram = {lam: float(-np.log(lam * seen / np.maximum(total, 1) + (1 - lam) * unigram[valid[1:]]).mean())
              for lam in (0.5, 0.6, 0.7, 0.8, 0.9)}
    return {"unigram": float(-np.log(unigram[valid]).mean()), "bigram": min(bigram.values()),
            "bigram_weight": min(bigram, key=bigram.get)}


def form(body: list[str]) -> dict:
    """Whether every line of a poem's body is regular, and whether the lines all have one length."""
    lines = [line for line in body if line]
    return {"regular": bool(lines) and all(REGULAR.match(line) for line in lines),
            "even": bool(lines) and len({len(line) for line in lines}) == 1}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", required=True)
    ap.add_argument("--poems", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default="bench/results/tang_poems.json")
    args = ap.parse_args()

    import torch

    from qkv.data.corpora import read_text
    from qkv.data.lm import split_text
    from qkv.generation.completer import Completer
    from qkv.training.logging import read_metrics

    torch.set_num_threads(1)
    run = Path(args.run)
    config = json.loads((run / "config.json").read_text(encoding="utf-8"))
    valid_fraction, split = config["data"]["valid_fraction"], config["data"].get("split", "position")
    train_text, valid_text = split_text(read_text(config["data"]["corpus"]), split, valid_fraction)
    if valid_text is None:  # by position; a character is a token here, so the tokens' split falls here
        cut = int(len(train_text) * (1.0 - valid_fraction))
        train_text, valid_text = train_text[:cut], train_text[cut:].split("\n\n", 1)[1]  # less the poem cut in two

    def poems_of(part: str) -> list[list[str]]:
        return [p.split("\n") for p in part.split("\n\n") if p.count("\n") >= 2]  # title, poet, body lines

    completer = Completer.from_run(run, device="cpu")
    written, samples = [], []
    for i in range(args.poems):
        out = completer.complete("\n\n", max_new_tokens=150, temperature=0.8, top_k=40, seed=args.seed + i,
                                 stop=["\n\n"], sliding_window=True)  # a long poem slides past the context
        lines = out.strip("\n").split("\n")
        written.append(form(lines[2:]))
        if i < 8:
            samples.append(out.strip("\n"))
    real = {"train": [form(body) for _, _, *body in poems_of(train_text)],
            "valid": [form(body) for _, _, *body in poems_of(valid_text)]}
    final = [r for r in read_metrics(run / "metrics.jsonl") if r["split"] == "valid_full"][-1]

    def share(forms: list[dict], key: str) -> float:
        return sum(f[key] for f in forms) / len(forms)

    write_result(args.out, {
        "benchmark": "a GPT on the Tang poems: validation loss beside n-gram baselines, and the form of its poems",
        "run": str(run), "steps": final["step"], "train_seconds": final["train_seconds"],
        "loss": {"gpt_full_pass": final["loss"], **ngram_losses(run, config["model"]["vocab_size"], valid_fraction)},
        "poems_written": args.poems, "poems_real": {k: len(v) for k, v in real.items()},
        "form": {name: {"regular": share(forms, "regular"), "even": share(forms, "even")}
                 for name, forms in (("model", written), ("train", real["train"]), ("valid", real["valid"]))},
        "samples": samples,
    })


if __name__ == "__main__":
    main()
