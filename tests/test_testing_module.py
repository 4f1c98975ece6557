"""``specdecode.testing``, the public exact-test helper: it passes the lossless chain rules
(built-in and written by hand), rejects lossy ones and broken variants of the lossless ones, and
its chi-square agrees with the test suite's own (scipy) implementation."""

from __future__ import annotations

import doctest

import pytest
import rule_variants as rv
import stat_utils as su
import torch

import specdecode
import specdecode.testing as st


@pytest.mark.parametrize("rule", ["token", "block"])
def test_lossless_chain_rules_pass(rule):
    for seed in (0, 1, 2):
        result = st.exact_test(rule, num_samples=40_000, seed=seed)
        assert result.passed, f"{rule} seed {seed}: {result}"


@pytest.mark.parametrize("rule,options", [("typical", {"epsilon": 0.3}), ("top_beta", {"beta": 2}),
                                          ("greedy", {})])
def test_lossy_chain_rules_fail(rule, options):
    result = st.exact_test(rule, num_samples=40_000, seed=1, **options)
    assert not result.passed, f"{rule}: {result}"


def test_a_hand_written_rule_passes_and_its_broken_variants_fail():
    """A function (not registered) is tested directly; the suite's vectorised token rule is the
    control, its variants without the residual or with the wrong acceptance are caught."""
    assert st.exact_test(rv.make_token_rule(), num_samples=40_000, seed=3).passed
    assert st.exact_test(rv.make_block_rule(), num_samples=40_000, seed=3).passed
    for broken in (rv.make_token_rule(residual=False), rv.make_token_rule(accept="p"), rv.make_block_rule(h="w")):
        assert not st.exact_test(broken, num_samples=40_000, seed=3).passed


def test_registered_user_rule_by_name(user_rules):
    user_rules("hand_token", rv.make_token_rule(), lossless=True)
    assert st.exact_test("hand_token", num_samples=20_000, seed=4).passed


def test_chi_square_matches_scipy():
    gen = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(40, generator=gen, dtype=torch.float64) * 2, 0)
    counts = torch.bincount(torch.multinomial(probs, 3000, replacement=True, generator=gen), minlength=40)
    mine = st.goodness_of_fit(counts, probs)
    theirs = su.goodness_of_fit(counts, probs)
    assert mine.dof == theirs.dof and mine.statistic == pytest.approx(theirs.statistic)
    assert mine.pvalue == pytest.approx(theirs.pvalue, rel=1e-6)
    impossible = st.goodness_of_fit(torch.tensor([5, 5, 1]), torch.tensor([0.5, 0.5, 0.0]))
    assert impossible.impossible == 1 and impossible.pvalue == 0.0 and not impossible.passed


def test_tables_are_checked_and_distributions():
    tables = st.random_tables(3, 2, seed=5)
    assert torch.allclose(tables.target.sum(-1), torch.ones(13, dtype=torch.float64))
    assert float(st.exact_joint(tables, 3).sum()) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="vocab_size"):
        st.random_tables(1)
    with pytest.raises(ValueError, match="children"):
        st.exact_tree_test("rrs", children="hub")
    with pytest.raises(ValueError, match="num_samples"):
        st.exact_test("token", num_samples=0)
    with pytest.raises(ValueError, match="alpha"):
        st.exact_test("token", alpha=1.5)
    with pytest.raises(ValueError, match="tables: rows for prefixes up to length 2 are needed, these stop at 1"):
        st.exact_tree_test("rrs", children="without_replacement", tables=st.random_tables(3, 1))


def test_docstring_examples():
    import specdecode.trees.reference

    for module in (st, specdecode.trees.reference):
        result = doctest.testmod(module, extraglobs={"torch": torch, "specdecode": specdecode})
        assert result.attempted > 0 and result.failed == 0, f"{module.__name__}: {result}"
