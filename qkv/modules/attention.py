"""Attention (Section 3.2): scaled dot-product attention, its masks, multi-head attention, self and cross, and
the keys and values it keeps while decoding (the KV cache).

Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V

Two paths compute it: the fused ``F.scaled_dot_product_attention`` (fast, the default) and an
explicit one that also returns the weights (for seeing attention). They agree within 1e-5.

"The Transformer uses multi-head attention in three different ways" (Section 3.2.3): the encoder's
self-attention, the decoder's masked self-attention, and the encoder-decoder attention, whose
queries come from the decoder and whose keys and values come from the encoder output. Self-attention
(:class:`SelfAttention`) projects q, k and v from one input with one stacked matrix, rotates them
with RoPE when the model uses it, and appends each decoding step to its KV cache. Cross-attention
(:class:`CrossAttention`) projects the queries with W^Q and the source with [W^K; W^V], whose
keys and values a decoding step computes once per source and the hypotheses of a beam share.

Masks are built here and nowhere else: boolean, True = may attend, broadcast against the scores (B, H, T, L).
"""

from __future__ import annotations

import math
from contextvars import ContextVar
from typing import TYPE_CHECKING, Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv.modules.packing import UNPACKED, Layout

if TYPE_CHECKING:  # layers.py builds on this file; attention only calls the rotation it is given
    from qkv.modules.layers import RotaryEmbedding

# Masks: "masking out (setting to -inf) all values in the input of the softmax which correspond to illegal
# connections" (Section 3.2.3). A padding mask is (B, 1, 1, L), a causal mask (1, 1, T, L), their
# combination (B, 1, T, L).


def padding_mask(tokens: Tensor, pad_id: int) -> Tensor:
    """Keys that are real tokens, not padding.

    Args:
        tokens: (B, L) token ids.
        pad_id: the padding id.

    Returns:
        (B, 1, 1, L) bool, True where the key is not padding.
    """
    if tokens.dim() != 2:
        raise ValueError(f"padding_mask: expected token ids of shape (B, L), got {tuple(tokens.shape)}")
    return (tokens != pad_id)[:, None, None, :]  # (B, 1, 1, L)


def lengths_mask(lengths: Tensor, max_len: int) -> Tensor:
    """Keys before each sequence's length: (B,) lengths -> (B, 1, 1, max_len) bool."""
    positions = torch.arange(max_len, device=lengths.device)
    return (positions[None, :] < lengths[:, None])[:, None, None, :]  # (B, 1, 1, L)


def causal_mask(t: int, l: int | None = None, offset: int = 0, device: torch.device | str | None = None) -> Tensor:
    """Each query sees only keys at or before its own position (Section 3.2.3: "prevent leftward
    information flow in the decoder").

    With a KV cache the T new queries sit at absolute positions offset .. offset+T-1 and the L keys at
    0 .. L-1, so query i may attend key j iff j <= offset + i.

    Args:
        t: number of queries T.
        l: number of keys L (default offset + t).
        offset: absolute position of the first query (the cache length before this step).

    Returns:
        (1, 1, T, L) bool.
    """
    l = offset + t if l is None else l
    q_pos = torch.arange(offset, offset + t, device=device)[:, None]  # (T, 1)
    k_pos = torch.arange(l, device=device)[None, :]  # (1, L)
    return (k_pos <= q_pos)[None, None]  # (1, 1, T, L)


def combine(*masks: Tensor | None) -> Tensor | None:
    """Logical AND of broadcastable masks, skipping None; None if all are None."""
    out = None
    for m in masks:
        if m is None:
            continue
        out = m if out is None else out & m
    return out


def check_mask(mask: Tensor, batch: int, t: int, l: int) -> None:
    """Raise a clear error unless ``mask`` is a bool tensor broadcastable to (B, H, T, L)."""
    if mask.dtype != torch.bool:
        raise TypeError(f"attention mask must be torch.bool (True = may attend), got {mask.dtype}")
    if mask.dim() != 4:
        raise ValueError(
            f"attention mask must have 4 dims broadcastable to (B, H, T, L) = ({batch}, H, {t}, {l}), "
            f"got shape {tuple(mask.shape)}"
        )
    b, _, mt, ml = mask.shape
    if b not in (1, batch) or mt not in (1, t) or ml != l:
        raise ValueError(
            f"attention mask of shape {tuple(mask.shape)} does not broadcast to (B, H, T, L) = "
            f"({batch}, H, {t}, {l}); expected (B or 1, 1 or H, T or 1, L)"
        )


