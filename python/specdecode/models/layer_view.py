"""A view of a Hugging Face causal LM that runs only some of its decoder layers, on the same
weights: the model's own forward (embeddings, rotary embeddings, masks, final norm, LM head)
over a shorter layer list.

How the view is built (nothing is copied but Python objects; every parameter and buffer is the
model's own tensor):

- the ``*ForCausalLM`` module and the modules on the path to the layer list (``model``,
  ``model.decoder``, ...) are *shallow clones*: new module objects whose submodules, parameters
  and buffers are the original ones, except the layer list, which holds the chosen layers;
- those clones get a copy of the model's config with ``num_hidden_layers`` set to the number of
  chosen layers and the per-layer lists (``layer_types``, ...) re-indexed, because the model's
  forward walks ``layers[: config.num_hidden_layers]`` and picks each layer's mask by index;
- a chosen layer that sits at its original index (the first ``k`` layers) is the original
  module; a layer that moves (a subset such as ``[0, 2, 5]``) is cloned with all its
  submodules, and every clone with a ``layer_idx`` gets its new index: attention modules
  address the KV cache by ``layer_idx``, and the view's cache has one entry per chosen layer;
- a method or ``functools.partial`` bound to an original module (an ``accelerate`` hook wraps
  ``forward`` that way) is re-bound to its clone, so the clone runs its own submodules.

Per-layer facts fixed at construction (a sliding window, GPT-2's ``1 / (layer_idx + 1)``
attention scaling) stay those of the original layer, which is what the layer computes in the
full model.
"""

from __future__ import annotations

import copy
import functools
import types
from collections.abc import Sequence
from typing import Any

import torch

from specdecode.models.facts import decoder_layers, decoder_layers_path

# Config attributes that hold one entry per decoder layer (re-indexed for the view).
PER_LAYER_CONFIG = ("layer_types", "layers_block_type", "no_rope_layers", "layer_rope_theta", "sliding_windows")


def layer_subset_view(model: torch.nn.Module, layers: Sequence[int]) -> torch.nn.Module:
    """A module that computes ``model``'s logits with only the decoder layers ``layers`` (in
    that order), sharing every parameter with ``model``.

    ``layers`` must be strictly increasing indices into the model's decoder-layer list
    (:func:`~specdecode.models.facts.decoder_layers`); the caller checks that. The view
    behaves like the model class it clones (``forward``, ``config``, ``get_input_embeddings``).
    Raises ``ValueError`` (naming ``layers``) when a moved layer has no ``layer_idx`` to
    renumber.
    """
    path = decoder_layers_path(model).split(".")
    full = decoder_layers(model)
    total = len(full)
    chosen: list[torch.nn.Module] = []
    for new_index, old_index in enumerate(layers):
        layer = full[old_index]
        chosen.append(layer if new_index == old_index else _renumbered(layer, old_index, new_index))

    # Modules of one model may share a config object: they share its view too. A list searched by
    # identity, not a dict keyed by id(): it lives for this call only, but identity needs no argument.
    configs: list[tuple[Any, Any]] = []

    def view_config(config: Any) -> Any:
        for original, view in configs:
            if original is config:
                return view
        configs.append((config, _subset_config(config, layers, total)))
        return configs[-1][1]

    root = _shallow_clone(model)
    parent = root
    for name in path[:-1]:
        child = _shallow_clone(parent._modules[name])
        parent._modules[name] = child
        parent = child
    parent._modules[path[-1]] = torch.nn.ModuleList(chosen)
    for module in _path_modules(root, path[:-1]):
        config = module.__dict__.get("config")
        if config is not None and hasattr(config, "num_hidden_layers"):
            module.__dict__["config"] = view_config(config)
    return root


def _path_modules(root: torch.nn.Module, names: list[str]) -> list[torch.nn.Module]:
    modules = [root]
    for name in names:
        modules.append(modules[-1]._modules[name])
    return modules


def _subset_config(config: Any, layers: Sequence[int], total: int) -> Any:
    view = copy.deepcopy(config)
    for name in PER_LAYER_CONFIG:
        values = getattr(config, name, None)
        if isinstance(values, (list, tuple)) and len(values) == total:
            setattr(view, name, type(values)(values[i] for i in layers))
    view.num_hidden_layers = len(layers)
    return view


def _shallow_clone(module: torch.nn.Module) -> torch.nn.Module:
    """A new module object with the same submodules, parameters, buffers and hooks (its own
    dictionaries of them, so that replacing one in the clone leaves ``module`` untouched)."""
    clone = copy.copy(module)
    state = clone.__dict__
    for key, value in list(state.items()):
        if isinstance(value, (dict, set)):
            state[key] = copy.copy(value)
        elif isinstance(value, types.MethodType) and value.__self__ is module:
            state[key] = types.MethodType(value.__func__, clone)
        elif isinstance(value, functools.partial) and value.args and value.args[0] is module:
            rebound = functools.partial(value.func, clone, *value.args[1:], **value.keywords)
            state[key] = functools.update_wrapper(rebound, value)
    return clone


def _renumbered(layer: torch.nn.Module, old_index: int, new_index: int) -> torch.nn.Module:
    """A clone of ``layer`` and all its submodules (parameters shared) in which every
    ``layer_idx`` equal to ``old_index`` becomes ``new_index``."""
    # original -> clone for modules shared within the layer; the entry keeps the original alive
    # for this call, so its id() cannot be taken by another object meanwhile.
    clones: dict[int, tuple[torch.nn.Module, torch.nn.Module]] = {}
    renumbered = 0

    def clone_tree(module: torch.nn.Module) -> torch.nn.Module:
        nonlocal renumbered
        if id(module) in clones:
            return clones[id(module)][1]
        clone = _shallow_clone(module)
        clones[id(module)] = (module, clone)
        for name, child in module._modules.items():
            if child is not None:
                clone._modules[name] = clone_tree(child)
        index = clone.__dict__.get("layer_idx")
        if isinstance(index, int) and not isinstance(index, bool) and index == old_index:
            clone.__dict__["layer_idx"] = new_index
            renumbered += 1
        return clone

    result = clone_tree(layer)
    if renumbered == 0:
        raise ValueError(
            f"layers: decoder layer {old_index} ({type(layer).__name__}) has no layer_idx to renumber, so it cannot "
            f"run as layer {new_index} of a shorter model; choose the first k layers (num_layers=k) instead"
        )
    return result
