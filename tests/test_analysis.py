"""The analysis formulas of docs/verification.md §9 (Leviathan et al. 2022, §3): Table 1's speedups, the
closed forms, the optimal draft length, acceptance_rate = 1 - TV, and bad inputs.
"""

from __future__ import annotations

import math

import pytest
import torch

import specdecode
from specdecode import analysis


@pytest.mark.parametrize("alpha,gamma,expected", [
    (0.6, 2, 1.96), (0.7, 3, 2.53), (0.8, 2, 2.44), (0.8, 5, 3.69), (0.9, 2, 2.71), (0.9, 10, 6.86),
])
def test_leviathan_table_1(alpha, gamma, expected):
    """Expected improvement at c = 0 reproduces Leviathan et al.'s Table 1 (2 decimals), and at
    c = 0 speedup equals expected tokens per call."""
    speedup = specdecode.expected_speedup(alpha=alpha, num_draft_tokens=gamma, cost_ratio=0.0)
    assert round(speedup, 2) == expected
    assert speedup == pytest.approx(specdecode.expected_tokens_per_call(alpha, gamma), rel=1e-15)


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.75, 0.99])
@pytest.mark.parametrize("gamma", [0, 1, 4, 17])
@pytest.mark.parametrize("c", [0.0, 0.05, 0.5])
def test_closed_forms(alpha, gamma, c):
    """The formulas equal their definitions: tokens per call = sum_{k=0..gamma} alpha^k
    (a geometric sum), speedup divides by gamma c + 1, work growth is (gamma c + gamma + 1)
    divided by tokens per call."""
    tokens = sum(alpha**k for k in range(gamma + 1))
    assert specdecode.expected_tokens_per_call(alpha, gamma) == pytest.approx(tokens, rel=1e-12)
    assert specdecode.expected_speedup(alpha, gamma, c) == pytest.approx(tokens / (gamma * c + 1), rel=1e-12)
    assert analysis.expected_work_increase(alpha, gamma, c) == pytest.approx((gamma * c + gamma + 1) / tokens, rel=1e-12)


def test_alpha_one_limit():
    """alpha = 1 (draft == target): every draft is accepted, gamma + 1 tokens per call."""
    for gamma in (0, 1, 5, 64):
        assert specdecode.expected_tokens_per_call(1.0, gamma) == gamma + 1
        assert specdecode.expected_tokens_per_call(1.0 - 1e-12, gamma) == pytest.approx(gamma + 1, rel=1e-6)


def test_optimal_gamma_maximises_speedup():
    """optimal_num_draft_tokens returns an argmax of expected_speedup over gamma = 1..64."""
    for alpha in (0.5, 0.7, 0.8, 0.9, 0.95):
        for c in (0.01, 0.05, 0.1, 0.3):
            best = specdecode.optimal_num_draft_tokens(alpha, c)
            speedups = [specdecode.expected_speedup(alpha, g, c) for g in range(1, 65)]
            assert 1 <= best <= 64
            assert specdecode.expected_speedup(alpha, best, c) == pytest.approx(max(speedups), rel=1e-12)


def test_optimal_gamma_monotone():
    """Sanity: a better draft (higher alpha) never asks for fewer drafts, a costlier draft
    (higher c) never for more; a useless draft (alpha = 0) asks for one; a perfect free draft
    for the maximum."""
    alphas = [0.1 * k for k in range(1, 10)] + [0.95, 0.99]
    costs = [0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0]
    for c in costs[1:]:
        gammas = [specdecode.optimal_num_draft_tokens(a, c) for a in alphas]
        assert gammas == sorted(gammas), (c, gammas)
    for a in alphas:
        gammas = [specdecode.optimal_num_draft_tokens(a, c) for c in costs[1:]]
        assert gammas == sorted(gammas, reverse=True), (a, gammas)
    assert specdecode.optimal_num_draft_tokens(0.0, 0.1) == 1
    assert specdecode.optimal_num_draft_tokens(1.0, 0.0) == 64
    assert specdecode.optimal_num_draft_tokens(1.0, 0.0, max_num_draft_tokens=8) == 8


def test_speedup_below_one_when_draft_is_useless():
    """With alpha = 0 and c > 0 speculative decoding only costs time."""
    assert specdecode.expected_speedup(0.0, 4, 0.1) < 1.0


