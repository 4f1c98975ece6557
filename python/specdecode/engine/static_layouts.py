"""The static decode path's kept layouts: caches, buffers and CUDA graphs reused by the next
generation with the same shapes, and freed with the models they serve.

- The table holds each target **weakly** (a ``WeakKeyDictionary``): deleting the target frees
  its layouts. A layout itself holds no model between generations (the engine's step functions
  reach the target through a weak reference and the drafter only while a generation runs).
- A layout's key names the drafter's model by ``weakref.ref`` (the drafter's ``static_key``):
  when that model is freed, its layouts are dropped at once (``weakref.finalize``).
- A layout is reused only while its models' parameters are the **same live tensors, unchanged**
  (:class:`Weights`): CUDA graphs read parameters by address, so a replaced or re-allocated
  parameter means a new layout. Nothing is ever looked up by ``id()`` or by a data pointer.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import Any, Sequence

import torch

#: How many static layouts (caches, buffers, CUDA graphs) are kept for reuse, per target.
SESSION_CACHE_SIZE = 8

# target -> (key -> (layout, the Weights of each model it was built for)), oldest first.
_LAYOUTS: "weakref.WeakKeyDictionary[torch.nn.Module, OrderedDict[tuple, tuple[Any, tuple]]]" = (
    weakref.WeakKeyDictionary())


def clear_static_sessions(target: torch.nn.Module | None = None) -> None:
    """Free the kept static layouts (caches, buffers and CUDA graphs) of every model, or of
    ``target`` only."""
    if target is None:
        _LAYOUTS.clear()
    else:
        _LAYOUTS.pop(target, None)


def kept_layouts(target: torch.nn.Module) -> list[Any]:
    """The layouts kept for ``target``, oldest first (for inspection; empty when none)."""
    return [layout for layout, _ in _LAYOUTS.get(target, OrderedDict()).values()]


class Weights:
    """The parameters a layout was built for: each parameter object, held weakly, with its
    storage address, dtype and shape at that time. It matches a model whose parameters are the
    same live objects, unchanged; a parameter replaced, reassigned (``param.data = ...``) or moved
    does not match. A freed parameter never matches (its weak reference is dead). Checked at
    every call (:func:`kept_layout`), so the modules' own parameter tables are read directly
    (a tied parameter appears once per module that holds it, in both walks alike)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self._params = [(weakref.ref(p), p.data_ptr(), p.dtype, p.shape) for p in _parameters(model)]

    def match(self, model: torch.nn.Module) -> bool:
        params = _parameters(model)
        return len(params) == len(self._params) and all(
            ref() is p and p.data_ptr() == ptr and p.dtype == dtype and p.shape == shape
            for (ref, ptr, dtype, shape), p in zip(self._params, params))


def _parameters(model: torch.nn.Module) -> list[torch.Tensor]:
    """Every module's parameters, in module order (a parameter tied to two modules twice)."""
    return [p for module in modules_of(model) for p in module._parameters.values() if p is not None]


def modules_of(model: torch.nn.Module) -> list[torch.nn.Module]:
    """``model`` and its submodules, depth first, in a fixed order; a module held twice is listed
    twice. What ``model.modules()`` gives without naming every module on the way (the static
    path walks its models at every call)."""
    found, stack = [], [model]
    while stack:
        module = stack.pop()
        found.append(module)
        stack.extend(reversed([child for child in module._modules.values() if child is not None]))
    return found


def _weights_of(models: Sequence[Any]) -> tuple:
    return tuple(Weights(m) if isinstance(m, torch.nn.Module) else None for m in models)


def _matches(weights: tuple, models: Sequence[Any]) -> bool:
    return len(weights) == len(models) and all(
        (w is None and not isinstance(m, torch.nn.Module)) or (w is not None and isinstance(m, torch.nn.Module)
                                                                and w.match(m))
        for w, m in zip(weights, models))


def kept_layout(target: torch.nn.Module, key: tuple, models: Sequence[Any]) -> Any | None:
    """The layout kept for ``target`` under ``key``, if it was built for ``models``' current
    parameters (else it is dropped and None returned); marks it the most recently used."""
    table = _LAYOUTS.get(target)
    if table is None or key not in table:
        return None
    layout, weights = table[key]
    if not _matches(weights, models):
        del table[key]  # the weights moved or were replaced: the old layout's graphs read stale addresses
        return None
    table.move_to_end(key)
    return layout


def keep_layout(target: torch.nn.Module, key: tuple, models: Sequence[Any], layout: Any) -> None:
    """Keep ``layout`` for ``target`` under ``key`` (built for ``models``' current parameters),
    dropping the least recently used beyond :data:`SESSION_CACHE_SIZE`."""
    table = _LAYOUTS.get(target)
    if table is None:
        table = _LAYOUTS[target] = OrderedDict()
    for dead in [k for k in table if _is_dead(k)]:
        del table[dead]
    table[key] = (layout, _weights_of(models))
    table.move_to_end(key)
    _drop_when_freed(key, table)
    while len(table) > SESSION_CACHE_SIZE:
        table.popitem(last=False)


def _drop_when_freed(key: tuple, table: "OrderedDict[tuple, Any]") -> None:
    """Forget ``table[key]`` when a model that ``key`` names by weak reference is freed (the
    table is held weakly too: a freed target's table goes with it)."""
    held = weakref.ref(table)

    def drop() -> None:
        alive = held()
        if alive is not None:
            alive.pop(key, None)

    for part in _flatten(key):
        if isinstance(part, weakref.ref) and part() is not None:
            weakref.finalize(part(), drop)


def _flatten(key: Any) -> list[Any]:
    if isinstance(key, tuple):
        return [leaf for part in key for leaf in _flatten(part)]
    return [key]


def _is_dead(key: tuple) -> bool:
    return any(isinstance(part, weakref.ref) and part() is None for part in _flatten(key))
