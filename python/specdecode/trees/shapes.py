"""Tree shapes: the structure of a draft tree, independent of the tokens in it.

A :class:`TreeShape` lists the nodes of one tree in topological order. Node 0 is the root (the
last committed token); every other node ``i`` has a parent ``parents[i] < i`` and a
``child_rank[i]``: which of the parent's candidates it is, in the order the drafter produces
them (0 = the most likely token of a top-k draft, or the first child drawn by a sampling
draft). Siblings always appear in rank order, because verification walks the children of a
node in index order. The root's rank is ``-1`` (it has no parent), like its parent.

Shapes come from:

- a "choices" list of rank paths (Medusa/EAGLE static trees): :meth:`TreeShape.from_paths`;
- :meth:`TreeShape.chain` (plain speculative decoding) and :meth:`TreeShape.full`;
- an explicit parent list: :meth:`TreeShape.from_parents`;
- :func:`specdecode.trees.sequoia.sequoia_shape`, the shape of at most ``n`` nodes that
  maximises the expected number of accepted tokens for a measured acceptance-by-rank vector.

``num_nodes`` always counts the root, as in the token-tree tensors: a chain of ``k`` draft
tokens has ``k + 1`` nodes.

Shapes and stochastic verification rules. The rules that verify sampled children (SpecInfer's
multi-step speculative sampling, i.i.d. children; recursive rejection sampling, children drawn
without replacement) are lossless only when the number of children of a node is decided before
they are drawn, and the kept children are exactly the ones drawn. A fixed shape does that: at
node ``v`` the engine draws ``num_children[v]`` tokens from the draft's processed distribution
at ``v``, in rank order (i.i.d. for SpecInfer, without replacement for recursive rejection
sampling; see :func:`specdecode.trees.stochastic.draw_children`), and the ``r``-th draw becomes
the child of rank ``r``. Drawing more and keeping the most probable ones (re-ranking sampled
children, as EAGLE-2 does with top-k children) changes the law of the kept children and makes
the output differ from the target's distribution. Value-based pruning
(:mod:`specdecode.trees.dynamic`) is only for deterministic children (top-k of the draft),
verified with the deterministic or greedy rule.

>>> shape = TreeShape.from_paths([[0], [1], [0, 0], [0, 1], [1, 0]])
>>> shape.parents, shape.child_rank, shape.depth
((-1, 0, 0, 1, 1, 2), (-1, 0, 1, 0, 1, 0), (0, 1, 1, 2, 2, 2))
>>> shape.num_nodes, shape.max_depth, shape.num_children
(6, 2, (2, 2, 1, 0, 0, 0))
>>> TreeShape.chain(3).parents
(-1, 0, 1, 2)
>>> TreeShape.full([2, 1]).paths()
[[0], [1], [0, 0], [1, 0]]
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import Tensor

__all__ = ["TreeShape", "TreeShapeTensors"]


class TreeShapeTensors(NamedTuple):
    """A shape as tensors (see :meth:`TreeShape.to_tensors`).

    Shape:
        parents: ``[N]`` int64, ``parents[0] = -1``.
        child_rank: ``[N]`` int64, ``child_rank[0] = -1``.
        depth: ``[N]`` int64, ``depth[0] = 0``.
    """

    parents: Tensor
    child_rank: Tensor
    depth: Tensor


def _int_tuple(values: object, name: str) -> tuple[int, ...]:
    if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, Tensor)):
        raise TypeError(f"{name}: expected a sequence of ints, got {type(values).__name__}")
    if isinstance(values, Tensor):
        if values.dim() != 1 or values.dtype.is_floating_point or values.dtype.is_complex:
            raise TypeError(f"{name}: expected a 1-D integer tensor, got {values.dtype} "
                            f"with shape {tuple(values.shape)}")
        values = values.tolist()
    out = []
    for i, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name}[{i}]: expected an int, got {type(value).__name__}")
        out.append(int(value))
    return tuple(out)


@dataclass(frozen=True)
class TreeShape:
    """One tree shape in topological order.

    Args:
        parents: ``parents[0] = -1`` (the root), ``0 <= parents[i] < i`` for ``i > 0``.
        child_rank: the rank of each node among its parent's candidates (``-1`` for the root),
            strictly increasing over the siblings in index order; ranks may skip values (a
            top-k drafter can keep its 1st and 3rd token). Leave it empty to number the
            children of every node ``0, 1, 2, ...`` in index order.

    Derived fields: ``depth`` (root 0) and ``num_children`` per node.

    Raises:
        ValueError: naming the argument when the lists are malformed (``TypeError`` for a
            wrong type).
    """

    parents: tuple[int, ...]
    child_rank: tuple[int, ...] = ()
    depth: tuple[int, ...] = field(init=False, compare=False)
    num_children: tuple[int, ...] = field(init=False, compare=False, repr=False)
    _children: tuple[tuple[int, ...], ...] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        parents = _int_tuple(self.parents, "parents")
        if len(parents) == 0:
            raise ValueError("parents: expected at least the root (parents = (-1,)), got ()")
        if parents[0] != -1:
            raise ValueError(f"parents[0]: the root's parent must be -1, got {parents[0]}")
        for i in range(1, len(parents)):
            if not 0 <= parents[i] < i:
                raise ValueError(f"parents[{i}]: expected 0 <= parents[i] < {i} (topological "
                                 f"order), got {parents[i]}")
        children: list[list[int]] = [[] for _ in parents]
        for i in range(1, len(parents)):
            children[parents[i]].append(i)

        if isinstance(self.child_rank, (tuple, list)) and len(self.child_rank) == 0:
            ranks = [-1] * len(parents)
            for kids in children:
                for rank, child in enumerate(kids):
                    ranks[child] = rank
            child_rank = tuple(ranks)
        else:
            child_rank = _int_tuple(self.child_rank, "child_rank")
            if len(child_rank) != len(parents):
                raise ValueError(f"child_rank: expected {len(parents)} entries (one per node), "
                                 f"got {len(child_rank)}")
            if child_rank[0] != -1:
                raise ValueError(f"child_rank[0]: the root's rank must be -1, got {child_rank[0]}")
            for kids in children:
                previous = -1
                for child in kids:
                    if child_rank[child] <= previous:
                        raise ValueError(
                            f"child_rank[{child}]: siblings must have non-negative ranks that "
                            f"increase with the node index, got {child_rank[child]} after "
                            f"{previous}")
                    previous = child_rank[child]

        depth = [0] * len(parents)
        for i in range(1, len(parents)):
            depth[i] = depth[parents[i]] + 1
        object.__setattr__(self, "parents", parents)
        object.__setattr__(self, "child_rank", child_rank)
        object.__setattr__(self, "depth", tuple(depth))
        object.__setattr__(self, "num_children", tuple(len(k) for k in children))
        object.__setattr__(self, "_children", tuple(tuple(k) for k in children))

    # ------------------------------------------------------------------ constructors

    @classmethod
    def from_parents(cls, parents: Sequence[int]) -> TreeShape:
        """Shape from a parent list; the children of a node get ranks 0, 1, ... in index order.

        >>> TreeShape.from_parents([-1, 0, 0, 1]).child_rank
        (-1, 0, 1, 0)
        """
        return cls(_int_tuple(parents, "parents"))

    @classmethod
    def from_paths(cls, paths: Sequence[Sequence[int]]) -> TreeShape:
        """Shape from a "choices" list of rank paths (the root is implicit).

        ``[r1, r2, ..., rk]`` is the node reached from the root by taking the ``r1``-th ranked
        child, then that node's ``r2``-th ranked child, and so on. Every proper prefix of a path
        must be in the list too. Nodes are ordered by depth, then lexicographically, so the
        siblings of a node are contiguous and in rank order; :meth:`paths` gives the list back
        in that order.

        >>> TreeShape.from_paths([[1], [0, 0], [0]]).parents
        (-1, 0, 0, 1)
        """
        if isinstance(paths, (str, bytes)) or not isinstance(paths, Sequence):
            raise TypeError(f"paths: expected a sequence of rank paths, got {type(paths).__name__}")
        keys: list[tuple[int, ...]] = []
        for i, path in enumerate(paths):
            key = _int_tuple(path, f"paths[{i}]")
            if len(key) == 0:
                raise ValueError(f"paths[{i}]: expected a non-empty rank path (the root is "
                                 "implicit), got []")
            if min(key) < 0:
                raise ValueError(f"paths[{i}]: ranks must be >= 0, got {list(key)}")
            keys.append(key)
        known = set(keys)
        if len(known) != len(keys):
            duplicate = next(k for k in keys if keys.count(k) > 1)
            raise ValueError(f"paths: rank path {list(duplicate)} appears more than once")
        for key in keys:
            for cut in range(1, len(key)):
                if key[:cut] not in known:
                    raise ValueError(f"paths: {list(key)} needs its prefix {list(key[:cut])}, "
                                     "which is missing")
        ordered = sorted(keys, key=lambda k: (len(k), k))
        index = {k: i + 1 for i, k in enumerate(ordered)}
        parents = [-1] + [index[k[:-1]] if len(k) > 1 else 0 for k in ordered]
        ranks = [-1] + [k[-1] for k in ordered]
        return cls(tuple(parents), tuple(ranks))

    @classmethod
    def chain(cls, num_draft_tokens: int) -> TreeShape:
        """A chain of ``num_draft_tokens`` drafts: ``num_draft_tokens + 1`` nodes.

        >>> TreeShape.chain(2).paths()
        [[0], [0, 0]]
        """
        if isinstance(num_draft_tokens, bool) or not isinstance(num_draft_tokens, int):
            raise TypeError(f"num_draft_tokens: expected an int, got "
                            f"{type(num_draft_tokens).__name__}")
        if num_draft_tokens < 0:
            raise ValueError(f"num_draft_tokens: expected >= 0, got {num_draft_tokens}")
        return cls(tuple(range(-1, num_draft_tokens)))

    @classmethod
    def full(cls, branching: Sequence[int]) -> TreeShape:
        """Every node at depth ``i`` has ``branching[i]`` children (depth ``len(branching)``).

        >>> TreeShape.full([3, 2]).num_nodes        # 1 + 3 + 3 * 2
        10
        """
        counts = _int_tuple(branching, "branching")
        for i, count in enumerate(counts):
            if count < 1:
                raise ValueError(f"branching[{i}]: expected >= 1 children per node, got {count}")
        paths = [list(p) for depth in range(1, len(counts) + 1)
                 for p in itertools.product(*(range(c) for c in counts[:depth]))]
        return cls.from_paths(paths)

    # ------------------------------------------------------------------ queries

    @property
    def num_nodes(self) -> int:
        """Number of nodes, root included."""
        return len(self.parents)

    @property
    def max_depth(self) -> int:
        """Depth of the deepest node (0 for a root-only tree): the longest acceptable path."""
        return max(self.depth)

    def children(self, node: int) -> tuple[int, ...]:
        """Children of ``node`` in index (= rank) order."""
        if isinstance(node, bool) or not isinstance(node, int):
            raise TypeError(f"node: expected an int, got {type(node).__name__}")
        if not 0 <= node < self.num_nodes:
            raise ValueError(f"node: expected 0 <= node < {self.num_nodes}, got {node}")
        return self._children[node]

    def paths(self) -> list[list[int]]:
        """Rank path of every non-root node, in node order (``paths()[i - 1]`` is node ``i``)."""
        out: list[list[int]] = [[]]
        for i in range(1, self.num_nodes):
            out.append(out[self.parents[i]] + [self.child_rank[i]])
        return out[1:]

    def to_tensors(self, device: torch.device | str | None = None) -> TreeShapeTensors:
        """``parents``, ``child_rank`` and ``depth`` as int64 tensors on ``device``.

        Shape:
            each: ``[N]`` int64 with ``N = num_nodes``. For a batch of rows sharing the shape,
            ``parents.expand(B, N)``.
        """
        def as_tensor(values: tuple[int, ...]) -> Tensor:
            return torch.tensor(values, dtype=torch.int64, device=device)

        return TreeShapeTensors(as_tensor(self.parents), as_tensor(self.child_rank),
                                as_tensor(self.depth))
