"""Static KV caches: every layer's keys and values preallocated as ``[B, H, capacity, D]`` and
written at explicit per-row columns, so that a forward pass has static shapes and addresses
(what a CUDA graph needs) and rolling a row back is only moving its length pointer.

Layout (one per generation, shared by the target and any draft model)
---------------------------------------------------------------------
Row ``b`` occupies columns ``[start[b], length[b])`` of its cache: its real prompt tokens, then
every token it has emitted. Columns before ``start[b]`` are left padding, never attended. A
forward pass feeds ``n`` new columns per row, ``first[b] .. first[b] + n - 1`` (different for
every row), and writes their keys and values there; queries see the row's real columns up to
and including their own (causal). Nothing beyond a query's own column is ever attended, so
columns past a row's length may hold anything: a rejected draft is forgotten by not moving the
length past it, and the next forward overwrites it.

Attention runs over all ``capacity`` columns with a 4D additive mask (built by
:func:`column_inputs`), or over the first :attr:`ColumnCache.visible` ones while that is set: a
prefill, and a chain step's bucketed width (:mod:`specdecode.engine.attention_widths`).

Sliding-window layers keep a *ring* of ``R = window + span`` columns instead
(:func:`specdecode.models.layer_masks.ring_sizes`; ``span`` the columns one step writes after
the pending one): column
``c`` lives at slot ``c % R``. A forward's ring layer attends over the ring as it was before the
forward (slot ``s`` then holds the last column before the forward's first that is ``s`` modulo
``R``) followed by the forward's own new columns, ``R + n`` keys in all, its mask gathered from
the sliding mask over the capacity (:meth:`ColumnCache.ring_key_columns`). A slot may still hold a
rejected draft's keys from an earlier step (written at most ``span`` columns after that step's
pending column): its slot's column by the formula is ``R`` columns earlier, at least
``R - span = window`` columns before every query of the forward (a row's pending column never
moves back), so the window masks it whatever it holds. And the ring holds every column a query
can attend: the ``R >= window`` columns before the forward's first.

The cache implements the Hugging Face
``Cache`` interface that decoder layers call (``update(key, value, layer_idx)``), so any model
that accepts a custom 4D attention mask with explicit position ids runs on it unchanged
(:func:`specdecode.models.facts.accepts_custom_4d_mask`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor
from transformers.cache_utils import Cache


class ColumnCache(Cache):
    """A static KV cache of ``capacity`` columns per row, written at per-row columns.

    Before each forward set :attr:`columns` (``[B, n]`` int64: the column of every fed token);
    every layer's ``update`` then scatters its new keys/values there and returns the whole
    ``[B, H, capacity, D]`` tensors (the first :attr:`visible` columns only while it is set:
    :func:`prefill_inputs`, a chain step's width, :mod:`specdecode.engine.attention_widths`).
    Layers are allocated on their first update (prefill); at the end of
    the prefill they are moved into one tensor, every layer's keys and values a view of it
    (:meth:`stack_layers`), and keep their addresses afterwards.

    Shape:
        columns: ``[B, n]`` int64, each in ``[0, capacity)``.
    """

    def __init__(self, capacity: int, rings: dict[int, int] | None = None) -> None:
        super().__init__(layers=[])
        self.capacity = int(capacity)
        #: layer index -> ring size for sliding-window layers (see the module docstring)
        self.rings = dict(rings or {})
        if len(set(self.rings.values())) > 1 or any(r >= self.capacity for r in self.rings.values()):
            raise ValueError(f"rings: expected one ring size below the capacity ({self.capacity}), got {self.rings}")
        self.columns: Tensor | None = None
        self.visible: int | None = None
        self.keys: list[Tensor | None] = []
        self.values: list[Tensor | None] = []
        self.stacked: Tensor | None = None  # [2 * layers, B, H, capacity, D]: see stack_layers
        self._starts: Tensor | None = None  # see _row_starts
        #: the recurrent layers' states (:mod:`specdecode.models.recurrent_static`), None without any
        self.recurrent: Any = None

    @classmethod
    def for_model(cls, model: torch.nn.Module, capacity: int, span: int) -> "ColumnCache":
        """The cache of ``model`` with ``capacity`` columns, its sliding-window layers keeping a
        ring of their window plus the ``span`` columns one step writes after the pending one,
        where that is smaller (:func:`specdecode.models.layer_masks.ring_sizes`)."""
        from specdecode.models.kv_cache import has_recurrent_layers
        from specdecode.models.layer_masks import ring_sizes
        from specdecode.models.recurrent_static import RecurrentLayers

        cache = cls(capacity, ring_sizes(model, span, capacity))
        if has_recurrent_layers(model):  # Hugging Face's mixers reach their states through cache.layers
            cache.recurrent = RecurrentLayers(model)
            cache.layers = cache.recurrent.layers
        return cache

    # --- recurrent layers (no-ops without any) ----------------------------------------------
    @property
    def attention_free(self) -> bool:
        """Whether every layer of the cache is recurrent (a Mamba model: its forward takes the 2D
        padding mask, or None, never a 4D one)."""
        return self.recurrent is not None and self.recurrent.attention_free

    @property
    def recurrent_padding(self) -> Tensor | None:
        """``[B, width]`` int64 during a prefill of a cache with recurrent layers (1 = a real
        token), else None: the recurrent layers' padding mask."""
        return None if self.recurrent is None else self.recurrent.padding

    def attach(self, model: torch.nn.Module) -> None:
        """Before a generation of ``model`` on this cache (outside compiled code and graphs): its
        recurrent mixers step through verification forwards one position at a time, their
        states recorded for :meth:`keep_states`. Undone by :meth:`detach`."""
        if self.recurrent is not None:
            self.recurrent.attach(model)

    def detach(self) -> None:
        """After the generation: the model is as it was."""
        if self.recurrent is not None:
            self.recurrent.detach()

    def feed_tree(self, parents: Tensor | None) -> None:
        """The coming forwards feed token trees whose node ``i`` has parent ``parents[b, i]`` among
        the fed positions (-1: the root); None: chains. Attention layers read the tree from the
        mask; recurrent layers step each node from its parent's states.

        Shape:
            parents: ``[B, n]`` int64.
        """
        if self.recurrent is not None:
            self.recurrent.parents = parents

    def keep_states(self, accepted: Tensor) -> None:
        """After a verification forward: row ``b`` keeps its fed position ``accepted[b]`` and what
        leads to it (a chain's first ``accepted[b] + 1`` columns; a tree's accepted path, whose
        last node it is). Attention layers need nothing here (the row's length pointer, and for a
        tree the path's keys moved into place, say it); recurrent layers take the states recorded
        after that position.

        Shape:
            accepted: ``[B]`` int64.
        """
        if self.recurrent is not None:
            self.recurrent.keep(accepted)

    # --- the interface decoder layers call --------------------------------------------------
    def update(self, key_states: Tensor, value_states: Tensor, layer_idx: int, *args: Any, **kwargs: Any
               ) -> tuple[Tensor, Tensor]:
        if self.columns is None:
            raise RuntimeError("ColumnCache: set .columns ([B, n] int64) before a forward pass")
        while len(self.keys) <= layer_idx:
            self.keys.append(None)
            self.values.append(None)
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        B, H, n, _ = key_states.shape
        size = self.rings.get(layer_idx, self.capacity)
        if keys is None or values is None or keys.shape[0] != B:
            self.stacked = None  # a layer outside the stack: moves go layer by layer again
            keys = self.keys[layer_idx] = _allocate(key_states, size)
            values = self.values[layer_idx] = _allocate(value_states, size)
        columns = self.columns.to(keys.device)
        if size != self.capacity:
            return self._ring_update(keys, values, key_states, value_states, columns, size)
        for store, states in ((keys, key_states), (values, value_states)):
            if store.is_contiguous():  # one row copy per (row, head, column): several times faster than scatter_
                flat = (self._row_starts(store) + columns[:, None, :]).reshape(-1)
                store.view(-1, store.shape[3]).index_copy_(0, flat, states.to(store.dtype).reshape(-1, store.shape[3]))
            else:
                store.scatter_(2, columns[:, None, :, None].expand(B, H, n, store.shape[3]), states.to(store.dtype))
        if self.visible is not None:
            return keys[:, :, : self.visible], values[:, :, : self.visible]
        return keys, values

    def _ring_update(self, keys: Tensor, values: Tensor, key_states: Tensor, value_states: Tensor, columns: Tensor,
                     size: int) -> tuple[Tensor, Tensor]:
        """A ring layer: returns the ring as it was followed by the new states (``R + n`` keys),
        then writes the new states at their slots (the last ``R`` of them, when more)."""
        joined = (torch.cat([keys, key_states.to(keys.dtype)], 2), torch.cat([values, value_states.to(values.dtype)], 2))
        keep = min(columns.shape[1], size)
        slots = columns[:, -keep:] % size
        B, H, _, D = keys.shape
        index = slots[:, None, :, None].expand(B, H, keep, D)
        keys.scatter_(2, index, key_states[:, :, -keep:].to(keys.dtype))
        values.scatter_(2, index, value_states[:, :, -keep:].to(values.dtype))
        return joined

    def ring_key_columns(self) -> Tensor | None:
        """The cache column behind each key a ring layer attends to in the coming forward (-1:
        none): the ring's slots as they are, then the forward's columns; None without rings.

        Shape: ``[B, R + n]`` int64, with :attr:`columns` ``[B, n]``.
        """
        if not self.rings or self.columns is None:
            return None
        size = next(iter(self.rings.values()))
        columns = self.columns
        last = columns[:, :1] - 1  # the last column before this forward's
        slots = torch.arange(size, device=columns.device)[None, :]
        held = last - torch.remainder(last - slots, size)
        return torch.cat([held.clamp_min(-1), columns], 1)

    def _row_starts(self, store: Tensor) -> Tensor:
        """``[B, H, 1]`` int64: the index of column 0 of every (row, head) among the rows of
        ``D`` values of a contiguous ``[B, H, capacity, D]`` layer (made once per shape and device)."""
        B, H = store.shape[:2]
        starts = self._starts
        if starts is None or starts.shape[:2] != (B, H) or starts.device != store.device:
            starts = torch.arange(B * H, device=store.device).view(B, H, 1) * self.capacity
            self._starts = starts
        return starts

    def get_seq_length(self, layer_idx: int = 0) -> int:
        # Positions and masks are always passed explicitly and the per-row lengths live on the
        # device; models only read this for defaults they never reach here.
        return 0

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self.capacity, 0

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return self.capacity

    def get_query_offset(self, layer_idx: int = 0) -> int:
        return 0

    @property
    def is_compileable(self) -> bool:
        return True

    @property
    def is_initialized(self) -> bool:
        return bool(self.keys) and all(k is not None for k in self.keys)

    def crop(self, tokens_to_remove: int) -> None:
        raise RuntimeError("ColumnCache: roll back by moving the row lengths, not by cropping")

    def __repr__(self) -> str:
        return f"ColumnCache(capacity={self.capacity}, layers={len(self.keys)})"

    def stack_layers(self) -> None:
        """Move every allocated layer's keys and values into one tensor, :attr:`stacked`
        (``[2 * layers, B, H, capacity, D]``; keys first, in layer order), each layer's keys and
        values becoming a view of it, so that :func:`move_columns` moves a column of every
        layer with one gather and one scatter. A no-op once stacked, and for layers of
        different shapes, dtypes or devices (they stay apart). Copies the cache once: call it
        outside CUDA graphs, before any graph records the layers' addresses
        (:func:`prefill_inputs` does, after the prefill)."""
        if self.stacked is not None or self.rings:
            return
        layers = [t for t in (*self.keys, *self.values) if t is not None]
        first = layers[0] if layers else None
        if first is None or len(layers) < 2 or any(
                t.shape != first.shape or t.dtype != first.dtype or t.device != first.device for t in layers):
            return
        stacked = torch.stack(layers)
        views = iter(stacked.unbind(0))
        for store in (self.keys, self.values):
            for i, tensor in enumerate(store):
                if tensor is not None:
                    store[i] = next(views)
        self.stacked = stacked

    def nbytes(self) -> int:
        """Bytes held by the allocated keys and values."""
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values) if t is not None)


