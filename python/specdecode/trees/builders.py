"""Tree builders: who decides a draft tree's shape, and how its children are drawn.

A builder grows a batch of trees from each row's root (the pending token) with the help of a
drafter's *expand* function, which scores new nodes (one draft forward per depth):

    expand(node_ids [b, n], tokens [b, n], parents [b, n], depth) -> logits [b, n, V]

``node_ids`` number the nodes in the builder's own order (root 0, then every node in the
order it was created, which is topological); ``parents`` refer to those numbers. The result,
:class:`BuiltTree`, is a :class:`~specdecode.trees.TokenTree` plus, per node, the draft logits
its children were drawn from, and the *children scheme* that says which tree rule verifies it
losslessly:

==========================  =========================================  ==================
children                    how a node's children are produced         lossless rule
==========================  =========================================  ==================
``"deterministic"``         the draft's top-k (a function of context)  ``deterministic``
``"iid"``                   i.i.d. draws from the processed ``q``      ``specinfer``
``"without_replacement"``   draws without replacement from ``q``       ``rrs``
``"hub"``                   SpecHub's pair: ``x1 ~ q``, then the hub   ``spechub``
                            (``argmax q``, or a draw without it when
                            ``x1`` is the hub), then without
                            replacement
==========================  =========================================  ==================

- :class:`StaticTree`: a fixed :class:`TreeShape` (Medusa / EAGLE "choices"), any scheme.
- :class:`SequoiaTree`: the optimal static shape for the acceptance by rank (and depth)
  measured while generating, re-planned every step; sampled steps keep the shape of a fixed
  profile, ``SAMPLED_PROFILE`` (unless ``adapt_sampled``), any scheme.
- :class:`DynamicTree`: EAGLE-2: expand the best frontier nodes by path probability, keep the
  best ``num_nodes`` overall; deterministic children only (re-ranking *sampled* children by
  their own probability would bias the stochastic rules).

Draws use the compiled processed distribution (:func:`specdecode.sampling.sample_logits`,
:func:`specdecode.sampling.processed_probs`), so every child is drawn from exactly the ``q``
that verification reads. The number of children of a node is fixed by the shape before any
child is drawn; without replacement, a node whose ``q`` has fewer tokens than children gets
fewer (a function of the context only) and the tree is compacted. At temperature 0 every
builder takes the draft's top-k as children (sampled children would all be the argmax).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from specdecode.sampling import SamplingParams
from specdecode.trees.builder_base import (CHILDREN_SCHEMES, LOSSLESS_RULE, SAMPLED_PROFILE, BuiltTree, Coins,
                                           Expand, StaticTree, TreeBuilder, compact_tree)
from specdecode.trees.calibration import AcceptanceCalibration
from specdecode.trees.dynamic import prune_to_budget, select_frontier
from specdecode.trees.outcomes import NodeRecord, RankDepthCounts, path_outcomes
from specdecode.trees.sequoia import acceptance_from_conditional, sequoia_shape, sequoia_shape_by_depth
from specdecode.trees.shapes import TreeShape
from specdecode.trees.static_depth import DepthAcceptance
from specdecode.trees.tree import TokenTree

__all__ = ["CHILDREN_SCHEMES", "LOSSLESS_RULE", "SAMPLED_PROFILE", "BuiltTree", "Coins", "DynamicTree", "Expand",
           "SequoiaTree", "StaticTree", "TreeBuilder", "compact_tree", "make_tree_builder"]


class SequoiaTree(StaticTree):
    """Sequoia's optimal static shape (at most ``num_nodes`` nodes, root included, and
    ``max_depth`` levels, default ``min(num_nodes - 1, 16)``: deep enough for the chain of the
    same budget, which at temperature 1 often wins) for a measured acceptance profile, or for the ``acceptance_by_rank``
    vector given (then fixed). ``acceptance_by_rank[r]`` is the probability that the accepted
    child is the rank-r child (see :func:`specdecode.trees.sequoia_shape`).

    With ``by_depth=True`` (the default) the profile is the conditional acceptance by rank *and
    depth* this builder counts from each step's accepted path (reported through :meth:`record`),
    each depth's rate shrunk towards the rate pooled over depths and that towards ``PRIOR``
    (``pooled_weight`` / ``depth_weight`` pseudo-counts); the shape is re-planned every
    ``replan_every`` steps (:func:`specdecode.trees.sequoia.sequoia_shape_by_depth`). With
    ``by_depth=False`` it is the engine's acceptance by rank over the whole generation
    (``observe``), re-planned every ``replan_every`` steps until ``settle_after`` tries per rank.
    Either way the shape of a step is fixed before that step's draws, from earlier steps only,
    so ``children="iid"`` / ``"without_replacement"`` stay lossless.

    Steps whose children are sampled (temperature > 0) accept siblings far less often than
    steps with top-k children, so they are planned for ``SAMPLED_PROFILE`` instead of ``PRIOR``:
    with ``adapt_sampled=False`` (the default) in the shape fixed for that profile, as Sequoia
    plans from a profile measured offline (on the demo pair's tune prompts, re-planning each
    64-token generation online from its own few steps gave fewer tokens per call at every size:
    the rates it re-plans from are noisy); with ``True`` re-planned online like greedy steps,
    from that prior. Tries and acceptances are counted in every mode (``self.counts``).
    """

    #: Prior conditional acceptance per rank of sampled children (their fixed profile unless
    #: ``adapt_sampled``).
    SAMPLED_PRIOR = SAMPLED_PROFILE
    #: Prior conditional acceptance per rank before anything was measured.
    PRIOR = (0.6, 0.3, 0.2, 0.15, 0.1, 0.1, 0.1, 0.1)

    def __init__(self, num_nodes: int = 16, max_depth: int | None = None,
                 acceptance_by_rank: Sequence[float] | None = None,
                 children: str = "without_replacement", replan_every: int | None = None, settle_after: int = 2000,
                 by_depth: bool = True, pooled_weight: float = 4.0, depth_weight: float = 8.0,
                 adapt_sampled: bool = False) -> None:
        if replan_every is None:
            replan_every = 1 if by_depth else 16
        if max_depth is None:
            max_depth = max(min(num_nodes - 1, 16), 1) if isinstance(num_nodes, int) else 8
        for name, value in (("num_nodes", num_nodes), ("max_depth", max_depth), ("replan_every", replan_every)):
            if isinstance(value, bool) or not isinstance(value, int) or value < (2 if name == "num_nodes" else 1):
                raise ValueError(f"{name}: expected an int >= {2 if name == 'num_nodes' else 1}, got {value!r}")
        for name, flag in (("by_depth", by_depth), ("adapt_sampled", adapt_sampled)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name}: expected a bool, got {type(flag).__name__}")
        for name, value in (("pooled_weight", pooled_weight), ("depth_weight", depth_weight)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name}: expected a positive number, got {value!r}")
        self.num_nodes, self.max_depth = num_nodes, max_depth
        self.fixed = acceptance_by_rank is not None
        self.by_depth = by_depth and not self.fixed
        self.replan_every, self.settle_after = replan_every, settle_after
        self.pooled_weight, self.depth_weight = float(pooled_weight), float(depth_weight)
        self.steps = 0
        self.counts = RankDepthCounts(max_depth=max_depth, max_rank=len(self.PRIOR) - 1)
        vector = list(acceptance_by_rank) if self.fixed else acceptance_from_conditional(list(self.PRIOR))
        shape, self.expected_accepted = sequoia_shape(vector, num_nodes, max_depth)
        self.acceptance_by_rank = vector
        self.acceptance_by_depth = [vector]
        self._last: TokenTree | None = None
        self.adapt_sampled = adapt_sampled
        self._planned_sampled = False  # the current shape is planned for sampled children
        super().__init__(shape, children)

    def observe(self, rank_tried: Sequence[int], rank_accepted: Sequence[int]) -> None:
        if self.by_depth:
            return
        self.steps += 1
        if self.fixed or self.steps % self.replan_every or not rank_tried:
            return
        if min(rank_tried[: len(self.PRIOR)] or [0]) >= self.settle_after:
            return  # settled: keep the shape
        conditional = []
        for r, prior in enumerate(self.PRIOR):
            tried = rank_tried[r] if r < len(rank_tried) else 0
            accepted = rank_accepted[r] if r < len(rank_accepted) else 0
            conditional.append((accepted + 10 * prior) / (tried + 10))  # shrink towards the prior
        vector = acceptance_from_conditional(conditional)
        shape, value = sequoia_shape(vector, self.num_nodes, self.max_depth)
        self.acceptance_by_rank, self.expected_accepted = vector, value
        self.set_shape(shape)

    def describe(self, sampling: SamplingParams) -> str:
        return (f"sequoia, up to {self.max_nodes} nodes, children {self._scheme(sampling)}: shape re-planned from "
                "the measured acceptance")

    def build(self, root_tokens: Tensor, root_logits: Tensor, expand: Expand, sampling: SamplingParams,
              coins: Coins) -> BuiltTree:
        sampled = self._scheme(sampling) != "deterministic"
        if sampled != self._planned_sampled and not self.fixed and self.by_depth:
            self._planned_sampled = sampled
            self._replan()
        built = super().build(root_tokens, root_logits, expand, sampling, coins)
        self._last = built.tree
        return built

    def record(self, accepted_nodes: Tensor) -> None:
        """Count the last built trees' tries and acceptances by depth and rank (``self.counts``);
        with ``by_depth``, re-plan."""
        last, self._last = self._last, None
        if last is None:
            return
        self.counts.update(last.parents, last.num_nodes, accepted_nodes)  # counted in every mode
        if not self.by_depth:
            return
        self.steps += 1
        if self.steps % self.replan_every or (self._planned_sampled and not self.adapt_sampled):
            return
        self._replan()

    def _replan(self) -> None:
        """The shape for the current mode: the fixed ``SAMPLED_PROFILE`` shape for sampled
        children unless ``adapt_sampled``; otherwise from the counts by rank and depth, shrunk
        towards the mode's prior."""
        prior_rates = self.SAMPLED_PRIOR if self._planned_sampled else self.PRIOR
        if self._planned_sampled and not self.adapt_sampled:
            vector = acceptance_from_conditional(list(prior_rates))
            shape, value = sequoia_shape(vector, self.num_nodes, self.max_depth)
            self.acceptance_by_depth, self.acceptance_by_rank, self.expected_accepted = [vector], vector, value
            self.set_shape(shape)
            return
        prior = torch.tensor(prior_rates, dtype=torch.float64)
        rates = self.counts.conditional(prior, self.pooled_weight, self.depth_weight)
        table = [acceptance_from_conditional(row.clamp(0.0, 1.0).tolist()) for row in rates]
        shape, value = sequoia_shape_by_depth(table, self.num_nodes, self.max_depth)
        self.acceptance_by_depth, self.acceptance_by_rank, self.expected_accepted = table, table[0], value
        self.set_shape(shape)


