"""GPT-2 interop: HF ``GPT2LMHeadModel`` weights to qkv's ``GPT`` and back.

HF's GPT-2 stores its projections as ``Conv1D`` with weights of shape (in, out); qkv uses
``nn.Linear``'s (out, in). The transpose happens here, at the boundary, and nowhere else.
``transformers`` is imported when it is used (``qkv.errors.require``): the core does not need it.
"""

from __future__ import annotations

import torch

from qkv.config import ModelConfig
from qkv.errors import require
from qkv.models.gpt import GPT
from qkv.modules.layers import sinusoidal_table

# qkv name <- HF name within block i, and whether HF stores it as Conv1D (needs a transpose).
_BLOCK_MAP = [
    ("self_attn_sublayer.norm.weight", "ln_1.weight", False),
    ("self_attn_sublayer.norm.bias", "ln_1.bias", False),
    ("self_attn.in_proj.weight", "attn.c_attn.weight", True),
    ("self_attn.in_proj.bias", "attn.c_attn.bias", False),
    ("self_attn.out_proj.weight", "attn.c_proj.weight", True),
    ("self_attn.out_proj.bias", "attn.c_proj.bias", False),
    ("ff_sublayer.norm.weight", "ln_2.weight", False),
    ("ff_sublayer.norm.bias", "ln_2.bias", False),
    ("feed_forward.w_1.weight", "mlp.c_fc.weight", True),
    ("feed_forward.w_1.bias", "mlp.c_fc.bias", False),
    ("feed_forward.w_2.weight", "mlp.c_proj.weight", True),
    ("feed_forward.w_2.bias", "mlp.c_proj.bias", False),
]
_TOP_MAP = [
    ("token_embedding.weight", "transformer.wte.weight"),
    ("positional.weight", "transformer.wpe.weight"),
    ("final_norm.weight", "transformer.ln_f.weight"),
    ("final_norm.bias", "transformer.ln_f.bias"),
]


def config_from_hf(hf_config) -> ModelConfig:
    """The qkv config of a GPT2Config: pre-norm, learned positions, tanh-GELU, biases, tied head."""
    act = getattr(hf_config, "activation_function", "gelu_new")
    if act not in ("gelu_new", "gelu_pytorch_tanh"):
        raise ValueError(f"gpt_from_hf: unsupported activation_function {act!r} (GPT-2 uses gelu_new)")
    return ModelConfig(
        arch="gpt", vocab_size=hf_config.vocab_size, d_model=hf_config.n_embd, n_heads=hf_config.n_head,
        d_ff=hf_config.n_inner or 4 * hf_config.n_embd, n_layers=hf_config.n_layer, max_len=hf_config.n_positions,
        dropout=hf_config.resid_pdrop, positional="learned", norm="pre", final_norm=True, activation="gelu_tanh",
        bias=True, tie_embeddings=True, layer_norm_eps=hf_config.layer_norm_epsilon,
    )


def gpt_from_hf(hf_model) -> GPT:
    """Build a qkv ``GPT`` with the weights of a HF ``GPT2LMHeadModel``; logits agree within 1e-4."""
    cfg = config_from_hf(hf_model.config)
    if getattr(hf_model.config, "scale_attn_by_inverse_layer_idx", False) or getattr(hf_model.config, "reorder_and_upcast_attn", False):
        raise ValueError("gpt_from_hf: scale_attn_by_inverse_layer_idx / reorder_and_upcast_attn are not supported")
    model = GPT(cfg)
    hf = hf_model.state_dict()
    state = {}
    for ours, theirs in _TOP_MAP:
        state[ours] = hf[theirs]
    for i in range(cfg.n_layers):
        for ours, theirs, conv1d in _BLOCK_MAP:
            w = hf[f"transformer.h.{i}.{theirs}"]
            state[f"layers.{i}.{ours}"] = w.t() if conv1d else w
    state["lm_head.weight"] = state["token_embedding.weight"]
    model.load_state_dict({k: v.detach().clone().contiguous() for k, v in state.items()}, strict=True)
    return model


