"""DrafterCache (specdecode.drafters.drafter_cache), the KV cache and per-column target features
that EAGLE and MTP drafters keep: a commit moves them as a plain per-row reference says
(crop to the committed columns, keep rows, re-pack and keep the prefix of new columns that all
come from cached ones), a variant that keeps every re-packed column fails the same check, the
edge cases (an empty cache when rows leave, no cached column at a re-pack) drop the cache, the
previous-real-column features equal a loop over each row, and nothing passed is modified."""

from __future__ import annotations

import pytest
import torch

import specdecode.drafters.drafter_cache as drafter_cache
from specdecode.drafters import CommitUpdate
from specdecode.drafters.drafter_cache import DrafterCache, cached_prefix
from specdecode.models import kv_cache

B, HEADS, COLUMNS, F = 3, 2, 9, 5
SIZES = (4, 7)  # keys' and values' head sizes differ, as in latent attention


def filled(seed: int = 0) -> tuple[DrafterCache, list[list[torch.Tensor]]]:
    """A DrafterCache whose cache holds ``COLUMNS`` random columns in two layers, and those
    layers' keys / values. Shape: each ``[B, HEADS, COLUMNS, size]``."""
    g = torch.Generator().manual_seed(seed)
    memory = DrafterCache("cpu")
    cache = memory.open()
    layers = []
    for layer in range(2):
        keys, values = (torch.randn(B, HEADS, COLUMNS, size, generator=g) for size in SIZES)
        cache.update(keys, values, layer)
        layers.append([keys, values])
    memory.cached_columns = COLUMNS
    return memory, layers


def reference(layers, features, cached: int, num_columns: int, rows: list[int], order: torch.Tensor):
    """The commit done row by row with loops: keys / values cropped to the committed columns,
    the rows kept, column ``j`` of row ``r`` taking column ``order[r, j]``, the cache cut to
    the leading columns every row takes from a cached one; the features written at their
    columns, moved likewise (columns never written are zeros). Returns the layers, the number
    of cached columns and the features' first ``num_columns`` columns."""
    valid = min(cached, num_columns - 1)
    keep = 0
    while keep < order.shape[1] and all(int(order[r, keep]) < valid for r in range(len(rows))):
        keep += 1
    moved_layers = []
    for tensors in layers:
        moved = []
        for t in tensors:
            out = torch.zeros(len(rows), HEADS, keep, t.shape[-1])
            for i, r in enumerate(rows):
                for j in range(keep):
                    out[i, :, j] = t[r, :, int(order[i, j])]
            moved.append(out)
        moved_layers.append(moved)
    stored = torch.zeros(B, num_columns, F)
    m = features.shape[1]
    stored[:, num_columns - 1 - m: num_columns - 1] = features
    moved_features = torch.zeros(len(rows), num_columns, F)
    for i, r in enumerate(rows):
        for j in range(num_columns):
            moved_features[i, j] = stored[r, int(order[i, j])]
    return moved_layers, keep, moved_features


def commit_case(seed: int = 1):
    """A commit after a step: 8 committed columns (the last one pending), the features of
    the 5 columns before it, row 1 left, and a re-pack whose orders differ by row; the first
    ``cached_prefix`` columns come from cached ones in both rows."""
    g = torch.Generator().manual_seed(seed)
    features = torch.randn(B, 5, F, generator=g)
    order = torch.tensor([[0, 1, 2, 4, 5, 6, 7, 7], [1, 2, 3, 4, 7, 5, 6, 7]])
    return CommitUpdate(torch.zeros(B, dtype=torch.long), 8, kept_rows=torch.tensor([2, 0]), column_order=order,
                        features=features)


def moves_like_the_reference(memory: DrafterCache, layers) -> bool:
    update = commit_case()
    want_layers, want_columns, want_features = reference(layers, update.features, memory.cached_columns,
                                                         update.num_columns, update.kept_rows.tolist(),
                                                         update.column_order)
    memory.commit(update)
    got = [[layer.keys, layer.values] for layer in memory.cache.layers]
    return (memory.cached_columns == want_columns == kv_cache.num_columns(memory.cache)
            and all(torch.equal(g, w) for gs, ws in zip(got, want_layers) for g, w in zip(gs, ws))
            and torch.equal(memory.target_features[:, : update.num_columns], want_features))


