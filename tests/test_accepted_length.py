"""Expected accepted length (docs/verification.md §3, §8): exact values by enumeration, token vs block vs the
full-information ideal, the paper's two-token example, and the ops' empirical mean
accepted_len against the exact values.

Exact formulas (x ~ q, drafted token by token):
    token: E[tau] = sum_i E[prod_{k<=i} min(1, p_k(x_k) / q_k(x_k))]
    block: E[tau] = sum_i E[w_i],  w_i = min(1, w_{i-1} p_i(x_i) / q_i(x_i))
    ideal: sum_i (1 - TV(p^(i), q^(i)))   (the joints of the first i tokens)
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch

import specdecode
import stat_utils as su

PAPER_P = [Fraction(1, 3), Fraction(2, 3)]
PAPER_Q = [Fraction(2, 3), Fraction(1, 3)]


def _exact(tables: su.PrefixTables, rule: str, gamma: int | None = None) -> float:
    p_fn, q_fn = su.table_row_fns(tables)
    return float(su.exact_expected_accepted(p_fn, q_fn, tables.V, tables.gamma if gamma is None else gamma, rule))


def _empirical_accepted(tables: su.PrefixTables, rule: str, N: int, seed: int, num_draft=None) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    drafts = su.draw_drafts(tables, N, gen)
    p, q = su.gather_rows(tables, drafts)
    out = specdecode.verify(p.float(), q.float(), drafts, rule=rule, num_draft_tokens=num_draft,
                            generator=torch.Generator().manual_seed(seed + 1))
    return out.accepted_len.double()


def _assert_close_to(samples: torch.Tensor, exact: float, what: str, n_se: float = 4.5) -> None:
    mean = float(samples.mean())
    se = float(samples.std()) / math.sqrt(samples.numel())
    assert abs(mean - exact) <= n_se * se + 1e-12, f"{what}: empirical {mean:.5f} vs exact {exact:.5f} (se {se:.2g})"


def test_paper_example_exact():
    """Sun et al.'s example (gamma = 2, p = (1/3, 2/3), q = (2/3, 1/3), context-free): token
    verification accepts 10/9 drafts on average, block verification 11/9, the ideal 12/9."""
    p_fn, q_fn = (lambda prefix: PAPER_P), (lambda prefix: PAPER_Q)
    assert su.exact_expected_accepted(p_fn, q_fn, 2, 2, "token") == Fraction(10, 9)
    assert su.exact_expected_accepted(p_fn, q_fn, 2, 2, "block") == Fraction(11, 9)
    assert su.exact_expected_accepted(p_fn, q_fn, 2, 2, "ideal") == Fraction(12, 9)


@pytest.mark.parametrize("rule,exact", [("token", 10 / 9), ("block", 11 / 9)])
def test_paper_example_empirical(rule, exact):
    """The ops' mean accepted_len on the paper's example matches 10/9 (token) and 11/9 (block)
    within a few standard errors, and the block mean is clearly above the token mean."""
    tables = su.context_free_tables([1 / 3, 2 / 3], [2 / 3, 1 / 3], gamma=2)
    samples = _empirical_accepted(tables, rule, 200_000, 7)
    _assert_close_to(samples, exact, f"paper example, {rule}")
    # the two exact values are 1/9 apart, about 40 standard errors at this N
    assert abs(float(samples.mean()) - (21 / 9 - exact)) > 0.08


@pytest.mark.parametrize("rule", ["token", "block"])
@pytest.mark.parametrize("cfg", [(3, 2, 0), (4, 3, 1), (5, 4, 2), (3, 4, 3)], ids=lambda c: "V{}-g{}-s{}".format(*c))
def test_empirical_mean_matches_exact(rule, cfg):
    """On random context-dependent tables, the mean accepted_len of the compiled op equals the
    exact enumerated E[tau] within a few standard errors (fixed seeds)."""
    V, gamma, seed = cfg
    tables = su.make_tables(V, gamma, 200 + seed)
    _assert_close_to(_empirical_accepted(tables, rule, 100_000, seed), _exact(tables, rule), f"{rule} {cfg}")


@pytest.mark.parametrize("rule", ["token", "block"])
def test_empirical_mean_matches_exact_ragged(rule):
    """With ragged num_draft_tokens the mean accepted_len equals the average over rows of the
    exact E[tau] for that row's draft count."""
    tables = su.make_tables(4, 4, 210)
    N = 100_000
    num_draft = torch.randint(0, 5, (N,), generator=torch.Generator().manual_seed(5))
    exact_by_n = [_exact(tables, rule, gamma=n) if n > 0 else 0.0 for n in range(5)]
    exact = float(torch.tensor(exact_by_n, dtype=torch.float64)[num_draft].mean())
    samples = _empirical_accepted(tables, rule, N, 6, num_draft=num_draft)
    assert bool((samples <= num_draft).all())
    _assert_close_to(samples, exact, f"{rule} ragged")


