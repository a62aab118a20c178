"""A static, preallocated key/value cache for autoregressive decoding.

During generation the keys and values of past positions never change, so each step computes K and V
only for the new position and appends them here; attention then costs one query against the cached
prefix instead of recomputing the whole prefix (as gpt-fast and torchtune do). The buffers are
allocated once (a model's ``setup_cache``) so decoding allocates nothing per step. Each model
installs them over its own layers: a :class:`KVCache` in every self-attention of the decoder, a
:class:`StaticKV` in every cross-attention; the encoder sees the whole source at once and has none.
"""

from __future__ import annotations

import torch
from torch import Tensor


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


def reorder(self_caches: list[KVCache], cross_caches: list[StaticKV], indices: Tensor,
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
