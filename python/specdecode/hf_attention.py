"""What specdecode's Transformers attention implementations share: registering one under its
name (:func:`register_attention`, with SDPA's own mask function, so that masks are built as for
SDPA), finding the configs that name a model's implementation (:func:`attention_configs`), and
handing a call that an implementation does not take to Transformers' own SDPA function
(:func:`sdpa_fallback`).
The implementations: :mod:`specdecode.cpu_attention` (the CPU fast path's) and
:mod:`specdecode.grouped_attention` (grouped-query heads on a GPU)."""

from __future__ import annotations

from typing import Any, Callable

from torch import Tensor, nn

__all__ = ["attention_configs", "register_attention", "sdpa_fallback"]

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


def sdpa_fallback(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                  dropout: float, scaling: float | None, is_causal: bool | None, **kwargs: Any) -> tuple[Tensor, Any]:
    """Transformers' ``sdpa_attention_forward`` with the arguments of an attention-implementation
    call: what specdecode's implementations run where their own kernel does not apply.

    Shape:
        query ``[B, H, n, D]``, key and value ``[B, Hkv, C, D]`` -> ``([B, n, H, D], None)``.

    Example (an implementation's last line)::

        return sdpa_fallback(module, query, key, value, attention_mask, dropout, scaling, is_causal, **kwargs)
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  is_causal=is_causal, **kwargs)
