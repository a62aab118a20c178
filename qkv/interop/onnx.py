"""``qkv export onnx``: a run as ONNX graphs that onnxruntime runs, in Python or in a browser page.

A translation run becomes two graphs, a GPT run one:

- ``encoder.onnx`` (translation): the source ids in, and out the keys and values that every decoder
  layer's cross-attention reads (computed once per source), with every encoder self-attention head's
  weights.
- ``decoder.onnx`` (translation) or ``step.onnx`` (GPT): one decoding step. The newest token and its
  position in, with the keys and values of the positions before it (the KV cache, passed in and handed
  back one position longer: the graph keeps nothing); out the next token's logits, the cache, and each
  head's attention row of the step (masked self-attention and, for a translator, cross-attention).

Every graph also takes, per attention layer, a weight for each head: 1 keeps it, 0 switches it off,
zeroing its output before W^O exactly as ``qkv.interpret.ablation.heads_off`` does. So the explorer page
draws every figure from the graphs' outputs, head switch-off included, without recomputing anything.

The graphs are built around the paper's modules: each layer's Sublayer, FeedForward, projections and
``scaled_dot_product_attention`` are the model's own, called here with the cache as an argument; only
the stacking of the layers' caches and weights into one tensor each is this file's. Two forms:
``fp32``, ``fp16`` and ``int8``, whose weights are stored in half precision or in 8 bits a row and made
float32 again when the session loads (half or a quarter of the file; the arithmetic stays fp32, so only
the weights' rounding differs).

``manifest.json`` beside the graphs says what the page needs: the sizes, the special ids, the inputs'
and outputs' names, and the run's tokenizer (``tokenizer.json`` is copied along).
"""

from __future__ import annotations

import json
import math
import shutil
import warnings
from pathlib import Path

import torch
from torch import Tensor, nn

from qkv.errors import require
from qkv.interop.export import _prepare_out, staged
from qkv.models import GPT, Transformer
from qkv.modules.attention import SelfAttention, padding_mask, scaled_dot_product_attention
from qkv.modules.packing import UNPACKED
from qkv.runs import TOKENIZER_FILE, Run, RunError, load_model
from qkv.tokenizers.bpe import BPETokenizer
from qkv.tokenizers.char import CharTokenizer

FORMS = ("fp32", "fp16", "int8")
MANIFEST = "manifest.json"
OPSET = 17
# The names of the graphs' inputs and outputs, which the page (static/runtime.js) reads from the manifest.
ENCODER_IO = (["source", "heads"], ["memory_keys", "memory_values", "weights"])
DECODER_IO = (["token", "position", "past_keys", "past_values", "memory_keys", "memory_values", "self_heads",
               "cross_heads"], ["logits", "present_keys", "present_values", "self_weights", "cross_weights"])
STEP_IO = (["token", "position", "past_keys", "past_values", "heads"],
           ["logits", "present_keys", "present_values", "weights"])


class OnnxUnsupported(RunError):
    """A run the ONNX graphs cannot express (the message names what and why)."""


def _heads_weighted(out: Tensor, on: Tensor) -> Tensor:
    """(B, H, T, d_v) heads' outputs times (H,) weights: a head with 0 contributes nothing to W^O."""
    return out * on[None, :, None, None]


def _self_attention(attn: SelfAttention, h: Tensor, position: Tensor, past_k: Tensor, past_v: Tensor,
                    on: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """One step of masked self-attention with the cache passed in.

    h: (B, 1, D); position: (B, 1); past_k, past_v: (B, H, P, d_k | d_v). Returns the sublayer's output
    (B, 1, D), the step's weights (B, H, P + 1) and the cache one position longer.
    """
    q, k, v = (attn.split_heads(z) for z in attn.in_proj(h).split(attn.qkv_sizes, dim=-1))  # (B, H, 1, d)
    if attn.rope is not None:
        q, k = attn.rope(q, positions=position), attn.rope(k, positions=position)
    k, v = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)  # (B, H, P + 1, d)
    # One query at the newest position may see every key: the causal mask has nothing to hide.
    out, weights = scaled_dot_product_attention(q, k, v, need_weights=True)
    return attn.merge_heads(_heads_weighted(out, on), UNPACKED), weights[:, :, 0], k, v


