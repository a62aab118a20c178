"""The encoder-decoder Transformer of "Attention Is All You Need" (Section 3, Figure 1)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import repeat

import torch
from torch import Tensor, nn

from qkv.config import ModelConfig
from qkv.modules.attention import KVCache, StaticKV, cached, padding_mask, reorder_caches
from qkv.modules.layers import DecoderLayer, EncoderLayer, build_positional
from qkv.modules.packing import UNPACKED, Layout, packing_for

# Parameters runs saved before the two models named their parts alike (2026-12-03) call by other names.
OLD_NAMES = {"embedding.weight": "token_embedding.weight", "generator.weight": "lm_head.weight"}


class Transformer(nn.Module):
    """Encoder-decoder with one shared vocabulary.

    "We share the same weight matrix between the two embedding layers and the pre-softmax linear
    transformation ... In the embedding layers, we multiply those weights by sqrt(d_model)"
    (Section 3.4).
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if cfg.arch != "transformer":
            raise ValueError(f"Transformer needs a config with arch='transformer', got {cfg.arch!r}")
        self.cfg = cfg
        self.token_embedding = nn.Embedding(cfg.vocab_size, cfg.d_model)
        d_k, _ = cfg.head_sizes
        self.positional, rope = build_positional(cfg.positional, cfg.d_model, d_k, cfg.max_len, cfg.rope_base)
        self.rope = rope
        # "We apply dropout to the sums of the embeddings and the positional encodings in both the
        # encoder and decoder stacks" (Section 5.4).
        self.dropout = nn.Dropout(cfg.dropout)
        self.encoder_layers = nn.ModuleList(EncoderLayer(cfg, rope) for _ in range(cfg.n_layers))
        self.decoder_layers = nn.ModuleList(DecoderLayer(cfg, True, rope) for _ in range(cfg.decoder_layers))
        final = cfg.use_final_norm
        self.encoder_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps) if final else nn.Identity()
        self.decoder_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps) if final else nn.Identity()
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)  # the pre-softmax projection
        self._init_weights()
        if cfg.tie_embeddings:
            self.lm_head.weight = self.token_embedding.weight

    def _init_weights(self) -> None:
        # Xavier-uniform for every projection, as the paper's tensor2tensor code and the Annotated
        # Transformer do; the shared embedding ~ N(0, d_model^-1/2), so that after the sqrt(d_model)
        # scaling token vectors have unit variance, on the scale of the sinusoids (fairseq's choice).
        for name, p in self.named_parameters():
            if p.dim() > 1 and name != "token_embedding.weight":
                nn.init.xavier_uniform_(p)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
        nn.init.normal_(self.token_embedding.weight, mean=0.0, std=self.cfg.d_model ** -0.5)

    # ------------------------------------------------------------------------------------------

    def embed(self, tokens: Tensor, offset: int = 0, positions: Tensor | None = None) -> Tensor:
        """Scaled embeddings plus positions: (B, T) ids -> (B, T, D); the positions offset.., or (B, T) ``positions``."""
        if tokens.dim() != 2:
            raise ValueError(f"expected token ids of shape (B, T), got {tuple(tokens.shape)}")
        x = self.token_embedding(tokens) * math.sqrt(self.cfg.d_model)  # (B, T, D)
        if self.positional is not None:
            x = x + self.positional(tokens.shape[1], offset=offset, positions=positions)
        return self.dropout(x)

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """Run the encoder stack.

        Args:
            src: (B, S) source ids, right-padded with ``pad_id``.
            src_mask: (B, 1, 1, S) bool; default: the non-padding positions of ``src``.

        Returns:
            memory: (B, S, D) (zeros at padding positions).
        """
        if src_mask is None:
            src_mask = padding_mask(src, self.cfg.pad_id)
        layout = packing_for(src, self.cfg.pad_id)
        return layout.unpack(self._encode(src, src_mask, layout))  # (B, S, D)

    def _encode(self, src: Tensor, src_mask: Tensor, layout: Layout) -> Tensor:
        """The encoder on the real tokens only in a packed ``layout``: (N_s, D), else (B, S, D)."""
        x = layout.pack(self.embed(src))  # (N_s, D) or (B, S, D)
        for layer in self.encoder_layers:
            x = layer(x, src_mask, layout)
        return self.encoder_norm(x)

    def decode(self, tgt: Tensor, memory: Tensor | None, src_mask: Tensor | None,
               tgt_mask: Tensor | None = None, keep: Tensor | None = None,
               memory_layout: Layout = UNPACKED,
               caches: Sequence[tuple[KVCache, StaticKV]] | None = None) -> Tensor:
        """Run the decoder stack and the output projection.

        Args:
            tgt: (B, T) target ids (shifted right behind <bos>); with a cache, only the new positions.
            memory: (B, S, D) encoder output (may be None once a cache holds the cross-attention K/V),
                or (N_s, D) packed by ``memory_layout``, or (B / g, S, D) for groups of g consecutive
                rows of ``tgt`` that share a source (the hypotheses of a beam search).
            src_mask: (B, 1, 1, S) source padding mask; (B / g, 1, 1, S) with grouped memory.
            tgt_mask: optional (B, 1, 1, L) key padding mask for decoder self-attention. Causality is
                always applied; right padding needs no mask (real tokens never look right).
            keep: optional (B, T) bool: score only these positions (the ones the loss counts). The
                projection onto the vocabulary is the largest matrix multiply of a small model; padding
                positions need none of it.
            caches: each layer's self-attention and cross-attention caches, when their owner passes them
                (a step compiled ahead of time); default: the caches ``setup_cache`` gave the layers.

        Returns:
            logits: (B, T, V), or (N, V) for the N positions of ``keep``.
        """
        first = caches[0][0] if caches else self.decoder_layers[0].self_attn.cache
        # Teacher forcing packs the real target tokens; a cached decoding step feeds every row.
        layout = UNPACKED if first is not None else packing_for(tgt, self.cfg.pad_id)
        x = layout.pack(self.embed(tgt, offset=cached(first)))  # (N, D) or (B, T, D)
        # (None, None): the layer's own caches
        for layer, (self_cache, cross_cache) in zip(self.decoder_layers, caches or repeat((None, None))):
            x = layer(x, memory, self_mask=tgt_mask, memory_mask=src_mask, layout=layout,
                      memory_layout=memory_layout, self_cache=self_cache, cross_cache=cross_cache)
        x = self.decoder_norm(x)
        if layout.packs and keep is not None and torch.equal(keep, layout.keep):
            return self.lm_head(x)  # already exactly the kept positions, in order
        x = layout.unpack(x)  # (B, T, D)
        if keep is not None:
            x = x[keep]  # (N, D)
        return self.lm_head(x)

    def forward(self, src: Tensor, tgt: Tensor, keep: Tensor | None = None) -> Tensor:
        """Teacher forcing: all target positions in one pass.

        Padding costs nothing in the position-wise layers: they run on the real tokens only
        (qkv.modules.packing).

        Args:
            src: (B, S) source ids; tgt: (B, T) target ids shifted right behind <bos>.
            keep: optional (B, T) bool, the positions to score (e.g. ``targets != pad_id``).

        Returns:
            (B, T, V) logits, or (N, V) for the positions of ``keep``. Logits at padding positions of
            ``tgt`` are meaningless.
        """
        src_mask = padding_mask(src, self.cfg.pad_id)
        src_layout = packing_for(src, self.cfg.pad_id)
        memory = self._encode(src, src_mask, src_layout)
        return self.decode(tgt, memory, src_mask, keep=keep, memory_layout=src_layout)

    # ------------------------------------------------------------------------------------------
    # KV cache for decoding: decoder self-attention appends one position per step; cross-attention
    # keys and values are computed from the encoder output once per source. The encoder sees the
    # whole source at once and has no cache.

    def setup_cache(self, batch_size: int, max_len: int | None = None, dtype: torch.dtype | None = None) -> None:
        """Allocate caches for ``batch_size`` decoder rows of up to ``max_len`` positions (default: cfg.max_len)."""
        param = self.token_embedding.weight
        for layer in self.decoder_layers:
            layer.self_attn.setup_cache(batch_size, max_len or self.cfg.max_len, dtype or param.dtype, param.device)
            layer.cross_attn.setup_cache()

    def reset_cache(self) -> None:
        """Forget every cached position and source (the buffers stay) to decode a new batch of the same size."""
        for layer in self.decoder_layers:
            layer.self_attn.cache.reset()
            layer.cross_attn.cache.reset()

    def reorder_cache(self, indices: Tensor, sources: Tensor | None = None) -> None:
        """Keep decoder rows ``indices`` (beam search's surviving hypotheses) and source rows ``sources``
        (None: the sources stay; see :func:`qkv.modules.attention.reorder_caches`)."""
        reorder_caches([layer.self_attn.cache for layer in self.decoder_layers],
                         [layer.cross_attn.cache for layer in self.decoder_layers], indices, sources)

    def clear_cache(self) -> None:
        """Remove the caches: the model computes every position again (training, scoring)."""
        for layer in self.decoder_layers:
            layer.self_attn.cache = layer.cross_attn.cache = None

    def upgrade_state_dict(self, state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
        """The weights of a run saved by an earlier qkv, renamed to today's parameters (a copy): the embedding
        and the output projection named as the GPT names them, cross-attention's stacked projection split."""
        state_dict = dict(state_dict)
        for old, new in OLD_NAMES.items():
            if old in state_dict:
                state_dict.setdefault(new, state_dict.pop(old))
        for i, layer in enumerate(self.decoder_layers):
            layer.cross_attn.upgrade_state_dict(state_dict, f"decoder_layers.{i}.cross_attn.")
        return state_dict
