"""KV-cache operations on Hugging Face caches whose columns are shared by all rows of a batch.

Speculative decoding appends draft columns and then keeps only what was accepted: :func:`crop`
removes trailing columns (a chain step), :func:`gather_columns` moves per-row columns (tree
steps keep each row's accepted path; re-packing squeezes out holes), :func:`select_rows` drops
finished rows."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def new_cache() -> Any:
    """An empty ``DynamicCache``. Without a config every layer is a full-attention layer, which
    crops and gathers exactly (sliding-window layers would drop columns on their own)."""
    from transformers import DynamicCache

    return DynamicCache()


def num_columns(cache: Any) -> int:
    """Columns the cache holds."""
    return int(cache.get_seq_length())


def crop(cache: Any, length: int) -> None:
    """Keep the first ``length`` columns (no-op when the cache is not longer)."""
    current = cache.get_seq_length()
    if length < current:
        cache.crop(length - current)  # a negative argument removes that many columns (all 5.x versions)


def plain_layers(cache: Any) -> list[Any] | None:
    """The cache's layers if all of them store plain ``keys`` / ``values`` ``[b, h, T, d]`` tensors."""
    layers = getattr(cache, "layers", None)
    if layers is None:
        return None
    for layer in layers:
        if getattr(layer, "is_sliding", False):
            return None
        keys = getattr(layer, "keys", None)
        if keys is None and not getattr(layer, "is_initialized", True):
            continue  # a layer that never ran (e.g. shared KV)
        if not isinstance(keys, Tensor):
            return None
    return list(layers)


def select_rows(cache: Any, index: Tensor) -> None:
    """Keep the rows ``index`` (``[b']`` int64), in that order."""
    if hasattr(cache, "batch_select_indices"):
        cache.batch_select_indices(index)
        return
    layers = plain_layers(cache)
    if layers is None:
        raise RuntimeError("this cache type cannot drop finished rows (no batch_select_indices)")
    for layer in layers:
        if isinstance(getattr(layer, "keys", None), Tensor) and layer.keys.numel():
            layer.keys = layer.keys.index_select(0, index.to(layer.keys.device))
            layer.values = layer.values.index_select(0, index.to(layer.values.device))


def _filled_layers(cache: Any, what: str) -> list[Any]:
    """The cache's plain layers that hold columns, or ``RuntimeError`` saying the cache cannot
    ``what``."""
    layers = plain_layers(cache)
    if layers is None:
        raise RuntimeError(f"this cache type cannot {what} (sliding-window or quantized layers)")
    return [layer for layer in layers if isinstance(getattr(layer, "keys", None), Tensor) and layer.keys.numel()]


def gather_columns(cache: Any, order: Tensor, start: int = 0) -> None:
    """Per-row column gather of every layer, from column ``start`` on:
    ``keys[b, :, start + j] <- keys[b, :, order[b, j]]``; the cache then holds
    ``start + order.shape[1]`` columns.

    Shape:
        order: ``[b, n]`` int64, each entry a column index below the cache's length.
    """
    for layer in _filled_layers(cache, "gather columns"):
        b, h, _, d = layer.keys.shape
        index = order.to(layer.keys.device)[:, None, :, None].expand(b, h, order.shape[1], d)
        layer.keys = _join(layer.keys, index, start)
        layer.values = _join(layer.values, index, start)


def _join(tensor: Tensor, index: Tensor, start: int) -> Tensor:
    gathered = tensor.gather(2, index)
    if start == 0:
        return gathered
    return torch.cat([tensor[:, :, :start], gathered], 2)


def drop_columns(cache: Any, start: int, stop: int) -> None:
    """Remove columns ``[start, stop)`` of every layer, for every row; the columns after them
    move down (their keys keep the positions they were computed at)."""
    for layer in _filled_layers(cache, "drop columns"):
        layer.keys = torch.cat([layer.keys[:, :, :start], layer.keys[:, :, stop:]], 2)
        layer.values = torch.cat([layer.values[:, :, :start], layer.values[:, :, stop:]], 2)