@pytest.mark.parametrize("seed", range(40))
def test_block_never_below_token(seed):
    """Theorem 2 of the block verification paper on random pairs (exact values):
    token <= block <= ideal; with p == q all three equal gamma."""
    gen = torch.Generator().manual_seed(seed)
    V = int(torch.randint(2, 6, (1,), generator=gen))
    gamma = int(torch.randint(1, 5, (1,), generator=gen))
    tables = su.make_tables(V, gamma, 300 + seed)
    token, block, ideal = (_exact(tables, r) for r in ("token", "block", "ideal"))
    assert token <= block + 1e-12 <= ideal + 2e-12, (token, block, ideal)
    same = su.make_tables(V, gamma, 300 + seed, draft_relations=("equal",))
    assert [_exact(same, r) for r in ("token", "block", "ideal")] == pytest.approx([gamma] * 3, abs=1e-12)


def test_block_strictly_better_somewhere():
    """Block verification is strictly better than token verification on typical random pairs
    with gamma >= 2 (not merely equal)."""
    gains = [_exact(t, "block") - _exact(t, "token") for t in (su.make_tables(4, 3, 400 + s) for s in range(5))]
    assert min(gains) >= -1e-12 and max(gains) > 1e-3


def test_gamma_one_token_equals_block():
    """With a single draft, block verification is token verification: h_1 = w_1."""
    for seed in range(5):
        tables = su.make_tables(5, 1, 500 + seed)
        assert _exact(tables, "block") == pytest.approx(_exact(tables, "token"), abs=1e-12)


@pytest.mark.parametrize("seed", range(5))
def test_context_free_token_matches_analysis(seed):
    """For context-free p, q the token rule's exact E[tau] + 1 equals the analysis formula
    (1 - alpha^(gamma+1)) / (1 - alpha) with alpha = acceptance_rate(p, q) = sum min(p, q)."""
    gen = torch.Generator().manual_seed(seed)
    p = su.random_row("random", 4, gen)
    q = su.random_row("random", 4, gen)
    gamma = 3
    tables = su.context_free_tables(p.tolist(), q.tolist(), gamma)
    alpha = float(specdecode.acceptance_rate(p, q))
    assert 1.0 + _exact(tables, "token") == pytest.approx(specdecode.expected_tokens_per_call(alpha, gamma), rel=1e-12)


@pytest.mark.parametrize("rule", ["token", "block"])
def test_extremes(rule):
    """Disjoint supports accept nothing (exactly, every row), identical one-hot rows accept
    everything."""
    disjoint = su.context_free_tables([0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 0.3, 0.7], gamma=3)
    assert _exact(disjoint, rule) == 0.0
    assert bool((_empirical_accepted(disjoint, rule, 2000, 1) == 0).all())
    same = su.context_free_tables([0.0, 1.0, 0.0], [0.0, 1.0, 0.0], gamma=3)
    assert _exact(same, rule) == 3.0
    assert bool((_empirical_accepted(same, rule, 2000, 1) == 3).all())