def test_acceptance_rate_is_one_minus_tv():
    """acceptance_rate(p, q) = sum_x min(p, q) = 1 - TV(p, q), batched over leading dims, and it
    is the per-position acceptance probability of token verification."""
    gen = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(3, 4, 7, generator=gen, dtype=torch.float64), -1)
    q = torch.softmax(torch.randn(3, 4, 7, generator=gen, dtype=torch.float64), -1)
    beta = specdecode.acceptance_rate(p, q)
    assert beta.shape == (3, 4)
    torch.testing.assert_close(beta, 1 - 0.5 * (p - q).abs().sum(-1))
    torch.testing.assert_close(specdecode.acceptance_rate(p, p), p.sum(-1))  # = 1 up to rounding
    disjoint_p = torch.tensor([0.5, 0.5, 0.0, 0.0])
    disjoint_q = torch.tensor([0.0, 0.0, 0.2, 0.8])
    assert float(specdecode.acceptance_rate(disjoint_p, disjoint_q)) == 0.0


def test_acceptance_rate_matches_token_verification():
    """Empirically, single-position token verification accepts with probability alpha."""
    gen = torch.Generator().manual_seed(1)
    p = torch.softmax(torch.randn(5, generator=gen, dtype=torch.float64), -1)
    q = torch.softmax(torch.randn(5, generator=gen, dtype=torch.float64), -1)
    N = 100_000
    x = torch.multinomial(q, N, replacement=True, generator=gen)[:, None]
    out = specdecode.verify(p.expand(N, 2, 5), q.expand(N, 1, 5), x, rule="token", generator=gen)
    alpha = float(specdecode.acceptance_rate(p, q))
    rate = float(out.accepted_len.double().mean())
    assert abs(rate - alpha) < 4.5 * math.sqrt(alpha * (1 - alpha) / N)


@pytest.mark.parametrize("call,match", [
    pytest.param(lambda: specdecode.expected_speedup(1.5, 3, 0.1), "alpha", id="alpha-1"),
    pytest.param(lambda: specdecode.expected_speedup(-0.1, 3, 0.1), "alpha", id="alpha-2"),
    pytest.param(lambda: specdecode.expected_speedup(math.nan, 3, 0.1), "alpha", id="alpha-3"),
    pytest.param(lambda: specdecode.expected_speedup(0.5, -1, 0.1), "num_draft_tokens", id="num_draft_tokens-1"),
    pytest.param(lambda: specdecode.expected_speedup(0.5, 2.5, 0.1), "num_draft_tokens", id="num_draft_tokens-2"),
    pytest.param(lambda: specdecode.expected_speedup(0.5, True, 0.1), "num_draft_tokens", id="num_draft_tokens-3"),
    pytest.param(lambda: specdecode.expected_speedup(0.5, 3, -0.1), "cost_ratio", id="cost_ratio-1"),
    pytest.param(lambda: specdecode.expected_speedup(0.5, 3, math.nan), "cost_ratio", id="cost_ratio-2"),
    pytest.param(lambda: specdecode.expected_tokens_per_call(2.0, 3), "alpha", id="alpha-4"),
    pytest.param(lambda: specdecode.expected_tokens_per_call(0.5, -2), "num_draft_tokens", id="num_draft_tokens-4"),
    pytest.param(lambda: analysis.expected_work_increase(1.5, 3, 0.1), "alpha", id="alpha-5"),
    pytest.param(lambda: analysis.expected_work_increase(0.5, -3, 0.1), "num_draft_tokens", id="num_draft_tokens-5"),
    pytest.param(lambda: specdecode.optimal_num_draft_tokens(1.2, 0.1), "alpha", id="alpha-6"),
    pytest.param(lambda: specdecode.optimal_num_draft_tokens(0.5, -1.0), "cost_ratio", id="cost_ratio-3"),
    pytest.param(lambda: specdecode.optimal_num_draft_tokens(0.5, 0.1, max_num_draft_tokens=0), "max_num_draft_tokens", id="max_num_draft_tokens-1"),
    pytest.param(lambda: specdecode.acceptance_rate(torch.ones(2, 3) / 3, torch.ones(2, 4) / 4), "draft_probs", id="draft_probs-1"),
])
def test_bad_inputs(call, match):
    """Out-of-range rates, draft lengths and cost ratios raise ValueError naming the argument."""
    with pytest.raises(ValueError, match=match):
        call()
