"""What int8 decoding costs in BLEU and buys in speed: a trained translation run on Multi30K test2016.

The run's model decoded four ways on the same sentences, beam 4: qkv in fp32 and with ``--quantize
int8`` (PyTorch's dynamic quantization of the linear maps), and CTranslate2 4.8.5 on the same weights
(``qkv export ctranslate2``) in fp32 and with its int8 compute type. qkv ranks with GNMT's length
penalty (alpha 0.6, the paper's); CTranslate2 has only its own (|Y|^alpha), so its rows use alpha
0.6 in its formula: compare int8 with fp32 within each engine. BLEU: sacreBLEU, cased, 13a, of the
detokenized text against the references. Seconds: the whole test set, one process each, the threads
torch has (``OMP_NUM_THREADS``).

    python bench/int8_quality.py --run runs/table3/base_seed1 [--src ../shared/data/multi30k/test2016.de]
        [--ref ../shared/data/multi30k/test2016.en] [--out bench/results/int8_quality.json]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import peer_threads, write_result  # noqa: E402


def main() -> None:
    import ctranslate2
    import sacrebleu

    from qkv.interop.export import export_ctranslate2
    from qkv.generation.api import Translator
    from qkv.files import read_lines

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", required=True, help="a translation run (e.g. runs/table3/base_seed1)")
    ap.add_argument("--src", default="../shared/data/multi30k/test2016.de")
    ap.add_argument("--ref", default="../shared/data/multi30k/test2016.en")
    ap.add_argument("-n", type=int, default=None, help="only the first N sentences")
    ap.add_argument("--out", default="bench/results/int8_quality.json")
    args = ap.parse_args()
    src, refs = read_lines(args.src)[:args.n], read_lines(args.ref)[:args.n]
    rows = {}

    def score(name: str, hyps: list[str], seconds: float) -> None:
        bleu = sacrebleu.corpus_bleu(hyps, [refs]).score
        rows[name] = {"bleu": bleu, "seconds": seconds, "sentences_per_s": len(src) / seconds}
        print(f"{name:10s} BLEU {bleu:.2f}  {seconds:.1f} s", file=sys.stderr)

    for quantize in (None, "int8"):
        translator = Translator.from_run(args.run, device="cpu", quantize=quantize)
        translator.translate(src[:8])  # warm: kernel choices, oneDNN's kernels
        t0 = time.perf_counter()
        hyps = translator.translate(src)
        score(f"qkv-{quantize or 'fp32'}", hyps, time.perf_counter() - t0)
    tokenizer = translator.tokenizer
    tokens = [[tokenizer.id_to_token(i) for i in ids[:-1]] for ids in translator.encode_sources(src)]  # no <eos>
    vocab = {tokenizer.id_to_token(i): i for i in range(tokenizer.vocab_size)}
    with tempfile.TemporaryDirectory() as tmp:
        folder = export_ctranslate2(args.run, os.path.join(tmp, "ct2"))
        for compute_type in ("float32", "int8"):
            ct2 = ctranslate2.Translator(str(folder), device="cpu", compute_type=compute_type, inter_threads=1,
                                         intra_threads=peer_threads())
            ct2.translate_batch(tokens[:8], beam_size=4)
            t0 = time.perf_counter()
            results = ct2.translate_batch(tokens, beam_size=4, length_penalty=0.6, max_batch_size=64,
                                          max_decoding_length=max(len(t) for t in tokens) + 50)
            hyps = [tokenizer.decode([vocab[t] for t in r.hypotheses[0]]) for r in results]
            score(f"ct2-{'fp32' if compute_type == 'float32' else 'int8'}", hyps, time.perf_counter() - t0)
    write_result(args.out, {
        "benchmark": f"int8 decoding on {os.path.basename(args.src)} ({len(src)} sentences), beam 4", "run": args.run,
        "rows": rows,
        "bleu_change_qkv_int8": rows["qkv-int8"]["bleu"] - rows["qkv-fp32"]["bleu"],
        "bleu_change_ct2_int8": rows["ct2-int8"]["bleu"] - rows["ct2-fp32"]["bleu"],
        "speedup_qkv_int8": rows["qkv-fp32"]["seconds"] / rows["qkv-int8"]["seconds"],
        "speedup_ct2_int8": rows["ct2-fp32"]["seconds"] / rows["ct2-int8"]["seconds"],
    })


if __name__ == "__main__":
    main()
