"""Tree shapes, Sequoia's optimal shape, dynamic (EAGLE-2) selection and stochastic child draws.

The Sequoia DP is checked against brute force over every rooted ordered tree of up to 9 nodes;
the dynamic selection against a plain-Python ranking; the child draws by the exact uniform
intervals of the inverse CDF. The last section shows, by exact enumeration with Fractions, why
the stochastic rules need the shape fixed before the draws: SpecInfer / recursive rejection
sampling over a fixed number of drawn children emit exactly the target's law, while the same
rule applied after re-ranking sampled children by draft probability does not.
"""

from __future__ import annotations

import functools
import itertools
import math
from fractions import Fraction

import pytest
import torch

from specdecode.trees.dynamic import prune_to_budget, select_frontier
from specdecode.trees.sequoia import (
    acceptance_from_conditional,
    expected_accepted_length,
    sequoia_shape,
)
from specdecode.trees.shapes import TreeShape
from specdecode.trees.stochastic import draw_children

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


# ============================================================================ dynamic trees


def _frontier_reference(values: list[float], valid: list[bool], k: int) -> list[int]:
    ranked = sorted((i for i in range(len(values)) if valid[i]), key=lambda i: (-values[i], i))
    width = min(k, len(values))
    return (ranked + [-1] * width)[:width]


