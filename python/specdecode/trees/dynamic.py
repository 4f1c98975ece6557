"""Value-based dynamic trees (EAGLE-2 style): batched tensor functions for the drafter.

The drafter grows a tree depth by depth. Every node carries its path value: the product of the
draft probabilities along its path from the root, kept as a sum of logs so long paths do not
underflow (the root's value is ``log 1 = 0``). At each depth it keeps the best frontier nodes
(:func:`select_frontier`) and gives each of them its top-k children; after the last depth it
keeps the best ``num_nodes`` nodes overall (:func:`prune_to_budget`).

Since probabilities are at most 1, a node's path value never exceeds its parent's, so the best
nodes form a tree: each kept node's ancestors are kept. Ties (a child with probability 1) are
broken towards the lower index, and a parent's index is lower than its children's, so this
still holds with ties. For robustness the pruning ranks nodes by the minimum value along their
path, which is their own value whenever values do not increase along paths and guarantees a
closed set in every case.

These trees are lossless only with deterministic children (the top-k of the draft, verified by
the deterministic rule, or greedy at temperature 0). Do not use them to re-rank sampled
children for SpecInfer or recursive rejection sampling: see :mod:`specdecode.trees.shapes`.

Both functions check their inputs (shapes, dtypes, parent ranges, NaN) and raise ValueError /
TypeError naming the argument; the value checks read the tensors back to the host.

>>> import torch, math
>>> parents = torch.tensor([[-1, 0, 0, 1, 1]])
>>> log_values = torch.log(torch.tensor([[1.0, 0.6, 0.3, 0.4, 0.1]]))
>>> out = prune_to_budget(parents, log_values, torch.tensor([5]), num_nodes=3)
>>> out.keep.tolist(), out.parents.tolist(), out.num_nodes.tolist()
([[0, 1, 3]], [[-1, 0, 1]], [3])
>>> select_frontier(log_values, torch.tensor([[False, True, True, True, True]]), k=2).tolist()
[[1, 3]]
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

__all__ = ["PrunedTree", "best_first", "prune_on_device", "prune_to_budget", "select_frontier"]


class PrunedTree(NamedTuple):
    """The kept part of a tree, re-indexed (see :func:`prune_to_budget`).

    Shape:
        keep: ``[B, num_nodes]`` int64 — old index of each new node, increasing (topological);
            padding columns hold 0.
        parents: ``[B, num_nodes]`` int64 — new parent indices; ``parents[:, 0] = -1``;
            padding columns hold 0.
        num_nodes: ``[B]`` int64 — kept nodes per row: ``min(num_nodes, num_valid)``.
    """

    keep: Tensor
    parents: Tensor
    num_nodes: Tensor


def _check_positive_int(value: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name}: expected >= 1, got {value}")
    return value


def _check_log_values(values: Tensor, name: str) -> None:
    if not isinstance(values, Tensor) or not values.dtype.is_floating_point:
        raise TypeError(f"{name}: expected a floating tensor [B, N] of log path values, got "
                        f"{getattr(values, 'dtype', type(values).__name__)}")
    if values.dim() != 2:
        raise ValueError(f"{name}: expected shape [B, N], got {tuple(values.shape)}")


def _check_no_nan(values: Tensor, name: str, where: Tensor) -> None:
    if bool((torch.isnan(values) & where).any()):
        raise ValueError(f"{name}: NaN path value at a valid node")


def _stable_order(key: Tensor, valid: Tensor) -> Tensor:
    """Indices sorting each row by ``key`` descending, ties by lower index, invalid last."""
    order = torch.sort(key, dim=1, descending=True, stable=True).indices
    invalid_in_order = (~valid).gather(1, order).to(torch.uint8)
    return order.gather(1, torch.sort(invalid_in_order, dim=1, stable=True).indices)


def select_frontier(path_log_values: Tensor, valid: Tensor, k: int) -> Tensor:
    """The ``k`` valid frontier nodes with the largest path values, per row.

    Args:
        path_log_values: log path value of each frontier node (any float dtype).
        valid: which entries are real nodes; values at invalid entries are ignored.
        k: how many to keep.

    Returns:
        indices, best first, ties broken towards the lower index; a row with fewer than
        ``k`` valid nodes is padded with ``-1``.

    Shape:
        path_log_values: ``[B, F]``; valid: ``[B, F]`` bool; returns ``[B, min(k, F)]`` int64.
    """
    k = _check_positive_int(k, "k")
    _check_log_values(path_log_values, "path_log_values")
    if not isinstance(valid, Tensor) or valid.dtype != torch.bool:
        raise TypeError(f"valid: expected a bool tensor [B, F], got "
                        f"{getattr(valid, 'dtype', type(valid).__name__)}")
    if valid.shape != path_log_values.shape:
        raise ValueError(f"valid: expected shape {tuple(path_log_values.shape)} (that of "
                         f"path_log_values), got {tuple(valid.shape)}")
    if valid.device != path_log_values.device:
        raise ValueError(f"valid: expected device {path_log_values.device}, got {valid.device}")
    _check_no_nan(path_log_values, "path_log_values", valid)
    order = _stable_order(path_log_values, valid)[:, : min(k, valid.shape[1])]
    return torch.where(valid.gather(1, order), order, torch.full_like(order, -1))


def _ancestor_minimum(key: Tensor, parent_index: Tensor) -> Tensor:
    """Minimum of ``key`` over each node and all its ancestors, by pointer doubling.

    ``parent_index`` must map the root (and padding) to itself (index 0): after round ``t``,
    ``key`` covers ``2^t`` nodes of each path and ``jump`` points ``2^t`` levels up. A path has
    at most ``N - 1`` nodes below the root (whose key is the maximum anyway).
    """
    jump, covered = parent_index, 1
    while covered < key.shape[1] - 1:
        key = torch.minimum(key, key.gather(1, jump))
        jump = jump.gather(1, jump)
        covered *= 2
    return key


def prune_to_budget(parents: Tensor, path_log_values: Tensor, num_valid: Tensor,
                    num_nodes: int) -> PrunedTree:
    """Keep the ``num_nodes`` best nodes of each row (root included), closed under ancestors.

    Nodes are ranked by path value, best first, ties towards the lower index; the root always
    comes first (its value is ignored). Kept nodes stay in their original (topological) order and
    their parents are re-indexed. Padding columns (``j >= out.num_nodes[b]``) hold ``keep = 0``
    and ``parents = 0``: gathering with ``keep`` stays in range and the row passes a parent
    range check; like every padding column of a token tree they carry no meaning.

    Args:
        parents: row ``b`` is a tree in topological order over ``[0, num_valid[b])``:
            ``parents[b, 0] = -1``, ``0 <= parents[b, i] < i``; the rest is ignored.
        path_log_values: log of the product of draft probabilities along each node's path.
        num_valid: real nodes per row, ``1 <= num_valid[b] <= M``.
        num_nodes: the budget per row, root included.

    Shape:
        parents: ``[B, M]`` int64; path_log_values: ``[B, M]`` float; num_valid: ``[B]`` int64;
        returns :class:`PrunedTree` with ``[B, num_nodes]`` tensors.
    """
    num_nodes = _check_positive_int(num_nodes, "num_nodes")
    if not isinstance(parents, Tensor) or parents.dtype != torch.int64:
        raise TypeError(f"parents: expected an int64 tensor [B, M], got "
                        f"{getattr(parents, 'dtype', type(parents).__name__)}")
    if parents.dim() != 2 or parents.shape[1] < 1:
        raise ValueError(f"parents: expected shape [B, M] with M >= 1, got {tuple(parents.shape)}")
    batch, width = parents.shape
    if not isinstance(num_valid, Tensor) or num_valid.dtype != torch.int64:
        raise TypeError(f"num_valid: expected an int64 tensor [B], got "
                        f"{getattr(num_valid, 'dtype', type(num_valid).__name__)}")
    if num_valid.shape != (batch,):
        raise ValueError(f"num_valid: expected shape [{batch}], got {tuple(num_valid.shape)}")
    _check_log_values(path_log_values, "path_log_values")
    if path_log_values.shape != parents.shape:
        raise ValueError(f"path_log_values: expected shape {tuple(parents.shape)} (that of "
                         f"parents), got {tuple(path_log_values.shape)}")
    for name, tensor in (("path_log_values", path_log_values), ("num_valid", num_valid)):
        if tensor.device != parents.device:
            raise ValueError(f"{name}: expected device {parents.device}, got {tensor.device}")
    if bool(((num_valid < 1) | (num_valid > width)).any()):
        raise ValueError(f"num_valid: expected 1 <= num_valid[b] <= {width}, got "
                         f"{num_valid.tolist()}")
    column = torch.arange(width, device=parents.device)
    valid = column[None, :] < num_valid[:, None]
    _check_no_nan(path_log_values, "path_log_values", valid)
    if bool((parents[:, 0] != -1).any()):
        raise ValueError("parents: the root's parent parents[b, 0] must be -1 in every row")
    bad = valid[:, 1:] & ((parents[:, 1:] < 0) | (parents[:, 1:] >= column[None, 1:]))
    if bool(bad.any()):
        b, i = (int(x) for x in torch.nonzero(bad)[0])
        raise ValueError(f"parents[{b}, {i + 1}]: expected 0 <= parent < {i + 1} (topological "
                         f"order), got {int(parents[b, i + 1])}")
    return prune_on_device(parents, path_log_values, num_valid, num_nodes)


def best_first(path_log_values: Tensor, k: int) -> Tensor:
    """The ``k`` nodes with the largest path values per row, best first, ties towards the lower
    index: :func:`select_frontier` over all-valid nodes, without its checks (no host read, so it
    can run inside a CUDA graph; the caller vouches for its input). Shape: ``[B, F]`` float ->
    ``[B, min(k, F)]`` int64."""
    valid = torch.ones_like(path_log_values, dtype=torch.bool)
    return _stable_order(path_log_values, valid)[:, : min(k, path_log_values.shape[1])]


def prune_on_device(parents: Tensor, path_log_values: Tensor, num_valid: Tensor, num_nodes: int) -> PrunedTree:
    """:func:`prune_to_budget` without its checks: tensor operations only, no host read (so it
    can run inside a CUDA graph); the caller vouches for its inputs. Same shapes."""
    batch, width = parents.shape
    column = torch.arange(width, device=parents.device)
    valid = column[None, :] < num_valid[:, None]

    # Rank key: the root first, then the minimum value along the path (closure, see module doc).
    parent_index = torch.where(valid & (column[None, :] > 0), parents, torch.zeros_like(parents))
    key = torch.where(valid, path_log_values, torch.full_like(path_log_values, -torch.inf))
    key[:, 0] = torch.inf
    key = _ancestor_minimum(key, parent_index)
    order = _stable_order(key, valid)

    kept_count = num_valid.clamp(max=num_nodes)
    slot = torch.arange(num_nodes, device=parents.device)
    in_budget = slot[None, :] < kept_count[:, None]
    if num_nodes > width:
        order = torch.cat([order, order.new_zeros(batch, num_nodes - width)], dim=1)
    chosen = torch.where(in_budget, order[:, :num_nodes], torch.full_like(in_budget, width,
                                                                          dtype=torch.int64))
    keep = torch.sort(chosen, dim=1).values                   # topological: increasing index
    keep = torch.where(in_budget, keep, torch.zeros_like(keep))

    # old index -> new index, for kept nodes (padding slots write to a spare last column)
    new_index = torch.zeros(batch, width + 1, dtype=torch.int64, device=parents.device)
    new_index.scatter_(1, torch.where(in_budget, keep, torch.full_like(keep, width)),
                       slot.expand(batch, num_nodes).clone())
    old_parent = parent_index.gather(1, keep)
    new_parents = new_index.gather(1, old_parent)
    new_parents[:, 0] = -1
    new_parents = torch.where(in_budget | (slot[None, :] == 0), new_parents,
                              torch.zeros_like(new_parents))
    return PrunedTree(keep, new_parents, kept_count)
