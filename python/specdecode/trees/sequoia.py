"""Sequoia's optimal tree shape for a measured acceptance-by-rank vector.

Model. ``acceptance_by_rank[r]`` (written ``a_r``) is the probability that, once a node is
accepted, the child accepted next is its child of rank ``r``: the first ``r`` siblings were
rejected and this one accepted. These are probabilities of disjoint events, so
``sum(a) <= 1``; a rate measured as "accepted given that rank ``r`` was reached" is converted
with :func:`acceptance_from_conditional`. Assuming ``a`` depends only on the rank (not on the
depth or the context), node ``v`` is on the accepted path with probability
``prod(a[rank(e)] for e on the path root -> v)``, so the expected number of accepted draft
tokens of a shape (the emitted bonus token not counted) is::

    E(T) = sum over non-root nodes v of prod over the edges e on the root -> v path of a[rank(e)]

Dynamic programming. Write ``S(m, e)`` for the best value of a subtree of at most ``m`` nodes
(its own root included) and depth at most ``e``. Its root has children of ranks ``0..k-1``
(contiguous: a sampling drafter cannot skip a rank) with subtrees of at most ``m_0..m_{k-1}``
nodes, ``sum m_i <= m - 1``, and::

    S(m, e) = max over k and m_0..m_{k-1} of sum_i a_i * (1 + S(m_i, e - 1)),  S(1, e) = S(m, 0) = 0

The inner maximisation is a knapsack over the ranks, solved rank by rank from the last one, so
the subtree sizes go to whichever ranks they are worth most at: ``a`` need not be decreasing.
Cost ``O(max_depth * len(a) * num_nodes^2)`` (milliseconds for 64 nodes, depth 16).

Not modelled: trees that skip a rank (keep the 1st and 3rd candidate but not the 2nd). They can
only help when ``a`` increases somewhere, and only deterministic (top-k) drafters can build
them. A node has at most ``len(a)`` children: ranks beyond the vector were not measured.

>>> shape, value = sequoia_shape([0.6, 0.2], num_nodes=4, max_depth=2)
>>> shape.paths(), round(value, 12)
([[0], [1], [0, 0]], 1.16)
>>> shape, value = sequoia_shape([0.6, 0.2], num_nodes=4, max_depth=3)
>>> shape.paths(), round(value, 12)
([[0], [0, 0], [0, 0, 0]], 1.176)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from torch import Tensor

from specdecode.trees.shapes import TreeShape

__all__ = ["acceptance_from_conditional", "expected_accepted_length", "expected_accepted_length_by_depth",
           "sequoia_shape", "sequoia_shape_by_depth"]

_SUM_TOLERANCE = 1e-9


def _as_float_list(values: Sequence[float] | Tensor, name: str) -> list[float]:
    if isinstance(values, Tensor):
        if values.dim() != 1 or not values.dtype.is_floating_point:
            raise TypeError(f"{name}: expected a 1-D floating tensor, got {values.dtype} with "
                            f"shape {tuple(values.shape)}")
        values = values.tolist()
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"{name}: expected a sequence of floats, got {type(values).__name__}")
    out = []
    for i, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{name}[{i}]: expected a float, got {type(value).__name__}")
        if not (0.0 <= float(value) <= 1.0):
            raise ValueError(f"{name}[{i}]: expected a probability in [0, 1], got {value}")
        out.append(float(value))
    if len(out) == 0:
        raise ValueError(f"{name}: expected at least one rank, got an empty vector")
    return out


def _check_acceptance(acceptance_by_rank: Sequence[float] | Tensor) -> list[float]:
    a = _as_float_list(acceptance_by_rank, "acceptance_by_rank")
    total = math.fsum(a)
    if total > 1.0 + _SUM_TOLERANCE:
        raise ValueError(
            f"acceptance_by_rank: the entries are probabilities of disjoint events (the accepted "
            f"child has rank r) and must sum to <= 1, got sum {total!r}; convert rates measured "
            f"as 'accepted given rank r was reached' with acceptance_from_conditional")
    return a


def _check_count(value: int, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name}: expected >= {minimum}, got {value}")
    return value


def acceptance_from_conditional(conditional_rates: Sequence[float] | Tensor) -> list[float]:
    """``a_r = c_r * prod_{s < r} (1 - c_s)`` from rates ``c_r`` = P(rank r accepted | ranks
    ``< r`` rejected).

    >>> acceptance_from_conditional([0.5, 0.5, 1.0])
    [0.5, 0.25, 0.25]
    """
    c = _as_float_list(conditional_rates, "conditional_rates")
    out, reach = [], 1.0
    for rate in c:
        out.append(reach * rate)
        reach *= 1.0 - rate
    return out


def expected_accepted_length(shape: TreeShape,
                             acceptance_by_rank: Sequence[float] | Tensor) -> float:
    """Expected number of accepted draft tokens of ``shape`` (module docstring's ``E(T)``).

    Raises ValueError when the shape uses a rank that ``acceptance_by_rank`` does not cover.

    >>> expected_accepted_length(TreeShape.chain(3), [0.5])     # 0.5 + 0.25 + 0.125
    0.875
    """
    if not isinstance(shape, TreeShape):
        raise TypeError(f"shape: expected a TreeShape, got {type(shape).__name__}")
    a = _check_acceptance(acceptance_by_rank)
    used = max(shape.child_rank)
    if used >= len(a):
        raise ValueError(f"acceptance_by_rank: shape uses child rank {used}, but the vector has "
                         f"only {len(a)} entries")
    reach = [1.0] * shape.num_nodes
    for i in range(1, shape.num_nodes):
        reach[i] = reach[shape.parents[i]] * a[shape.child_rank[i]]
    return math.fsum(reach[1:])


def sequoia_shape(acceptance_by_rank: Sequence[float] | Tensor, num_nodes: int,
                  max_depth: int) -> tuple[TreeShape, float]:
    """The shape of at most ``num_nodes`` nodes (root included) and depth at most
    ``max_depth`` that maximises :func:`expected_accepted_length`, and that value.

    Ties are broken towards fewer nodes: a child whose expected gain is exactly 0 (a zero
    acceptance) is not added, so the result can have fewer than ``num_nodes`` nodes. The
    returned value is ``expected_accepted_length(shape, acceptance_by_rank)``.

    Args:
        acceptance_by_rank: ``a_r`` for ranks ``0..K-1``, each in ``[0, 1]``, sum ``<= 1``;
            a node gets at most ``K`` children.
        num_nodes: node budget, root included (``>= 1``).
        max_depth: depth budget (``>= 0``); a chain of ``k`` drafts has depth ``k``.
    """
    a = _check_acceptance(acceptance_by_rank)
    n = _check_count(num_nodes, "num_nodes", 1)
    d = min(_check_count(max_depth, "max_depth", 0), n - 1)
    shape = _best_shape([a] * d, n, d)
    return shape, expected_accepted_length(shape, a)


def sequoia_shape_by_depth(acceptance_by_depth: Sequence[Sequence[float]], num_nodes: int,
                           max_depth: int) -> tuple[TreeShape, float]:
    """:func:`sequoia_shape` when the acceptance vector depends on the depth:
    ``acceptance_by_depth[i]`` is the vector ``a`` of the children at depth ``i + 1`` (depths
    past the table use its last row). The same dynamic program, each level of remaining depth
    reading the vector of the absolute depth its children sit at.

    >>> shape, value = sequoia_shape_by_depth([[0.9], [0.3, 0.3]], num_nodes=4, max_depth=2)
    >>> shape.paths(), round(value, 12)
    ([[0], [0, 0], [0, 1]], 1.44)
    """
    if isinstance(acceptance_by_depth, (str, bytes)) or not isinstance(acceptance_by_depth, Sequence) \
            or len(acceptance_by_depth) == 0:
        raise TypeError("acceptance_by_depth: expected a non-empty sequence of acceptance vectors (one per depth)")
    table = [_check_acceptance(row) for row in acceptance_by_depth]
    n = _check_count(num_nodes, "num_nodes", 1)
    d = min(_check_count(max_depth, "max_depth", 0), n - 1)
    shape = _best_shape([table[min(i, len(table) - 1)] for i in range(d)], n, d)
    return shape, expected_accepted_length_by_depth(shape, table)


def expected_accepted_length_by_depth(shape: TreeShape, acceptance_by_depth: Sequence[Sequence[float]]) -> float:
    """:func:`expected_accepted_length` with a vector per depth (as :func:`sequoia_shape_by_depth`).

    >>> expected_accepted_length_by_depth(TreeShape.chain(3), [[0.5], [1.0]])   # 0.5 + 0.5 + 0.5
    1.5
    """
    if not isinstance(shape, TreeShape):
        raise TypeError(f"shape: expected a TreeShape, got {type(shape).__name__}")
    table = [_check_acceptance(row) for row in acceptance_by_depth]
    reach = [1.0] * shape.num_nodes
    for i in range(1, shape.num_nodes):
        row = table[min(shape.depth[i] - 1, len(table) - 1)]
        rank = shape.child_rank[i]
        reach[i] = reach[shape.parents[i]] * (row[rank] if rank < len(row) else 0.0)
    return math.fsum(reach[1:])


def _best_shape(layers: list[list[float]], n: int, d: int) -> TreeShape:
    """The dynamic program; ``layers[i]`` is the acceptance vector of the children at depth ``i + 1``."""
    num_ranks = min(max((len(a) for a in layers), default=1), max(n - 1, 1))
    layers = [list(a[:num_ranks]) + [0.0] * (num_ranks - len(a[:num_ranks])) for a in layers]

    # best[m] = S(m, e - 1) for m in 1..n-1 (index 0 unused); choices[e][r][m] = nodes given to
    # the rank-r child (0 = no such child) when ranks >= r share a budget of m nodes. numpy:
    # these are thousands of tiny array operations, where torch's per-call overhead dominates.
    best = np.zeros(n)
    budget = np.arange(n)
    offsets = budget[:, None] - budget[None, :]                # [m, j] -> m - j
    infeasible = np.where((budget[None, :] >= 1) & (offsets >= 0), 0.0, -np.inf)
    gather_at = np.maximum(offsets, 0)
    choices: list[list[list[int]]] = [[]]
    for e in range(1, d + 1):
        a = layers[d - e]                                       # children at absolute depth d - e + 1
        child_gain = 1.0 + best                                 # [j]: a child of <= j nodes
        later = np.zeros(n)                                     # no ranks left: worth 0
        sizes = np.zeros((num_ranks, n), dtype=np.int64)
        for r in range(num_ranks - 1, -1, -1):
            candidates = a[r] * child_gain[None, :] + later[gather_at] + infeasible
            size = candidates.argmax(axis=1)                    # first maximum: smallest size
            value = candidates[budget, size]
            take = value > 0.0                                  # stopping is worth exactly 0
            later = np.where(take, value, 0.0)
            sizes[r] = np.where(take, size, 0)
        choices.append(sizes.tolist())
        best = np.concatenate([[0.0], later[:-1]])              # S(m, e) = F(ranks, m - 1)

    def build(prefix: list[int], size: int, depth_left: int, out: list[list[int]]) -> None:
        remaining, rank = size - 1, 0
        while depth_left > 0 and rank < num_ranks and remaining > 0:
            child_size = choices[depth_left][rank][remaining]
            if child_size == 0:
                break
            out.append(prefix + [rank])
            build(prefix + [rank], child_size, depth_left - 1, out)
            remaining -= child_size
            rank += 1

    paths: list[list[int]] = []
    build([], n, d, paths)
    return TreeShape.from_paths(paths)
