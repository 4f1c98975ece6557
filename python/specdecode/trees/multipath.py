"""Greedy multi-path block verification (GBV; after Thomas & Pal 2026, *Greedy Multi-Path Block
Verification for Faster Decoding in Speculative Sampling*): pick one of K i.i.d. draft paths
with a rule whose induced law is known, then block-verify the picked path against that law.

**Drafting.** K paths of the same length L drawn i.i.d. from the draft, laid out as a tree whose
root has K children, each the head of a chain of L nodes (first tokens may repeat). This is
what the builders produce for the shape ``[[0], [0, 0], ..., [1], [1, 0], ...]`` with
``children="iid"``.

**Selection.** Going down the positions, keep the set S of paths that agree with the picked
prefix (all K at first). At each position the rule either takes the *best* token present in
S under a local priority (tokens ranked by ``p(x) / q(x)``, highest first, lowest id on ties),
or the token of S's *first* path; S shrinks to the paths that carry the chosen token. Which of
the two it uses is decided greedily per position, before looking at the draws: the one whose
induced next-token law ``q~`` has the larger overlap ``sum_x min(p(x), q~(x))``. With ``m``
paths in S, the best-present token is ``b`` with probability
``G(b)^m - (G(b) - q(b))^m`` (``G(b)``: the mass of ``b`` and every token ranked below it),
and the first path's token is ``b`` with probability ``q(b)``. The size of S given the picked
prefix is tracked as a distribution (a forward pass over m = 1..K), so ``q~_i(. | prefix)``,
the law of the picked path, is exact at every position.

**Verification.** Block verification (Sun et al.) of the picked path with ``q~`` in place of
``q``: ``w_i = min(1, w_{i-1} p_i(x_i) / q~_i(x_i))``, accept the longest prefix ``i`` whose
coin falls under ``h_i`` (``h_L = w_L``, ``h_i = Z_i / (Z_i + 1 - w_i)``,
``Z_i = sum (w_i p_{i+1} - q~_{i+1})_+``), then emit from ``(w_tau p_{tau+1} - q~_{tau+1})_+``,
or from ``p_{L+1}`` when the whole path is accepted. Block verification is lossless for a path
of any law as long as it is verified against that law, which is why the selection may look at
the draws.

The selection is our reading of the paper's decomposition (path selection inducing a skewed
draft, then single-path block verification, with a tree-based ranking of paths); the paper's
own ranking is not reproduced. The functions work on floats or Fractions and draw every random
answer from a chooser (see :mod:`specdecode.trees.reference`).
"""

from __future__ import annotations

from math import comb
from typing import Any, Sequence

from specdecode.trees.reference import children_lists, normalized_or

Number = Any


def k_paths(parents: Sequence[int], num_nodes: int) -> list[list[int]] | None:
    """The K root-to-leaf paths (node indices, root excluded) of a tree made of K disjoint
    chains of one length below the root, or None for any other shape."""
    children = children_lists(parents, num_nodes)
    paths = []
    for head in children[0]:
        path = [head]
        while children[path[-1]]:
            if len(children[path[-1]]) != 1:
                return None
            path.append(children[path[-1]][0])
        paths.append(path)
    if len({len(path) for path in paths}) > 1:
        return None
    return paths


def _priority(p: Sequence[Number], q: Sequence[Number]) -> list[int]:
    """Tokens with q > 0, best first: by p/q descending, lowest id on ties."""
    drawable = [x for x in range(len(q)) if q[x] > 0]
    return sorted(drawable, key=lambda x: (-(p[x] / q[x]), x))


def _below(p: Sequence[Number], q: Sequence[Number]) -> list[Number]:
    """``G(x)``: the q-mass of x and of every token ranked below it."""
    G = [q[0] * 0] * len(q)
    running = q[0] * 0
    for x in reversed(_priority(p, q)):
        running = running + q[x]
        G[x] = running
    return G


def _next_law(p: Sequence[Number], q: Sequence[Number], state: list[Number], mode: str) -> list[Number]:
    """``q~(b) = sum_m state[m] * P(pick b | m paths)`` for ``mode`` "best" or "first"."""
    if mode == "first":
        return list(q)
    G = _below(p, q)
    zero = q[0] * 0
    law = []
    for b in range(len(q)):
        if q[b] > 0:
            law.append(sum((s * (G[b] ** m - (G[b] - q[b]) ** m) for m, s in enumerate(state) if m and s), zero))
        else:
            law.append(zero)
    return law