def _decoder_layers(layers: nn.ModuleList, x: Tensor, position: Tensor, past_keys: Tensor, past_values: Tensor,
                    self_heads: Tensor, memory_keys: Tensor | None = None, memory_values: Tensor | None = None,
                    cross_heads: Tensor | None = None) -> tuple[Tensor, list[Tensor], list[Tensor], list[Tensor], list[Tensor]]:
    """The decoder stack on one step: x (B, 1, D) through every layer, with the caches (L, B, H, P, d) passed in."""
    keys, values, self_w, cross_w = [], [], [], []
    for i, layer in enumerate(layers):
        found = {}

        def masked_self(h: Tensor, i=i, found=found) -> Tensor:
            out, found["w"], found["k"], found["v"] = _self_attention(
                layer.self_attn, h, position, past_keys[i], past_values[i], self_heads[i])
            return out

        x = layer.self_attn_sublayer(x, masked_self)
        keys.append(found["k"]), values.append(found["v"]), self_w.append(found["w"])
        if layer.cross_attn is not None:
            cross = layer.cross_attn

            def encoder_decoder(h: Tensor, i=i, cross=cross) -> Tensor:
                q = cross.split_heads(cross.q_proj(h))  # (B, H, 1, d_k)
                out, w = scaled_dot_product_attention(q, memory_keys[i], memory_values[i], need_weights=True)
                cross_w.append(w[:, :, 0])  # (B, H, S)
                return cross.merge_heads(_heads_weighted(out, cross_heads[i]), UNPACKED)

            x = layer.cross_attn_sublayer(x, encoder_decoder)
        x = layer.ff_sublayer(x, layer.feed_forward)
    return x, keys, values, self_w, cross_w


class EncoderGraph(nn.Module):
    """source (B, S) ids, heads (L_enc, H) -> memory_keys, memory_values (L_dec, B, H, S, d), weights (L_enc, B, H, S, S)."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, source: Tensor, heads: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        model = self.model
        mask = padding_mask(source, model.cfg.pad_id)  # (B, 1, 1, S)
        x = model.embed(source)  # (B, S, D)
        maps = []
        for i, layer in enumerate(model.encoder_layers):
            attn = layer.self_attn

            def self_attention(h: Tensor, i=i, attn=attn) -> Tensor:
                q, k, v = (attn.split_heads(z) for z in attn.in_proj(h).split(attn.qkv_sizes, dim=-1))  # (B, H, S, d)
                if attn.rope is not None:
                    q, k = attn.rope(q), attn.rope(k)
                out, w = scaled_dot_product_attention(q, k, v, mask=mask, need_weights=True)
                maps.append(w)  # (B, H, S, S)
                return attn.merge_heads(_heads_weighted(out, heads[i]), UNPACKED)

            x = layer.self_attn_sublayer(x, self_attention)
            x = layer.ff_sublayer(x, layer.feed_forward)
        memory = model.encoder_norm(x)  # (B, S, D)
        keys, values = [], []
        for layer in model.decoder_layers:  # each cross-attention's keys and values, once per source
            cross = layer.cross_attn
            k, v = cross.kv_proj(memory).split(cross.kv_sizes, dim=-1)
            keys.append(cross.split_heads(k)), values.append(cross.split_heads(v))  # (B, H, S, d)
        return torch.stack(keys), torch.stack(values), torch.stack(maps)


class DecoderGraph(nn.Module):
    """One decoding step of a translator (inputs and outputs: ``DECODER_IO``, shapes in ``forward``)."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, token: Tensor, position: Tensor, past_keys: Tensor, past_values: Tensor,
                memory_keys: Tensor, memory_values: Tensor, self_heads: Tensor, cross_heads: Tensor):
        """token, position: (B, 1); past_*: (L, B, H, P, d); memory_*: (L, B, H, S, d); *_heads: (L, H).

        Returns logits (B, V), present_* (L, B, H, P + 1, d), self_weights (L, B, H, P + 1), cross_weights (L, B, H, S).
        """
        model = self.model
        x = model.embed(token, positions=position)  # (B, 1, D)
        x, keys, values, self_w, cross_w = _decoder_layers(
            model.decoder_layers, x, position, past_keys, past_values, self_heads, memory_keys, memory_values,
            cross_heads)
        logits = model.lm_head(model.decoder_norm(x))[:, -1]  # (B, V)
        return logits, torch.stack(keys), torch.stack(values), torch.stack(self_w), torch.stack(cross_w)


