"""Pure-Python reference of the token-tree ops: the documentation of their math and the oracle
the tests compare the compiled ops against. Never on a hot path.

Every tree rule is one per-node function over plain Python sequences of numbers (floats, or
:class:`fractions.Fraction` for exact arithmetic). It draws its randomness only through a
*chooser*:

- ``chooser.accept(node, ratio) -> bool``: accept child ``node`` with probability
  ``min(1, ratio)`` (``ratio`` may be ``math.inf``);
- ``chooser.sample(weights) -> int``: draw ``y`` with probability ``weights[y] / sum(weights)``.

:class:`CoinChooser` answers with the op's coins (``u < ratio`` on the node's coin; the
inverse CDF with the emission coin), which makes :func:`verify_tree_reference` the reference of
``specdecode.verify_tree``. A test can instead answer every question both ways with its exact
probability and so integrate the coins exactly (``tests/tree_stat_utils.py``).

A node function receives ``p`` (the target's distribution at the node), ``q`` (the
distribution the node's children were drafted from, None for rules without it), the children
as ``(node index, token)`` pairs in index order, and the chooser; it returns
``("accept", j)`` for its j-th child or ``("emit", y)``.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from specdecode.reference import process_logits
from specdecode.sampling import SamplingParams
from specdecode.trees.mask import TreeMasks
from specdecode.trees.tree import TokenTree
from specdecode.trees.output import TreeVerifyOutput

Number = Any  # float or fractions.Fraction
NodeDecision = tuple[str, int]
NodeRule = Callable[..., NodeDecision]


# --------------------------------------------------------------------------- choosers


class CoinChooser:
    """Answers a node rule's questions with one row of the op's coins.

    ``uniforms[c]`` (c > 0) is node c's acceptance coin: accept iff ``u < ratio`` (half-open,
    so a zero ratio never accepts). ``uniforms[0]`` draws the emitted token by inverse CDF: the
    first ``y`` with ``weights[y] > 0`` whose sequential cumulative sum exceeds ``u * total``.
    ``margin`` records how close any answer came to flipping (the smallest ``|u - ratio| / ratio``
    and the smallest relative distance of ``u * total`` to a cumulative-sum boundary), so a test can
    tell a float32-vs-float64 rounding difference from a real disagreement.
    """

    def __init__(self, uniforms: Sequence[float]) -> None:
        self.uniforms = [float(u) for u in uniforms]
        self.margin = math.inf

    def accept(self, node: int, ratio: Number) -> bool:
        u = self.uniforms[node]
        r = float(ratio)
        if math.isfinite(r):
            self.margin = min(self.margin, abs(u - r) / max(abs(r), 1e-300))
        return u < ratio

    def sample(self, weights: Sequence[Number]) -> int:
        u = self.uniforms[0]
        total = 0.0
        for w in weights:
            total += float(w)
        if not (total > 0.0 and math.isfinite(total)):
            return -1
        threshold = u * total
        cumulative, chosen, last_positive = 0.0, -1, -1
        for y, w in enumerate(weights):
            w = float(w)
            cumulative += w
            if w > 0.0:
                self.margin = min(self.margin, abs(cumulative - threshold) / total)
                if chosen < 0 and cumulative > threshold:
                    chosen = y
                last_positive = y
        return chosen if chosen >= 0 else last_positive


# ------------------------------------------------------------------------ node rules


def ratio(numerator: Number, denominator: Number) -> Number:
    """``numerator / denominator``; a zero denominator means "accept iff numerator > 0"."""
    if denominator > 0:
        return numerator / denominator
    return math.inf if numerator > 0 else 0


def normalized_or(weights: Sequence[Number], fallback: Sequence[Number]) -> list[Number]:
    """``norm(weights)``, or ``fallback`` when the weights have no mass (a residual of zero
    mass falls back to p)."""
    total = sum(weights)
    if not total > 0:
        return list(fallback)
    return [w / total for w in weights]


def argmax_lowest(values: Sequence[Number]) -> int:
    """Index of the largest value, the lowest one on ties."""
    best = 0
    for x in range(1, len(values)):
        if values[x] > values[best]:
            best = x
    return best


def greedy_node(p, q, children, chooser, **_: Any) -> NodeDecision:
    """Greedy tree (temperature 0): accept the child whose token is ``argmax p``; else emit it."""
    best = argmax_lowest(p)
    for j, (_, x) in enumerate(children):
        if x == best:
            return ("accept", j)
    return ("emit", best)


def specinfer_node(p, q, children, chooser, **_: Any) -> NodeDecision:
    """Multi-step speculative sampling; children i.i.d. from q.

    ``R = p``; child x: accept iff ``u < R(x) / q(x)``, else ``R = norm((R - q)_+)``; emit ``y ~ R``.
    """
    R = list(p)
    for j, (node, x) in enumerate(children):
        if chooser.accept(node, ratio(R[x], q[x])):
            return ("accept", j)
        R = normalized_or([max(r - d, 0) for r, d in zip(R, q)], p)
    return ("emit", chooser.sample(R))


def rrs_node(p, q, children, chooser, **_: Any) -> NodeDecision:
    """Recursive rejection sampling without replacement; children drawn without replacement
    from q. ``R = p, D = q``; child x: accept iff ``u < R(x) / D(x)``, else
    ``R = norm((R - D)_+)``, ``D(x) = 0``, ``D = norm(D)``; emit ``y ~ R``."""
    R, D = list(p), list(q)
    for j, (node, x) in enumerate(children):
        if chooser.accept(node, ratio(R[x], D[x])):
            return ("accept", j)
        R = normalized_or([max(r - d, 0) for r, d in zip(R, D)], p)
        D = list(D)
        D[x] = 0
        total = sum(D)
        D = [d / total for d in D] if total > 0 else D
    return ("emit", chooser.sample(R))


def deterministic_node(p, q, children, chooser, **_: Any) -> NodeDecision:
    """Deterministic children (distinct): D is one-hot on each child in turn. ``R = p``; child
    x: accept iff ``u < R(x)``, else ``R(x) = 0``, ``R = norm(R)``; emit ``y ~ R``."""
    R = list(p)
    for j, (node, x) in enumerate(children):
        if chooser.accept(node, R[x]):
            return ("accept", j)
        R = list(R)
        R[x] = 0
        R = normalized_or(R, p)
    return ("emit", chooser.sample(R))


def entropy(p: Sequence[Number]) -> float:
    """``H(p) = -sum p log p`` with ``0 log 0 = 0``."""
    return -sum(float(v) * math.log(float(v)) for v in p if v > 0)


def typical_node(p, q, children, chooser, *, epsilon: float = 0.09, delta: float = 0.3,
                 sample_correction: bool = False, **_: Any) -> NodeDecision:
    """Typical acceptance (Medusa), lossy: accept the first child with
    ``p(x) > min(epsilon, delta exp(-H(p)))``; emit ``argmax p`` (``y ~ p`` with
    ``sample_correction``)."""
    if children:
        threshold = min(epsilon, delta * math.exp(-entropy(p)))
        for j, (_, x) in enumerate(children):
            if p[x] > threshold:
                return ("accept", j)
    return ("emit", chooser.sample(p) if sample_correction else argmax_lowest(p))


NODE_RULES: dict[str, NodeRule] = {
    "greedy": greedy_node,
    "specinfer": specinfer_node,
    "rrs": rrs_node,
    "deterministic": deterministic_node,
    "typical": typical_node,
}
RULES_WITH_DRAFT = ("specinfer", "rrs")
RULES_WITH_DISTINCT_SIBLINGS = ("rrs", "deterministic")


# ------------------------------------------------------------------------ one row


def children_lists(parents: Sequence[int], num_nodes: int) -> list[list[int]]:
    """The children of every node of a valid row, each list in index order."""
    children: list[list[int]] = [[] for _ in range(num_nodes)]
    for i in range(1, num_nodes):
        children[parents[i]].append(i)
    return children


def verify_tree_row(
    node_rule: NodeRule,
    p_rows: Sequence[Sequence[Number]],
    q_rows: Sequence[Sequence[Number]] | None,
    tokens: Sequence[int],
    parents: Sequence[int],
    num_nodes: int,
    chooser: Any,
    **options: Any,
) -> tuple[list[int], list[int]]:
    """Walk one row's tree with ``node_rule``: returns the path's node indices (root first) and
    the emitted tokens (accepted path tokens, then the emitted one)."""
    children = children_lists(parents, num_nodes)
    v, nodes, out = 0, [0], []
    while True:
        kids = [(c, int(tokens[c])) for c in children[v]]
        kind, value = node_rule(p_rows[v], q_rows[v] if q_rows is not None else None, kids, chooser, **options)
        if kind == "accept":
            v = kids[value][0]
            nodes.append(v)
            out.append(kids[value][1])
        else:
            out.append(value)
            return nodes, out


# ------------------------------------------------------------------------ batched


def verify_tree_reference(
    target_probs: Tensor,
    draft_probs: Tensor | None,
    tree: TokenTree,
    *,
    rule: str,
    uniforms: Tensor,
    margins: list[float] | None = None,
    **options: Any,
) -> TreeVerifyOutput:
    """Row-by-row reference of ``verify_tree`` from processed probabilities (float64).

    Shape:
        target_probs: ``[B, N, V]``; draft_probs: ``[B, N, V]`` or None; uniforms: ``[B, N]``
        (the op's layout); returns outputs trimmed to ``tree.max_depth + 1`` columns.

    ``margins``, when given, receives each row's :attr:`CoinChooser.margin`.
    """
    node_rule = NODE_RULES[rule]
    B, N = tree.batch_size, tree.max_nodes
    width = tree.max_depth + 1
    tokens_out = torch.full((B, width), -1, dtype=torch.int64)
    nodes_out = torch.full((B, width), -1, dtype=torch.int64)
    accepted_len = torch.zeros(B, dtype=torch.int64)
    for b in range(B):
        n = int(tree.num_nodes[b])
        parents = tree.parents[b].tolist()
        tokens = tree.tokens[b].tolist()
        if rule in RULES_WITH_DISTINCT_SIBLINGS:
            for kids in children_lists(parents, n):
                if len({tokens[c] for c in kids}) != len(kids):
                    raise ValueError(f"tree_tokens: row {b}: two children of one node carry the same token")
        p_rows = target_probs[b, :n].double().cpu().tolist()
        q_rows = draft_probs[b, :n].double().cpu().tolist() if draft_probs is not None else None
        chooser = CoinChooser(uniforms[b].tolist())
        nodes, out = verify_tree_row(node_rule, p_rows, q_rows, tokens, parents, n, chooser, **options)
        tokens_out[b, : len(out)] = torch.tensor(out)
        nodes_out[b, : len(nodes)] = torch.tensor(nodes)
        accepted_len[b] = len(nodes) - 1
        if margins is not None:
            margins.append(chooser.margin)
    device = tree.device
    return TreeVerifyOutput(tokens_out.to(device), accepted_len.to(device), nodes_out.to(device))


def verify_tree_logits_reference(
    target_logits: Tensor,
    draft_logits: Tensor | None,
    tree: TokenTree,
    *,
    rule: str,
    uniforms: Tensor,
    sampling: SamplingParams = SamplingParams(),
    margins: list[float] | None = None,
    **options: Any,
) -> TreeVerifyOutput:
    """Reference of ``verify_tree``: :func:`specdecode.reference.process_logits` on target
    and draft alike, then :func:`verify_tree_reference`; temperature 0 is the greedy walk."""
    args = sampling.op_args()
    target_probs = process_logits(target_logits, *args)
    draft_probs = process_logits(draft_logits, *args) if draft_logits is not None else None
    if sampling.is_greedy:
        rule, options = "greedy", {}
    return verify_tree_reference(target_probs, draft_probs, tree, rule=rule, uniforms=uniforms, margins=margins,
                                 **options)


def tree_attention_mask_reference(parents: Tensor, num_nodes: Tensor, prefix_mask: Tensor,
                                  root_positions: Tensor) -> TreeMasks:
    """Reference of ``tree_attention_mask`` by plain loops over every row and node.

    Shape: as :func:`specdecode.trees.tree_attention_mask` (a valid tree is assumed).
    """
    B, N = parents.shape
    W = prefix_mask.shape[1]
    words = (N + 31) // 32
    positions = torch.zeros(B, N, dtype=torch.int64)
    attention = torch.zeros(B, 1, N, W + N, dtype=torch.bool)
    tree_mask = torch.zeros(B, N, N, dtype=torch.bool)
    packed = torch.zeros(B, N, words, dtype=torch.int64)
    first_child = torch.full((B, N), -1, dtype=torch.int64)
    next_sibling = torch.full((B, N), -1, dtype=torch.int64)
    depth = torch.zeros(B, N, dtype=torch.int64)
    for b in range(B):
        n = int(num_nodes[b])
        par = parents[b].tolist()
        for i in range(N):
            ancestors = {i}
            if i < n:
                k = i
                while k > 0:
                    k = par[k]
                    ancestors.add(k)
                depth[b, i] = len(ancestors) - 1
                attention[b, 0, i, :W] = prefix_mask[b].cpu() != 0
            positions[b, i] = int(root_positions[b]) + int(depth[b, i])
            for j in ancestors:
                tree_mask[b, i, j] = True
                packed[b, i, j // 32] |= 1 << (j % 32)
        for v, kids in enumerate(children_lists(par, n)):
            if kids:
                first_child[b, v] = kids[0]
            for a, c in zip(kids, kids[1:]):
                next_sibling[b, a] = c
    attention[:, 0, :, W:] = tree_mask
    packed = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)  # the int32 bit pattern
    device = parents.device
    return TreeMasks(*(t.to(device) for t in (positions, attention, tree_mask, packed, first_child, next_sibling, depth)))


def node_rule_as_tree_rule(node_rule: NodeRule) -> Callable[..., TreeVerifyOutput]:
    """A per-node rule (the protocol of this module's ``*_node`` functions) as a whole tree rule
    for :func:`specdecode.trees.register_tree_rule`: the top-down walk of
    :func:`verify_tree_row`, answering the node rule's questions with the op's coins
    (:class:`CoinChooser`), so a tree rule takes a few lines. Options reach the node rule as
    keywords.

    Shape:
        the returned rule takes target_probs, draft_probs ``[B, N, V]`` (draft None when not
        registered with ``needs_draft_logits``), a :class:`TokenTree` and ``uniforms`` ``[B, N]``
        and returns a :class:`TreeVerifyOutput` of width ``tree.max_depth + 1``.

    Example:
        >>> from specdecode.trees.reference import deterministic_node, node_rule_as_tree_rule
        >>> rule = node_rule_as_tree_rule(deterministic_node)
        >>> tree = TokenTree(torch.tensor([[0, 2, 1]]), torch.tensor([[-1, 0, 0]]), torch.tensor([3]))
        >>> p = torch.tensor([[[0.0, 0.0, 1.0]] * 3], dtype=torch.float64)
        >>> rule(p, None, tree, uniforms=torch.full((1, 3), 0.5, dtype=torch.float64)).tokens
        tensor([[2, 2]])
    """

    def tree_rule(target_probs: Tensor, draft_probs: Tensor | None, tree: TokenTree, *, uniforms: Tensor,
                  **options: Any) -> TreeVerifyOutput:
        B, width = tree.batch_size, tree.max_depth + 1
        tokens_out = torch.full((B, width), -1, dtype=torch.int64)
        nodes_out = torch.full((B, width), -1, dtype=torch.int64)
        accepted_len = torch.zeros(B, dtype=torch.int64)
        all_tokens, all_parents = tree.tokens.tolist(), tree.parents.tolist()
        p_all = target_probs.double().cpu()
        q_all = draft_probs.double().cpu() if draft_probs is not None else None
        coins = uniforms.double().cpu().tolist()
        for b in range(B):
            n = int(tree.num_nodes[b])
            q_rows = q_all[b, :n].tolist() if q_all is not None else None
            nodes, out = verify_tree_row(node_rule, p_all[b, :n].tolist(), q_rows, all_tokens[b], all_parents[b], n,
                                         CoinChooser(coins[b]), **options)
            tokens_out[b, : len(out)] = torch.tensor(out)
            nodes_out[b, : len(nodes)] = torch.tensor(nodes)
            accepted_len[b] = len(nodes) - 1
        device = tree.device
        return TreeVerifyOutput(tokens_out.to(device), accepted_len.to(device), nodes_out.to(device))

    tree_rule.__name__ = f"tree_rule_of_{getattr(node_rule, '__name__', 'node_rule')}"
    return tree_rule