@pytest.mark.parametrize("batch, width, k", [(1, 1, 1), (3, 7, 3), (17, 20, 4), (3, 5, 9)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_select_frontier_matches_reference(batch, width, k, dtype):
    gen = torch.Generator().manual_seed(batch * 100 + width)
    # coarse values: many exact ties, some -inf (probability 0), NaN only at invalid entries
    values = torch.log(torch.randint(0, 4, (batch, width), generator=gen).to(dtype) / 4)
    valid = torch.rand(batch, width, generator=gen) < 0.7
    values = torch.where(valid, values, torch.full_like(values, math.nan))
    before = values.clone()
    got = select_frontier(values, valid, k)
    assert got.dtype == torch.int64 and got.shape == (batch, min(k, width))
    for b in range(batch):
        assert got[b].tolist() == _frontier_reference(values[b].tolist(), valid[b].tolist(), k)
    assert torch.equal(values.isnan(), before.isnan()) and torch.equal(
        values.nan_to_num(), before.nan_to_num())


def _random_tree(gen: torch.Generator, width: int, monotone: bool, dtype=torch.float64):
    parents = torch.full((width,), -1, dtype=torch.int64)
    values = torch.zeros(width, dtype=dtype)
    for i in range(1, width):
        parents[i] = int(torch.randint(i, (1,), generator=gen))
        if monotone:   # probabilities 1, 1/2, 1/4, 0 or random: ties and -inf included
            choice = int(torch.randint(5, (1,), generator=gen))
            prob = [1.0, 0.5, 0.25, 0.0, float(torch.rand(1, generator=gen))][choice]
            values[i] = values[parents[i]] + math.log(prob) if prob > 0 else -math.inf
        else:
            values[i] = -3 * float(torch.rand(1, generator=gen))
    return parents, values


def _prune_reference(parents: list[int], values: list[float], num_valid: int,
                     num_nodes: int) -> list[int]:
    """The kept node set, by plain ranking on the path minimum (the root first)."""
    key = [math.inf] + [0.0] * (num_valid - 1)
    for i in range(1, num_valid):
        key[i] = min(values[i], key[parents[i]])
    ranked = sorted(range(num_valid), key=lambda i: (-key[i], i))
    return sorted(ranked[:num_nodes])


@pytest.mark.parametrize("batch, width, num_nodes", [(1, 1, 1), (3, 7, 4), (17, 30, 11),
                                                     (3, 6, 9), (5, 40, 1)])
@pytest.mark.parametrize("monotone", [True, False])
def test_prune_to_budget(batch, width, num_nodes, monotone):
    gen = torch.Generator().manual_seed(batch + 31 * width + num_nodes + monotone)
    rows = [_random_tree(gen, width, monotone) for _ in range(batch)]
    parents = torch.stack([r[0] for r in rows])
    values = torch.stack([r[1] for r in rows])
    num_valid = torch.randint(1, width + 1, (batch,), generator=gen)
    num_valid[0] = width
    # padding garbage must be ignored
    column = torch.arange(width)
    pad = column[None, :] >= num_valid[:, None]
    parents = torch.where(pad, torch.full_like(parents, 10 ** 6), parents)
    values = torch.where(pad, torch.full_like(values, math.nan), values)
    values[:, 0] = -5.0                                   # the root's value is ignored
    inputs = (parents.clone(), values.clone(), num_valid.clone())

    out = prune_to_budget(parents, values, num_valid, num_nodes)
    assert out.keep.shape == out.parents.shape == (batch, num_nodes)
    assert torch.equal(out.num_nodes, num_valid.clamp(max=num_nodes))
    for b in range(batch):
        count = int(out.num_nodes[b])
        keep = out.keep[b].tolist()
        new_parents = out.parents[b].tolist()
        assert keep[:count] == _prune_reference(parents[b].tolist(), values[b].tolist(),
                                                int(num_valid[b]), num_nodes)
        assert keep[0] == 0 and new_parents[0] == -1
        kept = set(keep[:count])
        for j in range(1, count):
            old_parent = int(parents[b, keep[j]])
            assert old_parent in kept                                    # ancestor closure
            assert 0 <= new_parents[j] < j and keep[new_parents[j]] == old_parent
        assert keep[count:] == [0] * (num_nodes - count)
        assert new_parents[count:] == [0] * (num_nodes - count)
        if monotone:   # the kept nodes are exactly the best by value (no ancestor adjustment)
            v = values[b].tolist()
            worst_kept = min((v[i] for i in keep[1:count]), default=math.inf)
            dropped = [v[i] for i in range(1, int(num_valid[b])) if i not in kept]
            assert all(x <= worst_kept for x in dropped)
    for before, after in zip(inputs, (parents, values, num_valid)):
        assert torch.equal(before.nan_to_num(), after.nan_to_num())


def test_prune_ties_keep_closure():
    """All values equal (probability-1 children): ties go to the lower index, i.e. parents."""
    parents = torch.tensor([[-1, 0, 1, 2, 0, 4, 5, 3]])
    values = torch.zeros(1, 8)
    out = prune_to_budget(parents, values, torch.tensor([8]), 5)
    assert out.keep.tolist() == [[0, 1, 2, 3, 4]]
    assert out.parents.tolist() == [[-1, 0, 1, 2, 0]]


def test_prune_closure_on_deep_paths_with_increasing_values():
    """Values that rise again deep in a long chain (not a product of probabilities): every node
    below node 1 ranks by node 1's low value, so the kept set is still closed and the best."""
    # a chain over the whole width (the deepest path is as long as possible) ...
    for width in (18, 33):                  # 17 and 32 nodes below the root
        parents = torch.arange(-1, width - 1)[None]
        values = torch.full((1, width), -1.0)
        values[0, 1] = -3.0
        for budget in (2, 3, 17, width):
            out = prune_to_budget(parents, values, torch.tensor([width]), budget)
            assert out.keep[0].tolist() == list(range(budget))
            assert out.parents[0].tolist() == list(range(-1, budget - 1))
    # ... and a chain next to a second root child that beats it
    width = 34
    parents = torch.tensor([[-1] + list(range(32)) + [0]])
    values = torch.full((1, width), -1.0)
    values[0, 1] = -3.0
    values[0, 33] = -2.0
    for budget in (3, 5, 34):
        out = prune_to_budget(parents, values, torch.tensor([width]), budget)
        expected = sorted([0, 33] + list(range(1, budget - 1)))
        assert out.keep[0].tolist() == expected
        assert out.parents[0, 1:].tolist() == [expected.index(int(parents[0, i]))
                                                for i in expected[1:]]


def test_prune_matches_topk_of_eagle_style_expansion():
    """A two-level top-2 expansion: the 4 best nodes by path probability, re-indexed."""
    # root -> a (0.6), b (0.3); a -> c (0.5: 0.30), d (0.4: 0.24); b -> e (0.9: 0.27), f (0.1)
    parents = torch.tensor([[-1, 0, 0, 1, 1, 2, 2]])
    probs = torch.tensor([[1.0, 0.6, 0.3, 0.30, 0.24, 0.27, 0.03]], dtype=torch.float64)
    out = prune_to_budget(parents, probs.log(), torch.tensor([7]), 5)
    assert out.keep.tolist() == [[0, 1, 2, 3, 5]]
    assert out.parents.tolist() == [[-1, 0, 0, 1, 2]]


@pytest.mark.parametrize("call, error, fragment", [
    (lambda: select_frontier(torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool), 0),
     ValueError, "k"),
    (lambda: select_frontier(torch.zeros(2, 3), torch.ones(2, 3), 1), TypeError, "valid"),
    (lambda: select_frontier(torch.zeros(2, 3), torch.ones(2, 4, dtype=torch.bool), 1),
     ValueError, "valid"),
    (lambda: select_frontier(torch.zeros(2, 3, dtype=torch.int64),
                             torch.ones(2, 3, dtype=torch.bool), 1), TypeError, "path_log_values"),
    (lambda: select_frontier(torch.full((1, 2), math.nan), torch.ones(1, 2, dtype=torch.bool), 1),
     ValueError, "NaN"),
    (lambda: select_frontier(torch.zeros(3), torch.ones(3, dtype=torch.bool), 1),
     ValueError, "path_log_values"),
    (lambda: prune_to_budget(torch.tensor([[-1, 0]]), torch.zeros(1, 2), torch.tensor([2]), 0),
     ValueError, "num_nodes"),
    (lambda: prune_to_budget(torch.tensor([[-1, 0]], dtype=torch.int32), torch.zeros(1, 2),
                             torch.tensor([2]), 2), TypeError, "parents"),
    (lambda: prune_to_budget(torch.tensor([-1, 0]), torch.zeros(2), torch.tensor([2]), 2),
     ValueError, "parents"),
    (lambda: prune_to_budget(torch.tensor([[-1, 0]]), torch.zeros(1, 3), torch.tensor([2]), 2),
     ValueError, "path_log_values"),
    (lambda: prune_to_budget(torch.tensor([[-1, 0]]), torch.zeros(1, 2), torch.tensor([3]), 2),
     ValueError, "num_valid"),
    (lambda: prune_to_budget(torch.tensor([[-1, 0]]), torch.zeros(1, 2), torch.tensor([0]), 2),
     ValueError, "num_valid"),
    (lambda: prune_to_budget(torch.tensor([[-1, 0]]), torch.zeros(1, 2), torch.tensor([2, 2]), 2),
     ValueError, "num_valid"),
    (lambda: prune_to_budget(torch.tensor([[-1, 0]]), torch.zeros(1, 2), torch.tensor([2.0]), 2),
     TypeError, "num_valid"),
    (lambda: prune_to_budget(torch.tensor([[0, 0]]), torch.zeros(1, 2), torch.tensor([2]), 2),
     ValueError, "parents"),
    (lambda: prune_to_budget(torch.tensor([[-1, 0, 2]]), torch.zeros(1, 3), torch.tensor([3]), 2),
     ValueError, "parents[0, 2]"),
    (lambda: prune_to_budget(torch.tensor([[-1, 0, 0]]), torch.tensor([[0.0, math.nan, 0.0]]),
                             torch.tensor([3]), 2), ValueError, "NaN"),
])
def test_dynamic_bad_input(call, error, fragment):
    with pytest.raises(error) as info:
        call()
    assert fragment in str(info.value)


# ============================================================================ child draws


def _interval_midpoints(weights: list[float]) -> dict[int, float]:
    """For each token with positive weight, the midpoint of its inverse-CDF interval in u."""
    total, running, out = sum(weights), 0.0, {}
    for token, w in enumerate(weights):
        if w > 0:
            out[token] = (running + w / 2) / total
        running += w
    return out


@pytest.mark.parametrize("vocab", [3, 7, 111])
def test_draw_children_inverse_cdf_intervals(vocab):
    """Every token is drawn exactly on its interval of u (length = its probability):
    i.i.d. draws use q every time; without replacement, the remaining renormalised q."""
    gen = torch.Generator().manual_seed(vocab)
    q = torch.rand(vocab, generator=gen, dtype=torch.float64)
    q[torch.rand(vocab, generator=gen) < 0.3] = 0.0
    q[1] = 0.4
    q /= q.sum()
    pairs = list(itertools.permutations([t for t in range(vocab) if q[t] > 0], 2))[:500]
    mids = _interval_midpoints(q.tolist())
    for replacement in (True, False):
        u = []
        for first, second in pairs:
            remaining = q.clone()
            if not replacement:
                remaining[first] = 0.0
            u.append([mids[first], _interval_midpoints(remaining.tolist())[second]])
        probs = q.expand(len(pairs), vocab).clone()
        uniforms = torch.tensor(u, dtype=torch.float64)
        drawn = draw_children(probs, 2, replacement, uniforms)
        assert drawn.tolist() == [list(pair) for pair in pairs]
        assert torch.equal(probs, q.expand(len(pairs), vocab))       # inputs untouched
    # ends of [0, 1): u = 0 gives the first positive token, u just below 1 the last one
    support = [t for t in range(vocab) if q[t] > 0]
    edge = torch.tensor([[0.0, 1.0 - 2.0 ** -53]], dtype=torch.float64)
    assert draw_children(q[None], 2, True, edge).tolist() == [[support[0], support[-1]]]


def test_draw_children_without_replacement_is_distinct_and_exhausts():
    q = torch.tensor([[0.0, 0.25, 0.0, 0.75]], dtype=torch.float64)
    u = torch.tensor([[0.9, 0.9, 0.9]], dtype=torch.float64)
    assert draw_children(q, 3, False, u).tolist() == [[3, 1, -1]]
    assert draw_children(q, 3, True, u).tolist() == [[3, 3, 3]]
    assert draw_children(q, 0, False, u[:, :0]).shape == (1, 0)
    gen = torch.Generator().manual_seed(5)
    probs = torch.softmax(torch.randn(17, 7, generator=gen, dtype=torch.float64), dim=1)
    uniforms = torch.rand(17, 7, generator=gen, dtype=torch.float64)
    drawn = draw_children(probs, 7, False, uniforms)
    assert all(sorted(row) == list(range(7)) for row in drawn.tolist())


@pytest.mark.parametrize("call, error, fragment", [
    (lambda: draw_children(torch.ones(1, 2) / 2, 1, True, torch.zeros(1, 1, dtype=torch.float64)),
     TypeError, "probs"),
    (lambda: draw_children(torch.ones(1, 2, dtype=torch.float64) / 2, 1, True, torch.zeros(1, 1)),
     TypeError, "uniforms"),
    (lambda: draw_children(torch.ones(1, 2, dtype=torch.float64) / 2, 2, True,
                           torch.zeros(1, 1, dtype=torch.float64)), ValueError, "uniforms"),
    (lambda: draw_children(torch.ones(1, 2, dtype=torch.float64), 1, True,
                           torch.zeros(1, 1, dtype=torch.float64)), ValueError, "sum to 1"),
    (lambda: draw_children(torch.tensor([[1.5, -0.5]], dtype=torch.float64), 1, True,
                           torch.zeros(1, 1, dtype=torch.float64)), ValueError, "non-negative"),
    (lambda: draw_children(torch.ones(1, 2, dtype=torch.float64) / 2, 1, True,
                           torch.ones(1, 1, dtype=torch.float64)), ValueError, "[0, 1)"),
    (lambda: draw_children(torch.ones(2, dtype=torch.float64) / 2, 1, True,
                           torch.zeros(1, 1, dtype=torch.float64)), ValueError, "probs"),
    (lambda: draw_children(torch.ones(1, 2, dtype=torch.float64) / 2, -1, True,
                           torch.zeros(1, 1, dtype=torch.float64)), ValueError, "num_children"),
    (lambda: draw_children(torch.ones(1, 2, dtype=torch.float64) / 2, 1, 1,
                           torch.zeros(1, 1, dtype=torch.float64)), TypeError, "replacement"),
])
def test_draw_children_bad_input(call, error, fragment):
    with pytest.raises(error) as info:
        call()
    assert fragment in str(info.value)


# ============================================================================ why shapes are fixed
# Exact laws with Fractions. One node (the root) with target p and draft q; its children are
# drafted by a scheme, then verified by SpecInfer (i.i.d. children) or recursive rejection
# sampling (children without replacement). The emitted token is the accepted child, or a draw
# from the final residual: its law must be p.


def _normalise(weights: list[Fraction]) -> list[Fraction]:
    total = sum(weights)
    return [w / total for w in weights]


def _emitted_law(p, q, children, without_replacement: bool) -> list[Fraction]:
    """Law of the emitted token given the drafted children (SpecInfer / RRS, exactly)."""
    law = [Fraction(0)] * len(p)
    residual, draft, reach = list(p), list(q), Fraction(1)
    for token in children:
        accept = min(Fraction(1), residual[token] / draft[token])
        law[token] += reach * accept
        reach *= 1 - accept
        leftover = [max(r - d, Fraction(0)) for r, d in zip(residual, draft)]
        residual = _normalise(leftover) if sum(leftover) > 0 else list(p)
        if without_replacement:
            draft[token] = Fraction(0)
            if sum(draft) > 0:
                draft = _normalise(draft)
    return [x + reach * r for x, r in zip(law, residual)]


def _draws(q, count: int, without_replacement: bool):
    """Every ordered draw of ``count`` children with its probability."""
    for children in itertools.product(range(len(q)), repeat=count):
        if without_replacement and len(set(children)) < count:
            continue
        prob, remaining = Fraction(1), list(q)
        for token in children:
            prob *= remaining[token] / sum(remaining)
            if without_replacement:
                remaining[token] = Fraction(0)
        if prob > 0:
            yield prob, children


def _scheme_law(p, q, drawn: int, keep_best: int | None, without_replacement: bool):
    """Draw ``drawn`` children; keep them all (fixed shape) or only the ``keep_best`` most
    probable under q (re-ranking sampled children, ties to the earlier draw); verify."""
    law = [Fraction(0)] * len(p)
    for prob, children in _draws(q, drawn, without_replacement):
        if keep_best is not None:
            ranked = sorted(range(drawn), key=lambda j: (-q[children[j]], j))[:keep_best]
            children = tuple(children[j] for j in ranked)
        for token, x in enumerate(_emitted_law(p, q, children, without_replacement)):
            law[token] += prob * x
    return law


PAIRS = [
    ([Fraction(1, 2), Fraction(1, 3), Fraction(1, 6)],
     [Fraction(1, 5), Fraction(3, 10), Fraction(1, 2)]),
    ([Fraction(1, 10), Fraction(2, 5), Fraction(1, 4), Fraction(1, 4)],
     [Fraction(1, 4), Fraction(1, 4), Fraction(3, 8), Fraction(1, 8)]),
]


@pytest.mark.parametrize("p, q", PAIRS)
@pytest.mark.parametrize("without_replacement", [False, True])
def test_fixed_shape_draws_are_lossless_and_reranking_is_not(p, q, without_replacement):
    for drawn in (1, 2, 3):
        assert _scheme_law(p, q, drawn, None, without_replacement) == p
    # the broken variant: draw 2 (or 3), keep the most probable 1 (or 2) by q
    for drawn, kept in ((2, 1), (3, 1), (3, 2)):
        law = _scheme_law(p, q, drawn, kept, without_replacement)
        assert sum(law) == 1
        assert max(abs(float(x - y)) for x, y in zip(law, p)) > 0.05, (drawn, kept, law)


# ============================================================================ CUDA


@pytest.mark.cuda
def test_cuda_matches_cpu():
    """The tensor functions give the same results on a GPU (skips without one)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    device = torch.device("cuda")
    gen = torch.Generator().manual_seed(11)
    rows = [_random_tree(gen, 30, monotone=True, dtype=torch.float32) for _ in range(17)]
    parents = torch.stack([r[0] for r in rows])
    values = torch.stack([r[1] for r in rows])
    num_valid = torch.randint(1, 31, (17,), generator=gen)
    valid = torch.arange(30)[None, :] < num_valid[:, None]
    cpu = prune_to_budget(parents, values, num_valid, 11)
    gpu = prune_to_budget(parents.to(device), values.to(device), num_valid.to(device), 11)
    for a, b in zip(cpu, gpu):
        assert b.device.type == "cuda" and torch.equal(a, b.cpu())
    assert torch.equal(select_frontier(values, valid, 5),
                       select_frontier(values.to(device), valid.to(device), 5).cpu())
    probs = torch.softmax(torch.randn(17, 111, generator=gen, dtype=torch.float64), dim=1)
    uniforms = torch.rand(17, 4, generator=gen, dtype=torch.float64)
    for replacement in (True, False):
        assert torch.equal(draw_children(probs, 4, replacement, uniforms),
                           draw_children(probs.to(device), 4, replacement,
                                         uniforms.to(device)).cpu())
    assert TreeShape.chain(3).to_tensors(device).parents.device.type == "cuda"
