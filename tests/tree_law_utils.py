"""Exact law of *whole-tree* rules (traversal verification, GBV) and of the multi-draft node
rules, by enumeration: every draft tree of a shape drawn by a scheme, with its probability,
and every coin of the rule integrated exactly by replaying it with both answers to each
question (the chooser protocol of ``specdecode.trees.reference``).

Unlike ``tree_stat_utils.tree_law``, which factorises over nodes (valid for per-node rules),
this enumerates whole trees, so it also holds for rules whose decision at a node depends on
other subtrees. It is slower: keep shapes to about 7 nodes over V = 3.
"""

from __future__ import annotations

from collections import defaultdict
from fractions import Fraction
from typing import Callable, Sequence

import tree_stat_utils as tsu
from specdecode.trees.reference import verify_tree_row

Draws = tsu.Draws


def hub_children(q: Sequence[Fraction], k: int) -> Draws:
    """SpecHub's drafting scheme: x1 ~ q; the hub (argmax q, lowest id) if x1 is not the hub,
    else a draw from q without it; later children without replacement from q without both."""
    hub = max(range(len(q)), key=lambda x: (q[x], -x))
    if k <= 1:
        return tsu.without_replacement_children(q, k)
    out: Draws = []
    rest = list(q)
    rest[hub] = Fraction(0)
    for x1 in range(len(q)):
        if q[x1] == 0:
            continue
        if x1 == hub:
            total = sum(rest)
            seconds = [((y,), rest[y] / total) for y in range(len(q)) if rest[y] > 0] if total > 0 else [((), Fraction(1))]
        else:
            seconds = [((hub,), Fraction(1))]
        for second, p2 in seconds:
            drawn = (x1,) + second
            if len(drawn) < 2 or k == 2:
                out.append((drawn, q[x1] * p2))
                continue
            remaining = list(rest)
            remaining[drawn[1] if drawn[0] == hub else drawn[0]] = Fraction(0)
            total = sum(remaining)
            if total == 0:
                out.append((drawn, q[x1] * p2))
                continue
            normalized = [v / total for v in remaining]
            for later, p3 in tsu.without_replacement_children(normalized, k - 2):
                out.append((drawn + later, q[x1] * p2 * p3))
    return out


def scheme_draws(scheme: str) -> Callable[[Sequence[Fraction], int], Draws]:
    if scheme == "hub":
        return hub_children
    return tsu.SCHEMES[scheme]


def paths_shape(K: int, L: int) -> tsu.Shape:
    """K disjoint paths of L drafts below the root (GBV's layout of K i.i.d. paths)."""
    return tuple(tsu.chain_shape(L - 1) for _ in range(K))


def tree_draws(tables: tsu.ExactTables, shape: tsu.Shape, scheme: str) -> list[tuple[list[int], list[int], Fraction]]:
    """Every draft tree of ``shape`` drafted by ``scheme``, with its probability, as
    ``(tokens, parents, probability)`` in breadth-first order (the root's token is 0). A scheme
    that runs out of tokens gives a node fewer children (a function of the context only); the
    missing nodes and their subtrees are dropped."""
    parents, _ = tsu.shape_layout(shape)
    n = len(parents)
    kids: list[list[int]] = [[] for _ in range(n)]
    for i in range(1, n):
        kids[parents[i]].append(i)
    draw = scheme_draws(scheme)
    out: list[tuple[list[int], list[int], Fraction]] = []

    def context(tokens: list[int], v: int) -> tuple:
        path = []
        while v > 0:
            path.append(tokens[v])
            v = parents[v]
        return tuple(reversed(path))

    def compact(tokens: list[int]) -> tuple[list[int], list[int]]:
        keep = [v for v in range(n) if v == 0 or tokens[v] >= 0]
        index = {v: i for i, v in enumerate(keep)}
        return [tokens[v] for v in keep], [-1] + [index[parents[v]] for v in keep[1:]]

    def rec(v: int, tokens: list[int], prob: Fraction) -> None:
        if v == n:
            out.append((*compact(tokens), prob))
            return
        if not kids[v] or tokens[v] < 0:
            rec(v + 1, tokens, prob)
            return
        for drawn, pd in draw(tables.q(context(tokens, v)), len(kids[v])):
            nxt = list(tokens)
            for j, c in enumerate(kids[v]):
                nxt[c] = drawn[j] if j < len(drawn) else -1
            rec(v + 1, nxt, prob * pd)

    rec(0, [0] + [-2] * (n - 1), Fraction(1))
    return out


def outcomes(run: Callable[[object], object]) -> dict[object, Fraction]:
    """Every result of ``run(chooser)`` with its exact probability over the chooser's answers."""
    results: dict[object, Fraction] = defaultdict(Fraction)
    stack: list[list[int]] = [[]]
    while stack:
        forced = stack.pop()
        chooser = tsu.ReplayChooser(forced)
        result = run(chooser)
        results[result] += chooser.probability()
        for position in range(len(forced), len(chooser.trace)):
            alternatives, index = chooser.trace[position]
            prefix = [i for _, i in chooser.trace[:position]]
            for other, (_, prob) in enumerate(alternatives):
                if other != index and prob > 0:
                    stack.append(prefix + [other])
    return dict(results)


RowRule = Callable[..., tuple[list[int], list[int]]]


def node_rule_as_row(node_rule, **options) -> RowRule:
    """A per-node rule as a whole-tree row function (the top-down walk)."""
    def row(p_rows, q_rows, tokens, parents, n, chooser):
        return verify_tree_row(node_rule, p_rows, q_rows, tokens, parents, n, chooser, **options)
    return row


