"""Traversal verification (``specdecode.trees.traversal``): exact losslessness by enumeration
for both drafting schemes, broken variants the same check rejects, block verification on a
chain, and the expected accepted length against ``rrs`` / ``specinfer`` on the same trees."""

from __future__ import annotations

from fractions import Fraction
from functools import partial

import pytest
import tree_law_utils as tlu
import tree_stat_utils as tsu

from specdecode.trees.reference import rrs_node, specinfer_node
from specdecode.trees.traversal import rejected_update, traversal_row

WOR = partial(traversal_row, replacement=False)
IID = partial(traversal_row, replacement=True)
SHAPES = [tsu.branching_shape([2, 2]), tsu.branching_shape([3, 1]), tsu.chain_shape(3)]


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("shape", SHAPES, ids=["2x2", "3x1", "chain3"])
def test_traversal_is_exactly_lossless(seed, shape):
    tables = tsu.ExactTables(3, seed)
    assert tsu.law_difference(tlu.whole_tree_law(tables, shape, WOR, "without_replacement"), tables, shape) == 0
    assert tsu.law_difference(tlu.whole_tree_law(tables, shape, IID, "iid"), tables, shape) == 0


@pytest.mark.parametrize("name, rule, scheme, seed", [
    ("no renormalisation after a rejected child", partial(traversal_row, replacement=True, renormalize=False), "iid", 0),
    ("without-replacement update on i.i.d. children", WOR, "iid", 5),
    ("i.i.d. update on children drawn without replacement", IID, "without_replacement", 5),
])
def test_broken_traversal_variants_are_rejected(name, rule, scheme, seed):
    tables, shape = tsu.ExactTables(3, seed), tsu.branching_shape([2, 1])
    assert tsu.law_difference(tlu.whole_tree_law(tables, shape, rule, scheme), tables, shape) > 0, name


def test_traversal_on_a_chain_is_block_verification():
    """On a chain, E[accepted] = sum_i E[w_i] (block verification's identity)."""
    for seed in range(3):
        tables = tsu.ExactTables(3, seed)
        law = tlu.whole_tree_law(tables, tsu.chain_shape(3), IID, "iid")
        expected = Fraction(0)
        for tokens, _, prob in tlu.tree_draws(tables, tsu.chain_shape(3), "iid"):
            w, ctx = Fraction(1), ()
            for x in tokens[1:]:
                p, q = tables.p(ctx), tables.q(ctx)
                w = min(Fraction(1), w * p[x] / q[x])
                expected += prob * w
                ctx += (x,)
        assert tsu.expected_accepted(law) == expected


def test_traversal_accepts_at_least_as_much_as_token_level_rules():
    """By enumeration: traversal >= rrs on trees drawn without replacement and traversal_iid >=
    specinfer on i.i.d. trees, on every table tried (the paper's claim)."""
    for seed in range(6):
        tables = tsu.ExactTables(3, seed)
        for shape in SHAPES[:2]:
            trav = tsu.expected_accepted(tlu.whole_tree_law(tables, shape, WOR, "without_replacement"))
            rrs = tsu.expected_accepted(tlu.whole_tree_law(tables, shape, tlu.node_rule_as_row(rrs_node), "without_replacement"))
            assert trav >= rrs, (seed, shape)
            trav = tsu.expected_accepted(tlu.whole_tree_law(tables, shape, IID, "iid"))
            spec = tsu.expected_accepted(tlu.whole_tree_law(tables, shape, tlu.node_rule_as_row(specinfer_node), "iid"))
            assert trav >= spec, (seed, shape)


def test_rejected_update_keeps_the_mass_identity():
    m = [Fraction(1, 2), Fraction(1, 4), Fraction(0)]   # mass 3/4
    D = [Fraction(1, 4), Fraction(1, 2), Fraction(1, 4)]
    new = rejected_update(m, D, [Fraction(1, 3)] * 3)
    # Z = 1/4, Z + 1 - alpha = 1/2: alpha' = 1/2 on the excess token only
    assert new == [Fraction(1, 2), 0, 0]
    # a rejection that cannot happen (m == D) falls back to the target row
    assert rejected_update(D, D, [Fraction(1, 3)] * 3) == [Fraction(1, 3)] * 3


def test_same_coins_do_not_order_the_rules_path_by_path():
    """Exactly, with shared coins: a rule against itself always agrees; traversal against token
    verification on a chain (block against token verification) accepts more on some coins and
    fewer on others, so its advantage holds in expectation only."""
    tables, chain = tsu.ExactTables(3, 3, draft_relations=("close", "near_uniform", "independent")), tsu.chain_shape(3)
    spec = tlu.node_rule_as_row(specinfer_node)
    assert tlu.same_coin_comparison(tables, chain, spec, spec, "iid") == {"fewer": 0, "same": 1, "more": 0}
    result = tlu.same_coin_comparison(tables, chain, IID, spec, "iid")
    assert sum(result.values()) == 1
    assert result["fewer"] > 0 and result["more"] > 0
