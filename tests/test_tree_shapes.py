"""Tree shapes and Sequoia's optimal shape: TreeShape's constructors, tensors and checks; the
Sequoia DP against brute force over every rooted ordered tree of up to 9 nodes, its objective
two ways and its worked examples. Dynamic (EAGLE-2) selection: ``test_tree_dynamic.py``; the
stochastic child draws: ``test_tree_child_draws.py``.
"""

from __future__ import annotations

import functools
from fractions import Fraction

import pytest
import torch

from specdecode.trees.sequoia import (
    acceptance_from_conditional,
    expected_accepted_length,
    sequoia_shape,
)
from specdecode.trees.shapes import TreeShape


# ============================================================================ TreeShape


def test_from_paths_orders_by_depth_then_rank():
    shape = TreeShape.from_paths([[1, 0], [0, 1], [1], [0], [0, 0], [0, 0, 2]])
    assert shape.paths() == [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 2]]
    assert shape.parents == (-1, 0, 0, 1, 1, 2, 3)
    assert shape.child_rank == (-1, 0, 1, 0, 1, 0, 2)
    assert shape.depth == (0, 1, 1, 2, 2, 2, 3)
    assert shape.num_children == (2, 2, 1, 1, 0, 0, 0)
    assert shape.children(0) == (1, 2) and shape.children(1) == (3, 4) and shape.children(6) == ()
    assert shape.num_nodes == 7 and shape.max_depth == 3
    assert TreeShape.from_paths(shape.paths()) == shape


def test_chain_full_and_root_only():
    assert TreeShape.chain(0) == TreeShape((-1,)) == TreeShape.from_paths([])
    chain = TreeShape.chain(5)
    assert chain.parents == (-1, 0, 1, 2, 3, 4) and chain.num_nodes == 6 and chain.max_depth == 5
    assert chain.paths() == [[0] * d for d in range(1, 6)]
    full = TreeShape.full([3, 2, 1])
    assert full.num_nodes == 1 + 3 + 6 + 6 and full.max_depth == 3
    expected_children = {0: 3, 1: 2, 2: 1, 3: 0}
    for node in range(full.num_nodes):
        assert full.num_children[node] == expected_children[full.depth[node]]
    assert TreeShape.full([1, 1, 1]) == TreeShape.chain(3)
    assert TreeShape.full([]) == TreeShape.chain(0)


def test_from_parents_keeps_any_topological_order():
    # depth-first order: siblings still in index order, ranks from that order
    shape = TreeShape.from_parents([-1, 0, 1, 1, 0, 4, 0])
    assert shape.child_rank == (-1, 0, 0, 1, 1, 0, 2)
    assert shape.depth == (0, 1, 2, 2, 1, 2, 1)
    assert shape.paths() == [[0], [0, 0], [0, 1], [1], [1, 0], [2]]
    assert TreeShape.from_parents(torch.tensor([-1, 0, 0])) == TreeShape((-1, 0, 0))


def test_rank_gaps_and_explicit_ranks():
    shape = TreeShape.from_paths([[0], [2], [2, 5]])
    assert shape.child_rank == (-1, 0, 2, 5) and shape.parents == (-1, 0, 0, 2)
    assert TreeShape((-1, 0, 0, 2), (-1, 0, 2, 5)) == shape
    assert shape != TreeShape.from_parents((-1, 0, 0, 2))          # same parents, other ranks
    assert len({shape, TreeShape.from_paths([[2, 5], [2], [0]])}) == 1   # hashable, canonical


def test_to_tensors():
    shape = TreeShape.from_paths([[0], [1], [0, 0]])
    tensors = shape.to_tensors("cpu")
    for tensor, expected in zip(tensors, (shape.parents, shape.child_rank, shape.depth)):
        assert tensor.dtype == torch.int64 and tensor.shape == (4,)
        assert tensor.tolist() == list(expected)
    assert tensors.depth.tolist() == [0, 1, 1, 2]


