"""Multi-draft rules at one node, from optimal transport: SpecTr's k-sequential selection and
SpecHub's hub pairs. Both are per-node rules (the same signature as the node functions of
:mod:`specdecode.trees.reference`), so in a tree they run at every node, and an accepted child
continues with its own subtree.

- **SpecTr k-sequential selection** (Sun et al. 2023, *SpecTr*), children i.i.d. from ``q``
  (their count ``k`` fixed before drawing): with ``beta(rho) = sum_x min(q(x), p(x)/rho)``, take
  the smallest ``rho`` in ``[1, k]`` with ``rho * beta >= 1 - (1 - beta)^k``
  (:func:`spectr_rho`); try the children in order, accepting ``x`` with probability
  ``min(1, p(x) / (rho q(x)))``; if none is accepted emit from
  ``norm(p - c min(q, p/rho))``, ``c = (1 - (1 - beta)^k) / beta``.
- **SpecHub** (Sun et al. 2024, *SpecHub*), children drafted as a *hub pair*
  (:func:`draw_hub_children`): ``a = argmax q`` (lowest id on ties); the first child
  ``x1 ~ q``; the second is ``a`` when ``x1 != a`` and a draw from ``q`` without ``a``
  otherwise; so the pair is ``{a, y}`` with probability ``r(y) = q(y) / (1 - q(a))``. Accept
  the non-hub child ``y`` with probability ``min(1, p(y) / r(y))``; else accept the hub child
  with probability ``min(1, p(a) / A)``, ``A = sum_y (r(y) - p(y))_+``; else emit from the
  residual ``(p - r)_+`` off the hub and ``(p(a) - A)_+`` at the hub. Children after the
  first two (our extension to ``k > 2``) are drawn without replacement from ``q`` without the
  pair and verified by recursive rejection sampling from that residual.

docs/trees.md derives both and says where each one beats ``specinfer`` / ``rrs``.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any, Sequence

import torch
from torch import Tensor

from specdecode.trees.reference import argmax_lowest, normalized_or, ratio, rrs_node, specinfer_node
from specdecode.trees.stochastic import draw_children

Number = Any

#: Bisection steps of :func:`spectr_rho` (``rho`` is found to ``k * 2**-40``; any ``rho`` that
#: passes the check is exact, a larger one only accepts a little less).
RHO_STEPS = 40


class _Beta:
    """``beta(rho) = sum_x min(q(x), p(x) / rho)`` in O(log V) per call: tokens sorted by
    ``p/q``; those with ``p/q < rho`` contribute ``p/rho``, the others ``q``."""

    def __init__(self, p: Sequence[Number], q: Sequence[Number]) -> None:
        items = sorted((p[x] / q[x], p[x], q[x]) for x in range(len(q)) if q[x] > 0)
        zero = p[0] * 0
        self.ratios = [r for r, _, _ in items]
        self.low_p = [zero]
        for _, px, _ in items:
            self.low_p.append(self.low_p[-1] + px)
        self.high_q = [zero]
        for _, _, qx in reversed(items):
            self.high_q.append(self.high_q[-1] + qx)
        self.high_q.reverse()

    def __call__(self, rho: Number) -> Number:
        i = bisect_left(self.ratios, rho)
        return self.low_p[i] / rho + self.high_q[i]


def spectr_rho(p: Sequence[Number], q: Sequence[Number], k: int) -> Number:
    """The smallest ``rho`` in ``[1, k]`` (to ``k * 2**-40``) with
    ``rho * beta(rho) >= 1 - (1 - beta(rho))**k``: the relaxation that makes SpecTr's residual
    non-negative. The check is monotone in ``rho`` (``rho * beta`` grows, ``beta`` shrinks), and
    the returned value always passes it in the arithmetic of ``p`` (exact for Fractions)."""
    one = p[0] * 0 + 1
    if k <= 1:
        return one
    beta = _Beta(p, q)

    def feasible(rho: Number) -> bool:
        b = beta(rho)
        return rho * b >= 1 - (1 - b) ** k

    if feasible(one):
        return one
    lo, hi = one, one * k
    for _ in range(RHO_STEPS):
        mid = (lo + hi) / 2
        if feasible(mid):
            hi = mid
        else:
            lo = mid
    return hi


def spectr_node(p: Sequence[Number], q: Sequence[Number], children: Sequence[tuple[int, int]], chooser: Any, *,
                rho: Number | None = None, **_: Any) -> tuple[str, int]:
    """SpecTr's k-sequential selection over the node's ``k`` children (i.i.d. from q).

    ``rho`` overrides :func:`spectr_rho` (``rho=1`` is a broken variant: no relaxation).
    """
    k = len(children)
    if k == 0:
        return ("emit", chooser.sample(p))
    rho = spectr_rho(p, q, k) if rho is None else rho
    for j, (node, x) in enumerate(children):
        if chooser.accept(node, ratio(p[x], rho * q[x])):
            return ("accept", j)
    beta = sum(min(qx, px / rho) for px, qx in zip(p, q))
    c = (1 - (1 - beta) ** k) / beta if beta > 0 else 0
    residual = [max(px - c * min(qx, px / rho), 0) for px, qx in zip(p, q)]
    return ("emit", chooser.sample(normalized_or(residual, p)))


def hub_token(q: Sequence[Number]) -> int:
    """SpecHub's hub: the most likely draft token (lowest id on ties)."""
    return argmax_lowest(q)


