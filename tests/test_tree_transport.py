"""SpecTr's k-sequential selection and SpecHub (``specdecode.trees.transport``): exact
losslessness by enumeration with their drafting schemes, broken variants rejected, the
relaxation ``rho``, and SpecHub's drafting function against its exact law."""

from __future__ import annotations

from collections import Counter
from fractions import Fraction

import pytest
import torch
import tree_law_utils as tlu
import tree_stat_utils as tsu

from specdecode.trees.reference import rrs_node, specinfer_node
from specdecode.trees.transport import draw_hub_children, hub_token, spechub_node, spectr_node, spectr_rho

SPECTR = tlu.node_rule_as_row(tlu.memoized_spectr_node())
SPECHUB = tlu.node_rule_as_row(spechub_node)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("branching", [[2], [4], [2, 2], [3, 1]], ids=str)
def test_spectr_and_spechub_are_exactly_lossless(seed, branching):
    tables, shape = tsu.ExactTables(3, seed), tsu.branching_shape(branching)
    assert tsu.law_difference(tlu.whole_tree_law(tables, shape, SPECTR, "iid"), tables, shape) == 0
    assert tsu.law_difference(tlu.whole_tree_law(tables, shape, SPECHUB, "hub"), tables, shape) == 0


@pytest.mark.parametrize("name, rule, scheme, seed", [
    ("spectr without the relaxation (rho = 1)", tlu.node_rule_as_row(spectr_node, rho=1), "iid", 1),
    ("spechub without the cap at the hub", tlu.node_rule_as_row(spechub_node, cap_hub=False), "hub", 8),
    ("spechub fed i.i.d. children", SPECHUB, "iid", 0),
])
def test_broken_transport_variants_are_rejected(name, rule, scheme, seed):
    tables, shape = tsu.ExactTables(3, seed), tsu.branching_shape([2])
    assert tsu.law_difference(tlu.whole_tree_law(tables, shape, rule, scheme), tables, shape) > 0, name


def test_spectr_rho_is_the_smallest_feasible_relaxation():
    p = [Fraction(1, 2), Fraction(1, 3), Fraction(1, 6)]
    q = [Fraction(1, 6), Fraction(1, 3), Fraction(1, 2)]
    assert spectr_rho(p, q, 1) == 1
    assert spectr_rho(p, p, 3) == 1                      # p == q needs no relaxation
    for k in (2, 3, 4):
        rho = spectr_rho(p, q, k)
        beta = sum(min(b, a / rho) for a, b in zip(p, q))
        assert 1 <= rho <= k and rho * beta >= 1 - (1 - beta) ** k
        lower = rho - Fraction(k, 2**39)
        beta = sum(min(b, a / lower) for a, b in zip(p, q))
        assert lower * beta < 1 - (1 - beta) ** k          # a visibly smaller rho is infeasible


def test_spectr_with_one_child_is_token_verification():
    tables, shape = tsu.ExactTables(3, 4), tsu.chain_shape(2)
    assert tlu.whole_tree_law(tables, shape, SPECTR, "iid") == \
        tlu.whole_tree_law(tables, shape, tlu.node_rule_as_row(specinfer_node), "iid")


def test_draw_hub_children_follows_the_hub_scheme():
    q = [Fraction(2, 5), Fraction(1, 5), Fraction(3, 10), Fraction(1, 10)]
    exact = dict(tlu.hub_children(q, 3))
    assert sum(exact.values()) == 1 and hub_token(q) == 0
    n = 40000
    gen = torch.Generator().manual_seed(0)
    probs = torch.tensor([[float(v) for v in q]], dtype=torch.float64).expand(n, 4)
    drawn = draw_hub_children(probs, 3, torch.rand(n, 3, generator=gen, dtype=torch.float64))
    counts = Counter(tuple(row) for row in drawn.tolist())
    assert set(counts) <= set(exact)
    for cell, prob in exact.items():
        expected = n * float(prob)
        assert abs(counts[cell] - expected) < 5 * expected**0.5 + 5, cell


def test_draw_hub_children_when_q_is_one_hot():
    probs = torch.tensor([[0.0, 1.0, 0.0]], dtype=torch.float64)
    out = draw_hub_children(probs, 3, torch.full((1, 3), 0.5, dtype=torch.float64))
    assert out.tolist() == [[1, -1, -1]]


def test_spechub_is_above_rrs_on_average_but_not_on_every_table():
    """docs/trees.md: SpecHub spends one of its two drafts on the hub, which loses to rrs when
    the target dislikes the hub (table 8), and wins elsewhere (table 7)."""
    shape = tsu.branching_shape([2])
    rrs = tlu.node_rule_as_row(rrs_node)
    values = {}
    for seed in (7, 8):
        tables = tsu.ExactTables(3, seed)
        values[seed] = (tsu.expected_accepted(tlu.whole_tree_law(tables, shape, SPECHUB, "hub")),
                        tsu.expected_accepted(tlu.whole_tree_law(tables, shape, rrs, "without_replacement")))
    assert values[8][0] < values[8][1]
    assert values[7][0] > values[7][1]
