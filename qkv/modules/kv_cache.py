"""A static, preallocated key/value cache for autoregressive decoding.

During generation the keys and values of past positions never change, so each step computes K and V
only for the new position and appends them here; attention then costs one query against the cached
prefix instead of recomputing the whole prefix (as gpt-fast and torchtune do). The buffers are
allocated once (``setup``) so decoding allocates nothing per step.
"""

from __future__ import annotations

from typing import Iterator

import torch
from torch import Tensor, nn

from qkv.modules.linear import Linear, pack_linears, unpack_linears


class KVCache:
    """Keys and values of one attention layer, for ``max_len`` positions.

    Buffers are (B, H, max_len, Dh); ``length`` positions are filled. A plain object, not an
    ``nn.Module``: it lives for one generation on the device it is made for, and a module's attribute
    machinery (every ``self.k = ...``, every ``attention.cache`` lookup) cost beam search 2% of its time.
    """

    def __init__(self, batch_size: int, n_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> None:
        shape = (batch_size, n_heads, max_len, head_dim)
        # The allocation, and the rows in use (its first ones; ``reorder`` may narrow and widen them).
        self._k = torch.zeros(shape, dtype=dtype, device=device)
        self._v = torch.zeros(shape, dtype=dtype, device=device)
        self.k, self.v = self._k, self._v
        self.max_len = max_len
        self.length = 0
        # Set by a compiled decoding step (qkv.generation.compiled): a (1,) tensor naming the slot the
        # next position goes to, so that every step has the same shapes; see ``update``.
        self.slot: Tensor | None = None

    @property
    def batch_size(self) -> int:
        return self.k.shape[0]

    def reset(self) -> None:
        """Forget all positions (the buffers stay allocated)."""
        self.length = 0

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append the new positions' keys and values; return all cached ones.

        Args:
            k, v: (B, H, T, Dh) for the T new positions.

        Returns:
            (B, H, length + T, Dh) keys and values (views of the buffers). With ``slot`` set, the one
            new position is written at that slot and all ``max_len`` slots come back, (B, H, max_len,
            Dh): shapes that never change, so one compiled graph serves every step. The caller's mask
            then hides the slots not yet written, and ``length`` is left alone.
        """
        if self.slot is not None:
            self.k.index_copy_(2, self.slot, k)
            self.v.index_copy_(2, self.slot, v)
            return self.k, self.v
        b, h, t, dh = k.shape
        if (b, h, dh) != (self.k.shape[0], self.k.shape[1], self.k.shape[3]):
            raise ValueError(
                f"KVCache.update: got keys of shape {tuple(k.shape)}, the cache holds "
                f"(B, H, *, Dh) = ({self.k.shape[0]}, {self.k.shape[1]}, *, {self.k.shape[3]})"
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
                taken = rows[:, :, :n].index_select(0, indices[moved])  # (C, H, n, Dh)
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


# ----------------------------------------------------------------------------------------------
# Installing caches in a model: every self-attention gets a KVCache, every cross-attention a
# StaticKV. The models call these from setup_cache / reset_cache / reorder_cache / clear_cache.


def _attention_modules(model: nn.Module):
    """The model's attention modules, in order.

    Listed once when the caches are set up: walking every module of the model at every step (to
    find the cache length, to reorder) cost beam search 4% of its time.
    """
    listed = getattr(model, "_decoding_attention", None)
    return listed if listed is not None else _find_attention_modules(model)


def _find_attention_modules(model: nn.Module) -> list[nn.Module]:
    from qkv.modules.attention import MultiHeadAttention

    return [m for m in model.modules() if isinstance(m, MultiHeadAttention)]


def setup_caches(model: nn.Module, batch_size: int, max_len: int, dtype: torch.dtype | None = None) -> None:
    """Allocate a cache in every attention module of ``model`` for ``batch_size`` rows of ``max_len`` positions."""
    param = next(model.parameters())
    dtype = dtype or param.dtype
    model._decoding_attention = _find_attention_modules(model)
    for m in model._decoding_attention:
        if m.kind == "cross":
            m.cache = StaticKV()
        else:
            m.cache = KVCache(batch_size, m.n_heads, max_len, m.head_dim, dtype=dtype, device=param.device)


def reset_caches(model: nn.Module) -> None:
    """Empty every cache (keeping the buffers) to decode a new batch of the same size."""
    for m in _attention_modules(model):
        if m.cache is not None:
            m.cache.reset()


def reorder_caches(model: nn.Module, indices: Tensor, sources: Tensor | None = None) -> None:
    """Keep the rows ``indices`` in every self-attention cache and ``sources`` in every cross-attention one.

    Cross-attention caches hold the keys and values of the sources: one row per source, which beam
    search shares among the hypotheses of a sentence (one row per decoder row in greedy search, where
    ``sources`` and ``indices`` are the same). Hypotheses trading places within a sentence never change
    its source, so ``sources=None`` leaves those caches as they are; they move only when sentences leave.
    """
    moved = moved_rows(indices)  # once for all the self-attention caches
    for m in _attention_modules(model):
        if isinstance(m.cache, StaticKV):
            if sources is not None:
                m.cache.reorder(sources)
        elif m.cache is not None:
            m.cache.reorder(indices, moved)


def clear_caches(model: nn.Module) -> None:
    """Remove the caches: the model computes every position again (training, scoring)."""
    for m in _attention_modules(model):
        m.cache = None
    model._decoding_attention = None


def cache_length(model: nn.Module) -> int:
    """Positions already cached (0 without a cache)."""
    for m in _attention_modules(model):
        if isinstance(m.cache, KVCache):
            return m.cache.length
    return 0


class CachedDecoding:
    """Mixin for models that decode with caches: prefill in one call, then one position per call."""

    cfg: object

    def setup_cache(self, batch_size: int, max_len: int | None = None, dtype: torch.dtype | None = None,
                    pack: bool = True) -> None:
        """Allocate caches for ``batch_size`` rows of up to ``max_len`` positions (default: cfg.max_len).

        ``pack=False`` skips laying out the weights for oneDNN, which compiled steps do not use.
        """
        setup_caches(self, batch_size, max_len or self.cfg.max_len, dtype)
        if pack:  # every step multiplies batch_size rows by these weights: lay them out for that once
            pack_linears(self.stepwise_linears(), batch_size)

    def reset_cache(self) -> None:
        reset_caches(self)

    def reorder_cache(self, indices: Tensor, sources: Tensor | None = None) -> None:
        reorder_caches(self, indices, sources)

    def clear_cache(self) -> None:
        clear_caches(self)
        unpack_linears(self.stepwise_linears())

    def stepwise_linears(self) -> Iterator[Linear]:
        """The linear maps that every decoding step runs (default: all of the model's)."""
        return (m for m in self.modules() if isinstance(m, Linear))
