"""Helpers of the token-tree tests: random trees, tree shapes, drafting schemes, and the exact
law of a tree rule (token-trees spec §5).

**Exact law.** A tree rule's output (accepted path tokens + the emitted token) has a law that
factorises over the tree: at a node with context ``c`` and shape ``S`` (the list of its
children's sub-shapes), the children's tokens are drawn by the drafting scheme from ``q(.|c)``,
the node rule (a function of ``specdecode.trees.reference``) accepts child ``j`` or emits ``y``,
and an accepted child continues with the law of its own subtree at context ``c + (s_j,)``
(whose drafts are independent of the siblings given ``s_j``). :func:`tree_law` computes this
law exactly with :class:`fractions.Fraction`: every draft draw is enumerated with its
probability, and every coin of the node rule is integrated exactly by replaying the rule with a
chooser that answers each question both ways (:func:`node_outcomes`). Completing each output
to ``depth + 1`` tokens from the target's conditionals must then give exactly the target's
joint; anything else is a bias, however small.

**Tables.** :class:`ExactTables` gives every context its own target row ``p(.|c)`` and draft
row ``q(.|c)`` as Fractions with small denominators, of mixed kinds (random, sparse with zeros,
one-hot, near-uniform, peaked; q equal to p, close to it, independent, one-hot, sparse).
Each row depends only on (seed, context), never on the order rows are asked for.

**Monte Carlo through the compiled op.** :func:`draft_tree_batch` drafts N trees of one shape
at once with a scheme (float64 ``stat_utils.PrefixTables``), for a chi-square test of the op.
"""

from __future__ import annotations

import itertools
import random
from collections import defaultdict
from fractions import Fraction
from typing import Callable, Sequence

import torch
from torch import Tensor

import stat_utils as su
from specdecode.trees import TokenTree

Shape = tuple  # a node's shape: the tuple of its children's shapes; () is a leaf

# ----------------------------------------------------------------------------- random trees


def random_trees(B: int, N: int, gen: torch.Generator, *, ragged: bool = True, chain_prob: float = 0.3,
                 vocab: int = 100) -> TokenTree:
    """B random valid trees with N slots: node i's parent is i - 1 with probability
    ``chain_prob``, else uniform in [0, i). Ragged rows get num_nodes uniform in [1, N] and
    garbage (out-of-range parents and tokens) in their padding slots."""
    parents = torch.empty(B, N, dtype=torch.int64)
    parents[:, 0] = -1
    for i in range(1, N):
        uniform = torch.randint(0, i, (B,), generator=gen)
        chain = torch.rand(B, generator=gen) < chain_prob
        parents[:, i] = torch.where(chain, torch.full_like(uniform, i - 1), uniform)
    tokens = torch.randint(0, vocab, (B, N), generator=gen)
    if ragged:
        num_nodes = torch.randint(1, N + 1, (B,), generator=gen)
        pad = torch.arange(N)[None, :] >= num_nodes[:, None]
        parents = torch.where(pad, torch.randint(-3, N + 3, (B, N), generator=gen), parents)
        tokens = torch.where(pad, torch.randint(-5, vocab + 5, (B, N), generator=gen), tokens)
    else:
        num_nodes = torch.full((B,), N, dtype=torch.int64)
    return TokenTree(tokens, parents, num_nodes)


# ---------------------------------------------------------------------------- tree shapes


def branching_shape(branching: Sequence[int]) -> Shape:
    """The full tree with ``branching[d]`` children per node at depth d."""
    if not branching:
        return ()
    child = branching_shape(branching[1:])
    return tuple(child for _ in range(branching[0]))


def chain_shape(depth: int) -> Shape:
    """A chain of ``depth`` drafts."""
    return branching_shape([1] * depth)


def shape_depth(shape: Shape) -> int:
    return 0 if not shape else 1 + max(shape_depth(c) for c in shape)


def shape_layout(shape: Shape) -> tuple[list[int], list[Shape]]:
    """Nodes of ``shape`` in breadth-first order (parents before children, siblings in
    order): their parent indices (root -1) and their own shapes."""
    parents, shapes = [-1], [shape]
    head = 0
    while head < len(shapes):
        for child in shapes[head]:
            parents.append(head)
            shapes.append(child)
        head += 1
    return parents, shapes


# -------------------------------------------------------------------------------- tables

ROW_KINDS = ("random", "sparse", "one_hot", "near_uniform", "peaked")
DRAFT_RELATIONS = ("equal", "close", "independent", "one_hot", "sparse", "near_uniform")