@pytest.mark.parametrize("make, error, fragment", [
    (lambda: TreeShape(()), ValueError, "parents"),
    (lambda: TreeShape((0, 0)), ValueError, "parents[0]"),
    (lambda: TreeShape((-1, 1)), ValueError, "parents[1]"),
    (lambda: TreeShape((-1, 0, -1)), ValueError, "parents[2]"),
    (lambda: TreeShape((-1, 0.0)), TypeError, "parents[1]"),
    (lambda: TreeShape((-1, True)), TypeError, "parents[1]"),
    (lambda: TreeShape("ab"), TypeError, "parents"),
    (lambda: TreeShape((-1, 0), (-1,)), ValueError, "child_rank"),
    (lambda: TreeShape((-1, 0), (0, 0)), ValueError, "child_rank[0]"),
    (lambda: TreeShape((-1, 0, 0), (-1, 1, 1)), ValueError, "child_rank[2]"),
    (lambda: TreeShape((-1, 0, 0), (-1, 1, 0)), ValueError, "child_rank[2]"),
    (lambda: TreeShape((-1, 0), (-1, -2)), ValueError, "child_rank[1]"),
    (lambda: TreeShape.from_paths([[0], [0, 1], [1, 1]]), ValueError, "prefix [1]"),
    (lambda: TreeShape.from_paths([[0], [0]]), ValueError, "more than once"),
    (lambda: TreeShape.from_paths([[]]), ValueError, "paths[0]"),
    (lambda: TreeShape.from_paths([[0], [-1]]), ValueError, "paths[1]"),
    (lambda: TreeShape.from_paths([[0], ["a"]]), TypeError, "paths[1][0]"),
    (lambda: TreeShape.from_paths(3), TypeError, "paths"),
    (lambda: TreeShape.chain(-1), ValueError, "num_draft_tokens"),
    (lambda: TreeShape.chain(2.0), TypeError, "num_draft_tokens"),
    (lambda: TreeShape.full([2, 0]), ValueError, "branching[1]"),
    (lambda: TreeShape.from_parents(torch.tensor([-1.0, 0.0])), TypeError, "parents"),
    (lambda: TreeShape.chain(2).children(3), ValueError, "node"),
])
def test_shape_bad_input(make, error, fragment):
    with pytest.raises(error, match=None) as info:
        make()
    assert fragment in str(info.value)


def test_shape_is_frozen():
    shape = TreeShape.chain(2)
    with pytest.raises(AttributeError):
        shape.parents = (-1,)  # type: ignore[misc]


# ============================================================================ Sequoia
# A tree is represented here, independently of TreeShape, by the tuple of its root's child
# subtrees in rank order (a leaf is ()).


@functools.cache
def _forests(num_nodes: int) -> tuple[tuple, ...]:
    """Every ordered forest with exactly ``num_nodes`` nodes."""
    if num_nodes == 0:
        return ((),)
    return tuple((first,) + rest for size in range(1, num_nodes + 1)
                 for first in _forests(size - 1) for rest in _forests(num_nodes - size))


def _all_trees(max_nodes: int) -> list[tuple]:
    return [tree for n in range(1, max_nodes + 1) for tree in _forests(n - 1)]


def _size(tree: tuple) -> int:
    return 1 + sum(_size(c) for c in tree)


def _depth(tree: tuple) -> int:
    return 1 + max(_depth(c) for c in tree) if tree else 0


def _width(tree: tuple) -> int:
    return max([len(tree)] + [_width(c) for c in tree])


def _value(tree: tuple, a: list[float]) -> float:
    """The objective written as the recursion S = sum_i a_i (1 + S(child_i))."""
    return sum(a[i] * (1.0 + _value(child, a)) for i, child in enumerate(tree))


def _paths(tree: tuple, prefix: tuple = ()) -> list[list[int]]:
    out = []
    for rank, child in enumerate(tree):
        out.append(list(prefix + (rank,)))
        out.extend(_paths(child, prefix + (rank,)))
    return out


def _acceptance_vectors() -> list[list[float]]:
    gen = torch.Generator().manual_seed(7)
    vectors = [[0.7], [0.35, 0.35], [0.5, 0.0, 0.3], [0.1, 0.6], [0.05, 0.1, 0.2, 0.3],
               [1.0, 0.0, 0.0], [0.0, 0.0]]
    for length in (2, 3, 4, 10):
        raw = torch.rand(length, generator=gen, dtype=torch.float64)
        total = 0.5 + 0.5 * float(torch.rand(1, generator=gen, dtype=torch.float64))
        decreasing = (raw / raw.sum() * total).sort(descending=True).values
        vectors.append(decreasing.tolist())
        vectors.append(decreasing[torch.randperm(length, generator=gen)].tolist())
    return vectors