class StepGraph(nn.Module):
    """One decoding step of a GPT (``STEP_IO``): the translator's step without cross-attention."""

    def __init__(self, model: GPT) -> None:
        super().__init__()
        self.model = model

    def forward(self, token: Tensor, position: Tensor, past_keys: Tensor, past_values: Tensor, heads: Tensor):
        model = self.model
        x = model.embed(token, positions=position)  # (B, 1, D)
        x, keys, values, self_w, _ = _decoder_layers(model.layers, x, position, past_keys, past_values, heads)
        logits = model.lm_head(model.final_norm(x))[:, -1]  # (B, V)
        return logits, torch.stack(keys), torch.stack(values), torch.stack(self_w)


def _sizes(model: nn.Module) -> dict:
    cfg = model.cfg
    d_k, d_v = cfg.head_sizes
    decoder = model.decoder_layers if isinstance(model, Transformer) else model.layers
    return {"arch": cfg.arch, "d_model": cfg.d_model, "n_heads": cfg.n_heads, "d_k": d_k, "d_v": d_v, "d_ff": cfg.d_ff,
            "n_layers": cfg.n_layers, "n_decoder_layers": len(decoder), "vocab_size": cfg.vocab_size,
            "max_len": cfg.max_len, "encoder_layers": len(model.encoder_layers) if isinstance(model, Transformer) else 0,
            "decoder_layers": len(decoder)}


def _export(graph: nn.Module, args: tuple, io: tuple[list[str], list[str]], dynamic: dict, path: Path) -> None:
    with warnings.catch_warnings():
        # The tracer warns at every Python check of a shape (the masks' own checks): they hold for any input.
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        # The TorchScript exporter (dynamo=False) traces these plain tensor programs with their dynamic
        # sizes named; torch 2.13, which qkv pins, keeps it while announcing its successor.
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(graph, args, str(path), input_names=io[0], output_names=io[1], dynamic_axes=dynamic,
                          opset_version=OPSET, dynamo=False, do_constant_folding=True)


def _example(sizes: dict, batch: int = 2, past: int = 3, source: int = 5) -> dict:
    """Inputs of the shapes the graphs take, to trace them (every dynamic size distinct, so none is baked in)."""
    layers, h = sizes["decoder_layers"], sizes["n_heads"]
    return {
        "source": torch.full((batch, source), 4, dtype=torch.long),
        "token": torch.full((batch, 1), 4, dtype=torch.long),
        "position": torch.full((batch, 1), past, dtype=torch.long),
        "past_keys": torch.zeros(layers, batch, h, past, sizes["d_k"]),
        "past_values": torch.zeros(layers, batch, h, past, sizes["d_v"]),
        "memory_keys": torch.zeros(layers, batch, h, source, sizes["d_k"]),
        "memory_values": torch.zeros(layers, batch, h, source, sizes["d_v"]),
        "heads": torch.ones(max(sizes["encoder_layers"], layers), h),
    }


