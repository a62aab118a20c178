"""The encoder-decoder Transformer of "Attention Is All You Need" (Section 3, Figure 1)."""

from __future__ import annotations

import math
from typing import Iterator

import torch
from torch import Tensor, nn

from qkv.config import ModelConfig
from qkv.modules.kv_cache import CachedDecoding, cache_length
from qkv.modules.layers import DecoderLayer, EncoderLayer
from qkv.modules.linear import Linear
from qkv.modules.masks import padding_mask
from qkv.modules.packing import Packing, packing_for
from qkv.modules.positional import build_positional


class Transformer(CachedDecoding, nn.Module):
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
        self.embedding = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.positional, rope = build_positional(cfg.positional, cfg.d_model, cfg.head_dim, cfg.max_len, cfg.rope_base)
        self.rope = rope
        # "We apply dropout to the sums of the embeddings and the positional encodings in both the
        # encoder and decoder stacks" (Section 5.4).
        self.dropout = nn.Dropout(cfg.dropout)
        self.encoder_layers = nn.ModuleList(EncoderLayer(cfg, i, rope) for i in range(cfg.n_layers))
        self.decoder_layers = nn.ModuleList(DecoderLayer(cfg, i, True, rope) for i in range(cfg.decoder_layers))
        final = cfg.use_final_norm
        self.encoder_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps) if final else nn.Identity()
        self.decoder_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps) if final else nn.Identity()
        self.generator = Linear(cfg.d_model, cfg.vocab_size, bias=False)  # the pre-softmax projection
        self._init_weights()
        if cfg.tie_embeddings:
            self.generator.weight = self.embedding.weight

    def _init_weights(self) -> None:
        # Xavier-uniform for every projection, as the paper's tensor2tensor code and the Annotated
        # Transformer do; the shared embedding ~ N(0, d_model^-1/2), so that after the sqrt(d_model)
        # scaling token vectors have unit variance, on the scale of the sinusoids (fairseq's choice).
        for name, p in self.named_parameters():
            if p.dim() > 1 and name != "embedding.weight":
                nn.init.xavier_uniform_(p)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
        nn.init.normal_(self.embedding.weight, mean=0.0, std=self.cfg.d_model ** -0.5)

    # ------------------------------------------------------------------------------------------

    def embed(self, tokens: Tensor, offset: int = 0) -> Tensor:
        """Scaled embeddings plus positions: (B, T) ids -> (B, T, D)."""
        if tokens.dim() != 2:
            raise ValueError(f"expected token ids of shape (B, T), got {tuple(tokens.shape)}")
        x = self.embedding(tokens) * math.sqrt(self.cfg.d_model)  # (B, T, D)
        if self.positional is not None:
            x = x + self.positional(tokens.shape[1], offset=offset)
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
        packing = packing_for(src, self.cfg.pad_id)
        memory = self._encode(src, src_mask, packing)
        return packing.unpack(memory) if packing is not None else memory

    def _encode(self, src: Tensor, src_mask: Tensor, packing: Packing | None) -> Tensor:
        """The encoder on the real tokens only when ``packing`` is given: (N_s, D), else (B, S, D)."""
        x = self.embed(src)  # (B, S, D)
        if packing is not None:
            x = packing.pack(x)  # (N_s, D)
        for layer in self.encoder_layers:
            x = layer(x, src_mask, packing)
        return self.encoder_norm(x)

    def decode(self, tgt: Tensor, memory: Tensor | None, src_mask: Tensor | None,
               tgt_mask: Tensor | None = None, keep: Tensor | None = None,
               memory_packing: Packing | None = None) -> Tensor:
        """Run the decoder stack and the output projection.

        Args:
            tgt: (B, T) target ids (shifted right behind <bos>); with a cache, only the new positions.
            memory: (B, S, D) encoder output (may be None once a cache holds the cross-attention K/V),
                or (N_s, D) packed by ``memory_packing``, or (B / g, S, D) for groups of g consecutive
                rows of ``tgt`` that share a source (the hypotheses of a beam search).
            src_mask: (B, 1, 1, S) source padding mask; (B / g, 1, 1, S) with grouped memory.
            tgt_mask: optional (B, 1, 1, L) key padding mask for decoder self-attention. Causality is
                always applied; right padding needs no mask (real tokens never look right).
            keep: optional (B, T) bool: score only these positions (the ones the loss counts). The
                projection onto the vocabulary is the largest matrix multiply of a small model; padding
                positions need none of it.

        Returns:
            logits: (B, T, V), or (N, V) for the N positions of ``keep``.
        """
        decoding = self.decoder_layers[0].self_attn.cache is not None
        # Teacher forcing packs the real target tokens; a cached decoding step feeds every row.
        packing = None if decoding else packing_for(tgt, self.cfg.pad_id)
        x = self.embed(tgt, offset=cache_length(self))  # (B, T, D)
        if packing is not None:
            x = packing.pack(x)  # (N, D)
        for layer in self.decoder_layers:
            x = layer(x, memory, self_mask=tgt_mask, memory_mask=src_mask, packing=packing,
                      memory_packing=memory_packing)
        x = self.decoder_norm(x)
        if packing is not None:
            if keep is not None and torch.equal(keep, packing.keep):
                return self.generator(x)  # already exactly the kept positions, in order
            x = packing.unpack(x)  # (B, T, D)
        if keep is not None:
            x = x[keep]  # (N, D)
        return self.generator(x)

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
        src_packing = packing_for(src, self.cfg.pad_id)
        memory = self._encode(src, src_mask, src_packing)
        return self.decode(tgt, memory, src_mask, keep=keep, memory_packing=src_packing)

    # ------------------------------------------------------------------------------------------
    # KV cache for decoding: decoder self-attention appends one position per step; cross-attention
    # keys and values are computed from the encoder output once per source.

    def setup_cache(self, batch_size: int, max_len: int | None = None, dtype: torch.dtype | None = None,
                    pack: bool = True) -> None:
        super().setup_cache(batch_size, max_len, dtype, pack)
        # The encoder never uses a cache: it sees the whole source at once.
        for layer in self.encoder_layers:
            layer.self_attn.cache = None

    def stepwise_linears(self) -> Iterator[Linear]:
        """The decoder's linear maps and the output projection (the encoder runs once per source;
        of cross-attention's [W^Q; W^K; W^V] a step uses W^Q, its ``step_outputs``)."""
        for part in (*self.decoder_layers, self.generator):
            for m in part.modules():
                if isinstance(m, Linear):
                    yield m