class DynamicTree(TreeBuilder):
    """EAGLE-2's dynamic tree: at each of ``max_depth`` levels, the ``top_k`` frontier nodes with
    the highest path value get their ``top_k`` most likely children; at the end the ``num_nodes``
    best nodes overall (root included, ancestors kept) form the tree. Children are deterministic
    (lossless with the ``deterministic`` rule at any temperature, ``greedy`` at temperature 0).

    A node's path value is the product, along its path, of the probability that each node is
    accepted once its parent is. With ``calibrated=True`` (the default) that factor is the rate
    measured while generating for the node's depth, rank and draft-probability bucket
    (:class:`~specdecode.trees.calibration.AcceptanceCalibration`, in ``self.calibration``; the
    drafter reports each step's accepted path through :meth:`record`); with ``False`` it is the
    draft's own probability (EAGLE-2 as published). Growing stops early once no deeper node can
    enter the best ``num_nodes`` (path values only fall along a path), which saves draft forwards
    and changes nothing else. ``max_depth`` defaults to ``min(num_nodes - 1, 16)`` calibrated, 6 raw
    (``depth_given`` says whether it was given). The static decode path, which cannot stop early,
    drafts a default depth chosen, up to ``max_depth``, from the acceptance by depth it measured
    in this builder's earlier generations (``static_depths``, a
    :class:`~specdecode.trees.static_depth.DepthAcceptance`; 6 before any:
    :mod:`specdecode.trees.static_depth`).

    At temperature > 0 top-k children verified by the ``deterministic`` rule are accepted with
    probability ``p(child)`` only, and a shape that depends on the draws' own probabilities is
    not lossless with the stochastic rules. So with ``sampled_children`` (the default: ``"without_replacement"``, verified by
    ``rrs``; ``"iid"``: ``specinfer``; None keeps top-k children at every temperature) a sampling
    step builds a tree whose shape is planned before its draws from the acceptance measured in
    the earlier sampling steps, by rank and depth (:class:`SequoiaTree`, in ``self.sampled``), and
    samples its children: the tree still adapts as generation runs, and stays lossless.

    The calibration lives in this object: per generation when ``generate`` builds the builder from
    ``tree="dynamic"``, per drafter when you pass your own (it keeps learning across generations).
    """

    children = "deterministic"

    def __init__(self, num_nodes: int = 16, max_depth: int | None = None, top_k: int = 4, calibrated: bool = True,
                 calibration: AcceptanceCalibration | None = None,
                 sampled_children: str | None = "without_replacement") -> None:
        self.depth_given = max_depth is not None
        if max_depth is None:
            max_depth = max(min(num_nodes - 1, 16), 1) if calibrated and isinstance(num_nodes, int) else 6
        for name, value, low in (("num_nodes", num_nodes, 2), ("max_depth", max_depth, 1), ("top_k", top_k, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name}: expected an int >= {low}, got {value!r}")
        if not isinstance(calibrated, bool):
            raise TypeError(f"calibrated: expected a bool, got {type(calibrated).__name__}")
        if calibration is not None and not isinstance(calibration, AcceptanceCalibration):
            raise TypeError(f"calibration: expected an AcceptanceCalibration or None, got {type(calibration).__name__}")
        self.num_nodes, self.max_depth, self.top_k = num_nodes, max_depth, top_k
        self.max_nodes = num_nodes
        self.calibrated = calibrated
        self.calibration = calibration if calibration is not None else AcceptanceCalibration(max_depth=max(max_depth, 1))
        if sampled_children is not None and (sampled_children == "deterministic"
                                             or sampled_children not in CHILDREN_SCHEMES):
            schemes = [c for c in CHILDREN_SCHEMES if c != "deterministic"]
            raise ValueError(f"sampled_children: expected one of {', '.join(schemes)} or None, got {sampled_children!r}")
        self.sampled = None if sampled_children is None else SequoiaTree(num_nodes, max_depth, children=sampled_children)
        self.static_depths = DepthAcceptance()  # the static path's acceptance by depth: its depth follows it
        self._last: NodeRecord | None = None
        self._last_sampled = False

    def describe(self, sampling: SamplingParams) -> str:
        if self.sampled is not None and not sampling.is_greedy:
            return f"dynamic, sampling steps drafted as {self.sampled.describe(sampling)}"
        return f"dynamic (EAGLE-2), up to {self.max_nodes} nodes, children deterministic"

    def _log_factor(self, log_probs: Tensor, depth: int) -> Tensor:
        """log of each candidate's acceptance factor; ``log_probs`` ``[b, f, k]`` in rank order."""
        if not self.calibrated:
            return log_probs
        rank = torch.arange(log_probs.shape[-1], device=log_probs.device).expand(log_probs.shape)
        return self.calibration.predict(log_probs.exp(), torch.full_like(rank, depth), rank).log()

    def build(self, root_tokens: Tensor, root_logits: Tensor, expand: Expand, sampling: SamplingParams,
              coins: Coins) -> BuiltTree:
        self._last_sampled = self.sampled is not None and not sampling.is_greedy
        if self._last_sampled:
            return self.sampled.build(root_tokens, root_logits, expand, sampling, coins)
        b, device = root_tokens.shape[0], root_tokens.device
        V = root_logits.shape[-1]
        k = min(self.top_k, V)
        tokens = [root_tokens[:, None]]
        parents = [torch.full((b, 1), -1, dtype=torch.long, device=device)]
        values = [torch.zeros((b, 1), dtype=torch.float32, device=device)]
        probs = [torch.ones((b, 1), dtype=torch.float32, device=device)]
        depths = [torch.zeros((b, 1), dtype=torch.long, device=device)]
        ranks = [torch.zeros((b, 1), dtype=torch.long, device=device)]
        frontier = torch.zeros((b, 1), dtype=torch.long, device=device)  # node ids
        frontier_logits = root_logits[:, None]
        size, calls = 1, 0
        for depth in range(1, self.max_depth + 1):
            logq = torch.log_softmax(frontier_logits.float(), -1)
            top = logq.topk(k, dim=-1)  # [b, f, k]
            base = torch.cat(values, 1).gather(1, frontier)  # [b, f]
            cand_values = (base[:, :, None] + self._log_factor(top.values, depth)).flatten(1)
            cand_tokens = top.indices.flatten(1)
            cand_parents = frontier[:, :, None].expand(-1, -1, k).flatten(1)
            tokens.append(cand_tokens)
            parents.append(cand_parents)
            values.append(cand_values)
            probs.append(top.values.exp().flatten(1))
            depths.append(torch.full_like(cand_tokens, depth))
            ranks.append(torch.arange(k, device=device).repeat(top.values.shape[1]).expand(b, -1))
            first = size
            size += cand_tokens.shape[1]
            if depth == self.max_depth:
                break
            valid = torch.isfinite(cand_values)
            chosen = select_frontier(cand_values, valid, k).clamp_min(0)  # [b, k] candidate positions
            if self._deeper_cannot_enter(torch.cat(values[1:], 1), cand_values.gather(1, chosen)):
                break
            frontier = first + chosen
            frontier_logits = expand(frontier, cand_tokens.gather(1, chosen), cand_parents.gather(1, chosen), depth)
            calls += 1
        all_tokens, all_parents, all_values = torch.cat(tokens, 1), torch.cat(parents, 1), torch.cat(values, 1)
        all_values = torch.where(torch.isfinite(all_values), all_values, torch.full_like(all_values, -1e30))
        num_valid = torch.full((b,), all_tokens.shape[1], dtype=torch.long, device=device)
        pruned = prune_to_budget(all_parents, all_values, num_valid, min(self.num_nodes, all_tokens.shape[1]))
        tree = TokenTree(all_tokens.gather(1, pruned.keep), pruned.parents, pruned.num_nodes)
        keep = pruned.keep
        self._last = NodeRecord(tree.parents, tree.num_nodes, torch.cat(probs, 1).gather(1, keep),
                                torch.cat(depths, 1).gather(1, keep), torch.cat(ranks, 1).gather(1, keep))
        return BuiltTree(tree, None, self.children, calls)

    def _deeper_cannot_enter(self, values: Tensor, frontier_values: Tensor) -> bool:
        """True when every row already has ``num_nodes - 1`` non-root nodes worth at least the best
        frontier node: its descendants are worth no more and lose ties (higher indices)."""
        best = frontier_values.max(1, keepdim=True).values
        return bool(((values >= best).sum(1) >= self.num_nodes - 1).all())

    def record(self, accepted_nodes: Tensor) -> None:
        """Count the last built tree's offered and accepted nodes into the calibration (or, after
        a sampling step, into the sampled planner)."""
        if self._last_sampled:
            self._last_sampled = False
            self.sampled.record(accepted_nodes)
            return
        last, self._last = self._last, None
        if last is None or not self.calibrated:
            return
        offered, accepted = path_outcomes(last.parents, last.num_nodes, accepted_nodes)
        if offered is None:
            return
        self.calibration.update(last.probs, last.depth.clamp_min(1), last.rank, accepted, offered)


def make_tree_builder(tree: str | TreeShape | TreeBuilder | Sequence[Sequence[int]], *, num_nodes: int = 16,
                      max_depth: int | None = None, children: str | None = None,
                      acceptance_by_rank: Sequence[float] | None = None) -> TreeBuilder:
    """A builder from ``generate``'s ``tree=`` argument: ``"dynamic"``, ``"sequoia"``,
    ``"static"`` (a full tree of ``num_nodes`` nodes, branching 2 then 1; its children are
    sampled without replacement when sampling), a :class:`TreeShape` or a list of rank paths
    (top-k children unless ``children`` says otherwise), or a :class:`TreeBuilder`."""
    if isinstance(tree, TreeBuilder):
        return tree
    if isinstance(tree, TreeShape) or (isinstance(tree, (list, tuple)) and tree and not isinstance(tree, str)):
        return StaticTree(tree, children or "deterministic")
    if tree == "dynamic":
        if children not in (None, "deterministic", "iid", "without_replacement"):
            raise ValueError("children: a dynamic tree drafts top-k children ('deterministic') and, when sampling, "
                             "'without_replacement' (default) or 'iid' children in a shape planned before the draws; "
                             f"got {children!r}")
        sampled = None if children == "deterministic" else children or "without_replacement"
        return DynamicTree(num_nodes=num_nodes, max_depth=max_depth, sampled_children=sampled)
    if tree == "sequoia":
        return SequoiaTree(num_nodes=num_nodes, max_depth=max_depth or min(num_nodes - 1, 16),
                           acceptance_by_rank=acceptance_by_rank, children=children or "without_replacement")
    if tree == "static":  # top-k children at temperature 0; sampled without replacement (rrs) when sampling
        sampled_children = children or "without_replacement"
        sampled_shape = None
        if sampled_children != "deterministic":
            profile = acceptance_from_conditional(list(SAMPLED_PROFILE))
            sampled_shape = sequoia_shape(profile, num_nodes, max_depth or max(min(num_nodes - 1, 16), 1))[0]
        return StaticTree(_default_static_paths(num_nodes, max_depth or 8), sampled_children, sampled_shape)
    raise ValueError(
        f"tree: expected 'dynamic', 'sequoia', 'static', a TreeShape, a list of rank paths or a TreeBuilder, got {tree!r}"
    )


def _default_static_paths(num_nodes: int, max_depth: int) -> list[list[int]]:
    """A simple static shape: two children at the root's chain nodes, one child below, grown
    along the rank-0 chain until ``num_nodes`` nodes."""
    paths: list[list[int]] = []
    chain: list[int] = []
    while len(paths) + 1 < num_nodes and len(chain) < max_depth:
        chain = chain + [0]
        paths.append(list(chain))
        if len(paths) + 1 < num_nodes:
            paths.append(chain[:-1] + [1])
    return paths