def _allocate(states: Tensor, capacity: int) -> Tensor:
    B, H, _, D = states.shape
    return torch.zeros((B, H, capacity, D), dtype=states.dtype, device=states.device)


def column_inputs(first: Tensor, start: Tensor, num_columns: int, capacity: int, dtype: torch.dtype
                  ) -> tuple[Tensor, Tensor, Tensor]:
    """The columns, position ids and 4D attention mask of a forward that feeds ``num_columns``
    new columns per row, row ``b`` from column ``first[b]`` on.

    Query ``j`` of row ``b`` (column ``first[b] + j``) may attend to the row's real columns
    ``start[b] .. first[b] + j``; a query on a padding column (before ``start[b]``) attends to
    its own column only, so no softmax row is empty. Position ids count real tokens
    (``column - start``, 0 on padding).

    Shape:
        first, start: ``[B]`` int64.
        returns: columns ``[B, n]`` int64, positions ``[B, n]`` int64, additive mask
            ``[B, 1, n, capacity]`` of ``dtype`` (0 = attend, the dtype's minimum = masked).
    """
    device = first.device
    columns = first[:, None] + torch.arange(num_columns, device=device)[None, :]
    positions = (columns - start[:, None]).clamp_min(0)
    keys = torch.arange(capacity, device=device)[None, None, :]
    query = columns[:, :, None]
    allowed = ((keys >= start[:, None, None]) & (keys <= query)) | (keys == query)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, torch.finfo(dtype).min)
    return columns, positions, mask[:, None]


