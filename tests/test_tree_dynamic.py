"""Dynamic (EAGLE-2) tree selection: the frontier and the pruning to a node budget against
plain-Python rankings (ties, -inf, closure over deep paths, EAGLE-style expansion), bad input,
and the tensor functions of this and the other tree modules on a GPU (skipped without one).
"""

from __future__ import annotations

import math

import pytest
import torch

from specdecode.trees.dynamic import prune_to_budget, select_frontier
from specdecode.trees.shapes import TreeShape
from specdecode.trees.stochastic import draw_children



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