# While set (by qkv.interpret.capture), every attention module computes its weights explicitly and
# hands them to this callable. Nothing is computed or stored when it is None.
attention_observer: ContextVar[Callable[[nn.Module, Tensor], None] | None] = ContextVar(
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
        q: (B, H, T, d_k) queries.
        k, v: (B, H, L, d_k) keys and (B, H, L, d_v) values.
        mask: bool, broadcastable to (B, H, T, L).
        is_causal: also forbid keys after each query. The T queries are taken to be the *last* T of
            the L positions (so this is right with a KV cache, where T < L).
        dropout_p: dropout on the attention weights (pass 0 in eval).
        need_weights: use the explicit path and return the weights (B, H, T, L).

    Returns:
        (output (B, H, T, d_v), weights or None). A query whose keys are all masked gets zeros
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
    if need_weights:
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])  # (B, H, T, L)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        if mask is not None:
            # A fully masked row is softmax of all -inf = NaN; define it as "attend to nothing".
            weights = weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
        dropped = F.dropout(weights, dropout_p) if dropout_p > 0 else weights
        return dropped @ v, weights  # (B, H, T, d_v), (B, H, T, L)
    # SDPA itself gives zeros for a query whose keys are all masked (since torch 2.5; the pinned 2.13
    # does, and tests/modules/test_attention.py holds it to that), so no second pass is needed here.
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal)
    return out, None


