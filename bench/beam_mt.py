"""Beam search speed of qkv's encoder-decoder against HF MarianMTModel ``generate(num_beams=4)``.

Same dims as bench/train_mt.py (d_model 256, 3+3 layers, 4 heads, d_ff 1024, vocab 8k), random
weights, eval mode; 16 sources of 18-22 tokens decoded together with beam 4, 30 decoding steps each
(qkv: a 30-token limit, where it forces the end token; HF: min_new_tokens = max_new_tokens = 30; with
random weights the end token is as rare as any other of the 8,000, so both run all 30 steps), length
penalty 0.6 for all. Sentences per second, medians of fresh alternating processes. ``qkv`` chooses
each product's kernel by measuring it; ``qkv-aten``, ``qkv-transposed``, ``qkv-onednn`` and
``qkv-mkl`` force one kernel everywhere (what the choice is worth); ``qkv-int8`` decodes with
``--quantize int8``. CTranslate2 4.8.5 on the
same weights (``ct2``: exported as ``qkv export ctranslate2`` does, fp32; ``ct2-int8``: its int8
compute type), given the same threads as torch. ``--size base`` is the paper's base model (512 x 6+6,
8 heads, d_ff 2048) with a 32k vocabulary, where the products weigh more than the overhead of a step.
``--size tiny`` is the small model at 32 dimensions (d_ff 32), its 8,000-token vocabulary kept (so that the
end token stays rare): a step's products but the vocabulary's take next to nothing, and what is left is
each engine's cost of a step besides its arithmetic (the log-softmax and the vocabulary's product alike).

    python bench/beam_mt.py [--repeats 5] [--size small|base|tiny] [--out bench/results/beam_mt.json]
"""

from __future__ import annotations

import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (  # noqa: E402
    ctranslate2_folder, decoding_bench_args, linear_backend_for, median_of, peer_threads, run_alternating, time_steps,
    write_result,
)
from train_mt import D, FF, HEADS, LAYERS, PAD, VOCAB  # noqa: E402

SOURCES, BEAM, NEW = 16, 4, 30
SIZES = {"small": dict(vocab_size=VOCAB, d_model=D, n_heads=HEADS, d_ff=FF, n_layers=LAYERS),
         # every product but the vocabulary's shrunk to almost nothing: what a step costs besides arithmetic
         "tiny": dict(vocab_size=VOCAB, d_model=32, n_heads=HEADS, d_ff=32, n_layers=LAYERS),
         "base": dict(vocab_size=32000, d_model=512, n_heads=8, d_ff=2048, n_layers=6)}


def sources(vocab: int):
    import torch

    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(18, 23, (SOURCES,), generator=g)
    src = torch.full((SOURCES, int(lengths.max())), PAD)
    for i, n in enumerate(lengths.tolist()):
        src[i, :n] = torch.randint(4, vocab, (n,), generator=g)
    return src


def model_of(size: str, changes: dict | None = None):
    """The benchmarks' model: random weights (seed 0), eval mode, the dimensions of ``size`` with ``changes``
    (e.g. ``{"d_ff": 2048}``)."""
    import torch

    from qkv import ModelConfig, Transformer

    torch.manual_seed(0)
    return Transformer(ModelConfig(**{**SIZES[size], **(changes or {})}, dropout=0.1, max_len=256)).eval()


def searches(impl: str, size: str, changes: dict | None = None):
    """A function that runs one beam search of ``impl`` over the 16 sources, on :func:`model_of` ``size``
    with ``changes``."""
    model = model_of(size, changes)
    src = sources(model.cfg.vocab_size)
    if linear_backend_for(impl) in ("qkv", "qkv-int8"):
        from qkv.generation.beam import beam_search
        from qkv.accel.quantize import quantized

        if impl == "qkv-int8":
            model = quantized(model)

        def run():
            hyps = beam_search(model, src, bos_id=1, eos_id=2, beam_size=BEAM, alpha=0.6, limit=NEW)
            assert len(hyps) == SOURCES and all(h for h in hyps)
    elif impl == "marian":
        from transformers import MarianConfig, MarianMTModel

        dims = model.cfg  # HF's model gets the same dimensions (its own random weights)
        cfg = MarianConfig(
            vocab_size=dims.vocab_size, d_model=dims.d_model, encoder_layers=dims.n_layers,
            decoder_layers=dims.decoder_layers, encoder_attention_heads=dims.n_heads,
            decoder_attention_heads=dims.n_heads, encoder_ffn_dim=dims.d_ff, decoder_ffn_dim=dims.d_ff,
            activation_function="relu",
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
    elif impl in ("ct2", "ct2-int8"):
        import ctranslate2

        ct2 = ctranslate2.Translator(ctranslate2_folder(model), device="cpu", inter_threads=1,
                                     intra_threads=peer_threads(),
                                     compute_type="int8" if impl == "ct2-int8" else "float32")
        tokens = [[f"t{i}" for i in row if i != PAD] for row in src.tolist()]  # it appends <eos> itself

        def run():
            out = ct2.translate_batch(tokens, beam_size=BEAM, length_penalty=0.6, min_decoding_length=NEW,
                                      max_decoding_length=NEW)
            assert all(len(r.hypotheses[0]) == NEW for r in out), [len(r.hypotheses[0]) for r in out]
    else:
        raise ValueError(impl)
    return run


def worker(impl: str, reps: int, size: str) -> dict:
    import torch

    run = searches(impl, size)
    with torch.inference_mode():
        times = time_steps(run, reps, warmup=1)
    return {"impl": impl, "sentences_per_s": SOURCES / statistics.median(times), "seconds": statistics.median(times)}


def main() -> None:
    def extra(ap) -> None:
        ap.add_argument("--impls", default="qkv,marian,ct2,qkv-int8,ct2-int8,qkv-aten,qkv-transposed,qkv-onednn,qkv-mkl")
        ap.add_argument("--size", choices=SIZES, default="small")
    args = decoding_bench_args(__doc__, "bench/results/beam_mt.json", 5, lambda a: worker(a.worker, a.reps, a.size),
                               "timed decodes per process", extra)
    runs = run_alternating(__file__, args.impls.split(","), args.repeats,
                           ["--reps", str(args.reps), "--size", args.size])
    summary = {impl: {"sentences_per_s_median": median_of(rs, "sentences_per_s"),
                      "seconds_median": median_of(rs, "seconds")} for impl, rs in runs.items()}
    result = {"benchmark": "beam search, beam 4, 16 sources of 18-22 tokens, 30 new tokens each",
              "size": {args.size: SIZES[args.size]}, "summary": summary}
    for ours, peer in (("qkv", "marian"), ("qkv", "ct2"), ("qkv-int8", "ct2-int8"), ("ct2", "marian"),
                       ("qkv-aten", "marian"), ("qkv-onednn", "qkv-aten")):
        if ours in summary and peer in summary:
            result[f"ratio_{ours.replace('-', '_')}_over_{peer.replace('-', '_')}"] = (
                summary[ours]["sentences_per_s_median"] / summary[peer]["sentences_per_s_median"])
    result["runs"] = runs
    write_result(args.out, result)


if __name__ == "__main__":
    main()
