"""Grouped-query attention without copying the cache: Hugging Face attention for the static
path's masked few-query steps on a GPU.

With a mask (the static path always passes one: left padding, unwritten columns, tree masks),
Transformers' SDPA function cannot ask PyTorch's CUDA kernels for grouped-query attention, so
it copies every key and value head ``H / Hkv`` times (``repeat_kv``) in every layer of every
step: at the data stage's 512 rows of SmolLM2 (9 query heads over 3 key/value heads) that is
three times the cache's bytes written and read again, per layer and step.

:func:`grouped_sdpa_attention` folds the query heads of each group into the query axis instead:
the ``n`` queries of the ``g = H / Hkv`` heads that share key/value head ``j`` become ``g * n``
queries of head ``j`` (``[B, H, n, D]`` is ``[B, Hkv, g * n, D]`` in memory order), the mask is
repeated along that axis (a view when it has one query row), and one
``scaled_dot_product_attention`` call attends over the cache as it is. Every query still sees
exactly its own mask row and its own group's keys and values, so the result is the same
attention (only float rounding differs); nothing of the cache is copied.

It applies (:func:`grouped_attention_applies`) to calls with a 4D mask shared by all heads, at
most :data:`MAX_QUERIES` queries, grouped heads (``Hkv < H``), no dropout, no autograd graph,
nothing SDPA's wrapper would add (position bias, softcap, attention weights); other calls go to
Transformers' ``sdpa_attention_forward``. :func:`installed` switches an SDPA model to it for a
``with`` block: the data stage does so for its continuations on CUDA
(:mod:`specdecode.training.continuations`).
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager
from typing import Any, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specdecode.hf_attention import attention_configs, register_attention, sdpa_fallback

__all__ = ["ATTENTION_NAME", "MAX_QUERIES", "grouped_attention_applies", "grouped_sdpa_attention", "installed"]

#: The attention implementation name :func:`installed` sets on a model's config.
ATTENTION_NAME = "specdecode_grouped"
#: Most queries per row a call may have to be folded (decode steps, verification forwards, tree
#: levels); a prefill keeps SDPA's own handling.
MAX_QUERIES = 64

def grouped_attention_applies(query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                              dropout: float = 0.0, **kwargs: Any) -> bool:
    """Whether a call with these arguments is folded (see the module docstring) rather than
    handed to SDPA's own function.

    Shape:
        query: ``[B, H, n, D]``; key, value: ``[B, Hkv, C, D]``; attention_mask ``[B or 1, 1,
        n or 1, C]``, additive (the query's dtype) or bool (True = attend).
    """
    if attention_mask is None or dropout or kwargs.get("position_bias") is not None \
            or kwargs.get("softcap") is not None or kwargs.get("output_attentions"):
        return False
    if query.dim() != 4 or key.dim() != 4 or value.shape != key.shape or attention_mask.dim() != 4:
        return False
    B, H, n, D = query.shape
    Hkv, C = key.shape[1], key.shape[2]
    if n > MAX_QUERIES or Hkv == 0 or Hkv >= H or H % Hkv or key.shape[0] != B or key.shape[3] != D:
        return False
    if attention_mask.shape[1] != 1 or attention_mask.shape[3] != C or attention_mask.shape[0] not in (1, B) \
            or attention_mask.shape[2] not in (1, n):
        return False
    if attention_mask.dtype != torch.bool and attention_mask.dtype != query.dtype:
        return False
    return not (torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad))


def grouped_sdpa_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                           attention_mask: Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                           is_causal: bool | None = None, **kwargs: Any) -> tuple[Tensor, None]:
    """Transformers' attention-implementation signature: the folded SDPA call where it applies,
    else ``sdpa_attention_forward`` with the same arguments.

    Shape:
        query ``[B, H, n, D]``, key and value ``[B, Hkv, C, D]`` -> ``([B, n, H, D], None)``.
    """
    if grouped_attention_applies(query, key, value, attention_mask, dropout, **kwargs):
        B, H, n, D = query.shape
        Hkv = key.shape[1]
        groups = H // Hkv
        folded = query.reshape(B, Hkv, groups * n, D)  # head h = j * groups + i reads key/value head j
        mask = attention_mask  # [Bm, 1, n or 1, C]
        if mask.shape[2] == 1:
            mask = mask.expand(mask.shape[0], 1, groups * n, mask.shape[3])
        else:
            mask = mask[:, :, None].expand(mask.shape[0], 1, groups, n, mask.shape[3]).reshape(
                mask.shape[0], 1, groups * n, mask.shape[3])
        out = F.scaled_dot_product_attention(folded, key, value, attn_mask=mask, scale=scaling)
        return out.reshape(B, H, n, D).transpose(1, 2).contiguous(), None
    return sdpa_fallback(module, query, key, value, attention_mask, dropout, scaling, is_causal, **kwargs)


@contextmanager
def installed(model: nn.Module) -> Iterator[int]:
    """Within the block, every config of ``model`` whose attention implementation is ``"sdpa"``
    runs :data:`ATTENTION_NAME`; yields how many were switched and puts ``"sdpa"`` back on them
    at the end (those still switched). Other implementations are left alone.

    Example::

        from specdecode import grouped_attention

        with grouped_attention.installed(target) as switched:  # target on CUDA, "sdpa" attention
            out = target.generate(input_ids, attention_mask=mask, max_new_tokens=32)
        # switched: the configs that ran grouped_attention.ATTENTION_NAME (0: none was "sdpa")
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    switched = []
    for config in attention_configs(model):
        if config._attn_implementation == "sdpa":
            register_attention(ATTENTION_NAME, grouped_sdpa_attention)
            config._attn_implementation = ATTENTION_NAME
            switched.append(weakref.ref(config))
    try:
        yield len(switched)
    finally:
        for ref in switched:
            config = ref()
            if config is not None and config._attn_implementation == ATTENTION_NAME:
                config._attn_implementation = "sdpa"
