"""Packing: run the position-wise layers on the real tokens of a padded batch only.

Everything in a Transformer layer but attention works on each position alone (the projections, the
feed-forward network, residuals, LayerNorm), so the padding of a (B, T) batch is pure waste there. A
:class:`Packing` keeps the N real tokens as an (N, D) matrix and lays them back out as (B, T, D)
only for the attention scores, the one place where positions meet. On batches with a third of
padding this does a third less work; on unpadded batches nothing changes (nothing is packed).

Every layer takes a layout and calls its ``pack``/``unpack`` unconditionally: a :class:`Packing` for
a padded batch, :data:`UNPACKED` (which lays nothing out) otherwise, so no layer branches on it.
"""

from __future__ import annotations

from torch import Tensor


class Unpacked:
    """The layout of a batch that is not packed: ``pack`` and ``unpack`` return their input."""

    packs = False

    def pack(self, x: Tensor) -> Tensor:
        return x

    def unpack(self, x: Tensor) -> Tensor:
        return x


UNPACKED = Unpacked()


class Packing:
    """The real (non-padding) positions of a (B, T) batch.

    Args:
        keep: (B, T) bool, True at real tokens.
    """

    packs = True

    def __init__(self, keep: Tensor) -> None:
        if keep.dim() != 2 or keep.dtype.is_floating_point:
            raise ValueError(f"Packing expects a (B, T) bool mask, got {tuple(keep.shape)} {keep.dtype}")
        self.keep = keep
        self.batch, self.length = keep.shape
        self.index = keep.reshape(-1).nonzero().squeeze(1)  # (N,) positions in the flattened (B*T,) batch

    @property
    def n_tokens(self) -> int:
        return self.index.numel()

    def pack(self, x: Tensor) -> Tensor:
        """(B, T, ...) -> (N, ...): the real positions, in row-major order (the order of ``x[keep]``)."""
        return x.reshape(self.batch * self.length, *x.shape[2:]).index_select(0, self.index)

    def unpack(self, x: Tensor) -> Tensor:
        """(N, ...) -> (B, T, ...), with zeros at the padding positions."""
        out = x.new_zeros(self.batch * self.length, *x.shape[1:]).index_copy(0, self.index, x)
        return out.view(self.batch, self.length, *x.shape[1:])


Layout = Packing | Unpacked


def packing_for(tokens: Tensor, pad_id: int) -> Layout:
    """A Packing of the non-``pad_id`` positions, or :data:`UNPACKED` when there is no padding (nothing to gain)."""
    keep = tokens != pad_id
    return UNPACKED if bool(keep.all()) else Packing(keep)
