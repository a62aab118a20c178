"""The quality of a trained translation run: BLEU and chrF of each kept weights, greedy and beam.

    python bench/mt_quality.py --run runs/multi30k-de-en --out bench/results/quality_multi30k_de_en.json
    python bench/mt_quality.py --run runs/cmn-eng-zh-en --out bench/results/quality_cmn_eng_zh_en.json \\
        --extra iwslt15-tst2013 ../shared/data/iwslt15-zh-en/tst2013.zh ../shared/data/iwslt15-zh-en/tst2013.en

For the run's test split (and each --extra pair of files) it translates with the last checkpoint and
with the average of the last K (Section 6.1), greedily and with beam 4 (alpha 0.6), and scores each
with sacreBLEU (cased, 13a) and chrF. It also records what the run cost (training time, steps,
epochs, tokens/s, parameters) and a few example translations: the best and the worst of the first
100 test sentences by sentence chrF, so that the good and the bad are both on show.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_result  # noqa: E402


def run_cost(run: Path) -> dict:
    """Training time, steps, epochs, throughput and size of a run, from its results and metrics."""
    from qkv.training.logging import read_metrics

    results = json.loads((run / "results.json").read_text(encoding="utf-8"))
    train = [r for r in read_metrics(run / "metrics.jsonl") if r["split"] == "train"]
    return {"train_seconds": results["train_seconds"], "steps": results["steps"], "stop": results["stop"],
            "final_weights": results["final"], "parameters": results["parameters"],
            "epochs": train[-1]["epoch"] + 1 if train else 0,
            "tokens_per_s_median": statistics.median(r["tokens_per_s"] for r in train) if train else None}


def examples(src: list[str], hyps: list[str], refs: list[str], n: int = 3, pool: int = 100) -> dict:
    """The ``n`` best and worst translations among the first ``pool`` sentences, by sentence chrF."""
    import sacrebleu

    scored = sorted(((sacrebleu.sentence_chrf(h, [r]).score, i) for i, (h, r) in
                     enumerate(zip(hyps[:pool], refs[:pool]))), reverse=True)
    pick = lambda items: [{"src": src[i], "hyp": hyps[i], "ref": refs[i], "chrf": round(s, 1)} for s, i in items]
    return {"good": pick(scored[:n]), "bad": pick(scored[-n:])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--weights", nargs="+", default=["last", "average"], help="weights of the run to score")
    ap.add_argument("--beams", nargs="+", type=int, default=[1, 4])
    ap.add_argument("--alpha", type=float, default=0.6)
    ap.add_argument("--extra", nargs=3, action="append", default=[], metavar=("NAME", "SRC", "REF"),
                    help="another test set: a name and line-aligned source and reference files")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args()

    import torch

    from qkv.settings import from_dict
    from qkv.data.corpora import read_lines
    from qkv.data.translation import DataConfig, load_split
    from qkv.evaluation.bleu import score
    from qkv.generation.api import Translator, load_run_config

    if args.threads:
        torch.set_num_threads(args.threads)
    run = Path(args.run)
    config = load_run_config(run)
    data = from_dict(DataConfig, config["data"], where=f"{run}/config.json: data")
    sets = {f"{data.corpus} {data.test}": load_split(data, data.test)}
    for name, src, ref in args.extra:
        sets[name] = (read_lines(src), read_lines(ref))

    scores = []
    shown = {}
    for weights in args.weights:
        translator = Translator.from_run(run, weights=weights)
        for name, (src, refs) in sets.items():
            for beam in args.beams:
                t0 = time.perf_counter()
                hyps = translator.translate(src, beam=beam, alpha=args.alpha, truncate=True)
                seconds = time.perf_counter() - t0
                s = score(hyps, refs)
                scores.append({"set": name, "weights": weights, "beam": beam, "bleu": round(s["bleu"], 2),
                               "chrf": round(s["chrf"], 2), "seconds": round(seconds, 1),
                               "bleu_signature": s["bleu_signature"]})
                print(f"{name}: {weights} beam {beam}: BLEU {s['bleu']:.2f} chrF {s['chrf']:.2f} "
                      f"({seconds:.0f} s)", file=sys.stderr)
                if weights == args.weights[-1] and beam == max(args.beams):
                    shown[name] = examples(src, hyps, refs)
    write_result(args.out, {"run": str(run), "direction": f"{data.src_lang}->{data.tgt_lang}",
                            "corpus": data.corpus, "alpha": args.alpha, "cost": run_cost(run),
                            "scores": scores, "examples": shown})


if __name__ == "__main__":
    main()