BRUTE_FORCE_NODES = 9


@pytest.mark.parametrize("a", _acceptance_vectors())
def test_sequoia_matches_brute_force(a):
    trees = [t for t in _all_trees(BRUTE_FORCE_NODES) if _width(t) <= len(a)]
    table = [(_size(t), _depth(t), _value(t, a)) for t in trees]
    for n in range(1, BRUTE_FORCE_NODES + 1):
        for d in range(0, n + 1):
            best = max(v for size, depth, v in table if size <= n and depth <= d)
            shape, value = sequoia_shape(a, n, d)
            assert shape.num_nodes <= n and shape.max_depth <= d
            assert max(shape.num_children) <= len(a)
            assert abs(value - best) <= 1e-12, (a, n, d, value, best)
            assert value == expected_accepted_length(shape, a)


def test_objective_two_ways():
    """expected_accepted_length (sum of path products) == the recursion, on every small tree."""
    a = [0.45, 0.25, 0.15, 0.1, 0.05]
    for tree in _all_trees(7):
        if _width(tree) <= len(a):
            shape = TreeShape.from_paths(_paths(tree))
            assert shape.num_nodes == _size(tree) and shape.max_depth == _depth(tree)
            assert abs(expected_accepted_length(shape, a) - _value(tree, a)) <= 1e-14


@pytest.mark.parametrize("n, d", [(1, 0), (1, 5), (2, 1), (6, 10), (6, 3), (17, 16), (64, 16)])
def test_sequoia_special_cases(n, d):
    length = min(n - 1, d)
    shape, value = sequoia_shape([1.0, 0.0, 0.0], n, d)             # only rank 0 ever accepted
    assert shape == TreeShape.chain(length) and value == length
    for x in (0.3, 0.9):                                             # one rank: chains only
        shape, value = sequoia_shape([x], n, d)
        assert shape == TreeShape.chain(length)
        assert abs(value - sum(x ** i for i in range(1, length + 1))) <= 1e-12
    shape, value = sequoia_shape([0.0, 0.0], n, d)                   # nothing is accepted
    assert shape == TreeShape.chain(0) and value == 0.0
    if n > 1 and d > 0:                                              # equal ranks, depth 1: a star
        shape, value = sequoia_shape([1.0 / (n - 1)] * (n - 1), n, 1)
        assert shape == TreeShape.full([n - 1]) and abs(value - 1.0) <= 1e-12


def test_sequoia_worked_examples():
    shape, value = sequoia_shape([0.6, 0.2], 4, 2)
    assert shape.paths() == [[0], [1], [0, 0]] and abs(value - 1.16) <= 1e-12
    shape, value = sequoia_shape([0.6, 0.2], 4, 3)
    assert shape == TreeShape.chain(3) and abs(value - 1.176) <= 1e-12
    # ranks are contiguous: a lone child has rank 0 even when rank 1 is more likely
    assert sequoia_shape([0.1, 0.6], 2, 1) == (TreeShape.chain(1), 0.1)
    assert sequoia_shape([0.1, 0.6], 3, 1)[0] == TreeShape.full([2])


def test_sequoia_large_budget_beats_other_shapes():
    """n = 64, d = 16: no random shape within the budget does better; monotone in n and d."""
    gen = torch.Generator().manual_seed(3)
    a = [0.55, 0.2, 0.1, 0.05, 0.03, 0.02]
    shape, value = sequoia_shape(a, 64, 16)
    assert shape.num_nodes == 64 and shape.max_depth <= 16
    for _ in range(200):
        parents, depth, kids = [-1], [0], [0]
        while len(parents) < 64:
            parent = int(torch.randint(len(parents), (1,), generator=gen))
            if depth[parent] == 16 or kids[parent] == len(a):
                break
            parents.append(parent)
            depth.append(depth[parent] + 1)
            kids[parent] += 1
            kids.append(0)
        assert expected_accepted_length(TreeShape.from_parents(parents), a) <= value + 1e-12
    previous = 0.0
    for n in range(1, 40, 3):
        row = [sequoia_shape(a, n, d)[1] for d in range(0, 12)]
        assert all(x <= y + 1e-12 for x, y in zip(row, row[1:]))
        assert row[-1] >= previous - 1e-12
        previous = row[-1]


