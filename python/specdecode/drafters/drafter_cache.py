"""A drafter's own KV cache on the engine's columns, with the target's feature at each column:
what the EAGLE drafter (:mod:`specdecode.drafters.eagle`) and a model's MTP layers
(:mod:`specdecode.drafters.mtp`) keep between steps, and how a
:class:`~specdecode.drafters.base.CommitUpdate` moves it (:class:`DrafterCache`).

:func:`cached_prefix` and :func:`repack_cache` are the re-pack rule on their own, for drafters
that keep a cache without features (:class:`~specdecode.drafters.ModelDrafter`) or per-column
tensors of their own (:mod:`specdecode.drafters.dflash`,
:mod:`specdecode.drafters.gemma4_assistant`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from specdecode.drafters.base import CommitUpdate
from specdecode.drafters.column_store import ColumnStore
from specdecode.models import kv_cache

__all__ = ["DrafterCache", "cached_prefix", "repack_cache"]


def cached_prefix(order: Tensor, valid: int) -> int:
    """How many leading columns, after a re-pack by ``order``, hold in every row what one of
    the first ``valid`` columns held (what a drafter computed there stays good; the columns
    from the first one that does not are computed again).

    Shape:
        order: ``[b, n]`` int64: column ``j`` of row ``r`` takes what column ``order[r, j]`` held.
    """
    return int((order < valid).all(0).long().cumprod(0).sum())


def repack_cache(cache: Any, order: Tensor, cached_columns: int) -> int:
    """Re-pack a KV cache holding columns ``0 .. cached_columns - 1`` (``cached_columns >= 1``)
    by ``order`` and keep its :func:`cached_prefix`; returns the columns it holds then. (A column
    the cache never held, e.g. the last accepted draft of a fully accepted block, is fed again
    at the next step, and so is every column after it.)

    Shape:
        order: ``[b, n]`` int64, on the cache's device.
    """
    keep = cached_prefix(order, cached_columns)
    kv_cache.gather_columns(cache, order.clamp_max(cached_columns - 1))
    kv_cache.crop(cache, keep)
    return keep


class DrafterCache:
    """A drafter's own KV cache over the engine's columns and the target's feature at each
    column, moved with the engine's commits.

    ``cache`` is a transformers cache (None until the drafter's first forward) holding the
    drafter's keys and values of columns ``0 .. cached_columns - 1``, one entry per engine
    column. ``features`` (a :class:`~specdecode.drafters.column_store.ColumnStore`) holds the
    target's feature of each committed column, as commits bring them (zeros where none came).
    :meth:`commit` moves both as the engine moved its columns, in this order:

    1. the update's features are stored at their columns (:meth:`store`);
    2. the cache is cropped to the committed columns before the new pending one (what the
       drafter fed beyond them read its own drafts);
    3. the rows that continue are kept, in their new order (a cache left with no column is
       dropped: its empty layers would keep the old rows);
    4. on a re-pack, column ``j`` of row ``r`` takes what column ``column_order[r, j]`` held,
       in the features and in the cache; the cache keeps only the prefix of new columns that
       all come, in every row, from cached ones (:func:`repack_cache`; the drafter feeds the
       rest again at its next step), and is dropped when it had no column to move.

    Shape:
        cache: each layer's keys / values ``[b, heads, cached_columns, head_dim]``.
        target_features: ``[b, >= committed columns, F]`` or None before the first commit.
    """

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.reset()

    def reset(self) -> None:
        """Forget every column (a new generation)."""
        self.cache: Any = None
        self.cached_columns = 0
        self.features = ColumnStore()

    @property
    def target_features(self) -> Tensor | None:
        """The stored features (a view, or None before any). Shape: ``[b, columns, F]``."""
        return self.features.data

    def open(self) -> Any:
        """The cache, a new empty one (``cached_columns`` 0) when there is none."""
        if self.cache is None:
            self.cache, self.cached_columns = kv_cache.new_cache(), 0
        return self.cache

    def keep(self, columns: int) -> None:
        """Keep the cache's first ``columns`` columns (what a proposal fed from committed tokens)."""
        kv_cache.crop(self.cache, columns)
        self.cached_columns = columns

    def store(self, features: Tensor, num_columns: int) -> None:
        """Store the target's features of the ``m`` columns before the pending one,
        ``num_columns - 1 - m .. num_columns - 2``.

        Shape:
            features: ``[b, m, F]``.
        """
        self.features.write(num_columns - 1 - features.shape[1], features)

    def previous_features(self, real: Tensor, lo: int, hi: int, width: int, dtype: torch.dtype) -> Tensor:
        """For columns ``lo .. hi - 1``: the stored feature of each row's previous real column,
        zeros where the row has none before it (or nothing is stored yet), in ``dtype``.

        Shape:
            real: ``[b, >= hi]`` bool or 0/1, the rows' real columns; returns
            ``[b, hi - lo, F]`` (``F = width`` when nothing is stored).
        """
        have, b = self.features.data, real.shape[0]
        if have is None or hi == 0:
            return torch.zeros((b, hi - lo, width), dtype=dtype, device=self.device)
        cols = torch.arange(hi, device=self.device)
        real = real[:, :hi].to(self.device).bool()
        last = torch.cummax(torch.where(real, cols, torch.full_like(cols, -1)), 1).values
        previous = torch.cat([last.new_full((b, 1), -1), last[:, :-1]], 1)[:, lo:hi]
        found = have.gather(1, previous.clamp(0, have.shape[1] - 1)[:, :, None].expand(-1, -1, have.shape[-1]))
        return (found * (previous >= 0)[:, :, None].to(found.dtype)).to(dtype)

    def commit(self, update: CommitUpdate) -> None:
        """Move the cache and the features as ``update`` says (see the class)."""
        if update.features is not None:
            self.store(update.features.to(self.device), update.num_columns)
        if self.cache is not None:
            self.keep(min(self.cached_columns, update.num_columns - 1))  # before the new pending token
        if update.kept_rows is not None:
            rows = update.kept_rows.to(self.device)
            if self.cache is not None and self.cached_columns == 0:
                self.cache = None
            elif self.cache is not None:
                kv_cache.select_rows(self.cache, rows)
            self.features.rows(rows)
        order = update.column_order
        if order is None:
            return
        order = order.to(self.device)
        self.features.reorder(order)
        if self.cache is not None and self.cached_columns == 0:
            self.cache = None
        elif self.cache is not None:
            self.cached_columns = repack_cache(self.cache, order, self.cached_columns)
