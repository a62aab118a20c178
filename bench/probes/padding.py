"""Padding of multi30k training batches: length-bucketed token budgets against random batching.

Tokenizes multi30k train (de -> en) with a joint BPE, then cuts batches of at most --max-tokens padded
tokens a side both ways, and reports the share of the batch cells that are padding (source and target
input), averaged over 3 epochs' shuffles.

    python bench/probes/padding.py [--tokenizer runs/de-en/tokenizer.json] [--max-tokens 2500]
"""

from __future__ import annotations

import argparse
import json
import statistics

from qkv.data.translation import padding_fraction, token_budget_batches
from qkv.data.corpora import read_parallel


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", help="a run's tokenizer.json (default: train a joint BPE of 8,000)")
    ap.add_argument("--max-tokens", type=int, default=2500)
    ap.add_argument("--data-dir")
    args = ap.parse_args()
    src, tgt = read_parallel("multi30k", "train", "de", "en", data_dir=args.data_dir)
    if args.tokenizer:
        from qkv.tokenizers import load_tokenizer

        tok = load_tokenizer(args.tokenizer)
    else:
        from qkv.tokenizers.bpe import BPETokenizer

        tok = BPETokenizer.train(src + tgt, vocab_size=8000)
    s_len = [len(ids) + 1 for ids in tok.encode_batch(src)]  # + <eos>
    t_len = [len(ids) + 1 for ids in tok.encode_batch(tgt)]  # + <bos> (decoder input)
    result = {"corpus": "multi30k train de-en", "max_tokens": args.max_tokens}
    for name, bucketed in (("bucketed", True), ("random", False)):
        fractions = [padding_fraction(token_budget_batches(s_len, t_len, args.max_tokens, seed=0, epoch=e,
                                                           bucketed=bucketed), s_len, t_len) for e in range(3)]
        result[name] = statistics.mean(fractions)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
