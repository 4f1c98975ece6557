"""Traversal verification (Weng et al. 2025, *Traversal Verification for Speculative Tree
Decoding*): the tree is decided from the leaves up, each test accepting a whole root-to-node
path, and a node whose subtree was rejected is tried as a leaf itself.

Every node ``v`` carries an unnormalised measure ``m_v`` over the vocabulary whose mass
``alpha_v = sum(m_v) <= 1`` is the probability with which ``v``'s path is still to be accepted
somewhere in ``v``'s subtree or at ``v`` itself:

- the root starts with ``m = p_root`` (mass 1);
- a child ``c`` with token ``x``, drafted from ``D_v`` at its parent, starts with
  ``m_c = min(1, m_v(x) / D_v(x)) * p_c`` (the block-verification weight of its path times the
  target's distribution after it);
- nodes are visited in post-order (children in index order, a child's whole subtree before its
  next sibling). When a child's subtree is rejected, the parent's measure becomes
  ``m_v <- (m_v - D_v)_+ / sum((D_v - m_v)_+)`` and, for children drawn without replacement,
  ``D_v(x) <- 0`` and ``D_v`` is renormalised (i.i.d. children keep ``D_v = q_v``);
- once all of ``v``'s children are rejected, ``v`` is a leaf: its path is accepted with
  probability ``alpha_v`` (coin of node ``v``), and the emitted token is drawn from
  ``norm(m_v)``. The root is always accepted (its mass stays 1).

On a chain this is block verification (Sun et al.): ``alpha`` after the deepest rejection is
block verification's ``h_i``. docs/trees.md proves it lossless by induction over the subtree:
``v``'s subtree accepts ``v``'s path with probability ``alpha_v`` and then emits the target's
law after it.

The functions work on plain Python sequences of floats or :class:`fractions.Fraction` and draw
every random answer from a *chooser* (see :mod:`specdecode.trees.reference`).
"""

from __future__ import annotations

from typing import Any, Sequence

from specdecode.trees.reference import children_lists, ratio

Number = Any


def rejected_update(m: Sequence[Number], D: Sequence[Number], fallback: Sequence[Number]) -> list[Number]:
    """The node's measure after a rejected child: ``(m - D)_+ / sum((D - m)_+)``.

    The denominator is the probability that the child's subtree rejected; when it is 0 the
    rejection could not happen (``m == D``), and the measure falls back to ``norm((m - D)_+)``,
    or to ``fallback`` (the target row) when that has no mass either.
    """
    excess = [max(a - d, 0) for a, d in zip(m, D)]
    deficit = sum(max(d - a, 0) for a, d in zip(m, D))
    if deficit > 0:
        return [e / deficit for e in excess]
    total = sum(excess)
    return [e / total for e in excess] if total > 0 else list(fallback)


def traversal_row(
    p_rows: Sequence[Sequence[Number]],
    q_rows: Sequence[Sequence[Number]],
    tokens: Sequence[int],
    parents: Sequence[int],
    num_nodes: int,
    chooser: Any,
    *,
    replacement: bool,
    renormalize: bool = True,
) -> tuple[list[int], list[int]]:
    """Traversal verification of one tree: ``(path node indices from the root, emitted tokens)``.

    ``replacement`` says how every node's children were drafted from ``q_rows[v]``: i.i.d.
    (True) or without replacement (False). ``renormalize=False`` skips the division by the
    rejection probability (a deliberately broken variant the tests must reject).
    """
    children = children_lists(parents, num_nodes)
    # post-order walk with an explicit stack (trees may be deeper than Python's recursion limit);
    # a frame is [node, its measure m, its proposal D, index of the next child to try]
    stack: list[list[Any]] = [[0, list(p_rows[0]), list(q_rows[0]), 0]]
    while True:
        frame = stack[-1]
        v, m, D, i = frame
        if i < len(children[v]):
            c = children[v][i]
            frame[3] = i + 1
            x = int(tokens[c])
            beta = ratio(m[x], D[x])
            beta = 1 if beta >= 1 else beta
            stack.append([c, [beta * pc for pc in p_rows[c]], list(q_rows[c]), 0])
            continue
        if v == 0 or chooser.accept(v, sum(m)):  # v is a leaf now: accept its whole path
            nodes = [f[0] for f in stack]
            emitted = chooser.sample(m if sum(m) > 0 else p_rows[v])
            return nodes, [int(tokens[c]) for c in nodes[1:]] + [emitted]
        stack.pop()
        parent = stack[-1]
        u, m, D = parent[0], parent[1], parent[2]
        x = int(tokens[v])
        parent[1] = rejected_update(m, D, p_rows[u]) if renormalize else [max(a - d, 0) for a, d in zip(m, D)]
        if not replacement:
            D = list(D)
            D[x] = 0
            total = sum(D)
            parent[2] = [d / total for d in D] if total > 0 else D
