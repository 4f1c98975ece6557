"""Token trees: several draft continuations verified in one target forward.

- :class:`TokenTree` — a batch of trees (tokens, parents, num_nodes), topological order.
- :func:`tree_attention_mask` — positions, the 4D / tree-only / bit-packed masks and the
  first-child / next-sibling links a target forward over the tree needs (compiled op).
- :func:`verify_tree` — walk each tree with a per-node rule (compiled op), see
  :func:`list_tree_rules` for the rules and the drafting scheme each one is lossless for;
  :func:`register_tree_rule` adds one written in plain PyTorch.
- :mod:`specdecode.trees.reference` — the pure-Python reference of both ops.
- Shapes and builders: :class:`TreeShape` (static rank paths), :func:`sequoia_shape` (the
  optimal shape for a measured acceptance-by-rank vector), :func:`select_frontier` /
  :func:`prune_to_budget` (EAGLE-2 dynamic trees), :func:`draw_children` (fixed-shape draws),
  :func:`draw_hub_children` (SpecHub's hub pairs).
- Traversal verification, GBV, SpecTr and SpecHub: compiled like the others; their Python row
  functions (:mod:`specdecode.trees.python_rules`) are the reference.

>>> import torch
>>> from specdecode.trees import TokenTree, tree_attention_mask, verify_tree
>>> tree = TokenTree.chain(torch.tensor([3]), torch.tensor([[4, 5]]))
>>> tree_attention_mask(tree, torch.ones(1, 6, dtype=torch.bool)).positions
tensor([[6, 7, 8]])
"""

from specdecode.trees.dynamic import PrunedTree, prune_to_budget, select_frontier
from specdecode.trees.mask import TreeMasks, tree_attention_mask
from specdecode.trees.rules import (TreeRuleInfo, get_tree_rule, list_tree_rules, register_tree_rule,
                                    unregister_tree_rule)
from specdecode.trees.sequoia import acceptance_from_conditional, expected_accepted_length, sequoia_shape
from specdecode.trees.shapes import TreeShape
from specdecode.trees.stochastic import draw_children
from specdecode.trees.transport import draw_hub_children
from specdecode.trees.tree import MAX_TREE_NODES, TokenTree
from specdecode.trees.verify import TreeVerifyOutput, verify_tree

__all__ = [
    "MAX_TREE_NODES",
    "PrunedTree",
    "TokenTree",
    "TreeShape",
    "acceptance_from_conditional",
    "draw_children",
    "draw_hub_children",
    "expected_accepted_length",
    "prune_to_budget",
    "select_frontier",
    "sequoia_shape",
    "TreeMasks",
    "TreeRuleInfo",
    "TreeVerifyOutput",
    "get_tree_rule",
    "list_tree_rules",
    "register_tree_rule",
    "tree_attention_mask",
    "unregister_tree_rule",
    "verify_tree",
]
