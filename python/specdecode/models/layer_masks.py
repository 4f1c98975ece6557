"""Attention masks per layer type: sliding-window and chunked layers see only what their type
says, on every decode path, beyond the window and across rollbacks.

Many models mix layer types: Gemma 2/3, Cohere2 and gpt-oss put sliding-window layers between
full-attention ones, Mistral and Phi-3 may slide in every layer, Llama 4 attends in chunks. A
Hugging Face model builds each type's mask itself from a 2D padding mask and the cache's own
column count, which assumes that column ``i`` of the cache holds token ``i``. Speculative
decoding breaks that assumption: rejected drafts leave *holes* between a row's columns (the
eager path), rows start at different columns (the static path), and tree nodes sit side by side
at one depth. So every forward here receives the masks already made, one per layer type, and
the model's own mask building is skipped (a model takes a 4D mask as it is, and a mapping from
layer type to mask where its layers differ).

The one fact a windowed mask needs is each key's distance from the query in the query's own
sequence. It follows from the query's allowed keys alone: a query attends to exactly its own
sequence (its real prefix, its ancestors in a tree, itself), laid out in column order, so the
distance to an allowed key is the number of allowed keys in later columns. Hence a sliding
layer of window ``w`` keeps the allowed keys with fewer than ``w`` allowed keys after them
(the query itself among them: ``kv > q - w`` in Hugging Face's words), whatever the layout.
Chunked layers (``attention_chunk_size``) keep the allowed keys whose position
``q - distance`` lies in the query's chunk.

Models without windowed or chunked layers are handed their masks unchanged (:func:`layout` is
None for them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from specdecode.models.source_text import module_mentions

__all__ = ["ATTENTION_TYPES", "LayerLayout", "layer_masks", "layout"]

#: The layer types whose masks this module makes (the names of ``config.layer_types``).
ATTENTION_TYPES = ("full_attention", "sliding_attention", "chunked_attention")


@dataclass(frozen=True)
class LayerLayout:
    """What the masks of one model depend on.

    ``windows``: layer type -> sliding window in tokens (None: the whole context);
    ``chunk``: the chunk size of ``chunked_attention`` layers, or None; ``mapping``: the
    model takes a mapping from layer type to mask (it has ``config.layer_types``), else one
    mask for every layer; ``other_types``: layer types that are not attention (recurrent
    mixers, convolutions): they get the 2D padding mask, as Hugging Face's models give them.
    """

    windows: dict[str, int | None]
    chunk: int | None
    mapping: bool
    other_types: tuple[str, ...] = ()


def _positive(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def layout(model: torch.nn.Module) -> LayerLayout | None:
    """The model's :class:`LayerLayout`, or None when every layer attends over the whole
    context (the masks are then handed over unchanged)."""
    config = getattr(model, "config", None)
    if config is None:
        return None
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    window = _positive(getattr(config, "sliding_window", None))
    if getattr(config, "use_sliding_window", True) is False:
        window = None
    chunk = _positive(getattr(config, "attention_chunk_size", None))
    types = getattr(config, "layer_types", None)
    if not isinstance(types, (list, tuple)) or not types:
        if window is None or not module_mentions(type(model), "create_sliding_window_causal_mask"):
            # a window the model's own masks never apply (Moshi's: only flash attention reads it)
            return None
        return LayerLayout(windows={"sliding_attention": window}, chunk=None, mapping=False)
    kinds = list(dict.fromkeys(str(t) for t in types))
    if "sliding_attention" not in kinds and "chunked_attention" not in kinds:
        return None
    windows = {kind: (window if kind == "sliding_attention" else None) for kind in kinds if kind in ATTENTION_TYPES}
    others = tuple(kind for kind in kinds if kind not in ATTENTION_TYPES)
    return LayerLayout(windows=windows, chunk=chunk, mapping=True, other_types=others)


def _allowed(attention_mask: Tensor | None, batch: int, num_queries: int, num_columns: int,
             device: torch.device) -> tuple[Tensor, Tensor | None]:
    """``[b, n, T]`` bool: the keys each query may attend to (before any window), and the 2D
    padding mask the input carried (None for a 4D input or none)."""
    first = num_columns - num_queries  # the column of the first query
    query_cols = first + torch.arange(num_queries, device=device)
    causal = torch.arange(num_columns, device=device)[None, :] <= query_cols[:, None]  # [n, T]
    if attention_mask is None:
        return causal[None].expand(batch, -1, -1), None
    if attention_mask.dim() == 2:
        real = attention_mask.to(device=device).bool()
        own = torch.arange(num_columns, device=device)[None, :] == query_cols[:, None]
        # a padding query sees its own column only, so no softmax row is empty
        return (causal[None] & real[:, None, :]) | own[None], attention_mask
    if attention_mask.dim() != 4:
        raise ValueError(f"attention_mask: expected a 2D or 4D mask, got {attention_mask.dim()} dimensions")
    mask = attention_mask[:, 0]
    if mask.dtype == torch.bool:
        return mask, None
    return mask > torch.finfo(mask.dtype).min / 2, None


def layer_masks(model: torch.nn.Module, attention_mask: Tensor | None, position_ids: Tensor, num_columns: int,
                dtype: torch.dtype | None = None) -> Tensor | dict[str, Tensor | None] | None:
    """The ``attention_mask`` argument for one forward of ``model``: ``attention_mask`` itself
    for a model without windowed or chunked layers; else one additive 4D mask per layer type
    (a mapping where the model takes one, a single mask otherwise).

    ``attention_mask`` is what the caller would pass: a 2D 0/1 mask over all ``num_columns``
    columns (cache and new), a 4D mask (additive, or bool with True = attend) whose queries
    each see exactly their own sequence, or None (no padding, no holes).

    Shape:
        attention_mask: ``[b, T]``, ``[b, 1, n, T]`` or None; position_ids: ``[b, n]`` int64;
        returns ``[b, 1, n, T]`` masks of ``dtype`` (the model's by default; 0 = attend, the
        dtype's minimum = masked), with ``T = num_columns``.
    """
    info = layout(model)
    if info is None:
        return attention_mask
    batch, n = position_ids.shape
    dtype = dtype or getattr(model, "dtype", torch.float32)
    allowed, padding = _allowed(attention_mask, batch, n, num_columns, position_ids.device)
    # distance of each allowed key from the query in the query's own sequence
    after = allowed.flip(-1).long().cumsum(-1).flip(-1)  # allowed keys at this column or later
    distance = after - 1
    low = torch.finfo(dtype).min
    masks: dict[str, Tensor | None] = {}
    for kind, window in info.windows.items():
        keep = allowed
        if window is not None:
            keep = keep & (distance < window)
        if kind == "chunked_attention" and info.chunk is not None:
            query_pos = position_ids[:, :, None]
            keep = keep & (torch.div(query_pos - distance, info.chunk, rounding_mode="floor")
                           == torch.div(query_pos, info.chunk, rounding_mode="floor"))
        masks[kind] = torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill_(~keep, low)[:, None]
    if not info.mapping:
        return next(iter(masks.values()))
    recurrent = None  # as Hugging Face's recurrent-layer mask: the new columns' padding, None without any
    if padding is not None and not bool(padding[:, -n:].bool().all()):
        recurrent = padding[:, -n:].contiguous()
    for kind in info.other_types:
        masks[kind] = recurrent
    return masks


def ring_sizes(model: torch.nn.Module, span: int, capacity: int) -> dict[int, int]:
    """Layer index -> columns a static cache keeps for each sliding-window layer of ``model``:
    its window plus the ``span`` columns one step writes after the pending one (what its queries
    can still attend; see :class:`specdecode.models.static_cache.ColumnCache`), for the layers
    where that is fewer than ``capacity``. Empty for models without sliding layers, and for models whose
    layers share key/value states (their cache indices are not their layers')."""
    info = layout(model)
    window = None if info is None else info.windows.get("sliding_attention")
    if window is None or getattr(getattr(model, "config", None), "num_kv_shared_layers", 0):
        return {}
    ring = window + span
    if ring >= capacity:
        return {}
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    types = getattr(config, "layer_types", None)
    count = int(getattr(config, "num_hidden_layers", 0) or 0)
    if not info.mapping:
        return {i: ring for i in range(count)}
    if not isinstance(types, (list, tuple)) or len(types) != count:
        return {}
    return {i: ring for i, kind in enumerate(types) if kind == "sliding_attention"}


def ring_masks(masks: Tensor | dict[str, Any], key_columns: Tensor, info: LayerLayout) -> Tensor | dict[str, Any]:
    """The sliding layers' masks over a ring of a static cache: ``key_columns[b, j]`` is the
    cache column whose keys sit at the ring layer's key ``j`` (-1: none).

    Shape:
        masks: ``[b, 1, n, T]`` (or a mapping of them); key_columns: ``[b, R + n]`` int64;
        the sliding layers' mask becomes ``[b, 1, n, R + n]``.
    """
    def gather(mask: Tensor) -> Tensor:
        b, _, n, _ = mask.shape
        index = key_columns.clamp_min(0)[:, None, None, :].expand(b, 1, n, key_columns.shape[1])
        low = torch.finfo(mask.dtype).min
        return mask.gather(3, index).masked_fill((key_columns < 0)[:, None, None, :], low)

    if not info.mapping:
        return gather(masks)  # type: ignore[arg-type]
    return {kind: gather(mask) if kind == "sliding_attention" else mask for kind, mask in masks.items()}


def with_recurrent_padding(model: torch.nn.Module, masks: Any, padding: Tensor) -> dict[str, Any]:
    """The mapping a hybrid model takes as ``attention_mask`` (one entry per kind of its
    ``config.layer_types``): the attention kinds get ``masks`` (a 4D mask, or theirs from a
    mapping), the recurrent kinds the 2D ``padding`` of the fed columns (what Hugging Face's
    recurrent layers zero), a ``hybrid`` layer both. For a static cache's prefill, whose 4D mask
    cannot tell the recurrent layers which columns are padding.

    Shape:
        masks: ``[b, 1, n, T]`` (or a mapping of them); padding: ``[b, n]`` (1 = a real token).
    """
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    kinds = list(dict.fromkeys(str(t) for t in (getattr(config, "layer_types", None) or ())))

    def attention(kind: str) -> Any:
        if isinstance(masks, dict):
            return masks.get(kind, masks.get("full_attention"))
        return masks

    mapping: dict[str, Any] = {}
    for kind in kinds:
        if kind in ATTENTION_TYPES or kind == "attention":
            mapping[kind] = attention(kind)
        elif kind.startswith("hybrid"):
            attending = "sliding_attention" if "sliding" in kind else "full_attention"
            mapping[kind] = {attending: attention(attending), "linear_attention": padding}
        else:  # recurrent mixers (conv, linear_attention, mamba), and layers that take no mask
            mapping[kind] = padding
    mapping.setdefault("full_attention", attention("full_attention"))
    mapping.setdefault("linear_attention", padding)
    return mapping
