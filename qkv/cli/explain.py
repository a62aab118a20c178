"""``qkv explain --run DIR``: which heads of a demo-trained translator resolve pronouns (他 -> 小明), and what
switching each off changes (qkv.experiments.pronouns)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from qkv.experiments import pronouns


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "explain",
        help="find the heads that resolve pronouns (他 -> 小明) in a demo-trained model, and switch each off",
        description="Score every head on the held-out demo sentences' pronouns (largest weight on the antecedent), "
                    "then switch each head off and count the pronouns that change. Writes pronouns.json and "
                    "pronouns.png into the run (or --out) and prints the table.",
    )
    p.add_argument("--run", "--run-dir", required=True, help="a translation run trained on the demo corpus (qkv demo)")
    p.add_argument("--out", help="output folder (default: the run directory)")
    p.set_defaults(func=cmd_explain)


def cmd_explain(args: argparse.Namespace) -> int:
    results = pronouns.explain(args.run)
    print(pronouns.markdown(results), end="")
    best = results["best"]
    print(f"\nbest head: {best['kind']} layer {best['layer']} head {best['head']}: resolves {100 * best['share']:.1f}% "
          f"of {best['n']} pronouns; switched off, the pronoun changes in {100 * best['flip']:.1f}% of "
          f"{best['n_flip']} sentences (median of the other heads: {100 * results['median_flip']:.1f}%)")
    seed = results["seed_sentence"]
    if seed is not None:
        print(f"on the seed sentence ({seed['sentence']}) it puts its largest weight ({100 * seed['weight']:.1f}%) "
              f"on {seed['token']}")
    peers = results["sets"][0]
    print(f"switched off with the heads of its layer that resolve too ({len(peers['heads'])} heads), the pronoun "
          f"changes in {100 * peers['flip']:.1f}%")
    for path in pronouns.write(results, Path(args.out or args.run)):
        print(path, file=sys.stderr)
    return 0
