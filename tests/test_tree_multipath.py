"""Greedy multi-path block verification (``specdecode.trees.multipath``): exact losslessness on
K i.i.d. paths by enumeration, the broken variant that ignores the picked path's own law,
block verification for one path, and the shapes it refuses."""

from __future__ import annotations

from functools import partial

import pytest
import tree_law_utils as tlu
import tree_stat_utils as tsu

from specdecode.trees.multipath import gbv_row, k_paths
from specdecode.trees.reference import specinfer_node
from specdecode.trees.traversal import traversal_row


@pytest.mark.parametrize("seed", [0, 1, 2, 5])
@pytest.mark.parametrize("K, L", [(2, 2), (3, 1), (2, 3)])
def test_gbv_is_exactly_lossless(seed, K, L):
    tables, shape = tsu.ExactTables(3, seed), tlu.paths_shape(K, L)
    assert tsu.law_difference(tlu.whole_tree_law(tables, shape, gbv_row, "iid"), tables, shape) == 0


def test_gbv_verified_against_q_instead_of_the_picked_law_is_rejected():
    tables, shape = tsu.ExactTables(3, 5), tlu.paths_shape(2, 1)
    assert tsu.law_difference(tlu.whole_tree_law(tables, shape, partial(gbv_row, skew=False), "iid"), tables, shape) > 0


def test_gbv_with_one_path_is_block_verification():
    """K = 1: GBV is block verification, which is traversal verification on a chain."""
    for seed in range(3):
        tables, shape = tsu.ExactTables(3, seed), tlu.paths_shape(1, 3)
        assert tlu.whole_tree_law(tables, shape, gbv_row, "iid") == \
            tlu.whole_tree_law(tables, shape, partial(traversal_row, replacement=True), "iid")


def test_k_paths_recognises_only_disjoint_paths_of_one_length():
    assert k_paths([-1, 0, 0, 1, 2], 5) == [[1, 3], [2, 4]]
    assert k_paths([-1], 1) == []
    assert k_paths([-1, 0, 0, 1], 4) is None          # lengths 2 and 1
    assert k_paths([-1, 0, 1, 1], 4) is None          # a node with two children


def test_gbv_against_specinfer_on_the_same_iid_paths():
    """docs/trees.md: by enumeration GBV is above specinfer on most tables but not all (table 6)."""
    shape = tlu.paths_shape(2, 2)
    spec = tlu.node_rule_as_row(specinfer_node)
    gains = []
    for seed in (0, 1, 3, 5, 7, 6):
        tables = tsu.ExactTables(3, seed)
        gains.append(tsu.expected_accepted(tlu.whole_tree_law(tables, shape, gbv_row, "iid"))
                     - tsu.expected_accepted(tlu.whole_tree_law(tables, shape, spec, "iid")))
    assert gains[-1] < 0
    assert sum(gains) > 0
