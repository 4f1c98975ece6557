"""Token trees: several draft continuations verified in one target forward.

- :class:`TokenTree` — a batch of trees (tokens, parents, num_nodes), topological order.
- :func:`tree_attention_mask` — positions, the 4D / tree-only / bit-packed masks and the
  first-child / next-sibling links a target forward over the tree needs (compiled op).
- :func:`verify_tree` — walk each tree with a per-node rule (compiled op), see
  :func:`list_tree_rules` for the rules and the drafting scheme each one is lossless for.
- :mod:`specdecode.trees.reference` — the pure-Python reference of both ops.

>>> import torch
>>> from specdecode.trees import TokenTree, tree_attention_mask, verify_tree
>>> tree = TokenTree.chain(torch.tensor([3]), torch.tensor([[4, 5]]))
>>> tree_attention_mask(tree, torch.ones(1, 6, dtype=torch.bool)).positions
tensor([[6, 7, 8]])
"""

from specdecode.trees.mask import TreeMasks, tree_attention_mask
from specdecode.trees.rules import TreeRuleInfo, get_tree_rule, list_tree_rules
from specdecode.trees.tree import MAX_TREE_NODES, TokenTree
from specdecode.trees.verify import TreeVerifyOutput, verify_tree

__all__ = [
    "MAX_TREE_NODES",
    "TokenTree",
    "TreeMasks",
    "TreeRuleInfo",
    "TreeVerifyOutput",
    "get_tree_rule",
    "list_tree_rules",
    "tree_attention_mask",
    "verify_tree",
]