def test_commit_moves_like_a_per_row_reference():
    memory, layers = filled()
    assert cached_prefix(commit_case().column_order, 7) == 4
    assert moves_like_the_reference(memory, layers)
    assert memory.cached_columns == 4


def test_keeping_every_repacked_column_fails_the_same_check(monkeypatch):
    """Broken: the re-pack keeps every column, those moved from beyond the cache too."""
    monkeypatch.setattr(drafter_cache, "cached_prefix", lambda order, valid: order.shape[1] - 1)
    memory, layers = filled()
    assert not moves_like_the_reference(memory, layers)


def test_an_empty_cache_is_dropped_when_rows_leave():
    memory, _ = filled()
    features = torch.randn(B, 3, F, generator=torch.Generator().manual_seed(2))
    memory.keep(0)
    memory.commit(CommitUpdate(torch.zeros(B, dtype=torch.long), 4, kept_rows=torch.tensor([1]), features=features))
    assert memory.cache is None and memory.cached_columns == 0
    assert torch.equal(memory.target_features[:, :3], features[1:2])
    memory.open()  # the next proposal's cache: new, with the kept rows only
    assert memory.cached_columns == 0 and kv_cache.num_columns(memory.cache) == 0


@pytest.mark.parametrize("cache", ["empty", "none"])
def test_a_repack_with_no_cached_column_drops_the_cache(cache):
    memory, _ = filled()
    if cache == "empty":
        memory.keep(0)
    else:
        memory.reset()
    features = torch.randn(B, 4, F, generator=torch.Generator().manual_seed(3))
    order = torch.tensor([[0, 1, 3, 4, 4], [2, 2, 3, 0, 4], [1, 2, 0, 3, 4]])
    memory.commit(CommitUpdate(torch.zeros(B, dtype=torch.long), 5, column_order=order, features=features))
    assert memory.cache is None and memory.cached_columns == 0
    stored = torch.cat([features, torch.zeros(B, 1, F)], 1)
    assert torch.equal(memory.target_features[:, :5], stored.gather(1, order[:, :, None].expand(-1, -1, F)))


def test_commit_crops_to_the_committed_columns_and_keeps_the_rows():
    memory, layers = filled()
    memory.commit(CommitUpdate(torch.zeros(B, dtype=torch.long), 6, kept_rows=torch.tensor([2, 1])))
    assert memory.cached_columns == 5 and memory.target_features is None
    for layer, (keys, values) in zip(memory.cache.layers, layers):
        assert torch.equal(layer.keys, keys[[2, 1], :, :5]) and torch.equal(layer.values, values[[2, 1], :, :5])


def test_previous_features_are_each_rows_previous_real_column():
    memory = DrafterCache("cpu")
    real = torch.tensor([[0, 0, 1, 1, 0, 1, 1], [1, 1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0, 1]])
    empty = memory.previous_features(real, 2, 7, F, torch.float64)
    assert empty.shape == (B, 5, F) and empty.dtype == torch.float64 and not empty.any()
    features = torch.randn(B, 6, F, generator=torch.Generator().manual_seed(4))
    memory.store(features, 7)
    got = memory.previous_features(real.bool(), 2, 7, F, torch.float64)
    want = torch.zeros(B, 5, F, dtype=torch.float64)
    for r in range(B):
        for j in range(2, 7):
            before = [c for c in range(j) if real[r, c]]
            if before:
                want[r, j - 2] = features[r, before[-1]].double()
    assert torch.equal(got, want)
    assert torch.equal(memory.previous_features(real, 2, 7, F, torch.float64), want)  # 0/1 masks too


def test_nothing_passed_is_modified():
    memory, _ = filled()
    update = commit_case()
    before = [t.clone() for t in (update.features, update.kept_rows, update.column_order)]
    memory.commit(update)
    features = memory.target_features
    features.add_(1.0)  # the store holds its own copy of what it was given
    assert all(torch.equal(a, b) for a, b in zip(before, (update.features, update.kept_rows, update.column_order)))
