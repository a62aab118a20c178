"""Beam search speed of qkv's encoder-decoder against HF MarianMTModel ``generate(num_beams=4)``.

Same dims as bench/train_mt.py (d_model 256, 3+3 layers, 4 heads, d_ff 1024, vocab 8k), random
weights, eval mode; 16 sources of 18-22 tokens decoded together with beam 4, 30 decoding steps each
(qkv: a 30-token limit, where it forces the end token; HF: min_new_tokens = max_new_tokens = 30; with
random weights the end token is as rare as any other of the 8,000, so both run all 30 steps), length
penalty 0.6 for both. Sentences per second, medians of fresh alternating processes. ``qkv-aten`` is
qkv with its linear maps on PyTorch's default kernels instead of oneDNN (how much of the lead is the
kernel).

    python bench/beam_mt.py [--repeats 5] [--out bench/results/beam_mt.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import linear_backend_for, median_of, run_alternating, time_steps, write_result  # noqa: E402
from train_mt import D, FF, HEADS, LAYERS, PAD, VOCAB  # noqa: E402

SOURCES, BEAM, NEW = 16, 4, 30


def sources():
    import torch

    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(18, 23, (SOURCES,), generator=g)
    src = torch.full((SOURCES, int(lengths.max())), PAD)
    for i, n in enumerate(lengths.tolist()):
        src[i, :n] = torch.randint(4, VOCAB, (n,), generator=g)
    return src


def worker(impl: str, reps: int) -> dict:
    import torch

    torch.manual_seed(0)
    src = sources()
    if linear_backend_for(impl) == "qkv":
        from qkv import ModelConfig, Transformer
        from qkv.generation.beam import beam_search

        model = Transformer(ModelConfig(vocab_size=VOCAB, d_model=D, n_heads=HEADS, d_ff=FF, n_layers=LAYERS,
                                        dropout=0.1, max_len=256)).eval()

        def run():
            hyps = beam_search(model, src, bos_id=1, eos_id=2, beam_size=BEAM, alpha=0.6, limit=NEW)
            assert len(hyps) == SOURCES and all(h for h in hyps)
    elif impl == "marian":
        from transformers import MarianConfig, MarianMTModel

        cfg = MarianConfig(
            vocab_size=VOCAB, d_model=D, encoder_layers=LAYERS, decoder_layers=LAYERS, encoder_attention_heads=HEADS,
            decoder_attention_heads=HEADS, encoder_ffn_dim=FF, decoder_ffn_dim=FF, activation_function="relu",
            max_position_embeddings=256, scale_embedding=True, pad_token_id=PAD, decoder_start_token_id=1,
            eos_token_id=2, forced_eos_token_id=None, share_encoder_decoder_embeddings=True,
            tie_word_embeddings=True, attn_implementation="sdpa",
        )
        model = MarianMTModel(cfg).eval()
        mask = (src != PAD).long()

        def run():
            out = model.generate(input_ids=src, attention_mask=mask, num_beams=BEAM, length_penalty=0.6,
                                 min_new_tokens=NEW, max_new_tokens=NEW, early_stopping=False, use_cache=True)
            assert out.shape == (SOURCES, NEW + 1), out.shape  # decoder start + 30 tokens
    else:
        raise ValueError(impl)
    with torch.inference_mode():
        times = time_steps(run, reps, warmup=1)
    return {"impl": impl, "sentences_per_s": SOURCES / statistics.median(times), "seconds": statistics.median(times)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--reps", type=int, default=3, help="timed decodes per process")
    ap.add_argument("--impls", default="qkv,marian,qkv-aten")
    ap.add_argument("--out", default="bench/results/beam_mt.json")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.reps)))
        return
    runs = run_alternating(__file__, args.impls.split(","), args.repeats, ["--reps", str(args.reps)])
    summary = {impl: {"sentences_per_s_median": median_of(rs, "sentences_per_s")} for impl, rs in runs.items()}
    result = {"benchmark": "beam search, beam 4, 16 sources of 18-22 tokens, 30 new tokens each", "summary": summary}
    if "qkv" in summary and "marian" in summary:
        result["ratio_qkv_over_marian"] = summary["qkv"]["sentences_per_s_median"] / summary["marian"]["sentences_per_s_median"]
    if "qkv-aten" in summary and "marian" in summary:
        result["ratio_qkv_aten_over_marian"] = (summary["qkv-aten"]["sentences_per_s_median"]
                                                / summary["marian"]["sentences_per_s_median"])
    result["runs"] = runs
    write_result(args.out, result)


if __name__ == "__main__":
    main()
