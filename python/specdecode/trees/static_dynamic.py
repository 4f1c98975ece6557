"""EAGLE-2 dynamic trees grown on the device, for the static decode path
(:func:`~specdecode.trees.static_draft.grow_static_tree` with a ``"dynamic"`` plan): the same
trees as the eager :class:`~specdecode.trees.builders.DynamicTree` with ``calibrated=False``.

A plan of ``D`` levels, ``k = top_k`` and ``N = num_nodes`` grows per row:

- level 1: the root's ``k`` most likely children; every later level: the ``k`` children of each
  of the ``k`` *frontier* nodes, the candidates of the level before with the highest path
  values (the sum of the draft's log-probabilities along the path), fed to the draft in one
  forward. Level ``d``'s candidates are nodes ``first(d) .. first(d) + k^2 - 1`` (``k`` at
  level 1), in the frontier's order, each frontier node's children by rank; the frontier fed
  after level ``d`` sits at offsets ``1 + (d - 1) k .. d k`` after the root.
- after the last level, the ``N`` nodes of highest path value (root first) form the tree, in
  node order (topological).

Per level: one ``topk`` over the frontier's logits, one add of the path values, one stable sort
of the candidates (ties to the lower index, as the eager builder's; its first ``k`` values are
the new frontier's), a gather of the chosen candidates' tokens, their parents' positions, their
mask rows, and the draft forward (its inputs:
:class:`~specdecode.trees.static_growth.LevelInputs`). Node ids, parents and offsets are worked
out once at the end, from the chosen candidates of every level and index tables made once per
layout.

Why the best ``N`` nodes need no pass over the ancestors (the eager
:func:`~specdecode.trees.dynamic.prune_to_budget` ranks by the minimum value along each path
to make the chosen set closed under ancestors): here a child's value is its parent's plus a
log-probability, never more than its parent's, and a parent's index is lower than its
children's. Non-finite values become ``-1e30`` and values are clamped there, which keeps that
order; so in a stable sort by value every node comes after its parent, and any prefix of the
order holds its nodes' ancestors. (The eager builder keeps finite values below ``-1e30`` as they
are: the two may fill a budget larger than the finite candidates differently.)

About 8 kernels a level and 14 at the end, besides the draft forwards (``python
benchmarks/bench_tree_kernels.py --names`` lists them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from specdecode.trees.static_calibration import device_calibration
from specdecode.trees.static_growth import LevelInputs, StaticExpand, StaticTreeDraft, StaticTreePlan

#: Path values below this (and non-finite ones) count as this: see the module docstring.
FLOOR = -1e30


@dataclass
class _DynamicConstants:
    """Index tables of a dynamic plan, made once per layout (``W`` candidates, root included;
    ``F = (D - 1) k`` frontier nodes fed after the root). The parents' table of a step is
    ``[W (no parent), 0 (the root), the frontier's node ids...]``."""

    root_value: Tensor  # [B, 1] float32 zeros: the root's path value
    head: Tensor  # [B, 2] int64: W and 0, the parents' table before the frontier
    id_offsets: Tensor  # [1, 2 + F]: 0, 0, then the node id of each frontier node's level's first candidate
    parent_slot: Tensor  # [W]: each candidate's parent in the parents' table
    fed_offsets: Tensor  # [B, F]: the offset each frontier node is fed at
    unfed: Tensor  # [1, W]: 0 at the root, -1 elsewhere
    no_index: Tensor  # [1, W + 1]: -1
    slot: Tensor  # [B, N]: 0 .. N - 1
    num_nodes: Tensor  # [B]: N


def _dynamic_constants(plan: StaticTreePlan, batch: int, device: torch.device) -> _DynamicConstants:
    k, D = plan.top_k, plan.max_depth
    first = [1] + [1 + k + (d - 2) * k * k for d in range(2, D + 1)]  # node id of level d's first candidate
    frontier_first = [first[d - 1] for d in range(1, D) for _ in range(k)]  # the frontier after level d
    parent_slot = [0] + [1] * k  # the root (no parent), then level 1 (children of the root)
    for d in range(2, D + 1):
        parent_slot += [2 + (d - 2) * k + j // k for j in range(k * k)]
    W = len(parent_slot)

    def t(values: list[int], rows: int | None = None) -> Tensor:
        values = torch.tensor(values, dtype=torch.long, device=device)
        return values[None, :] if rows is None else values.expand(rows, -1).contiguous()

    return _DynamicConstants(torch.zeros((batch, 1), dtype=torch.float32, device=device), t([W, 0], batch),
                             t([0, 0] + frontier_first), t(parent_slot)[0], t(list(range(1, (D - 1) * k + 1)), batch),
                             t([0] + [-1] * (W - 1)), t([-1] * (W + 1)), t(list(range(plan.num_nodes)), batch),
                             t([plan.num_nodes] * batch)[0])


def grow_dynamic(plan: StaticTreePlan, state: Any, root_tokens: Tensor, root_logits: Tensor, expand: StaticExpand,
                 inputs: LevelInputs) -> StaticTreeDraft:
    """One EAGLE-2 tree per row by the dynamic ``plan`` (module docstring).

    Shape:
        root_tokens: ``[B]`` int64; root_logits: ``[B, V]``; returns ``N = plan.num_nodes`` nodes.
    """
    B, k, D, N = root_tokens.shape[0], plan.top_k, plan.max_depth, plan.num_nodes
    c = state.buffer(f"static_tree_dynamic:{plan.key}", lambda: _dynamic_constants(plan, B, root_tokens.device))
    calibration = device_calibration(state, plan)
    table = None if calibration is None else calibration.refit()  # the log rates of this step
    log_q = torch.log_softmax(root_logits.float(), -1)[:, None]  # [B, frontier, V]
    base = c.root_value  # [B, frontier]: the frontier's path values
    values, tokens, chosen_all, cells = [base], [root_tokens[:, None]], [], [c.head[:, 1:]]  # the root: cell 0
    for depth in range(1, D + 1):
        top = log_q.topk(k, dim=-1)  # [B, f, k]
        if calibration is not None and table is not None:
            factors, level_cells = calibration.log_factors(table, top.values, depth)
            level_values = (base[:, :, None] + factors.view_as(top.values)).flatten(1)
            cells.append(level_cells)
        else:
            level_values = (base[:, :, None] + top.values).flatten(1)
        level_tokens = top.indices.flatten(1)
        values.append(level_values)
        tokens.append(level_tokens)
        if depth == D:
            break
        ranked = torch.sort(level_values, dim=1, descending=True, stable=True)
        chosen, base = ranked.indices[:, :k], ranked.values[:, :k]  # the next frontier and its path values
        chosen_all.append(chosen)
        columns = inputs.columns[:, 1 + (depth - 1) * k: 1 + depth * k]
        level = inputs.level(level_tokens.gather(1, chosen), torch.div(chosen, k, rounding_mode="floor"), columns,
                             depth)
        log_q = torch.log_softmax(expand(level).float(), -1)
    values_all = torch.cat(values, 1)
    key = torch.where(values_all > FLOOR, values_all, FLOOR)  # NaN and -inf too (+inf cannot occur)
    keep = torch.sort(torch.sort(key, dim=1, descending=True, stable=True).indices[:, :N], dim=1).values
    all_tokens = torch.cat(tokens, 1)
    ids = torch.cat([c.head, *chosen_all], 1) + c.id_offsets if chosen_all else c.head  # the parents' table
    parents = ids.index_select(1, c.parent_slot)
    offsets = c.unfed.expand(B, -1)
    if chosen_all:
        offsets = offsets.scatter(1, ids[:, 2:], c.fed_offsets)
    new_index = c.no_index.expand(B, -1).scatter(1, keep, c.slot)  # old node id -> new; W (no parent) -> -1
    new_parents = new_index.gather(1, parents.gather(1, keep))
    kept_cells = torch.cat(cells, 1).gather(1, keep) if calibration is not None else None
    return StaticTreeDraft(all_tokens.gather(1, keep), new_parents, c.num_nodes, None, offsets.gather(1, keep),
                           full=True, cells=kept_cells)
