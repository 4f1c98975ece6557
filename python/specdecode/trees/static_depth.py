"""How deep an EAGLE-2 dynamic tree grows on the static decode path, when no depth is given.

On the static path every level of a dynamic tree is a draft forward in every step (the eager
builder stops once no deeper node can enter the tree, a host decision a CUDA graph cannot
take), so its depth is fixed before the generation, in its plan
(:func:`~specdecode.trees.static_growth.plan_static_tree`), and chosen from the acceptance
measured in the builder's earlier generations on this path (:class:`DepthAcceptance`, the
builder's ``static_depths``):

- the conditional acceptance by depth, ``a_d = P(the accepted path reaches depth d | it
  reached d - 1 and the tree had a node at depth d)``, counted by the engine after every
  generation (:func:`~specdecode.engine.static_tree.record_tree_acceptance`), each depth's
  rate shrunk towards the rate pooled over depths (:data:`DEPTH_WEIGHT` pseudo-counts); a
  depth never drafted takes the deepest measured depth's rate;
- the expected tokens per step of a tree ``D`` levels deep, ``1 + E_D`` with
  ``E_D = sum_{d <= D} a_1 ... a_d``, and its cost, a target forward plus ``D`` draft
  forwards of :data:`DRAFT_LEVEL_COST` each: the depth chosen maximises
  ``(1 + E_D) / (1 + DRAFT_LEVEL_COST * D)`` (:func:`best_depth`), at most the builder's
  ``max_depth`` (for a builder given no depth: ``min(num_nodes - 1, 16)``, the node budget's
  chain-like limit);
- it moves from the depth of the last generation only for a gain of more than
  :data:`SWITCH_MARGIN` (each new depth is a new layout: new caches, a new CUDA graph);
- before anything is measured: :data:`STATIC_DYNAMIC_DEPTH` (EAGLE-2's depth).

A level of depth ``d`` pays for itself when ``P(reach d) > DRAFT_LEVEL_COST * (tokens per unit
cost without it)``, so with acceptance near 1 (a draft that agrees with the target) the tree
grows to the node budget's limit and with poor acceptance it stays shallow. A builder made by
``generate(tree="dynamic")`` lives for one generation: it drafts at :data:`STATIC_DYNAMIC_DEPTH`;
a builder you keep (``ModelDrafter(draft, tree=DynamicTree(16))``) learns across generations.
``tree_depth=`` (the builder's ``max_depth`` given) fixes the depth.

>>> record = DepthAcceptance()
>>> record.add(6, reached=[100] * 6, accepted=[99] * 6)   # a generation of depth-6 trees
>>> record.choose(max_depth=15)
15
>>> record.add(6, reached=[100, 60, 30, 12, 4, 1], accepted=[60, 30, 12, 4, 1, 0])
>>> record.choose(max_depth=15) < 6
True
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["DRAFT_LEVEL_COST", "DEPTH_WEIGHT", "STATIC_DYNAMIC_DEPTH", "SWITCH_MARGIN", "DepthAcceptance",
           "best_depth"]

#: The depth of a dynamic tree given none, on the static path, before any acceptance is measured.
STATIC_DYNAMIC_DEPTH = 6
#: One draft level's cost relative to the rest of a step (the target's forward over the tree,
#: verification, bookkeeping). Measured on an H100 with the 1B benchmark pair, graphed: a chain
#: step of 5 draft forwards cost 4.24 ms against 2.63 ms for the target alone, about 0.12 per
#: draft forward.
DRAFT_LEVEL_COST = 0.12
#: Pseudo-counts of the pooled rate in each depth's rate.
DEPTH_WEIGHT = 8.0
#: The relative gain in expected tokens per unit cost a new depth needs over the last one.
SWITCH_MARGIN = 0.02


def best_depth(rates: Sequence[float], max_depth: int, cost: float = DRAFT_LEVEL_COST,
               current: int | None = None, margin: float = SWITCH_MARGIN) -> int:
    """The depth ``D`` in ``[1, max_depth]`` maximising ``(1 + E_D) / (1 + cost * D)`` for the
    conditional acceptance ``rates`` by depth (``rates[d - 1]`` for depth ``d``; the last one
    holds for deeper depths), ties to the shallower; ``current`` (a depth in range) is kept
    unless the best beats it by more than ``margin``."""
    if not rates:
        raise ValueError("rates: expected the acceptance of at least one depth")
    best, best_value, value_at = 1, -1.0, {}
    reach, expected = 1.0, 0.0
    for depth in range(1, max_depth + 1):
        reach *= min(max(float(rates[min(depth, len(rates)) - 1]), 0.0), 1.0)
        expected += reach
        value_at[depth] = (1.0 + expected) / (1.0 + cost * depth)
        if value_at[depth] > best_value:
            best, best_value = depth, value_at[depth]
    if current is not None and current in value_at and best_value <= value_at[current] * (1.0 + margin):
        return current
    return best


class DepthAcceptance:
    """Tree steps of a builder's static generations, counted by depth: ``reached[d - 1]``
    (steps whose accepted path reached depth ``d - 1`` and whose tree had a node at depth
    ``d``) and ``accepted[d - 1]`` (those whose path reached depth ``d``), summed over rows,
    steps and generations; ``depth``: the depth of the last generation counted (module
    docstring)."""

    def __init__(self) -> None:
        self.reached: list[int] = []
        self.accepted: list[int] = []
        self.depth: int | None = None

    def add(self, depth: int, reached: Sequence[int], accepted: Sequence[int]) -> None:
        """Count a generation of trees ``depth`` levels deep (``reached`` / ``accepted`` by
        depth, ``depth`` entries each)."""
        if len(reached) != len(accepted) or any(a > r or a < 0 for r, a in zip(reached, accepted)):
            raise ValueError(f"accepted: expected 0 <= accepted[d] <= reached[d] by depth, got {list(accepted)} "
                             f"and {list(reached)}")
        grow = len(reached) - len(self.reached)
        if grow > 0:
            self.reached += [0] * grow
            self.accepted += [0] * grow
        for d, (r, a) in enumerate(zip(reached, accepted)):
            self.reached[d] += int(r)
            self.accepted[d] += int(a)
        self.depth = depth

    def rates(self) -> list[float]:
        """Conditional acceptance by depth, each shrunk towards the pooled rate; empty before
        anything was counted."""
        measured = [d for d, r in enumerate(self.reached) if r > 0]
        if not measured:
            return []
        pooled = sum(self.accepted) / sum(self.reached)
        last = measured[-1]
        return [(self.accepted[d] + DEPTH_WEIGHT * pooled) / (self.reached[d] + DEPTH_WEIGHT)
                for d in range(last + 1)]

    def choose(self, max_depth: int, cost: float = DRAFT_LEVEL_COST) -> int:
        """The depth of the next generation (:func:`best_depth` of :meth:`rates`), at most
        ``max_depth``; :data:`STATIC_DYNAMIC_DEPTH` (at most ``max_depth``) before any count."""
        rates = self.rates()
        if not rates:
            return min(STATIC_DYNAMIC_DEPTH, max_depth)
        current = self.depth if self.depth is not None and self.depth <= max_depth else None
        return best_depth(rates, max_depth, cost, current)
