"""The builders' common ground: the children schemes and their lossless rules, the
:class:`BuiltTree` a builder returns, the :class:`TreeBuilder` interface, :class:`StaticTree`
(one fixed shape for every row), :func:`compact_tree`, and the profile sampled steps are
planned for. :mod:`specdecode.trees.builders` builds on it (and re-exports every name).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import Tensor

from specdecode.sampling import SamplingParams, processed_probs, sample_logits
from specdecode.trees.shapes import TreeShape
from specdecode.trees.stochastic import draw_children
from specdecode.trees.transport import draw_hub_children
from specdecode.trees.tree import TokenTree

CHILDREN_SCHEMES = ("deterministic", "iid", "without_replacement", "hub")
#: The lossless tree rule for each children scheme.
LOSSLESS_RULE = {"deterministic": "deterministic", "iid": "specinfer", "without_replacement": "rrs",
                 "hub": "spechub"}

Expand = Callable[[Tensor, Tensor, Tensor, int], Tensor]
Coins = Callable[..., Tensor]


#: Conditional acceptance by child rank of *sampled* children (drawn without replacement,
#: verified by ``rrs``) that sampled steps are planned for: the Sequoia shape of ``tree="static"``
#: when sampling, and of :class:`SequoiaTree` (so of the dynamic tree's sampling steps) unless it
#: adapts online. Measured on the demo pair's ``tune`` prompts at temperature 1: rank 0 about
#: 0.75, rank 1 about 0.35. Such a profile makes depth worth more than width: a long chain with a
#: few side branches near the root.
SAMPLED_PROFILE = (0.75, 0.35, 0.25, 0.2, 0.15, 0.1, 0.1, 0.1)


@dataclass
class BuiltTree:
    """A drafted batch of trees.

    Shape:
        tree: :class:`TokenTree` ``[b, N]``.
        draft_logits: ``[b, N, V]`` float32 or None — at node v, the logits v's children were
            drawn from (None for deterministic children: no rule reads them).
    """

    tree: TokenTree
    draft_logits: Tensor | None
    children: str
    forward_calls: int


def _check_children(children: str) -> str:
    if children not in CHILDREN_SCHEMES:
        raise ValueError(f"children: expected one of {', '.join(CHILDREN_SCHEMES)}, got {children!r}")
    return children


def _check_shape(shape: TreeShape, name: str) -> TreeShape:
    if not isinstance(shape, TreeShape):
        raise TypeError(f"{name}: expected a TreeShape or a list of rank paths, got {type(shape).__name__}")
    if shape.num_nodes < 2:
        raise ValueError(f"{name}: a tree needs at least one node besides the root")
    return shape


class TreeBuilder:
    """Base of the builders: ``build`` grows the trees; ``max_nodes`` bounds their size (root
    included); ``observe`` receives the measured acceptance by child rank after each step."""

    children: str = "deterministic"
    max_nodes: int = 1

    def build(self, root_tokens: Tensor, root_logits: Tensor, expand: Expand, sampling: SamplingParams,
              coins: Coins) -> BuiltTree:  # pragma: no cover - abstract
        raise NotImplementedError

    def describe(self, sampling: SamplingParams) -> str:
        """What this builder drafts under ``sampling``, in words (recorded in the statistics)."""
        return f"{type(self).__name__}: up to {self.max_nodes} nodes, children {self._scheme(sampling)}"

    def _scheme(self, sampling: SamplingParams) -> str:
        """At temperature 0 every ``q`` is one-hot, so sampled children would all be the
        argmax: draw the top-k instead (verification is the exact greedy walk then)."""
        return "deterministic" if sampling.is_greedy else self.children

    def observe(self, rank_tried: Sequence[int], rank_accepted: Sequence[int]) -> None:
        """Running counts per child rank: how often the rank-r child was tried / accepted."""
        return None

    def record(self, accepted_nodes: Tensor) -> None:
        """The accepted path of each row of the tree built last (root first, ``-1`` padded), which
        the drafter reports from its ``commit``; builders that learn from it override this.

        Shape:
            accepted_nodes: ``[b, D + 1]`` int64, rows as in the last :meth:`build`.
        """
        return None


class StaticTree(TreeBuilder):
    """Every row gets the same ``shape`` (a :class:`TreeShape` or a list of rank paths such as
    ``[[0], [1], [0, 0]]``); a node's children are drawn by ``children``. ``sampled_shape``, when
    given, replaces ``shape`` in the steps whose children are sampled (``children`` other than
    ``"deterministic"``, at temperature > 0): sampled siblings are accepted far less often than
    top-k ones, so the best shape there is deeper. Either shape is fixed before generation;
    :meth:`describe` says which one is drafted, and drafting a sampled shape that is a single
    path (what ``tree="static"`` plans for small budgets) warns once: tree rules then differ only
    as chain rules do. To compare tree rules on one branching shape, give the rank paths
    (``generate(..., tree=[[0], [1], [0, 0], ...], tree_children="without_replacement")``): a
    shape given so is drafted at every temperature.

    Example:
        >>> builder = StaticTree([[0], [1], [0, 0], [0, 1], [1, 0]], children="deterministic")
        >>> builder.max_nodes
        6
    """

    def __init__(self, shape: TreeShape | Sequence[Sequence[int]], children: str = "deterministic",
                 sampled_shape: TreeShape | Sequence[Sequence[int]] | None = None) -> None:
        self.children = _check_children(children)
        self.set_shape(shape if isinstance(shape, TreeShape) else TreeShape.from_paths(shape))
        #: The shape drawn when sampling with non-deterministic children (None: ``shape``).
        self.sampled_shape = None
        if sampled_shape is not None:
            self.sampled_shape = _check_shape(sampled_shape if isinstance(sampled_shape, TreeShape)
                                              else TreeShape.from_paths(sampled_shape), "sampled_shape")
            self.max_nodes = max(self.max_nodes, self.sampled_shape.num_nodes)
        self._warned_path = False

    def drafted_shape(self, sampling: SamplingParams) -> TreeShape:
        """The shape drafted under ``sampling``: ``sampled_shape`` when children are sampled."""
        sampled = self.sampled_shape is not None and self._scheme(sampling) != "deterministic"
        return self.sampled_shape if sampled else self.shape

    def describe(self, sampling: SamplingParams) -> str:
        shape = self.drafted_shape(sampling)
        kind = f"a chain of {shape.num_nodes - 1}" if _is_path(shape) else f"{shape.num_nodes} nodes"
        return f"static, {kind}, children {self._scheme(sampling)}: rank paths {shape.paths()}"

    def set_shape(self, shape: TreeShape) -> None:
        self.shape = _check_shape(shape, "shape")
        self.max_nodes = shape.num_nodes

    def build(self, root_tokens: Tensor, root_logits: Tensor, expand: Expand, sampling: SamplingParams,
              coins: Coins) -> BuiltTree:
        shape = self.drafted_shape(sampling)
        if shape is self.sampled_shape and _is_path(shape) and shape.num_nodes > 2 and not self._warned_path:
            self._warned_path = True
            warnings.warn(
                f"tree: the shape drafted for sampled children is a chain of {shape.num_nodes - 1} (planned for "
                f"{self.max_nodes} nodes), not a branching tree: tree rules compare on it as chain rules do; to fix a "
                "branching shape pass rank paths, e.g. tree=[[0], [1], [0, 0], [0, 1]] with tree_children=...",
                UserWarning, stacklevel=2)
        b, device = root_tokens.shape[0], root_tokens.device
        N = shape.num_nodes
        parents_row = torch.tensor(shape.parents, dtype=torch.long, device=device)
        tokens = torch.zeros((b, N), dtype=torch.long, device=device)
        tokens[:, 0] = root_tokens
        valid = torch.ones((b, N), dtype=torch.bool, device=device)
        node_logits: dict[int, Tensor] = {0: root_logits}
        calls = 0
        for depth in range(shape.max_depth):
            parents_here = [v for v in range(N) if shape.depth[v] == depth and shape.num_children[v] > 0]
            if not parents_here:
                break
            for v, kids in zip(parents_here, self._draw([node_logits[v] for v in parents_here],
                                                         [shape.num_children[v] for v in parents_here],
                                                         sampling, coins)):
                children = shape.children(v)
                tokens[:, list(children)] = kids.clamp_min(0)
                valid[:, list(children)] = (kids >= 0) & valid[:, v: v + 1]
            new = [c for c in range(N) if shape.depth[c] == depth + 1 and shape.num_children[c] > 0]
            if new:
                ids = torch.tensor(new, dtype=torch.long, device=device).expand(b, -1)
                logits = expand(ids, tokens[:, new], parents_row[new].expand(b, -1), depth + 1)
                calls += 1
                for i, c in enumerate(new):
                    node_logits[c] = logits[:, i]
        draft_logits = None
        if self._scheme(sampling) != "deterministic":
            zeros = torch.zeros_like(root_logits)
            draft_logits = torch.stack([node_logits.get(v, zeros) for v in range(N)], 1)
        parents = parents_row.expand(b, -1)
        if bool(valid.all()):
            num = torch.full((b,), N, dtype=torch.long, device=device)
            tree = TokenTree(tokens, parents.contiguous(), num)
        else:
            tree, keep = compact_tree(tokens, parents, valid)
            if draft_logits is not None:
                draft_logits = draft_logits.gather(1, keep[:, :, None].expand(-1, -1, draft_logits.shape[2]))
        return BuiltTree(tree, draft_logits, self._scheme(sampling), calls)

    def _draw(self, logits: list[Tensor], counts: list[int], sampling: SamplingParams, coins: Coins) -> list[Tensor]:
        """Children of several nodes at once: ``logits[j]`` ``[b, V]`` -> ``[b, counts[j]]``."""
        stacked = torch.stack(logits, 1)  # [b, m, V]
        b, m, V = stacked.shape
        k = max(counts)
        scheme = self._scheme(sampling)
        if scheme == "deterministic":
            drawn = stacked.topk(min(k, V), dim=-1).indices
            if k > V:
                drawn = torch.cat([drawn, drawn.new_full((b, m, k - V), -1)], -1)
        elif scheme == "iid":
            flat = stacked.reshape(b * m, V).repeat_interleave(k, 0)
            drawn = sample_logits(flat, sampling, uniforms=coins(b * m * k)).view(b, m, k)
        elif scheme == "hub":
            probs = processed_probs(stacked.reshape(b * m, V), sampling)
            drawn = draw_hub_children(probs, k, coins(b * m, k)).view(b, m, k)
        else:
            probs = processed_probs(stacked.reshape(b * m, V), sampling)
            drawn = draw_children(probs, k, False, coins(b * m, k)).view(b, m, k)
        return [drawn[:, j, : counts[j]] for j in range(m)]


def _is_path(shape: TreeShape) -> bool:
    """Whether every node of ``shape`` has at most one child."""
    return all(n <= 1 for n in shape.num_children)


def compact_tree(tokens: Tensor, parents: Tensor, valid: Tensor) -> tuple[TokenTree, Tensor]:
    """Drop invalid nodes (and their descendants) from trees in topological order, keeping the
    order of the rest; returns the compacted tree and, per row, the kept old node indices.

    Shape:
        tokens, parents: ``[b, N]`` int64; valid: ``[b, N]`` bool (the root must be valid).
        returns ``(TokenTree [b, N], keep [b, N])``; padding slots repeat node 0.
    """
    b, N = tokens.shape
    alive = valid.clone()
    for i in range(1, N):  # topological: a parent's status is final before its children
        alive[:, i] &= alive.gather(1, parents[:, i: i + 1].clamp_min(0))[:, 0]
    order = torch.sort((~alive).to(torch.int8), dim=1, stable=True).indices
    count = alive.sum(1)
    slot = torch.arange(N, device=tokens.device)[None, :]
    keep = torch.where(slot < count[:, None], order, torch.zeros_like(order))
    new_index = torch.empty_like(order)
    new_index.scatter_(1, order, slot.expand(b, -1).contiguous())
    old_parents = parents.gather(1, keep)
    new_parents = torch.where(old_parents >= 0, new_index.gather(1, old_parents.clamp_min(0)), old_parents)
    new_parents = torch.where(slot < count[:, None], new_parents, torch.zeros_like(new_parents))
    new_parents[:, 0] = -1
    return TokenTree(tokens.gather(1, keep), new_parents, count), keep