# qkv's activation -> GPT2Config.activation_function.
GPT2_ACTIVATIONS = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}


def check_gpt2(cfg: ModelConfig) -> None:
    """Raise ValueError naming the first option of ``cfg`` that HF's GPT-2 cannot express."""
    if cfg.norm != "pre" or not cfg.use_final_norm:
        raise ValueError(f"model.norm={cfg.norm!r} (final_norm {cfg.use_final_norm}): HF's GPT-2 is pre-norm with a "
                         "final norm")
    if cfg.positional not in ("learned", "sinusoidal"):
        raise ValueError(f"model.positional={cfg.positional!r}: HF's GPT-2 has a table of positions only "
                         "(learned, or the sinusoids written into it)")
    if cfg.activation not in GPT2_ACTIVATIONS:
        raise ValueError(f"model.activation={cfg.activation!r}: HF's GPT-2 has one up-projection, for "
                         f"{', '.join(GPT2_ACTIVATIONS)}")
    if cfg.d_k is not None:
        raise ValueError(f"model.d_k={cfg.d_k}: HF's GPT-2 has d_k = d_model / n_heads")


def gpt_to_hf(model: GPT):
    """A HF ``GPT2LMHeadModel`` (eval mode) computing what a qkv ``GPT`` computes (``check_gpt2`` says which can).

    Beyond GPT-2's own layout: a model without biases gets zero ones, the exact GELU and ReLU are
    GPT-2 activation functions too, sinusoidal positions are written into GPT-2's table of positions,
    and an untied output projection is HF's untied ``lm_head``.
    """
    transformers = require("transformers", "hf", "exporting a GPT to Hugging Face")
    cfg = model.cfg
    check_gpt2(cfg)
    hf_cfg = transformers.GPT2Config(
        vocab_size=cfg.vocab_size, n_positions=cfg.max_len, n_embd=cfg.d_model, n_layer=cfg.n_layers,
        n_head=cfg.n_heads, n_inner=cfg.d_ff, activation_function=GPT2_ACTIVATIONS[cfg.activation],
        resid_pdrop=cfg.dropout, embd_pdrop=cfg.dropout, attn_pdrop=cfg.attn_dropout,
        layer_norm_epsilon=cfg.layer_norm_eps, bos_token_id=min(50256, cfg.vocab_size - 1),
        eos_token_id=min(50256, cfg.vocab_size - 1), tie_word_embeddings=cfg.tie_embeddings,
    )
    hf_model = transformers.GPT2LMHeadModel(hf_cfg)
    ours = model.state_dict()
    if cfg.positional == "sinusoidal":
        ours["positional.weight"] = sinusoidal_table(cfg.max_len, cfg.d_model)
    hf_shapes = {k: v.shape for k, v in hf_model.state_dict().items()}

    def take(name: str, theirs: str, conv1d: bool = False) -> torch.Tensor:
        if name not in ours:  # a bias the model does not have: zero is the same function
            return torch.zeros(hf_shapes[theirs])
        return ours[name].t() if conv1d else ours[name]

    state = {theirs: take(o, theirs) for o, theirs in _TOP_MAP}
    for i in range(cfg.n_layers):
        for o, theirs, conv1d in _BLOCK_MAP:
            name = f"transformer.h.{i}.{theirs}"
            state[name] = take(f"layers.{i}.{o}", name, conv1d)
    state["lm_head.weight"] = ours["lm_head.weight"]
    missing, unexpected = hf_model.load_state_dict({k: v.detach().clone().contiguous() for k, v in state.items()}, strict=False)
    # HF registers non-persistent attention-bias buffers in some versions; nothing else may be missing.
    missing = [k for k in missing if not k.endswith((".attn.bias", ".attn.masked_bias"))]
    if missing or unexpected:
        raise RuntimeError(f"gpt_to_hf: missing {missing}, unexpected {unexpected}")
    if cfg.tie_embeddings:
        hf_model.tie_weights()
    return hf_model.eval()


__all__ = ["GPT2_ACTIVATIONS", "check_gpt2", "config_from_hf", "gpt_from_hf", "gpt_to_hf"]