def _fraction_row(kind: str, V: int, rng: random.Random) -> list[Fraction]:
    if kind == "random":
        w = [rng.randint(1, 6) for _ in range(V)]
    elif kind == "sparse":
        w = [rng.choice((0, 0, 1, 2, 3)) for _ in range(V)]
        w[rng.randrange(V)] = rng.randint(1, 3)
    elif kind == "one_hot":
        w = [0] * V
        w[rng.randrange(V)] = 1
    elif kind == "near_uniform":
        w = [10 + rng.randint(0, 2) for _ in range(V)]
    elif kind == "peaked":
        w = [rng.randint(1, 3) for _ in range(V)]
        w[rng.randrange(V)] = 20
    else:
        raise ValueError(kind)
    total = sum(w)
    return [Fraction(x, total) for x in w]


class ExactTables:
    """A synthetic context-dependent target/draft pair over V tokens with Fraction rows."""

    def __init__(self, V: int, seed: int, *, target_kinds: Sequence[str] = ROW_KINDS,
                 draft_relations: Sequence[str] = DRAFT_RELATIONS) -> None:
        self.V, self.seed = V, seed
        self.target_kinds, self.draft_relations = tuple(target_kinds), tuple(draft_relations)
        self._rows: dict[tuple, tuple[list[Fraction], list[Fraction]]] = {}

    def _pair(self, ctx: tuple) -> tuple[list[Fraction], list[Fraction]]:
        if ctx not in self._rows:
            rng = random.Random(f"{self.seed}|{self.V}|{ctx}")
            p = _fraction_row(rng.choice(self.target_kinds), self.V, rng)
            relation = rng.choice(self.draft_relations)
            if relation == "equal":
                q = list(p)
            elif relation == "close":
                other = _fraction_row("random", self.V, rng)
                q = [(3 * a + b) / 4 for a, b in zip(p, other)]
            elif relation == "independent":
                q = _fraction_row(rng.choice(ROW_KINDS), self.V, rng)
            else:
                q = _fraction_row(relation, self.V, rng)
            self._rows[ctx] = (p, q)
        return self._rows[ctx]

    def p(self, ctx: tuple) -> list[Fraction]:
        return self._pair(ctx)[0]

    def q(self, ctx: tuple) -> list[Fraction]:
        return self._pair(ctx)[1]

    def greedy(self) -> "ExactTables":
        """The temperature-0 target: each p row one-hot on its argmax (lowest id on ties)."""
        base = self

        class Greedy(ExactTables):
            def _pair(self, ctx):
                p, q = base._pair(ctx)
                best = max(range(len(p)), key=lambda x: (p[x], -x))
                return [Fraction(int(x == best)) for x in range(len(p))], q

        return Greedy(self.V, self.seed)

    def as_prefix_tables(self, depth: int) -> su.PrefixTables:
        """The same rows as float64 ``stat_utils.PrefixTables`` for prefixes of length
        0..depth (base-V order), renormalised after rounding."""
        rows_p, rows_q = [], []
        for k in range(depth + 1):
            for ctx in itertools.product(range(self.V), repeat=k):
                rows_p.append([float(v) for v in self.p(ctx)])
                rows_q.append([float(v) for v in self.q(ctx)])
        target = torch.tensor(rows_p, dtype=torch.float64)
        draft = torch.tensor(rows_q, dtype=torch.float64)
        return su.PrefixTables(self.V, depth, target / target.sum(-1, keepdim=True), draft / draft.sum(-1, keepdim=True))


# ------------------------------------------------------------------ drafting schemes (exact)

Draws = list[tuple[tuple[int, ...], Fraction]]


def iid_children(q: Sequence[Fraction], k: int) -> Draws:
    """k children drawn i.i.d. from q (SpecInfer's scheme)."""
    support = [x for x in range(len(q)) if q[x] > 0]
    out = []
    for draw in itertools.product(support, repeat=k):
        prob = Fraction(1)
        for x in draw:
            prob *= q[x]
        out.append((draw, prob))
    return out


def without_replacement_children(q: Sequence[Fraction], k: int) -> Draws:
    """Up to k children drawn without replacement from q (fewer when q's support runs out:
    the count depends on the context only, never on the draws)."""
    out: Draws = []

    def rec(drawn: tuple[int, ...], prob: Fraction, remaining: list[Fraction]) -> None:
        total = sum(remaining)
        if len(drawn) == k or total == 0:
            out.append((drawn, prob))
            return
        for x in range(len(q)):
            if remaining[x] > 0:
                rest = list(remaining)
                rest[x] = Fraction(0)
                rec(drawn + (x,), prob * remaining[x] / total, rest)

    rec((), Fraction(1), list(q))
    return out


