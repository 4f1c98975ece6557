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
