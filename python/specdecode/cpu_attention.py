"""The CPU fast path's attention: Hugging Face attention that runs few-query steps on
``torch.ops.specdecode.skinny_attention``.

A decode or verification step over a large batch (the data stage's continuations: 32 rows, one
query each) is bound by reading the KV cache, and a static cache
(:class:`specdecode.models.static_cache.ColumnCache`) holds left padding and columns not yet
written that an additive mask rules out. ``skinny_attention`` reads each key and value row once
for every query of its head group and skips the columns the mask rules out (the lowest float,
-inf or False: their softmax weight is exactly 0), where PyTorch's CPU
``scaled_dot_product_attention`` reads every column of every head. Transformers' own masks (a
verification forward over a dynamic cache) are boolean; the static path's are additive.

:func:`install` switches a model whose attention implementation is ``"sdpa"`` to
:data:`ATTENTION_NAME`, an implementation registered with Transformers' ``AttentionInterface``
(and its ``AttentionMaskInterface``, with SDPA's own mask function, so that masks are built as
for SDPA). Each call takes the op only when it applies (:func:`skinny_attention_applies`: CPU,
float32, a float32 additive or boolean mask, at most :data:`MAX_QUERIES` queries, no dropout, no autograd
graph, not traced or compiled, nothing SDPA's wrapper would add to the mask); otherwise it calls
Transformers' own ``sdpa_attention_forward``. Outputs differ from SDPA's only by float rounding.
:func:`specdecode.cpu.accelerate` installs it along with the linear layers' fast path and its
handle's ``remove()`` puts ``"sdpa"`` back.

>>> handle = specdecode.cpu.accelerate(model)         # an SDPA model, on the CPU
>>> model.config._attn_implementation
'specdecode_cpu'
>>> handle.remove()                                   # "sdpa" again
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import Tensor, nn

from specdecode._ops import ops
from specdecode.hf_attention import attention_configs, register_attention, sdpa_fallback
from specdecode.models.source_text import module_mentions

__all__ = ["ATTENTION_NAME", "MAX_QUERIES", "install", "installed_configs", "skinny_attention_applies",
           "skinny_sdpa_attention", "uninstall"]

#: The attention implementation name :func:`install` sets on a model's config.
ATTENTION_NAME = "specdecode_cpu"
#: Most queries per row a call may have to take the op (decode steps, verification forwards,
#: tree levels); a prefill takes SDPA, whose blocked kernel is made for many queries.
MAX_QUERIES = 64

_skinny_attention = ops.skinny_attention.default
_MASK_DTYPES = (torch.float32, torch.bool)  # additive, or True = attend
def skinny_attention_applies(query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                             dropout: float = 0.0, **kwargs: Any) -> bool:
    """Whether a call of the attention implementation with these arguments takes
    ``skinny_attention`` (see the module docstring) rather than SDPA. Cheap checks first: this
    runs in every layer of every forward.

    Shape:
        query: ``[B, H, n, D]``; key, value: ``[B, Hkv, C, D]``; attention_mask ``[B or 1, H or 1,
        n or 1, C]`` additive float32, or bool (True = attend).
    """
    if attention_mask is None or attention_mask.dtype not in _MASK_DTYPES or query.dtype != torch.float32:
        return False
    if not query.is_cpu or type(query) is not Tensor or type(key) is not Tensor or type(value) is not Tensor \
            or type(attention_mask) is not Tensor:
        return False
    if dropout or kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None \
            or kwargs.get("output_attentions"):
        return False
    if query.dim() != 4 or key.dim() != 4 or value.shape != key.shape or attention_mask.dim() != 4:
        return False
    B, H, n, D = query.shape
    Hkv, C = key.shape[1], key.shape[2]
    if n > MAX_QUERIES or key.shape[0] != B or key.shape[3] != D or Hkv == 0 or H % Hkv:
        return False
    if attention_mask.shape[3] != C or any(m not in (1, s) for m, s in zip(attention_mask.shape[:3], (B, H, n))):
        return False
    if key.dtype != torch.float32 or value.dtype != torch.float32 or not (key.is_cpu and value.is_cpu
                                                                          and attention_mask.is_cpu):
        return False
    if torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad
                                    or attention_mask.requires_grad):
        return False
    return not (torch.jit.is_tracing() or torch.compiler.is_compiling())


def skinny_sdpa_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                          attention_mask: Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                          is_causal: bool | None = None, **kwargs: Any) -> tuple[Tensor, None]:
    """Transformers' attention-implementation signature: ``skinny_attention`` where it applies,
    else ``sdpa_attention_forward`` with the same arguments.

    Shape:
        query ``[B, H, n, D]``, key and value ``[B, Hkv, C, D]`` -> ``([B, n, H, D], None)``.
    """
    if skinny_attention_applies(query, key, value, attention_mask, dropout, **kwargs):
        scale = query.shape[-1] ** -0.5 if scaling is None else float(scaling)
        out = _skinny_attention(query, key, value, attention_mask, scale)
        return out.transpose(1, 2).contiguous(), None
    return sdpa_fallback(module, query, key, value, attention_mask, dropout, scaling, is_causal, **kwargs)


def _branches_on_the_name(model: nn.Module) -> bool:
    """Whether a module class of ``model`` compares its attention implementation with ``"sdpa"``
    itself (Falcon does: under any other name it adds a boolean mask as if it were additive,
    and stops being causal), so that renaming the implementation would change its math."""
    return any(module_mentions(cls, '_attn_implementation == "sdpa"') for cls in {type(m) for m in model.modules()})


def install(model: nn.Module) -> list[weakref.ref]:
    """Switches every config of ``model`` whose attention implementation is ``"sdpa"`` to
    :data:`ATTENTION_NAME`; returns weak references to the configs switched (for
    :func:`uninstall`). Models with another implementation (eager, flash, flex) are left alone,
    and so are models whose code branches on the name ``"sdpa"`` itself (Falcon)."""
    if _branches_on_the_name(model):
        return []
    switched = []
    for config in attention_configs(model):
        if config._attn_implementation == "sdpa":
            register_attention(ATTENTION_NAME, skinny_sdpa_attention)
            config._attn_implementation = ATTENTION_NAME
            switched.append(weakref.ref(config))
    return switched


def uninstall(configs: list[weakref.ref]) -> int:
    """Puts ``"sdpa"`` back on the configs :func:`install` switched (those still switched);
    returns how many."""
    restored = 0
    for ref in configs:
        config = ref()
        if config is not None and config._attn_implementation == ATTENTION_NAME:
            config._attn_implementation = "sdpa"
            restored += 1
    return restored


def installed_configs(model: nn.Module) -> list[Any]:
    """The configs of ``model`` that currently run :data:`ATTENTION_NAME`."""
    return [c for c in attention_configs(model) if c._attn_implementation == ATTENTION_NAME]