def top_k_children(q: Sequence[Fraction], k: int) -> Draws:
    """The k most likely tokens under q (ties to the lowest id): deterministic children."""
    order = sorted(range(len(q)), key=lambda x: (-q[x], x))
    return [(tuple(order[:k]), Fraction(1))]


def pruned_iid_children(q: Sequence[Fraction], k: int) -> Draws:
    """BROKEN scheme for specinfer (token-trees spec §4): draw k + 1 children i.i.d. from q,
    then keep the k with the highest q (the pruning is by the children's own probability)."""
    out: Draws = []
    for draw, prob in iid_children(q, k + 1):
        order = sorted(range(k + 1), key=lambda j: (-q[draw[j]], j))
        out.append((tuple(draw[j] for j in order[:k]), prob))
    return out


SCHEMES: dict[str, Callable[[Sequence[Fraction], int], Draws]] = {
    "iid": iid_children,
    "without_replacement": without_replacement_children,
    "top_k": top_k_children,
    "pruned_iid": pruned_iid_children,
}


# ------------------------------------------------------------------------- exact law


class ReplayChooser:
    """Answers a node rule's questions for :func:`node_outcomes`: follows ``forced`` answers,
    then the first answer of positive probability, recording every question's alternatives."""

    def __init__(self, forced: list[int]) -> None:
        self.forced = forced
        self.trace: list[tuple[list[tuple[object, Fraction]], int]] = []

    def _choose(self, alternatives: list[tuple[object, Fraction]]):
        position = len(self.trace)
        if position < len(self.forced):
            index = self.forced[position]
        else:
            index = next(i for i, (_, prob) in enumerate(alternatives) if prob > 0)
        self.trace.append((alternatives, index))
        return alternatives[index][0]

    def accept(self, node: int, ratio) -> bool:
        a = Fraction(1) if ratio >= 1 else Fraction(ratio)
        return self._choose([(True, a), (False, 1 - a)])

    def sample(self, weights) -> int:
        total = sum(weights)
        if not total > 0:
            return -1
        return self._choose([(y, Fraction(w) / total) for y, w in enumerate(weights) if w > 0])

    def probability(self) -> Fraction:
        prob = Fraction(1)
        for alternatives, index in self.trace:
            prob *= alternatives[index][1]
        return prob


def node_outcomes(node_rule, p, q, children: list[tuple[int, int]], options: dict) -> dict[tuple, Fraction]:
    """Every decision of ``node_rule`` at one node with its exact probability over the coins."""
    results: dict[tuple, Fraction] = defaultdict(Fraction)
    stack: list[list[int]] = [[]]
    while stack:
        forced = stack.pop()
        chooser = ReplayChooser(forced)
        decision = node_rule(p, q, children, chooser, **options)
        results[decision] += chooser.probability()
        for position in range(len(forced), len(chooser.trace)):
            alternatives, index = chooser.trace[position]
            prefix = [i for _, i in chooser.trace[:position]]
            for other, (_, prob) in enumerate(alternatives):
                if other != index and prob > 0:
                    stack.append(prefix + [other])
    return dict(results)


def tree_law(tables: ExactTables, shape: Shape, node_rule, scheme: str, options: dict | None = None) -> dict[tuple, Fraction]:
    """The exact law of a tree rule's output (accepted tokens + emitted token) over the draft
    draws of ``scheme`` and the rule's coins, for one tree ``shape`` at the empty context."""
    options = options or {}
    draw = SCHEMES[scheme]
    memo: dict[tuple, dict[tuple, Fraction]] = {}

    def law(ctx: tuple, node_shape: Shape) -> dict[tuple, Fraction]:
        key = (ctx, node_shape)
        if key in memo:
            return memo[key]
        p, q = tables.p(ctx), tables.q(ctx)
        out: dict[tuple, Fraction] = defaultdict(Fraction)
        draws = draw(q, len(node_shape)) if node_shape else [((), Fraction(1))]
        for children, prob in draws:
            kids = [(j + 1, x) for j, x in enumerate(children)]
            for (kind, value), pd in node_outcomes(node_rule, p, q, kids, options).items():
                if kind == "accept":
                    x = children[value]
                    for seq, ps in law(ctx + (x,), node_shape[value]).items():
                        out[(x,) + seq] += prob * pd * ps
                else:
                    out[(value,)] += prob * pd
        memo[key] = dict(out)
        return memo[key]

    return law((), shape)


