"""What a verified tree step says about each node: offered (its parent was accepted) and
accepted (it is on the accepted path). Builders that learn online (calibrated dynamic trees,
Sequoia shapes re-planned by depth) read these from the accepted path the engine reports.

>>> import torch
>>> parents = torch.tensor([[-1, 0, 0, 1, 1]])
>>> offered, accepted = path_outcomes(parents, torch.tensor([5]), torch.tensor([[0, 1, -1]]))
>>> offered.int().tolist(), accepted.int().tolist()
([[0, 1, 1, 1, 1]], [[0, 1, 0, 0, 0]])
>>> sibling_rank(parents, torch.tensor([5])).tolist()
[[0, 0, 1, 0, 1]]
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

__all__ = ["NodeRecord", "path_outcomes", "sibling_rank"]


class NodeRecord(NamedTuple):
    """Per-node features of a built tree, kept until its step's outcome arrives.

    Shape:
        parents: ``[b, N]`` int64; num_nodes: ``[b]`` int64; probs: ``[b, N]`` float (the draft
        probability of each node's token); depth, rank: ``[b, N]`` int64.
    """

    parents: Tensor
    num_nodes: Tensor
    probs: Tensor
    depth: Tensor
    rank: Tensor


def path_outcomes(parents: Tensor, num_nodes: Tensor, accepted_nodes: Tensor) -> tuple[Tensor | None, Tensor | None]:
    """``(offered, accepted)`` bool ``[b, N]``: non-root real nodes whose parent is on the
    accepted path, and those on the path themselves. ``(None, None)`` when ``accepted_nodes``
    does not describe this batch of trees (another row count).

    Shape:
        parents: ``[b, N]`` int64; num_nodes: ``[b]`` int64; accepted_nodes: ``[b, D + 1]``
        int64, root first, ``-1`` padded.
    """
    if accepted_nodes.dim() != 2 or accepted_nodes.shape[0] != parents.shape[0]:
        return None, None
    b, N = parents.shape
    nodes = accepted_nodes.to(parents.device)
    on_path = torch.zeros((b, N + 1), dtype=torch.bool, device=parents.device)
    on_path.scatter_(1, torch.where((nodes >= 0) & (nodes < N), nodes, torch.full_like(nodes, N)), True)
    on_path = on_path[:, :N]
    index = torch.arange(N, device=parents.device)[None, :]
    real = (index < num_nodes.to(parents.device)[:, None]) & (index > 0)
    offered = on_path.gather(1, parents.clamp_min(0)) & real
    return offered, on_path & offered


def sibling_rank(parents: Tensor, num_nodes: Tensor) -> Tensor:
    """Each node's rank among its siblings (index order; the root 0).

    Shape:
        parents, returns: ``[b, N]`` int64; num_nodes: ``[b]`` int64.
    """
    N = parents.shape[1]
    index = torch.arange(N, device=parents.device)
    real = index[None, :] < num_nodes[:, None]
    same = (parents[:, :, None] == parents[:, None, :]) & real[:, None, :] & (index[None, None, :] < index[None, :, None])
    return same.sum(2) * real


class RankDepthCounts:
    """How often the child of rank ``r`` of a node at depth ``d - 1`` was *tried* (its parent
    accepted and its earlier siblings rejected) and *accepted*, per ``(d, r)``: the conditional
    acceptance by rank and depth that re-planned Sequoia shapes use.

    Depths past ``max_depth`` and ranks past ``max_rank`` share the last row / column.

    >>> import torch
    >>> counts = RankDepthCounts(max_depth=2, max_rank=1)
    >>> counts.update(torch.tensor([[-1, 0, 0, 1]]), torch.tensor([4]), torch.tensor([[0, 2, -1]]))
    >>> counts.tried.tolist(), counts.accepted.tolist()
    ([[1.0, 1.0], [0.0, 0.0]], [[0.0, 1.0], [0.0, 0.0]])
    """

    def __init__(self, max_depth: int = 16, max_rank: int = 7) -> None:
        self.max_depth, self.max_rank = max_depth, max_rank
        self.tried = torch.zeros((max_depth, max_rank + 1), dtype=torch.float64)
        self.accepted = torch.zeros_like(self.tried)

    def update(self, parents: Tensor, num_nodes: Tensor, accepted_nodes: Tensor) -> None:
        """Add one verified step of trees ``(parents, num_nodes)`` whose accepted paths are
        ``accepted_nodes`` (root first, ``-1`` padded); ignored when the rows do not match.

        Shape:
            parents: ``[b, N]`` int64; num_nodes: ``[b]`` int64; accepted_nodes: ``[b, D + 1]`` int64.
        """
        offered, accepted = path_outcomes(parents, num_nodes, accepted_nodes)
        if offered is None:
            return
        b, N = parents.shape
        rank = sibling_rank(parents, num_nodes)
        # rank of the accepted child of each node (N + 1 when none): later siblings were never tried
        accepted_rank = torch.full((b, N + 1), N + 1, dtype=torch.long, device=parents.device)
        accepted_rank.scatter_(1, torch.where(accepted, parents, torch.full_like(parents, N)), rank)
        tried = offered & (rank <= accepted_rank[:, :N].gather(1, parents.clamp_min(0)))
        depth = torch.zeros_like(parents)
        for i in range(1, N):  # topological order
            depth[:, i] = depth.gather(1, parents[:, i: i + 1].clamp_min(0))[:, 0] + 1
        d = (depth - 1).clamp(0, self.max_depth - 1).cpu()
        r = rank.clamp(0, self.max_rank).cpu()
        flat = d * (self.max_rank + 1) + r
        size = self.tried.numel()
        self.tried += torch.bincount(flat[tried.cpu()], minlength=size).view_as(self.tried).double()
        self.accepted += torch.bincount(flat[accepted.cpu()], minlength=size).view_as(self.tried).double()

    def conditional(self, prior: Tensor, pooled_weight: float, depth_weight: float) -> Tensor:
        """``[max_depth, max_rank + 1]`` float64 conditional rates, shrunk towards the rates
        pooled over depths, themselves shrunk towards ``prior`` (``[max_rank + 1]``)."""
        pooled = (self.accepted.sum(0) + pooled_weight * prior) / (self.tried.sum(0) + pooled_weight)
        return (self.accepted + depth_weight * pooled) / (self.tried + depth_weight)