def _check_exportable(model: nn.Module) -> None:
    if not isinstance(model, (Transformer, GPT)):
        raise OnnxUnsupported(f"cannot export a {type(model).__name__} to ONNX: only a translation run or a GPT run")


def export_graphs(model: nn.Module, out: Path) -> dict:
    """Write the graphs of ``model`` (fp32) into the folder ``out``; returns the manifest's ``graphs`` entry."""
    _check_exportable(model)
    model = model.eval()
    sizes = _sizes(model)
    ex = _example(sizes)
    batch, past, source = {0: "batch"}, {1: "batch", 3: "past"}, {1: "batch", 3: "source"}
    with torch.no_grad():
        if isinstance(model, Transformer):
            enc_heads = ex["heads"][:sizes["encoder_layers"]]
            _export(EncoderGraph(model), (ex["source"], enc_heads), ENCODER_IO,
                    {"source": {0: "batch", 1: "source"}, "memory_keys": source, "memory_values": source,
                     "weights": {1: "batch", 3: "source", 4: "source"}}, out / "encoder.onnx")
            dec_heads = ex["heads"][:sizes["decoder_layers"]]
            _export(DecoderGraph(model), (ex["token"], ex["position"], ex["past_keys"], ex["past_values"],
                                          ex["memory_keys"], ex["memory_values"], dec_heads, dec_heads), DECODER_IO,
                    {"token": batch, "position": batch, "past_keys": past, "past_values": past,
                     "memory_keys": source, "memory_values": source, "logits": batch,
                     "present_keys": {1: "batch", 3: "present"}, "present_values": {1: "batch", 3: "present"},
                     "self_weights": {1: "batch", 3: "present"}, "cross_weights": {1: "batch", 3: "source"}},
                    out / "decoder.onnx")
            return {"encoder": {"file": "encoder.onnx", "inputs": ENCODER_IO[0], "outputs": ENCODER_IO[1]},
                    "decoder": {"file": "decoder.onnx", "inputs": DECODER_IO[0], "outputs": DECODER_IO[1]}}
        _export(StepGraph(model), (ex["token"], ex["position"], ex["past_keys"], ex["past_values"], ex["heads"]),
                STEP_IO, {"token": batch, "position": batch, "past_keys": past, "past_values": past, "logits": batch,
                          "present_keys": {1: "batch", 3: "present"}, "present_values": {1: "batch", 3: "present"},
                          "weights": {1: "batch", 3: "present"}}, out / "step.onnx")
        return {"step": {"file": "step.onnx", "inputs": STEP_IO[0], "outputs": STEP_IO[1]}}


def compact(path: Path, form: str) -> None:
    """Store the float32 weights of the graph at ``path`` in ``form``: ``fp16`` (half precision, then a
    Cast back to float32) or ``int8`` (per row of the stored matrix, w = q * max|row| / 127: a Cast and
    a Mul). Either way onnxruntime folds the nodes into float32 weights once, when the session loads, so
    the arithmetic is fp32's and only the weights' rounding differs. Vectors (biases, LayerNorm) stay fp32.
    """
    onnx = require("onnx", "onnx", "qkv export onnx")
    import numpy as np
    from onnx import helper, numpy_helper

    graph_model = onnx.load(str(path))
    graph = graph_model.graph
    nodes, kept = [], []
    for init in graph.initializer:
        if init.data_type != onnx.TensorProto.FLOAT or len(init.dims) < 2:
            kept.append(init)
            continue
        w = numpy_helper.to_array(init)
        if form == "fp16":
            kept.append(numpy_helper.from_array(w.astype(np.float16), init.name + ".fp16"))
            nodes.append(helper.make_node("Cast", [init.name + ".fp16"], [init.name], to=onnx.TensorProto.FLOAT))
            continue
        rows = w.reshape(w.shape[0], -1)  # (rows, everything else)
        scale = np.abs(rows).max(axis=1, keepdims=True) / 127.0
        scale[scale == 0] = 1.0
        q = np.clip(np.rint(rows / scale), -127, 127).astype(np.int8).reshape(w.shape)
        scale = scale.astype(np.float32).reshape((w.shape[0],) + (1,) * (w.ndim - 1))
        kept += [numpy_helper.from_array(q, init.name + ".int8"), numpy_helper.from_array(scale, init.name + ".scale")]
        nodes += [helper.make_node("Cast", [init.name + ".int8"], [init.name + ".q"], to=onnx.TensorProto.FLOAT),
                  helper.make_node("Mul", [init.name + ".q", init.name + ".scale"], [init.name])]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    rest = list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes + rest)
    onnx.checker.check_model(graph_model)
    onnx.save(graph_model, str(path))