@contextlib.contextmanager
def prefill_inputs(cache: ColumnCache, start: Tensor, width: int, dtype: torch.dtype
                   ) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
    """The inputs of a forward over the first ``width`` columns of every row (a prompt's
    prefill), for the duration of a ``with`` block: its queries see none of the later columns,
    so attention runs over these ``width`` columns alone rather than the whole capacity
    (``cache.visible``); sets ``cache.columns``. Outside graphs only (its shapes follow the prompt).

    Shape:
        start: ``[B]`` int64. Yields columns ``[B, width]``, positions ``[B, width]`` and the
        additive mask ``[B, 1, width, width]`` (:func:`column_inputs`).
    """
    first = torch.zeros_like(start)
    columns, positions, mask = column_inputs(first, start, width, width, dtype)
    cache.columns, cache.visible = columns, width
    if cache.recurrent is not None:  # the states start empty; padding columns must not enter them
        cache.recurrent.reset()
        cache.recurrent.padding = (columns >= start[:, None]).long()
    try:
        yield columns, positions, mask
    finally:
        cache.visible = None
        if cache.recurrent is not None:
            cache.recurrent.padding = None
    cache.stack_layers()


def tree_inputs(lengths: Tensor, start: Tensor, visible: Tensor, capacity: int, dtype: torch.dtype
                ) -> tuple[Tensor, Tensor]:
    """The additive 4D mask of a forward over tree nodes written after each row's root column
    ``lengths[b]``: query ``i`` may attend to the row's committed columns ``start[b] ..
    lengths[b] - 1`` and to the columns ``lengths[b] + s`` with ``visible[b, i, s]`` (its
    ancestors-or-self, the root's offset 0 among them); and the columns of the offsets
    ``0 .. S - 1``.

    Shape:
        lengths, start: ``[B]`` int64; visible: ``[B, n, S]`` bool.
        returns: mask ``[B, 1, n, capacity]`` of ``dtype`` (0 = attend, the dtype's minimum =
            masked), slot columns ``[B, S]`` int64.
    """
    B, n, S = visible.shape
    device = lengths.device
    slots = lengths[:, None] + torch.arange(S, device=device)[None, :]
    keys = torch.arange(capacity, device=device)[None, None, :]
    allowed = ((keys >= start[:, None, None]) & (keys < lengths[:, None, None])).expand(B, n, capacity).clone()
    allowed.scatter_(2, slots[:, None, :].expand(B, n, S), visible)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[:, None], slots


def move_columns(cache: ColumnCache, source: Tensor, target: Tensor) -> None:
    """Copy every layer's keys and values of row ``b`` from columns ``source[b, j]`` to columns
    ``target[b, j]`` (all read before any is written, so the two may overlap): one gather and
    one scatter over :attr:`ColumnCache.stacked` when the layers are stacked, else two per
    layer's keys and values.

    Shape:
        source, target: ``[B, m]`` int64 in ``[0, capacity)``.
    """
    if cache.stacked is not None:
        S, B, H, _, D = cache.stacked.shape
        m = source.shape[1]
        moved = cache.stacked.gather(3, source[None, :, None, :, None].expand(S, B, H, m, D))
        cache.stacked.scatter_(3, target[None, :, None, :, None].expand(S, B, H, m, D), moved)
        return
    for store in (cache.keys, cache.values):
        for tensor in store:
            if tensor is None:
                continue
            B, H, size, D = tensor.shape
            m = source.shape[1]
            src, dst = (source, target) if size == cache.capacity else (source % size, target % size)  # a ring
            moved = tensor.gather(2, src[:, None, :, None].expand(B, H, m, D))
            tensor.scatter_(2, dst[:, None, :, None].expand(B, H, m, D), moved)
