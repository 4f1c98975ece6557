"""KV-cache operations on Hugging Face caches whose columns are shared by all rows of a batch.

Speculative decoding appends draft columns and then keeps only what was accepted: :func:`crop`
removes trailing columns (a chain step), :func:`gather_columns` moves per-row columns (tree
steps keep each row's accepted path; re-packing squeezes out holes), :func:`select_rows` drops
finished rows.

Recurrent layers (Mamba / Mamba2 mixers, gated-delta and other linear attention, short
convolutions: Hugging Face's ``LinearAttentionLayer`` caches) hold one state per row, not one
column per token, and a state that has run over a rejected draft cannot be cropped. A cache
that has them (:func:`has_recurrent_layers`) is rolled back by :func:`checkpoint` (copies of
every recurrent state, taken before a verification forward) and :func:`rewind` (those copies
put back, the attention layers cropped): the caller then feeds the accepted tokens again
(:func:`replays`). Their attention layers crop, gather and select rows as any other."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def new_cache(model: torch.nn.Module | None = None) -> Any:
    """An empty ``DynamicCache``. Without a config every layer is a full-attention layer, which
    crops and gathers exactly (sliding-window layers would drop columns on their own; their
    windows are masks: :mod:`specdecode.models.layer_masks`). A ``model`` with recurrent layers
    gets the cache its config lays out, recurrent states and all."""
    from transformers import DynamicCache

    if model is not None and has_recurrent_layers(model):
        return _full_windows(DynamicCache(config=model.config))
    return DynamicCache()


def _full_windows(cache: Any) -> Any:
    """``cache`` with its sliding-window attention layers swapped for full ones (with their
    recurrent states where they have them): columns are cropped and gathered exactly, the
    windows are masks."""
    from transformers.cache_utils import (DynamicLayer, DynamicSlidingWindowLayer,
                                          LinearAttentionAndFullAttentionLayer)

    for i, layer in enumerate(cache.layers):
        if isinstance(layer, DynamicSlidingWindowLayer):
            cache.layers[i] = (LinearAttentionAndFullAttentionLayer(number_of_states=layer.number_of_states)
                               if is_recurrent_layer(layer) else DynamicLayer())
    return cache


def is_recurrent_layer(layer: Any) -> bool:
    """Whether ``layer`` (a Hugging Face cache layer) holds recurrent states (a linear-attention
    cache layer: Mamba, gated delta rule, short convolutions)."""
    try:
        from transformers.cache_utils import LinearAttentionCacheLayerMixin
    except ImportError:  # transformers before its linear-attention cache layers: none to find
        return False
    return isinstance(layer, LinearAttentionCacheLayerMixin)


def has_recurrent_layers(model: torch.nn.Module) -> bool:
    """Whether the cache ``model``'s config lays out holds recurrent states (Hugging Face's
    linear-attention cache layers: Mamba, gated delta rule, short convolutions)."""
    from transformers import DynamicCache

    config = getattr(model, "config", None)
    if config is None:
        return False
    try:
        layers = DynamicCache(config=config).layers
    except Exception:  # noqa: BLE001 - a config the cache cannot lay out has no recurrent layers it knows
        return False
    return any(is_recurrent_layer(layer) for layer in layers)


def replays(cache: Any) -> bool:
    """Whether ``cache`` holds recurrent states: rolled back by :func:`checkpoint` /
    :func:`rewind` and feeding the kept tokens again, not by :func:`crop` alone."""
    return any(is_recurrent_layer(layer) for layer in getattr(cache, "layers", ()))


def checkpoint(cache: Any) -> list[tuple[Any, dict[int, Tensor], dict[int, Tensor]]]:
    """Copies of every recurrent layer's states (convolution and recurrent), for :func:`rewind`;
    empty for a cache without them or before its first forward."""
    saved = []
    for layer in getattr(cache, "layers", ()):
        if is_recurrent_layer(layer):
            conv = {i: t.clone() for i, t in layer.conv_states.items() if isinstance(t, Tensor)}
            recurrent = {i: t.clone() for i, t in layer.recurrent_states.items() if isinstance(t, Tensor)}
            saved.append((layer, conv, recurrent))
    return saved


def rewind(cache: Any, saved: list[tuple[Any, dict[int, Tensor], dict[int, Tensor]]], length: int) -> None:
    """Put the recurrent states of :func:`checkpoint` back (in place: their addresses stay) and
    keep the first ``length`` columns of the attention layers."""
    for layer, conv, recurrent in saved:
        for states, copies in ((layer.conv_states, conv), (layer.recurrent_states, recurrent)):
            for i, copy in copies.items():
                if states[i].shape == copy.shape:
                    states[i].copy_(copy)
                else:
                    states[i] = copy
    crop(cache, length)


def num_columns(cache: Any) -> int:
    """Columns the cache holds."""
    return int(cache.get_seq_length())


def crop(cache: Any, length: int) -> None:
    """Keep the first ``length`` columns (no-op when the cache is not longer). The recurrent
    states of a cache that has them are left as they are (:func:`rewind` restores them)."""
    current = cache.get_seq_length()
    if length >= current:
        return
    if not replays(cache):
        cache.crop(length - current)  # a negative argument removes that many columns (all 5.x versions)
        return
    from transformers.cache_utils import DynamicLayer

    for layer in cache.layers:
        if isinstance(layer, DynamicLayer) and isinstance(getattr(layer, "keys", None), Tensor) and layer.keys.numel():
            DynamicLayer.crop(layer, length - layer.keys.shape[-2])


def plain_layers(cache: Any) -> list[Any] | None:
    """The cache's layers if all of them store plain ``keys`` / ``values`` ``[b, h, T, d]`` tensors."""
    layers = getattr(cache, "layers", None)
    if layers is None:
        return None
    for layer in layers:
        if getattr(layer, "is_sliding", False):
            return None
        if not hasattr(layer, "keys"):
            continue  # recurrent states only (their rows: select_rows), or no cache at all (a dummy layer)
        keys = layer.keys
        if keys is None and not getattr(layer, "is_initialized", True):
            continue  # a layer that never ran (e.g. shared KV)
        if not isinstance(keys, Tensor):
            return None
    return list(layers)


def select_rows(cache: Any, index: Tensor) -> None:
    """Keep the rows ``index`` (``[b']`` int64), in that order."""
    if replays(cache):
        for layer in cache.layers:
            if is_recurrent_layer(layer):
                for states in (layer.conv_states, layer.recurrent_states):
                    for i, t in states.items():
                        if isinstance(t, Tensor):
                            states[i] = t.index_select(0, index.to(t.device))
        index_select_columns(cache, index)
        return
    if hasattr(cache, "batch_select_indices"):
        cache.batch_select_indices(index)
        return
    index_select_columns(cache, index)


def index_select_columns(cache: Any, index: Tensor) -> None:
    """Keep the rows ``index`` of every plain layer's keys and values."""
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
        for name in ("keys", "values"):  # (their head sizes may differ: DeepSeek's latent attention)
            tensor = getattr(layer, name)
            b, h, _, d = tensor.shape
            index = order.to(tensor.device)[:, None, :, None].expand(b, h, order.shape[1], d)
            setattr(layer, name, _join(tensor, index, start))


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