def _mode(p: Sequence[Number], q: Sequence[Number], state: list[Number]) -> tuple[str, list[Number]]:
    """The greedy choice: the mode whose next-token law overlaps p more (ties: "first")."""
    best = _next_law(p, q, state, "best")
    first = list(q)
    overlap_best = sum(min(a, b) for a, b in zip(p, best))
    overlap_first = sum(min(a, b) for a, b in zip(p, first))
    return ("best", best) if overlap_best > overlap_first else ("first", first)


def _advance(p: Sequence[Number], q: Sequence[Number], state: list[Number], mode: str, b: int) -> list[Number]:
    """The distribution of |S| after token b was picked (Bayes over the forward state)."""
    K = len(state) - 1
    new = [q[0] * 0] * (K + 1)
    G = _below(p, q) if mode == "best" else None
    for m, s in enumerate(state):
        if not m or not s:
            continue
        for n in range(1, m + 1):
            if mode == "best":
                weight = comb(m, n) * q[b] ** n * (G[b] - q[b]) ** (m - n)
            else:
                weight = q[b] * comb(m - 1, n - 1) * q[b] ** (n - 1) * (1 - q[b]) ** (m - n)
            new[n] = new[n] + s * weight
    total = sum(new)
    return [v / total for v in new] if total > 0 else new


def gbv_row(
    p_rows: Sequence[Sequence[Number]],
    q_rows: Sequence[Sequence[Number]],
    tokens: Sequence[int],
    parents: Sequence[int],
    num_nodes: int,
    chooser: Any,
    *,
    skew: bool = True,
) -> tuple[list[int], list[int]]:
    """GBV on one tree of K i.i.d. paths: ``(path node indices from the root, emitted tokens)``.

    ``skew=False`` block-verifies the picked path against ``q`` instead of its own law ``q~``
    (a deliberately broken variant the tests must reject). Raises ``ValueError`` when the tree
    is not K chains of one length below the root.
    """
    paths = k_paths(parents, num_nodes)
    if paths is None:
        raise ValueError("tree: the gbv rule needs K disjoint paths of one length below the root "
                         "(root children, each the head of a chain)")
    if not paths:
        return [0], [chooser.sample(p_rows[0])]
    K, L = len(paths), len(paths[0])
    one = p_rows[0][0] * 0 + 1
    state = [one * 0] * (K + 1)
    state[K] = one
    alive = list(range(K))
    picked: list[int] = []         # node of the picked path at each depth (a representative)
    laws: list[list[Number]] = []  # q~ at each position, then p rows along the path
    context = 0                    # the node whose rows give position i's p and q
    for i in range(L):
        p, q = p_rows[context], q_rows[context]
        mode, law = _mode(p, q, state)
        laws.append(law if skew else list(q))
        present = [int(tokens[paths[j][i]]) for j in alive]
        if mode == "best":
            rank = {x: r for r, x in enumerate(_priority(p, q))}
            b = min(present, key=lambda x: rank.get(x, len(rank)))
        else:
            b = present[0]
        alive = [j for j, x in zip(alive, present) if x == b]
        state = _advance(p, q, state, mode, b)
        context = paths[alive[0]][i]
        picked.append(context)
    # block verification of the picked path against laws[i]
    path_rows = [p_rows[0]] + [p_rows[v] for v in picked]       # p_1 .. p_{L+1}
    xs = [int(tokens[v]) for v in picked]
    weights = [one]
    for i in range(L):
        px, qx = path_rows[i][xs[i]], laws[i][xs[i]]
        w = weights[-1] * px / qx if qx > 0 else (one if px > 0 else one * 0)
        weights.append(w if w < 1 else one)
    tau = 0
    for i in range(L, 0, -1):
        if i == L:
            h = weights[L]
        else:
            Z = sum(max(weights[i] * a - b, 0) for a, b in zip(path_rows[i], laws[i]))
            denominator = Z + 1 - weights[i]
            h = Z / denominator if denominator > 0 else one
        if chooser.accept(picked[i - 1], h):
            tau = i
            break
    if tau == L:
        y = chooser.sample(path_rows[L])
    else:
        residual = [max(weights[tau] * a - b, 0) for a, b in zip(path_rows[tau], laws[tau])]
        y = chooser.sample(normalized_or(residual, path_rows[tau]))
    return [0] + picked[:tau], xs[:tau] + [y]
