"""How a KV cache is handed to a Hugging Face model and read back from its output.

transformers renamed the cache argument of a model's ``forward`` from ``past_key_values`` to
``cache`` (5.24; the old name warns and is due to go in 5.40), and the output field with it.
Older releases, and models loaded with remote code, know only ``past_key_values``. Every call
the project makes with a cache goes through :func:`cache_kwargs` and :func:`returned_cache`, so
the spelling is decided here, once per model class, from the signatures of its ``forward``.

Example:
    >>> from specdecode.models import cache_kwargs, new_cache, returned_cache
    >>> out = model(input_ids=ids, **cache_kwargs(model, new_cache()))  # doctest: +SKIP
    >>> out = model(input_ids=next_ids, **cache_kwargs(model, returned_cache(out)))  # doctest: +SKIP
"""

from __future__ import annotations

import functools
import inspect
import weakref
from collections.abc import Mapping
from typing import Any

import torch

#: The current name first: a forward that takes both is given the current one.
CACHE_KEYWORDS = ("cache", "past_key_values")

# model class -> its forward's cache keyword. Keyed by the class itself (weakly: a class defined
# in a test or a notebook cell is freed with its last model), never by an id().
_KEYWORD_BY_CLASS: "weakref.WeakKeyDictionary[type, str]" = weakref.WeakKeyDictionary()


def _class_keyword(cls: type) -> str:
    """The cache keyword of the first ``forward`` along ``cls``'s MRO that names one explicitly
    (a subclass whose ``forward(*args, **kwargs)`` wraps its parent's takes the parent's name).
    A model that names neither anywhere (a wrapper that passes everything on to a model it
    holds) gets the spelling of the installed transformers, which the model it wraps takes."""
    for klass in cls.__mro__:
        forward = klass.__dict__.get("forward")
        if forward is None:
            continue
        try:
            names = inspect.signature(forward).parameters
        except (TypeError, ValueError):
            continue
        for keyword in CACHE_KEYWORDS:
            if keyword in names:
                return keyword
    return _installed_keyword()


@functools.cache
def _installed_keyword() -> str:
    """``"cache"`` where the installed transformers' causal LMs take it, else ``"past_key_values"``."""
    try:
        from transformers import LlamaForCausalLM

        names = inspect.signature(LlamaForCausalLM.forward).parameters
    except (ImportError, TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in names else "past_key_values"


def cache_keyword(model: torch.nn.Module) -> str:
    """``"cache"`` or ``"past_key_values"``: the name ``model``'s forward takes its KV cache by."""
    return _class_cache_keyword(type(model))


@torch.compiler.assume_constant_result  # a fact about the class: compiled code bakes it in, guarding no table
def _class_cache_keyword(cls: type) -> str:
    """:func:`cache_keyword` for a model class. It takes the class, not the model: compiled code
    calls it with a constant (torch 2.11's Dynamo refuses a module as a constant-result argument)."""
    keyword = _KEYWORD_BY_CLASS.get(cls)
    if keyword is None:
        keyword = _KEYWORD_BY_CLASS[cls] = _class_keyword(cls)
    return keyword


def cache_kwargs(model: torch.nn.Module, cache: Any) -> dict[str, Any]:
    """The keyword arguments that hand ``cache`` to ``model``'s forward (with ``use_cache=True``)."""
    return {cache_keyword(model): cache, "use_cache": True}


def returned_cache(output: Any) -> Any:
    """The KV cache a forward returned: the output's ``cache`` field where it has one, else its
    ``past_key_values`` (looked up as a field, never through a deprecated attribute)."""
    for field in CACHE_KEYWORDS:
        if isinstance(output, Mapping):
            if field in output:
                return output[field]
        elif getattr(output, field, None) is not None:
            return getattr(output, field)
    raise ValueError(f"output: {type(output).__name__} holds no KV cache (no 'cache' or 'past_key_values' field)")
