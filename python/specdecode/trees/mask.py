"""Attention inputs of a token-tree forward pass: positions and masks (compiled op).

>>> import torch
>>> from specdecode.trees import TokenTree, tree_attention_mask
>>> tree = TokenTree(torch.tensor([[5, 7, 8]]), torch.tensor([[-1, 0, 0]]), torch.tensor([3]))
>>> masks = tree_attention_mask(tree, prefix_mask=torch.tensor([[0, 1, 1]]))  # one pad hole
>>> masks.positions                      # root position = 2 real prefix tokens
tensor([[2, 3, 3]])
>>> masks.attention_mask[0, 0].int()     # [N, W+N]: prefix columns, then tree columns
tensor([[0, 1, 1, 1, 0, 0],
        [0, 1, 1, 1, 1, 0],
        [0, 1, 1, 1, 0, 1]], dtype=torch.int32)
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from specdecode._ops import ops
from specdecode.trees.tree import TokenTree, _require_long

_PREFIX_MASK_DTYPES = (torch.bool, torch.uint8, torch.int32, torch.int64)


class TreeMasks(NamedTuple):
    """What a target forward over a batch of token trees needs, and the tree's links.

    Shape:
        positions: ``[B, N]`` int64 — ``root_position + depth`` (padding nodes: the root's).
        attention_mask: ``[B, 1, N, W+N]`` bool — True = may attend: the row's real prefix
            columns and the node's ancestor-or-self tree columns. A padding node attends to its
            own column only (never an empty row) and no real node attends to a padding node.
        tree_mask: ``[B, N, N]`` bool — the tree columns of ``attention_mask``.
        packed_tree_mask: ``[B, N, ceil(N/32)]`` int32 — bit ``j % 32`` of word ``j // 32`` of
            row ``i`` is set iff ``tree_mask[b, i, j]`` (the layout of bit-packed custom masks).
        first_child: ``[B, N]`` int64 — lowest-index child, -1 for a leaf or padding.
        next_sibling: ``[B, N]`` int64 — next child of the same parent, -1 for the last one.
        depth: ``[B, N]`` int64 — 0 for the root and for padding.
    """

    positions: Tensor
    attention_mask: Tensor
    tree_mask: Tensor
    packed_tree_mask: Tensor
    first_child: Tensor
    next_sibling: Tensor
    depth: Tensor

    def additive_mask(self, dtype: torch.dtype = torch.float32) -> Tensor:
        """``attention_mask`` as an additive float mask: 0 where attention is allowed, the
        dtype's most negative finite value elsewhere. Shape: ``[B, 1, N, W+N]``."""
        zero = torch.zeros((), dtype=dtype, device=self.attention_mask.device)
        return torch.where(self.attention_mask, zero, torch.finfo(dtype).min)


def tree_attention_mask(
    tree: TokenTree | Tensor,
    prefix_mask: Tensor,
    root_positions: Tensor | None = None,
    *,
    num_nodes: Tensor | None = None,
) -> TreeMasks:
    """Positions, masks and links for a target forward over ``tree`` after a cached prefix.

    ``tree`` is a :class:`TokenTree` or just its ``parents`` tensor (then ``num_nodes`` may be
    given; None means every slot is a node). ``prefix_mask`` marks which of the ``W`` committed
    cache columns of each row hold real tokens (left padding and holes are 0); ``W`` may be 0.
    ``root_positions`` is the position id the root takes; None means the number of real prefix
    tokens, ``prefix_mask.sum(1)``, exactly what the first token of a chain step gets. The
    compiled op checks the trees and raises ``ValueError`` naming ``parents``, ``num_nodes``,
    ``prefix_mask`` or ``root_positions``.

    Shape:
        tree / parents: ``[B, N]`` int64 (N <= 4096).
        prefix_mask: ``[B, W]`` bool / uint8 / int32 / int64, values 0 or 1.
        root_positions: ``[B]`` int64 >= 0, or None.
        num_nodes: ``[B]`` int64 in ``[1, N]``, or None (only with a parents tensor).
        returns: :class:`TreeMasks`.
    """
    if isinstance(tree, TokenTree):
        if num_nodes is not None:
            raise ValueError("num_nodes: pass it only with a parents tensor; a TokenTree carries its own")
        parents, num_nodes = tree.parents, tree.num_nodes
    else:
        parents = _require_long("parents", tree, 2, "[B, N]")
        B, N = parents.shape
        if num_nodes is None:
            num_nodes = torch.full((B,), N, dtype=torch.int64, device=parents.device)
        else:
            _require_long("num_nodes", num_nodes, 1, f"[B] = [{B}]")
    B = parents.shape[0]
    if not isinstance(prefix_mask, Tensor):
        raise TypeError(f"prefix_mask: expected a torch.Tensor of shape [B, W], got {type(prefix_mask).__name__}")
    if prefix_mask.dim() != 2 or prefix_mask.shape[0] != B:
        raise ValueError(f"prefix_mask: expected shape [B, W] = [{B}, W], got {tuple(prefix_mask.shape)}")
    if prefix_mask.dtype not in _PREFIX_MASK_DTYPES:
        raise TypeError(f"prefix_mask: expected bool, uint8, int32 or int64 (0/1), got {prefix_mask.dtype}")
    if prefix_mask.device != parents.device:
        raise ValueError(f"prefix_mask: expected device {parents.device} (that of the tree), got {prefix_mask.device}")
    if root_positions is None:
        root_positions = prefix_mask.to(torch.int64).sum(1)
    else:
        _require_long("root_positions", root_positions, 1, f"[B] = [{B}]")
    return TreeMasks(*ops.tree_attention_mask(parents, num_nodes, prefix_mask, root_positions))
