"""Scaled dot-product attention and multi-head attention (Sections 3.2.1 and 3.2.2).

Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V

Two paths compute it: the fused ``F.scaled_dot_product_attention`` (fast, the default) and an
explicit one that also returns the weights (for seeing attention). They agree within 1e-5.
"""

from __future__ import annotations

import math
from contextvars import ContextVar
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv.modules.kv_cache import KVCache, StaticKV
from qkv.modules.linear import Linear
from qkv.modules.masks import causal_mask, check_mask, combine
from qkv.modules.packing import Packing
from qkv.modules.positional import RotaryEmbedding

# While set (by qkv.interpret.capture), every MultiHeadAttention computes its weights explicitly and
# hands them to this callable. Nothing is computed or stored when it is None.
attention_observer: ContextVar[Callable[["MultiHeadAttention", Tensor], None] | None] = ContextVar(
    "attention_observer", default=None
)


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    need_weights: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """softmax(q k^T / sqrt(d_k)) v, with a boolean mask (True = may attend).

    Args:
        q: (B, H, T, Dh) queries.
        k, v: (B, H, L, Dh) keys and values.
        mask: bool, broadcastable to (B, H, T, L).
        is_causal: also forbid keys after each query. The T queries are taken to be the *last* T of
            the L positions (so this is right with a KV cache, where T < L).
        dropout_p: dropout on the attention weights (pass 0 in eval).
        need_weights: use the explicit path and return the weights (B, H, T, L).

    Returns:
        (output (B, H, T, Dh), weights or None). A query whose keys are all masked gets zeros
        (output and weights), never NaN.
    """
    t, l = q.shape[-2], k.shape[-2]
    if mask is not None:
        check_mask(mask, q.shape[0], t, l)
    if is_causal and t == 1:
        # One query at the last position (a cached decoding step) may see every key: no mask at all.
        is_causal = False
    if is_causal and (mask is not None or t != l or need_weights):
        # SDPA's own is_causal aligns the first query with the first key, which is wrong once a
        # cache holds earlier positions; build the mask with the right offset instead.
        mask = combine(mask, causal_mask(t, l, offset=l - t, device=q.device))
        is_causal = False
    # In a compiled decoding step (one query) the explicit formula is faster: inductor fuses it into
    # the layer's loops, where SDPA's CPU kernel is a call of its own (~0.2 ms of a 2 ms GPT step).
    if need_weights or (t == 1 and torch.compiler.is_compiling()):
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])  # (B, H, T, L)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        if mask is not None:
            # A fully masked row is softmax of all -inf = NaN; define it as "attend to nothing".
            weights = weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
        dropped = F.dropout(weights, dropout_p) if dropout_p > 0 else weights
        return dropped @ v, (weights if need_weights else None)  # (B, H, T, Dh), (B, H, T, L)
    # SDPA itself gives zeros for a query whose keys are all masked (since torch 2.5; the pinned 2.13
    # does, and tests/modules/test_attention.py holds it to that), so no second pass is needed here.
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal)
    return out, None


