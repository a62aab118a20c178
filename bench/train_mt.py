"""Training speed and memory of qkv's encoder-decoder against HF MarianMTModel, side by side in one run.

Both models have the same dims: d_model 256, 3 encoder + 3 decoder layers, 4 heads, d_ff 1024, one
shared 8,000-token vocabulary, post-norm, ReLU, sinusoidal positions, embeddings scaled by
sqrt(d_model) and tied to the output projection, dropout 0.1 on embeddings and sublayer outputs (no
attention or activation dropout, as in the paper). Both see identical padded batches of 64 pairs
(source and target lengths drawn uniformly from 8 to 32 tokens, or --min-len..--max-len), the same
loss (label-smoothed cross-entropy, 0.1, padding ignored: `F.cross_entropy` for Marian, as an HF
script computes it, and the trainer's `label_smoothed_nll` for qkv, which gives the same value) and
the same optimizer (the paper's Adam, fused). Tokens/s counts non-padding target tokens.

    python bench/train_mt.py [--repeats 5] [--steps 12] [--min-len 8 --max-len 32] [--out bench/results/train_mt.json]
"""

from __future__ import annotations

import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (  # noqa: E402
    matmul_peak_gflops, median_of, run_alternating, time_training, training_bench_args, write_result,
)

VOCAB, D, LAYERS, HEADS, FF, PAIRS, PAD = 8000, 256, 3, 4, 1024, 64, 0


def batches(n: int, min_len: int, max_len: int):
    """n identical-for-everyone padded batches: (src, tgt_in, tgt_out), right-padded with PAD."""
    import torch

    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        s_len = torch.randint(min_len, max_len + 1, (PAIRS,), generator=g)
        t_len = torch.randint(min_len, max_len + 1, (PAIRS,), generator=g)
        src = torch.full((PAIRS, int(s_len.max())), PAD)
        tgt = torch.full((PAIRS, int(t_len.max()) + 1), PAD)
        for i in range(PAIRS):
            src[i, : s_len[i]] = torch.randint(4, VOCAB, (int(s_len[i]),), generator=g)
            tgt[i, 0] = 1  # <bos>
            tgt[i, 1 : t_len[i] + 1] = torch.randint(4, VOCAB, (int(t_len[i]),), generator=g)
        out.append((src, tgt[:, :-1], tgt[:, 1:]))
    return out


def build(impl: str):
    """The model and a function (src, tgt_in, tgt_out) -> loss: label-smoothed (0.1) cross-entropy
    averaged over the non-padding target tokens, the same value for both."""
    import torch.nn.functional as F

    def loss_of(logits, targets):
        return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1), ignore_index=PAD, label_smoothing=0.1)

    if impl == "qkv":
        from qkv import ModelConfig, Transformer
        from qkv.evaluation.losses import label_smoothed_nll
        from qkv.devices import keep_freed_memory

        keep_freed_memory()  # as every qkv trainer's start does

        cfg = ModelConfig(vocab_size=VOCAB, d_model=D, n_heads=HEADS, d_ff=FF, n_layers=LAYERS, dropout=0.1, max_len=256)
        model = Transformer(cfg)

        def loss_fn(src, tgt_in, tgt_out):
            # As its trainer does: scores only the positions the loss counts, with its own loss (the
            # same value as `loss_of`).
            keep = tgt_out != PAD
            return label_smoothed_nll(model(src, tgt_in, keep=keep), tgt_out[keep], 0.1, ignore_index=PAD).loss

        return model, loss_fn
    if impl == "marian":
        from transformers import MarianConfig, MarianMTModel

        cfg = MarianConfig(
            vocab_size=VOCAB, d_model=D, encoder_layers=LAYERS, decoder_layers=LAYERS, encoder_attention_heads=HEADS,
            decoder_attention_heads=HEADS, encoder_ffn_dim=FF, decoder_ffn_dim=FF, activation_function="relu",
            dropout=0.1, attention_dropout=0.0, activation_dropout=0.0, max_position_embeddings=256,
            scale_embedding=True, pad_token_id=PAD, decoder_start_token_id=1, eos_token_id=2, forced_eos_token_id=2,
            share_encoder_decoder_embeddings=True, tie_word_embeddings=True, attn_implementation="sdpa",
        )
        model = MarianMTModel(cfg)

        def loss_fn(src, tgt_in, tgt_out):
            logits = model(input_ids=src, attention_mask=(src != PAD).long(), decoder_input_ids=tgt_in).logits
            return loss_of(logits, tgt_out)

        return model, loss_fn
    raise ValueError(f"unknown implementation {impl!r}")


def worker(args) -> dict:
    import torch

    impl, steps, warmup = args.worker, args.steps, args.warmup

    torch.manual_seed(0)
    model, loss_fn = build(impl)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=True)
    data = batches(steps + warmup, args.min_len, args.max_len)
    cells = sum(src.numel() + tgt_in.numel() for src, tgt_in, _ in data)
    real = sum(int((src != PAD).sum()) + int((tgt_in != PAD).sum()) for src, tgt_in, _ in data)
    tokens = [int((tgt_out != PAD).sum()) for _, _, tgt_out in data[warmup:]]
    times, memory = time_training(opt, loss_fn, iter(data).__next__, steps, warmup)
    per_step = [n / t for n, t in zip(tokens, times)]
    return {
        "impl": impl, "tokens_per_s": statistics.median(per_step), "padding_fraction": 1 - real / cells, **memory,
        "params": sum(p.numel() for p in model.parameters()),
    }


def main() -> None:
    def lengths(ap):
        ap.add_argument("--min-len", type=int, default=8, help="shortest sentence, in tokens")
        ap.add_argument("--max-len", type=int, default=32, help="longest (equal to --min-len: no padding at all)")

    args = training_bench_args(__doc__, "qkv,marian", "bench/results/train_mt.json", 12, worker, lengths)
    peak = matmul_peak_gflops()
    runs = run_alternating(__file__, args.impls, args.repeats, args.worker_args)
    summary = {impl: {"tokens_per_s_median": median_of(rs, "tokens_per_s"),
                      "peak_rss_mb_median": median_of(rs, "peak_rss_mb"), "params": rs[0]["params"]}
               for impl, rs in runs.items()}
    result = {"benchmark": "encoder-decoder training, d_model 256, 3+3 layers, 4 heads, d_ff 1024, vocab 8k, 64 pairs",
              "sentence_lengths": [args.min_len, args.max_len],
              "padding_fraction": runs[args.impls[0]][0]["padding_fraction"],
              "matmul_peak_gflops": peak, "summary": summary}
    if "qkv" in summary and "marian" in summary:
        result["ratio_tokens_per_s_qkv_over_marian"] = (
            summary["qkv"]["tokens_per_s_median"] / summary["marian"]["tokens_per_s_median"])
    result["runs"] = runs
    write_result(args.out, result)


if __name__ == "__main__":
    main()