def whole_tree_law(tables: tsu.ExactTables, shape: tsu.Shape, row_rule: RowRule, scheme: str,
                   options: dict | None = None) -> dict[tuple, Fraction]:
    """Exact law of the emitted tokens (accepted path + emitted token) of ``row_rule`` on trees
    of ``shape`` drafted by ``scheme`` at the empty context."""
    options = options or {}
    law: dict[tuple, Fraction] = defaultdict(Fraction)
    for tokens, parents, prob in tree_draws(tables, shape, scheme):
        n = len(parents)
        ctx: list[tuple] = [()]
        for v in range(1, n):
            ctx.append(ctx[parents[v]] + (tokens[v],))
        p_rows = [tables.p(c) for c in ctx]
        q_rows = [tables.q(c) for c in ctx]

        def run(chooser, p_rows=p_rows, q_rows=q_rows, tokens=tokens, parents=parents, n=n):
            return tuple(row_rule(p_rows, q_rows, tokens, parents, n, chooser, **options)[1])

        for out, pr in outcomes(run).items():
            law[out] += prob * pr
    return dict(law)


class SharedCoinChooser:
    """A chooser for running two rules on the *same* coins, exactly: each coin is kept as an
    interval ``[lo, hi)`` of its possible values, and a question whose answer depends on where
    the coin lies in its interval splits it (``accept(node, r)``: ``u < r``; ``sample``: the
    inverse-CDF cell of coin 0). Replayed by :func:`outcomes`, every branch has probability
    equal to the volume of its box of coins."""

    def __init__(self, forced: list[int]) -> None:
        self.forced = forced
        self.trace: list[tuple[list[tuple[object, Fraction]], int]] = []
        self.box: dict[int, tuple[Fraction, Fraction]] = {}

    def _choose(self, coin: int, cells: list[tuple[object, Fraction, Fraction]]):
        lo, hi = self.box.get(coin, (Fraction(0), Fraction(1)))
        parts = [(value, max(a, lo), min(b, hi)) for value, a, b in cells]
        parts = [(value, a, b) for value, a, b in parts if b > a]
        if len(parts) == 1:
            value, a, b = parts[0]
            self.box[coin] = (a, b)
            return value
        alternatives = [((value, a, b), (b - a) / (hi - lo)) for value, a, b in parts]
        position = len(self.trace)
        index = self.forced[position] if position < len(self.forced) else 0
        self.trace.append((alternatives, index))
        value, a, b = alternatives[index][0]
        self.box[coin] = (a, b)
        return value

    def accept(self, node: int, ratio) -> bool:
        r = Fraction(1) if ratio >= 1 else Fraction(ratio)
        return self._choose(node, [(True, Fraction(0), r), (False, r, Fraction(1))])

    def sample(self, weights) -> int:
        weights = [Fraction(w) for w in weights]
        total = sum(weights)
        if not total > 0:
            return -1
        cells, running = [], Fraction(0)
        for y, w in enumerate(weights):
            if w > 0:
                cells.append((y, running / total, (running + w) / total))
            running += w
        return self._choose(0, cells)

    def probability(self) -> Fraction:
        prob = Fraction(1)
        for alternatives, index in self.trace:
            prob *= alternatives[index][1]
        return prob


def same_coin_comparison(tables: tsu.ExactTables, shape: tsu.Shape, rule_a: RowRule, rule_b: RowRule,
                         scheme: str) -> dict[str, Fraction]:
    """Exact probabilities that ``rule_a`` accepts fewer / as many / more draft tokens than
    ``rule_b`` when both verify the same drafted trees with the same coins."""
    result = {"fewer": Fraction(0), "same": Fraction(0), "more": Fraction(0)}
    for tokens, parents, prob in tree_draws(tables, shape, scheme):
        n = len(parents)
        ctx: list[tuple] = [()]
        for v in range(1, n):
            ctx.append(ctx[parents[v]] + (tokens[v],))
        p_rows = [tables.p(c) for c in ctx]
        q_rows = [tables.q(c) for c in ctx]

        def run(chooser, p_rows=p_rows, q_rows=q_rows, tokens=tokens, parents=parents, n=n):
            a = len(rule_a(p_rows, q_rows, tokens, parents, n, chooser)[0])
            b = len(rule_b(p_rows, q_rows, tokens, parents, n, chooser)[0])
            return "fewer" if a < b else "same" if a == b else "more"

        stack: list[list[int]] = [[]]
        while stack:
            forced = stack.pop()
            chooser = SharedCoinChooser(forced)
            result[run(chooser)] += prob * chooser.probability()
            for position in range(len(forced), len(chooser.trace)):
                alternatives, index = chooser.trace[position]
                prefix = [i for _, i in chooser.trace[:position]]
                for other in range(len(alternatives)):
                    if other != index:
                        stack.append(prefix + [other])
    return result


def memoized_spectr_node():
    """``spectr_node`` with its relaxation ``rho`` computed once per (p, q, k) (keyed by the
    values: the enumeration asks for the same node rows thousands of times)."""
    from specdecode.trees.transport import spectr_node, spectr_rho

    cache: dict[tuple, object] = {}

    def node(p, q, children, chooser, **options):
        key = (tuple(p), tuple(q), len(children))
        if key not in cache:
            cache[key] = spectr_rho(p, q, len(children))
        return spectr_node(p, q, children, chooser, rho=cache[key], **options)

    return node