def _ungroup(x: Tensor, groups: int) -> Tensor:
    """(B / g, H, g T, X) attention of grouped queries -> (B, H, T, X), one row per query row."""
    n, h, gt, last = x.shape
    x = x.view(n, h, groups, gt // groups, last).transpose(1, 2)  # (B / g, g, H, T, X)
    return x.reshape(n * groups, h, gt // groups, last)


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O, head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V).

    One module serves self-attention (queries, keys and values from ``x``) and cross-attention
    (queries from ``x``, keys and values from the encoder output ``memory``). W^Q, W^K and W^V are
    stored stacked in ``in_proj`` (3D, D), as torch.nn.MultiheadAttention and GPT-2 do, so that
    self-attention projects all three with one matrix multiply.
    """

    def __init__(self, d_model: int, n_heads: int, bias: bool = True, dropout: float = 0.0,
                 rope: RotaryEmbedding | None = None, kind: str = "self", layer: int = 0) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        self.in_proj = Linear(d_model, 3 * d_model, bias=bias)  # [W^Q; W^K; W^V]
        if kind == "cross":  # a decoding step projects only the queries (K and V once per source)
            self.in_proj.step_outputs = d_model
        self.out_proj = Linear(d_model, d_model, bias=bias)  # W^O
        self.dropout = dropout
        self.rope = rope
        # Where this module sits, for attention maps: "encoder_self", "decoder_self", "cross", "self".
        self.kind, self.layer = kind, layer
        self.cache: KVCache | StaticKV | None = None

    def _split_heads(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        mask: Tensor | None = None,
        is_causal: bool = False,
        positions: Tensor | None = None,
        need_weights: bool = False,
        packing: Packing | None = None,
        memory_packing: Packing | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``x`` to itself, or to ``memory`` for cross-attention.

        Args:
            x: (B, T, D) queries' input.
            memory: (B, S, D) encoder output for cross-attention; None for self-attention. It may
                also hold one row per *group* of ``g`` consecutive rows of ``x``, (B / g, S, D): the
                ``g`` hypotheses of a beam share their source, so its keys and values are computed and
                stored once, and the group attends to them as ``g * T`` queries.
            mask: bool, broadcastable to (B, H, T, L), covering all L keys (cached ones included);
                for grouped cross-attention, (B / g, 1, 1, S), one row per source.
            is_causal: forbid attending to later positions.
            positions: (B, T) absolute positions for RoPE (default: after the cached ones).
            need_weights: also return the weights (B, H, T, L).
            packing: ``x`` holds only the N real tokens, (N, D), laid out by this Packing
                (qkv.modules.packing); the output is packed the same way.
            memory_packing: the same for ``memory``, (N_s, D).

        Returns:
            (output (B, T, D) or (N, D) when packed, weights or None).
        """
        d = self.d_model
        if x.shape[-1] != d or x.dim() != (2 if packing is not None else 3):
            expected = "(N, D)" if packing is not None else "(B, T, D)"
            raise ValueError(f"MultiHeadAttention: expected input {expected} with D={d}, got {tuple(x.shape)}")
        b, t = (packing.batch, packing.length) if packing is not None else x.shape[:2]
        w, bias = self.in_proj.weight, self.in_proj.bias
        cache = self.cache
        cross = memory is not None or isinstance(cache, StaticKV)
        groups = 1  # rows of x per row of memory
        if not cross:
            qkv = self.in_proj(x)  # (B, T, 3D), or (N, 3D) packed
            if packing is not None:
                qkv = packing.unpack(qkv)  # (B, T, 3D): attention needs the positions laid out
            q, k, v = qkv.split(d, dim=-1)  # 3 x (B, T, D)
            q, k, v = self._split_heads(q), self._split_heads(k), self._split_heads(v)  # (B, H, T, Dh)
            offset = cache.length if isinstance(cache, KVCache) else 0
            if self.rope is not None:
                q = self.rope(q, offset=offset, positions=positions)
                k = self.rope(k, offset=offset, positions=positions)
            if isinstance(cache, KVCache):
                k, v = cache.update(k, v)  # (B, H, offset + T, Dh)
        else:
            q = self.in_proj.first_outputs(x, d)  # (B, T, D) or (N, D): x W^Q
            q = self._split_heads(packing.unpack(q) if packing is not None else q)  # (B, H, T, Dh)
            if isinstance(cache, StaticKV) and cache.filled:
                k, v = cache.k, cache.v  # computed once per source, reused at every step
            else:
                packed_memory = memory_packing is not None and memory.dim() == 2
                if not packed_memory and (memory.dim() != 3 or memory.shape[-1] != d):
                    raise ValueError(
                        f"cross-attention: memory must be (B={b}, S, D={d}), got {tuple(memory.shape)}"
                    )
                kv = F.linear(memory, w[d:], None if bias is None else bias[d:])  # (B, S, 2D) or (N_s, 2D)
                if packed_memory:
                    kv = memory_packing.unpack(kv)  # (B, S, 2D)
                k, v = (self._split_heads(z) for z in kv.split(d, dim=-1))  # (B, H, S, Dh) each
                if isinstance(cache, StaticKV):
                    # Contiguous: every step reads them, and the kernel reads one block per head faster.
                    k, v = k.contiguous(), v.contiguous()
                    cache.set(k, v)
            # The g rows of a group (a beam's hypotheses) share one source: g * T queries of it.
            sources = k.shape[0]
            if sources != b and (sources == 0 or b % sources):
                raise ValueError(
                    f"cross-attention: {b} query rows but {sources} sources; memory must be (B={b}, S, D) "
                    "or hold one row per group of g consecutive rows, (B / g, S, D)"
                )
            groups = b // sources if sources else 1
            if groups > 1:
                q = q.view(sources, groups, self.n_heads, t, self.head_dim)  # (B / g, g, H, T, Dh)
                q = q.transpose(1, 2).reshape(sources, self.n_heads, groups * t, self.head_dim)  # (B / g, H, g T, Dh)
        # Capturing attention is an eager inspection; a compiled graph cannot read a ContextVar.
        observer = None if torch.compiler.is_compiling() else attention_observer.get()
        out, weights = scaled_dot_product_attention(
            q, k, v, mask=mask, is_causal=is_causal,
            dropout_p=self.dropout if self.training else 0.0,
            need_weights=need_weights or observer is not None,
        )
        if groups > 1:  # back to one row per query row
            out = _ungroup(out, groups)  # (B, H, T, Dh)
            weights = None if weights is None else _ungroup(weights, groups)  # (B, H, T, S)
        if observer is not None:
            observer(self, weights)
        out = out.transpose(1, 2).reshape(b, t, d)  # (B, T, H * Dh): the heads concatenated
        if packing is not None:
            out = packing.pack(out)  # (N, D)
        return self.out_proj(out), (weights if need_weights else None)