def test_objective_is_expected_accepted_length_of_deterministic_rule():
    """With context-independent p and q, the deterministic-children rule accepts the rank-r
    child (q's r-th most likely token) with probability a_r = p(that token): the exact expected
    accepted length of the walk equals the objective, rank gaps included."""
    p = [Fraction(k, 28) for k in (7, 1, 6, 5, 4, 3, 2)]
    top_of_q = [0, 2, 3, 4, 1, 5, 6]                  # the draft's ranking of the 7 tokens
    a = [p[token] for token in top_of_q]

    def walk(shape: TreeShape, node: int) -> Fraction:
        residual, reach, total = list(p), Fraction(1), Fraction(0)
        for child in shape.children(node):
            token = top_of_q[shape.child_rank[child]]
            accept = residual[token]
            total += reach * accept * (1 + walk(shape, child))
            reach *= 1 - accept
            residual[token] = Fraction(0)
            mass = sum(residual)
            if mass > 0:         # zero only once every token was a child: nothing follows
                residual = [r / mass for r in residual]
        return total

    for shape in (TreeShape.full([2, 2]), TreeShape.from_paths([[0], [2], [0, 1], [0, 3], [2, 0]]),
                  TreeShape.chain(3), sequoia_shape([float(x) for x in a], 9, 3)[0]):
        exact = walk(shape, 0)
        assert abs(float(exact) - expected_accepted_length(shape, [float(x) for x in a])) <= 1e-12


def test_acceptance_from_conditional():
    assert acceptance_from_conditional([0.5, 0.5, 1.0]) == [0.5, 0.25, 0.25]
    conditional = [0.8, 0.6, 0.5]
    a = acceptance_from_conditional(torch.tensor(conditional, dtype=torch.float64))
    assert abs(sum(a) - (1 - 0.2 * 0.4 * 0.5)) <= 1e-15
    with pytest.raises(ValueError, match="acceptance_from_conditional"):
        sequoia_shape(conditional, 8, 3)                  # conditional rates are not a_r
    assert sequoia_shape(a, 8, 3)[1] > 0


@pytest.mark.parametrize("call, error, fragment", [
    (lambda: sequoia_shape([], 4, 2), ValueError, "acceptance_by_rank"),
    (lambda: sequoia_shape([0.5, -0.1], 4, 2), ValueError, "acceptance_by_rank[1]"),
    (lambda: sequoia_shape([float("nan")], 4, 2), ValueError, "acceptance_by_rank[0]"),
    (lambda: sequoia_shape([0.7, 0.7], 4, 2), ValueError, "sum"),
    (lambda: sequoia_shape([True], 4, 2), TypeError, "acceptance_by_rank[0]"),
    (lambda: sequoia_shape("0.5", 4, 2), TypeError, "acceptance_by_rank"),
    (lambda: sequoia_shape(torch.ones(2, 2) / 4, 4, 2), TypeError, "acceptance_by_rank"),
    (lambda: sequoia_shape([0.5], 0, 2), ValueError, "num_nodes"),
    (lambda: sequoia_shape([0.5], 4.0, 2), TypeError, "num_nodes"),
    (lambda: sequoia_shape([0.5], 4, -1), ValueError, "max_depth"),
    (lambda: sequoia_shape([0.5], 4, True), TypeError, "max_depth"),
    (lambda: expected_accepted_length(TreeShape.full([3]), [0.5, 0.2]), ValueError, "rank 2"),
    (lambda: expected_accepted_length([-1, 0], [0.5]), TypeError, "shape"),
    (lambda: acceptance_from_conditional([1.5]), ValueError, "conditional_rates[0]"),
])
def test_sequoia_bad_input(call, error, fragment):
    with pytest.raises(error) as info:
        call()
    assert fragment in str(info.value)