def complete_law(law: dict[tuple, Fraction], tables: ExactTables, length: int) -> dict[tuple, Fraction]:
    """Extend every output to ``length`` tokens with the target's own conditionals."""
    out: dict[tuple, Fraction] = defaultdict(Fraction)

    def extend(seq: tuple, prob: Fraction) -> None:
        if len(seq) == length:
            out[seq] += prob
            return
        for x, px in enumerate(tables.p(seq)):
            if px > 0:
                extend(seq + (x,), prob * px)

    for seq, prob in law.items():
        if prob > 0:
            extend(seq, prob)
    return dict(out)


def target_joint(tables: ExactTables, length: int) -> dict[tuple, Fraction]:
    """The target's exact joint of ``length`` tokens (positive cells only)."""
    return complete_law({(): Fraction(1)}, tables, length)


def law_difference(law: dict[tuple, Fraction], tables: ExactTables, shape: Shape) -> Fraction:
    """Total variation between the completed output law and the target joint (0 = lossless)."""
    length = shape_depth(shape) + 1
    got, want = complete_law(law, tables, length), target_joint(tables, length)
    keys = set(got) | set(want)
    return sum(abs(got.get(k, Fraction(0)) - want.get(k, Fraction(0))) for k in keys) / 2


def expected_accepted(law: dict[tuple, Fraction]) -> Fraction:
    """E[accepted length] = E[len(output)] - 1."""
    return sum(prob * (len(seq) - 1) for seq, prob in law.items())


# ------------------------------------------------------------- Monte Carlo through the op


def _draw_children(q: Tensor, k: int, scheme: str, gen: torch.Generator) -> Tensor:
    """[N, V] float64 rows -> [N, k] children drawn by ``scheme`` (vectorised)."""
    if scheme == "iid":
        return torch.stack([su.sample_rows(q, gen) for _ in range(k)], 1)
    if scheme == "without_replacement":
        weights, out = q.clone(), []
        for _ in range(k):
            x = su.inverse_cdf(weights, torch.rand(q.shape[0], generator=gen, dtype=torch.float64))
            assert bool((x >= 0).all()), "without_replacement: q's support ran out (use full-support drafts)"
            out.append(x)
            weights.scatter_(1, x[:, None], 0.0)
        return torch.stack(out, 1)
    if scheme == "top_k":
        return torch.sort(-q, dim=1, stable=True).indices[:, :k]
    if scheme == "pruned_iid":
        draws = torch.stack([su.sample_rows(q, gen) for _ in range(k + 1)], 1)
        values = q.gather(1, draws)
        order = torch.sort(-values, dim=1, stable=True).indices[:, :k]
        return draws.gather(1, order)
    raise ValueError(scheme)


def draft_tree_batch(tables: su.PrefixTables, shape: Shape, scheme: str, N: int,
                     gen: torch.Generator) -> tuple[TokenTree, Tensor, Tensor]:
    """N trees of ``shape`` drafted by ``scheme`` from the draft table, with the target and
    draft rows at every node: (tree, p [N, nodes, V], q [N, nodes, V]) in float64.
    ``tables.gamma`` must be at least the shape's depth."""
    parents, shapes = shape_layout(shape)
    nodes = len(parents)
    children: list[list[int]] = [[] for _ in range(nodes)]
    for i in range(1, nodes):
        children[parents[i]].append(i)
    tokens = torch.zeros(N, nodes, dtype=torch.int64)
    p = torch.empty(N, nodes, tables.V, dtype=torch.float64)
    q = torch.empty_like(p)
    context = {0: torch.empty(N, 0, dtype=torch.int64)}
    for v in range(nodes):
        rows = tables.index(context[v])
        p[:, v], q[:, v] = tables.target[rows], tables.draft[rows]
        if children[v]:
            drawn = _draw_children(q[:, v], len(children[v]), scheme, gen)
            for j, c in enumerate(children[v]):
                tokens[:, c] = drawn[:, j]
                context[c] = torch.cat([context[v], drawn[:, j : j + 1]], 1)
    parents_t = torch.tensor(parents, dtype=torch.int64).expand(N, nodes).contiguous()
    return TokenTree(tokens, parents_t, torch.full((N,), nodes, dtype=torch.int64)), p, q
