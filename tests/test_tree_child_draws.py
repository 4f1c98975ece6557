"""Stochastic child draws: the inverse-CDF intervals of ``draw_children`` (with and without
replacement), and, by exact enumeration with Fractions, why the stochastic rules need the shape
fixed before the draws: SpecInfer / recursive rejection sampling over a fixed number of drawn
children emit exactly the target's law, while the same rule applied after re-ranking sampled
children by draft probability does not.
"""

from __future__ import annotations

import itertools
from fractions import Fraction

import pytest
import torch

from specdecode.trees.stochastic import draw_children



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
