"""What specdecode's Transformers attention implementations share: registering one under its
name (:func:`register_attention`, with SDPA's own mask function, so that masks are built as for
SDPA) and finding the configs that name a model's implementation (:func:`attention_configs`).
The implementations: :mod:`specdecode.cpu_attention` (the CPU fast path's) and
:mod:`specdecode.grouped_attention` (grouped-query heads on a GPU)."""

from __future__ import annotations

from typing import Any, Callable

from torch import nn

__all__ = ["attention_configs", "register_attention"]

_registered: set[str] = set()


def register_attention(name: str, function: Callable[..., Any]) -> None:
    """Registers ``function`` as Transformers' attention implementation ``name`` (with
    ``AttentionInterface``, and SDPA's mask function with ``AttentionMaskInterface``), once per
    name and process."""
    if name in _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(name, function)
    AttentionMaskInterface.register(name, sdpa_mask)
    _registered.add(name)


def attention_configs(model: nn.Module) -> list[Any]:
    """The distinct configs of ``model`` and its submodules (Transformers' ``PretrainedConfig``)."""
    seen: list[Any] = []
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "_attn_implementation") and not any(c is config for c in seen):
            seen.append(config)
    return seen