def _ungroup(x: Tensor, groups: int) -> Tensor:
    """(B / g, H, g T, X) attention of grouped queries -> (B, H, T, X), one row per query row."""
    n, h, gt, last = x.shape
    x = x.view(n, h, groups, gt // groups, last).transpose(1, 2)  # (B / g, g, H, T, X)
    return x.reshape(n * groups, h, gt // groups, last)


class Attention(nn.Module):
    """What self- and cross-attention share: h heads of d_k = d_v = d_model / h, the attention itself, and W^O.

    MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O, head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V).

    ``d_k`` sets the queries' and keys' size alone (Table 3, row (B): "reducing the attention key size
    d_k hurts model quality"); the values keep d_v = d_model / h, so the heads still concatenate to
    d_model. Scores are scaled by 1 / sqrt(d_k), whatever d_v is.
    """

    def __init__(self, d_model: int, n_heads: int, bias: bool = True, dropout: float = 0.0,
                 d_k: int | None = None) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.d_model, self.n_heads, self.d_v = d_model, n_heads, d_model // n_heads
        self.d_k = d_k or self.d_v
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)  # W^O
        self.dropout = dropout

    def _check_input(self, x: Tensor, layout: Layout) -> None:
        if x.shape[-1] != self.d_model or x.dim() != (2 if layout.packs else 3):
            expected = "(N, D)" if layout.packs else "(B, T, D)"
            raise ValueError(f"{type(self).__name__}: expected input {expected} with D={self.d_model}, "
                             f"got {tuple(x.shape)}")

    def split_heads(self, x: Tensor) -> Tensor:
        b, t, width = x.shape  # width: H * d_k (queries, keys) or H * d_v (values)
        return x.view(b, t, self.n_heads, width // self.n_heads).transpose(1, 2)  # (B, H, T, width / H)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool, need_weights: bool,
               groups: int = 1) -> tuple[Tensor, Tensor | None]:
        """The heads' attention, (B, H, T, d_v), and the weights when asked for or observed.

        ``groups``: q holds g rows of queries per row of k and v, as g * T queries (a beam's
        hypotheses share their source); the result comes back one row per query row.
        """
        observer = attention_observer.get()  # set while qkv.interpret.capture_attention runs
        out, weights = scaled_dot_product_attention(q, k, v, mask=mask, is_causal=is_causal,
                                   dropout_p=self.dropout if self.training else 0.0,
                                   need_weights=need_weights or observer is not None)
        if groups > 1:  # back to one row per query row
            out = _ungroup(out, groups)  # (B, H, T, d_v)
            weights = None if weights is None else _ungroup(weights, groups)  # (B, H, T, S)
        if observer is not None:
            observer(self, weights)
        return out, (weights if need_weights else None)

    def merge_heads(self, out: Tensor, layout: Layout) -> Tensor:
        """(B, H, T, d_v) -> W^O of the heads concatenated: (B, T, D), or (N, D) in a packed layout."""
        b, _, t, _ = out.shape
        out = out.transpose(1, 2).reshape(b, t, self.d_model)  # (B, T, H * d_v)
        return self.out_proj(layout.pack(out))


class SelfAttention(Attention):
    """Queries, keys and values from the same sequence: W^Q, W^K and W^V stacked in ``in_proj`` (3D, D), as
    torch.nn.MultiheadAttention and GPT-2 store them, so one matrix multiply projects all three.

    With RoPE, queries and keys are rotated by their positions. In decoding, a :class:`KVCache` keeps the keys
    and values of the positions already seen, so a step computes only its own: the one its owner passes
    (``cache=``), else ``cache``, installed by the model's ``setup_cache``.
    """

    def __init__(self, d_model: int, n_heads: int, bias: bool = True, dropout: float = 0.0,
                 rope: RotaryEmbedding | None = None, d_k: int | None = None) -> None:
        super().__init__(d_model, n_heads, bias, dropout, d_k)
        self.qkv_sizes = (n_heads * self.d_k, n_heads * self.d_k, d_model)  # widths of Q, K and V
        self.in_proj = nn.Linear(d_model, sum(self.qkv_sizes), bias=bias)  # [W^Q; W^K; W^V]
        self.rope = rope
        self.cache: KVCache | None = None

    def setup_cache(self, batch_size: int, max_len: int, dtype: torch.dtype, device: torch.device) -> None:
        self.cache = KVCache(batch_size, self.n_heads, max_len, self.d_v, dtype=dtype, device=device, d_k=self.d_k)

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        is_causal: bool = False,
        positions: Tensor | None = None,
        need_weights: bool = False,
        layout: Layout = UNPACKED,
        cache: KVCache | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from every position of ``x`` to the others (and to the cached ones).

        Args:
            x: (B, T, D), or (N, D): the real tokens of a packed ``layout`` (qkv.modules.packing).
            mask: bool, broadcastable to (B, H, T, L), covering all L keys (cached ones included).
            is_causal: forbid attending to later positions.
            positions: (B, T) absolute positions for RoPE (default: after the cached ones).
            need_weights: also return the weights (B, H, T, L).
            layout: how ``x`` is laid out; the output is laid out the same way.
            cache: the KV cache to read and append to, given by its owner (a step compiled ahead of time
                passes caches over its inputs); default: the module's own, from ``setup_cache``.

        Returns:
            (output of x's shape, weights or None).
        """
        self._check_input(x, layout)
        cache = self.cache if cache is None else cache
        qkv = layout.unpack(self.in_proj(x))  # (B, T, 2 H d_k + D): attention needs the positions laid out
        q, k, v = (self.split_heads(z) for z in qkv.split(self.qkv_sizes, dim=-1))  # (B, H, T, d_k|d_k|d_v)
        if self.rope is not None:
            q = self.rope(q, offset=cached(cache), positions=positions)
            k = self.rope(k, offset=cached(cache), positions=positions)
        if cache is not None:
            k, v = cache.update(k, v)  # (B, H, cached + T, d_k | d_v)
        out, weights = self.attend(q, k, v, mask, is_causal, need_weights)
        return self.merge_heads(out, layout), weights


class CrossAttention(Attention):
    """Queries from the decoder (W^Q, ``q_proj``), keys and values from the encoder output (W^K and W^V
    stacked, ``kv_proj``).

    In decoding, ``cache`` (a :class:`StaticKV`) holds the keys and values of the
    sources, computed at the first step and read at every later one. ``memory`` may hold one row per
    *group* of g consecutive query rows, (B / g, S, D): the g hypotheses of a beam share their source,
    so its keys and values are computed, stored and read once, and the group attends to them as
    g * T queries.
    """

    def __init__(self, d_model: int, n_heads: int, bias: bool = True, dropout: float = 0.0,
                 d_k: int | None = None) -> None:
        super().__init__(d_model, n_heads, bias, dropout, d_k)
        self.kv_sizes = (n_heads * self.d_k, d_model)  # widths of K and V
        self.q_proj = nn.Linear(d_model, n_heads * self.d_k, bias=bias)  # W^Q
        self.kv_proj = nn.Linear(d_model, sum(self.kv_sizes), bias=bias)  # [W^K; W^V]
        self.cache: StaticKV | None = None

    def setup_cache(self) -> None:
        self.cache = StaticKV()

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None,
        mask: Tensor | None = None,
        need_weights: bool = False,
        layout: Layout = UNPACKED,
        memory_layout: Layout = UNPACKED,
        cache: StaticKV | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``x`` to ``memory``.

        Args:
            x: (B, T, D), or (N, D) in a packed ``layout``.
            memory: (B, S, D) encoder output, (N_s, D) in a packed ``memory_layout``, or (B / g, S, D)
                for groups of g rows of ``x``; None once the cache holds the sources' keys and values.
            mask: source padding, (B, 1, 1, S); (B / g, 1, 1, S) for grouped memory.
            need_weights: also return the weights (B, H, T, S).
            cache: the sources' keys and values, given by their owner; default: the module's own.

        Returns:
            (output of x's shape, weights or None).
        """
        self._check_input(x, layout)
        cache = self.cache if cache is None else cache
        q = self.split_heads(layout.unpack(self.q_proj(x)))  # (B, H, T, d_k)
        b, _, t, _ = q.shape
        if cache is not None and cache.filled:
            k, v = cache.k, cache.v  # computed once per source, reused at every step
        else:
            if memory is None:
                raise ValueError("cross-attention needs the encoder output (memory)")
            if memory.shape[-1] != self.d_model or memory.dim() != (2 if memory_layout.packs else 3):
                raise ValueError(f"cross-attention: memory must be (B={b}, S, D={self.d_model}), "
                                 f"got {tuple(memory.shape)}")
            kv = memory_layout.unpack(self.kv_proj(memory))  # (B, S, H d_k + D)
            k, v = (self.split_heads(z) for z in kv.split(self.kv_sizes, dim=-1))  # (B, H, S, d_k), (B, H, S, d_v)
            if cache is not None:
                # Contiguous: every step reads them, and the kernel reads one block per head faster.
                k, v = k.contiguous(), v.contiguous()
                cache.set(k, v)
        # The g rows of a group (a beam's hypotheses) share one source: g * T queries of it.
        sources = k.shape[0]
        if sources != b and (sources == 0 or b % sources):
            raise ValueError(f"cross-attention: {b} query rows but {sources} sources; memory must be (B={b}, S, D) "
                             "or hold one row per group of g consecutive rows, (B / g, S, D)")
        groups = b // sources if sources else 1
        if groups > 1:
            q = q.view(sources, groups, self.n_heads, t, self.d_k)  # (B / g, g, H, T, d_k)
            q = q.transpose(1, 2).reshape(sources, self.n_heads, groups * t, self.d_k)  # (B / g, H, g T, d_k)
        out, weights = self.attend(q, k, v, mask, False, need_weights, groups)
        return self.merge_heads(out, layout), weights

    def upgrade_state_dict(self, state_dict: dict[str, Tensor], prefix: str) -> None:
        """Split the stacked ``in_proj`` of runs saved when cross-attention stored [W^Q; W^K; W^V] as one
        (3D, D) matrix into ``q_proj`` and ``kv_proj``, in place."""
        for part in ("weight", "bias"):
            old = state_dict.pop(f"{prefix}in_proj.{part}", None)
            if old is not None:
                state_dict[f"{prefix}q_proj.{part}"] = old[: self.d_model]
                state_dict[f"{prefix}kv_proj.{part}"] = old[self.d_model:]


# What attention keeps while decoding. During generation the keys and values of past positions never
# change, so each step computes K and V for its new positions only and appends them to a static,
# preallocated cache; attention then costs one query against the cached prefix instead of recomputing
# it (as gpt-fast and torchtune do). The buffers are allocated once (a model's ``setup_cache``), so
# decoding allocates nothing per step: a KVCache in every self-attention of the decoder, a StaticKV in
# every cross-attention; the encoder sees the whole source at once and has none.


class KVCache:
    """Keys and values of one attention layer, for ``max_len`` positions.

    Buffers are (B, H, max_len, d_v) (keys: (B, H, max_len, d_k) when ``d_k`` differs); ``length``
    positions are filled. A plain object, not an
    ``nn.Module``: it lives for one generation on the device it is made for, and a module's attribute
    machinery (every ``self.k = ...``, every ``attention.cache`` lookup) cost beam search 2% of its time.
    """

    def __init__(self, batch_size: int, n_heads: int, max_len: int, d_v: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None,
                 d_k: int | None = None) -> None:
        shape = (batch_size, n_heads, max_len, d_v)
        # The allocation, and the rows in use (its first ones; ``reorder`` may narrow and widen them).
        self._k = torch.zeros((*shape[:3], d_k or d_v), dtype=dtype, device=device)
        self._v = torch.zeros(shape, dtype=dtype, device=device)
        self.k, self.v = self._k, self._v
        self.max_len = max_len
        self.length = 0

    @property
    def batch_size(self) -> int:
        return self.k.shape[0]

    def reset(self) -> None:
        """Forget all positions (the buffers stay allocated)."""
        self.length = 0

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append the new positions' keys and values; return all cached ones.

        Args:
            k, v: (B, H, T, d_k) and (B, H, T, d_v) for the T new positions.

        Returns:
            (B, H, length + T, d_k | d_v) keys and values (views of the buffers).
        """
        b, h, t, d_k = k.shape
        if (b, h, d_k) != (self.k.shape[0], self.k.shape[1], self.k.shape[3]):
            raise ValueError(
                f"KVCache.update: got keys of shape {tuple(k.shape)}, the cache holds "
                f"(B, H, *, d_k) = ({self.k.shape[0]}, {self.k.shape[1]}, *, {self.k.shape[3]})"
            )
        end = self.length + t
        if end > self.max_len:
            raise ValueError(
                f"KVCache is full: {self.length} cached + {t} new positions > max_len {self.max_len}; "
                "set up the cache with a larger max_len"
            )
        self.k[:, :, self.length:end] = k
        self.v[:, :, self.length:end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]

    def reorder(self, indices: Tensor, moved: Tensor | None = None) -> None:
        """Keep rows ``indices`` (M,) of the rows in use, e.g. the surviving hypotheses of a beam search step.

        Beam search must reorder the cache along with the sequences, or a hypothesis would continue
        from another's past. The rows are moved in place, any M up to the allocated batch size: fewer
        rows when sentences finish, more when the first step's one row per sentence becomes its
        hypotheses. Rows that keep their own past (``indices[i] == i``) are not touched: in a beam
        search most hypotheses extend the one in their own row (beam search places them so), and
        copying every row at every step cost it a tenth of its time.

        ``moved``: :func:`moved_rows` of ``indices``, when the caller reorders many caches alike.
        """
        m, n = indices.shape[0], self.length
        # More rows than allocated, or a cache that autograd follows (an in-place copy would rewrite
        # what it saved): new buffers.
        if m > self._k.shape[0] or (torch.is_grad_enabled() and self.k.requires_grad):
            self._k, self._v = self.k.index_select(0, indices), self.v.index_select(0, indices)
            self.k, self.v = self._k, self._v
            return
        moved = moved_rows(indices) if moved is None else moved  # (C,)
        if moved.numel():
            # Only the filled positions, and the changed rows gathered before any is overwritten
            # (row a may take row b's past while row b takes row c's).
            for rows, allocated in ((self.k, self._k), (self.v, self._v)):
                taken = rows[:, :, :n].index_select(0, indices[moved])  # (C, H, n, d_k | d_v)
                allocated[:, :, :n].index_copy_(0, moved, taken)
        self.k, self.v = self._k[:m], self._v[:m]


def moved_rows(indices: Tensor) -> Tensor:
    """(C,) the rows i where ``indices[i] != i``: those whose past a reorder to ``indices`` changes."""
    return (indices != torch.arange(indices.shape[0], device=indices.device)).nonzero().squeeze(1)


class StaticKV:
    """Cross-attention keys and values: computed once from the encoder output, reused every step.

    A plain object, like :class:`KVCache`."""

    def __init__(self) -> None:
        self.k: Tensor | None = None
        self.v: Tensor | None = None

    @property
    def filled(self) -> bool:
        return self.k is not None

    def set(self, k: Tensor, v: Tensor) -> None:
        self.k, self.v = k, v

    def reset(self) -> None:
        self.k = self.v = None

    def reorder(self, indices: Tensor) -> None:
        if self.k is not None:
            self.k = self.k.index_select(0, indices)
            self.v = self.v.index_select(0, indices)


def cached(cache: KVCache | None) -> int:
    """Positions already in ``cache`` (0 without one): where the next input starts."""
    return cache.length if cache is not None else 0


def reorder_caches(self_caches: list[KVCache], cross_caches: list[StaticKV], indices: Tensor,
            sources: Tensor | None = None) -> None:
    """Keep the rows ``indices`` in every self-attention cache and ``sources`` in every cross-attention one.

    Cross-attention caches hold the keys and values of the sources: one row per source, which beam
    search shares among the hypotheses of a sentence (one row per decoder row in greedy search, where
    ``sources`` and ``indices`` are the same). Hypotheses trading places within a sentence never change
    its source, so ``sources=None`` leaves those caches as they are; they move only when sentences leave.
    """
    moved = moved_rows(indices)  # once for all the self-attention caches
    for cache in self_caches:
        cache.reorder(indices, moved)
    if sources is not None:
        for cache in cross_caches:
            cache.reorder(sources)


__all__ = ["padding_mask", "lengths_mask", "causal_mask", "combine", "check_mask", "scaled_dot_product_attention",
           "attention_observer", "Attention", "SelfAttention", "CrossAttention", "KVCache", "StaticKV",
           "moved_rows", "cached", "reorder_caches"]