def page_tokenizer(tokenizer, saved: dict) -> dict:
    """The run's tokenizer as the explorer page's ``static/tokenizer.js`` reads it; ``saved``: its tokenizer.json.

    Raises:
        OnnxUnsupported: a tokenizer the page cannot follow (GPT-2's byte-level BPE).
    """
    desc = {"tokens": [tokenizer.id_to_token(i) for i in range(tokenizer.vocab_size)], "pad": tokenizer.pad_id,
            "bos": tokenizer.bos_id, "eos": tokenizer.eos_id, "unk": tokenizer.unk_id}
    if isinstance(tokenizer, CharTokenizer):
        return {"type": "char", **desc}
    if not isinstance(tokenizer, BPETokenizer) or tokenizer.kind != "bpe":
        what = getattr(tokenizer, "kind", type(tokenizer).__name__)
        raise OnnxUnsupported(f"the explorer page cannot tokenize a {what} tokenizer; export a run with a "
                              "char or a joint BPE tokenizer (tokenizer: char or bpe)")
    steps = saved.get("pre_tokenizer", {}).get("pretokenizers", [])
    words = [s["pattern"]["Regex"] for s in steps if s.get("type") == "Split"]
    merges = [m.split(" ") if isinstance(m, str) else m for m in saved["model"]["merges"]]
    specials = [t["content"] for t in saved.get("added_tokens", [])]
    return {"type": "bpe", **desc, "merges": merges, "words": words[0] if words else None, "specials": specials}


def export_onnx(run_dir: str | Path, out: str | Path, weights: str | None = None, form: str = "fp32",
                overwrite: bool = False) -> Path:
    """Write the run's graphs, ``manifest.json`` and ``tokenizer.json`` into the folder ``out``; returns ``out``.

    Raises:
        RunError: ``out`` holds something (without ``overwrite``), or the run is missing or broken.
        OnnxUnsupported: a model the graphs cannot express.
        MissingDependencyError: ``onnx`` is not installed (the ``onnx`` extra).
    """
    if form not in FORMS:
        raise RunError(f"--form {form}: expected one of {', '.join(FORMS)}")
    require("onnx", "onnx", "qkv export onnx")
    run, out = Run(run_dir), Path(out)
    _prepare_out(out, overwrite)
    model, tokenizer = load_model(run, weights, device="cpu")
    with staged(out) as staging:
        graphs = export_graphs(model, staging)
        if form != "fp32":
            for entry in graphs.values():
                compact(staging / entry["file"], form)
        shutil.copyfile(run.file(TOKENIZER_FILE), staging / TOKENIZER_FILE)
        saved = json.loads(run.file(TOKENIZER_FILE).read_text(encoding="utf-8"))
        manifest = {"kind": "translation" if isinstance(model, Transformer) else "gpt", "form": form,
                    "sizes": _sizes(model), "graphs": graphs, "tokenizer": page_tokenizer(tokenizer, saved),
                    "opset": OPSET}
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return out


__all__ = ["export_onnx", "export_graphs", "compact", "page_tokenizer", "FORMS", "MANIFEST", "OnnxUnsupported",
           "EncoderGraph", "DecoderGraph", "StepGraph"]
