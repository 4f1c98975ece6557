"""Per-row tensors a drafter keeps by cache column (the target's features, the keys/values it
projects from them), moved as the engine moves the target's columns: rows selected when rows
leave the batch, columns gathered when the batch is re-packed. DFlash and Gemma 4's assistant
keep their context this way (:mod:`specdecode.drafters.dflash`,
:mod:`specdecode.drafters.gemma4_assistant`); EAGLE and MTP drafters the target's features, beside
their KV cache (:class:`~specdecode.drafters.drafter_cache.DrafterCache`).
"""

from __future__ import annotations

from torch import Tensor

__all__ = ["ColumnStore"]


class ColumnStore:
    """Per-row tensors with a column axis (``axis``; grown by doubling), moved with the engine's
    row selections and column re-packs: ``[b, columns, ...]`` for ``axis=1``, ``[b, h, columns,
    d]`` for ``axis=2``."""

    def __init__(self, axis: int = 1) -> None:
        self.axis = axis
        self.data: Tensor | None = None

    def write(self, start: int, values: Tensor) -> None:
        """Shape: ``values`` has ``m`` columns on the axis, stored at columns ``start .. start + m - 1``."""
        axis = self.axis
        end = start + values.shape[axis]
        have = self.data
        if have is None or have.shape[axis] < end or have.shape[0] != values.shape[0]:
            width = max(end + 16, 0 if have is None else 2 * have.shape[axis])
            shape = list(values.shape)
            shape[axis] = width
            grown = values.new_zeros(shape)
            if have is not None and have.shape[0] == values.shape[0]:
                grown.narrow(axis, 0, have.shape[axis]).copy_(have)
            self.data = grown
        self.data.narrow(axis, start, end - start).copy_(values)

    def columns(self, count: int) -> Tensor:
        """The first ``count`` columns (a view)."""
        assert self.data is not None
        return self.data.narrow(self.axis, 0, count)

    def rows(self, rows: Tensor) -> None:
        """Keep the rows ``rows``, in that order. Shape: ``[b']`` int64."""
        if self.data is not None:
            self.data = self.data[rows.to(self.data.device)]

    def reorder(self, order: Tensor) -> None:
        """Column ``j`` of row ``r`` takes what column ``order[r, j]`` held. Shape: ``[b, n]``."""
        if self.data is None:
            return
        axis, n = self.axis, order.shape[1]
        if self.data.shape[axis] < n:  # columns never written: zeros (never read before written)
            shape = list(self.data.shape)
            shape[axis] = 1
            self.write(n - 1, self.data.new_zeros(shape))
        data = self.data
        index = order.to(data.device).clamp_max(data.shape[axis] - 1)
        expanded = list(data.shape)
        expanded[axis] = n
        index = index.view(index.shape[0], *([1] * (axis - 1)), n, *([1] * (data.dim() - axis - 1)))
        data.narrow(axis, 0, n).copy_(data.gather(axis, index.expand(expanded)))
