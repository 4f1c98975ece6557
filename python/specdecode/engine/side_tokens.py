"""Side tokens: a drafter's own tokens scored in the target's tree forward, beside the tree.

A tree step's forward holds the tree (root = pending token, then the draft nodes) after the
committed prefix. A drafter may append side tokens (:class:`~specdecode.drafters.SideTokens`):
each attends to its row's real prefix, to the root and to the side tokens its ``mask`` allows,
never to a draft node; no tree node attends to a side token. So the tree's logits are exactly
what they are without side tokens (up to float rounding of the attention over masked columns),
verification reads only those, and the side tokens' logits go back to the drafter at commit.
Their cache columns come after the tree's and are dropped with the rejected nodes.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specdecode.drafters.base import SideTokens
from specdecode.trees.mask import TreeMasks


def with_side_tokens(tree_tokens: Tensor, masks: TreeMasks, side: SideTokens) -> tuple[Tensor, Tensor, Tensor]:
    """The forward inputs of a tree followed by side tokens: ``(input_ids, attention_mask,
    position_ids)``.

    Shape:
        tree_tokens: ``[b, N]`` int64; masks: the tree's :class:`TreeMasks` over ``W`` prefix
            columns; side: ``S`` tokens per row.
        returns: ``[b, N+S]`` int64, ``[b, 1, N+S, W+N+S]`` bool (True = may attend),
            ``[b, N+S]`` int64.
    """
    attn = masks.attention_mask
    b, _, n, width = attn.shape
    w = width - n
    s = side.tokens.shape[1]
    device = attn.device
    prefix = attn[:, :, :1, :w]  # the root's row: the real prefix columns
    tree_rows = torch.cat([attn, torch.zeros((b, 1, n, s), dtype=torch.bool, device=device)], 3)
    root = torch.zeros((b, 1, s, n), dtype=torch.bool, device=device)
    root[..., 0] = True
    side_rows = torch.cat([prefix.expand(b, 1, s, w), root, side.mask.to(device)[None, None].expand(b, 1, s, s)], 3)
    mask = torch.cat([tree_rows, side_rows], 2)
    tokens = torch.cat([tree_tokens, side.tokens], 1)
    positions = torch.cat([masks.positions, side.positions], 1)
    return tokens, mask, positions