def spechub_node(p: Sequence[Number], q: Sequence[Number], children: Sequence[tuple[int, int]], chooser: Any, *,
                 cap_hub: bool = True, **_: Any) -> tuple[str, int]:
    """SpecHub at one node whose children are a hub pair (then draws without replacement).

    ``cap_hub=False`` accepts the hub child whenever the other child is rejected (a broken
    variant: the hub then receives more than ``p(a)``).
    """
    a = hub_token(q)
    if len(children) < 2 or not q[a] < 1:  # one child: a plain draw from q (a pair needs two tokens)
        return specinfer_node(p, q, children[:1], chooser)
    (n1, x1), (n2, x2) = children[0], children[1]
    hub_node, (other_node, y) = (n1, children[1]) if x1 == a else (n2, children[0])
    rest = 1 - q[a]
    r = [qx / rest if x != a else 0 for x, qx in enumerate(q)]
    if chooser.accept(other_node, ratio(p[y], r[y])):
        return ("accept", 1 if x1 == a else 0)
    A = sum(max(rx - px, 0) for x, (rx, px) in enumerate(zip(r, p)) if x != a)
    if chooser.accept(hub_node, ratio(p[a], A) if cap_hub else 1):
        return ("accept", 0 if x1 == a else 1)
    R = [max(px - rx, 0) for px, rx in zip(p, r)]
    R[a] = max(p[a] - A, 0)
    R = normalized_or(R, p)
    if len(children) == 2:
        return ("emit", chooser.sample(R))
    D = list(q)
    D[x1] = D[x2] = 0
    D = normalized_or(D, q)
    kind, j = rrs_node(R, D, children[2:], chooser)
    return (kind, j + 2) if kind == "accept" else (kind, j)


def _draw_from(weights: Tensor, count: int, uniforms: Tensor) -> Tensor:
    """``draw_children`` without replacement from unnormalised ``weights``; rows without mass
    give ``-1``."""
    total = weights.sum(1, keepdim=True)
    empty = total[:, 0] <= 0
    safe = torch.where(empty[:, None], torch.ones_like(weights) / weights.shape[1], weights / total.clamp_min(1e-300))
    drawn = draw_children(safe, count, False, uniforms)
    return torch.where(empty[:, None], torch.full_like(drawn, -1), drawn)


def draw_hub_children(probs: Tensor, num_children: int, uniforms: Tensor) -> Tensor:
    """Draw SpecHub's children per row: ``x1 ~ q``; the hub ``argmax q`` if ``x1`` is not the
    hub, else a draw from ``q`` without the hub; then draws without replacement from ``q``
    without both. ``-1`` where ``q`` has no mass left (a function of ``q`` only).

    Shape:
        probs: ``[B, V]`` float64 (processed ``q``, rows summing to 1); uniforms:
        ``[B, num_children]`` float64 in ``[0, 1)``; returns ``[B, num_children]`` int64.
    """
    if num_children <= 1:
        return draw_children(probs, num_children, False, uniforms)
    B, V = probs.shape
    hub = torch.sort(-probs, dim=1, stable=True).indices[:, 0]
    first = draw_children(probs, 1, False, uniforms[:, :1])[:, 0]
    ids = torch.arange(V, device=probs.device)
    rest = probs.masked_fill(ids[None, :] == hub[:, None], 0.0)
    second = torch.where(first == hub, _draw_from(rest, 1, uniforms[:, 1:2])[:, 0], hub)
    out = torch.full((B, num_children), -1, dtype=torch.int64, device=probs.device)
    out[:, 0], out[:, 1] = first, second
    if num_children > 2:
        remaining = rest.masked_fill(ids[None, :] == first[:, None], 0.0)
        remaining = remaining.masked_fill(ids[None, :] == second[:, None], 0.0)
        later = _draw_from(remaining, num_children - 2, uniforms[:, 2:])
        out[:, 2:] = torch.where((second >= 0)[:, None], later, torch.full_like(later, -1))
    return out
