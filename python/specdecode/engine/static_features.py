"""Target features on the static decode path: the target's hidden states that a feature drafter
(EAGLE, Medusa, Hydra: a drafter with ``feature_layers``) reads, handed over on the device.

The buffer
----------
:attr:`StaticState.features <specdecode.engine.static_state.StaticState.features>` is one
``[B, capacity, F]`` tensor (the target's dtype; ``F`` = hidden size x number of feature
layers) laid out on the columns of the static caches (:mod:`specdecode.models.static_cache`).
Every target forward that writes keys and values at some columns writes its features at the
same columns, from the same forward (asked for its hidden states, which leaves its logits as
they are):

- the prefill: the prompt's committed columns ``[0, prompt_columns)``;
- each step's score forward: the pending column and the drafts, ``lengths .. lengths + gamma``.

Validity is the KV cache's: column ``c`` of row ``b`` holds the feature of a committed token
exactly when ``start[b] <= c < lengths[b]``. Committing a step moves ``lengths`` past the
pending token and the accepted drafts only, so after verification the accepted features are the
valid ones and the rejected drafts' features lie beyond the length, stale, to be overwritten;
no copy, no host decision. A drafter reads the buffer inside its step
(:func:`specdecode.drafters.last_feature.static_features_at`): Medusa and Hydra the column
``lengths - 1``, EAGLE the window of columns before the pending one.

The buffer is allocated at the first prefill of its layout (outside any graph) and keeps its
address for the layout's lifetime, as the caches do, so recorded graphs replay on its contents.

For token trees
---------------
A tree step scores ``N`` nodes at columns ``lengths .. lengths + N - 1`` (the root, the pending
token, first): the score forward writes the nodes' features there through the same
:func:`target_forward`. Once the accepted path (node indices ``path [B, D + 1]``, root first)
is known, the path's features are moved where a chain would have put them, the same move as
the keys and values: ``features[b, lengths + j] = features[b, lengths + path[b, j]]`` for
``j <= accepted``, a gather of the path's columns into a temporary then a scatter (the columns
overlap); :func:`move_columns` does it. After that the buffer obeys the rule above and a
drafter reads it as after a chain step.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from specdecode.models import facts

__all__ = ["drafter_modules", "feature_layers_of", "move_columns", "target_forward", "write_features"]


def feature_layers_of(target: torch.nn.Module, drafter: Any) -> tuple[int, ...] | None:
    """The target hidden states ``drafter`` reads (its ``feature_layers``, checked against
    ``target`` with a ``ValueError`` naming them), or None for a drafter that reads none."""
    layers = getattr(drafter, "feature_layers", None)
    if layers is None:
        return None
    return facts.check_feature_layers(target, layers, f"{type(drafter).__name__}.feature_layers")


def drafter_modules(drafter: Any) -> tuple[Any, ...]:
    """What a drafter's static steps read parameters from, besides the target: its ``model`` (a
    draft model, an EAGLE network), its ``heads`` (Medusa, Hydra) and the ``target`` a feature
    drafter was built for (its embeddings and LM head). Entries a drafter lacks are None."""
    return tuple(getattr(drafter, name, None) for name in ("model", "heads", "target"))


def write_features(state: Any, features: Tensor, columns: Tensor) -> None:
    """Write a target forward's ``features`` at its ``columns`` of ``state.features``
    (allocated on first use, zeros: never NaN, so garbage columns stay harmless under masks).

    Shape:
        features: ``[B, n, F]``; columns: ``[B, n]`` int64 in ``[0, capacity)``.
    """
    B, n, F = features.shape
    if state.features is None:
        state.features = torch.zeros((B, state.capacity, F), dtype=features.dtype, device=features.device)
    buffer = state.features
    if buffer.shape != (B, state.capacity, F) or buffer.dtype != features.dtype:
        raise RuntimeError(f"static features: the layout holds {tuple(buffer.shape)} {buffer.dtype} features, a "
                           f"forward gave {tuple(features.shape)} {features.dtype}")
    buffer.scatter_(1, columns[:, :, None].expand(B, n, F), features)


def target_forward(target: torch.nn.Module, ids: Tensor, mask: Tensor, positions: Tensor, cache: Any, state: Any,
                   layers: tuple[int, ...] | None, *, last_only: bool, logits_to_keep_ok: bool) -> Tensor:
    """One target forward on the static caches (``cache.columns`` set); with ``layers``, also
    writes its features at those columns (:func:`write_features`). Returns its logits, as
    :func:`specdecode.models.facts.forward`.

    Shape:
        ids, positions: ``[B, n]`` int64; mask: ``[B, 1, n, capacity]``; returns ``[B, V]``
        (``last_only``) or ``[B, n, V]``.
    """
    if layers is None:
        return facts.forward(target, ids, mask, positions, cache, last_only=last_only,
                             logits_to_keep_ok=logits_to_keep_ok)
    logits, features = facts.forward_with_features(target, ids, mask, positions, cache, layers=layers,
                                                   last_only=last_only, logits_to_keep_ok=logits_to_keep_ok)
    write_features(state, features, cache.columns)
    return logits


def move_columns(buffer: Tensor, source: Tensor, destination: Tensor) -> None:
    """``buffer[b, destination[b, j]] = buffer[b, source[b, j]]`` for every ``j``, reading every
    source before writing (the columns may overlap): how a tree's accepted path is moved onto
    the chain columns.

    Shape:
        buffer: ``[B, capacity, F]``; source, destination: ``[B, m]`` int64 in ``[0, capacity)``.
    """
    B, m = source.shape
    F = buffer.shape[-1]
    moved = buffer.gather(1, source[:, :, None].expand(B, m, F))
    buffer.scatter_(1, destination[:, :, None].expand(B, m, F), moved)
