"""GPT: the Transformer's decoder alone, trained to predict the next token (Radford et al., 2018/2019)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import repeat

import torch
from torch import Tensor, nn

from qkv.config import ModelConfig
from qkv.modules.attention import KVCache, cached, reorder_caches
from qkv.modules.layers import DecoderLayer, build_positional


class GPT(nn.Module):
    """Decoder-only Transformer: masked self-attention blocks without cross-attention.

    GPT-2's layout by default (pre-norm, a final LayerNorm, learned positions, tanh-GELU, the output
    projection tied to the token embedding); every choice is a config field.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if cfg.arch != "gpt":
            raise ValueError(f"GPT needs a config with arch='gpt', got {cfg.arch!r}")
        self.cfg = cfg
        self.token_embedding = nn.Embedding(cfg.vocab_size, cfg.d_model)
        d_k, _ = cfg.head_sizes
        self.positional, rope = build_positional(cfg.positional, cfg.d_model, d_k, cfg.max_len, cfg.rope_base)
        self.rope = rope
        self.dropout = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList(DecoderLayer(cfg, cross_attention=False, rope=rope) for _ in range(cfg.n_layers))
        self.final_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps) if cfg.use_final_norm else nn.Identity()
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self._init_weights()
        if cfg.tie_embeddings:
            self.lm_head.weight = self.token_embedding.weight

    def _init_weights(self) -> None:
        # GPT-2: N(0, 0.02) everywhere, and the projections that write into the residual stream scaled
        # by 1/sqrt(2 * n_layers) so that its variance does not grow with depth.
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() > 1:
                std = 0.02
                if name.endswith(("out_proj.weight", "w_2.weight")):
                    std = 0.02 / math.sqrt(2 * self.cfg.n_layers)
                nn.init.normal_(p, mean=0.0, std=std)

    def embed(self, idx: Tensor, offset: int = 0, positions: Tensor | None = None) -> Tensor:
        """Token embeddings plus positions: (B, T) ids -> (B, T, D); the positions offset.., or (B, T) ``positions``."""
        x = self.token_embedding(idx)  # (B, T, D)
        if self.positional is not None:
            x = x + self.positional(idx.shape[1], offset=offset, positions=positions)
        return self.dropout(x)

    def forward(self, idx: Tensor, mask: Tensor | None = None, positions: Tensor | None = None,
                caches: Sequence[KVCache] | None = None) -> Tensor:
        """Next-token logits for every position.

        Args:
            idx: (B, T) token ids; with a cache, only the new positions.
            mask: optional (B, 1, 1, L) key padding mask over all L keys (cached + new), for batches of
                left-padded prompts. Causality is always applied.
            positions: optional (B, T) absolute positions (left padding shifts them per row).
            caches: one KV cache per layer, when their owner passes them (a step compiled ahead of time,
                whose caches are its inputs); default: the caches ``setup_cache`` gave the layers.

        Returns:
            logits: (B, T, V).
        """
        if idx.dim() != 2:
            raise ValueError(f"GPT expects token ids of shape (B, T), got {tuple(idx.shape)}")
        first = caches[0] if caches else self.layers[0].self_attn.cache
        x = self.embed(idx, offset=cached(first), positions=positions)
        for layer, cache in zip(self.layers, caches or repeat(None)):  # None: the layer's own cache
            x = layer(x, self_mask=mask, positions=positions, self_cache=cache)
        return self.lm_head(self.final_norm(x))

    # ------------------------------------------------------------------------------------------
    # KV cache for decoding: every layer's self-attention appends one position per step.

    def setup_cache(self, batch_size: int, max_len: int | None = None, dtype: torch.dtype | None = None) -> None:
        """Allocate caches for ``batch_size`` rows of up to ``max_len`` positions (default: cfg.max_len)."""
        param = self.token_embedding.weight
        for layer in self.layers:
            layer.self_attn.setup_cache(batch_size, max_len or self.cfg.max_len, dtype or param.dtype, param.device)

    def reset_cache(self) -> None:
        """Forget every cached position (the buffers stay) to decode a new batch of the same size."""
        for layer in self.layers:
            layer.self_attn.cache.reset()

    def reorder_cache(self, indices: Tensor, sources: Tensor | None = None) -> None:
        """Keep the rows ``indices`` of every cache (``sources``: for the encoder-decoder's signature; unused)."""
        reorder_caches([layer.self_attn.cache for layer in self.layers], [], indices)

    def clear_cache(self) -> None:
        """Remove the caches: the model computes every position again (training, scoring)."""
        for layer in self.layers:
            layer.self_attn.cache = None
