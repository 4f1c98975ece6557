"""Token trees of a fixed size grown on the device: what a drafter uses to draft a tree on the
static decode path (:mod:`specdecode.engine.static_tree`), where every step must have the same
shapes and may not read a tensor on the host.

A :class:`StaticTreePlan` fixes, before the generation, what every step's tree looks like:
``num_nodes`` slots (root included) and ``max_depth`` levels in every row, and how children
are produced. It comes from the drafter's :class:`~specdecode.trees.builders.TreeBuilder`
(:func:`plan_static_tree`):

- a **fixed shape** (:class:`~specdecode.trees.builders.StaticTree`: a
  :class:`~specdecode.trees.TreeShape`, rank paths, ``tree="static"``; and
  :class:`~specdecode.trees.builders.SequoiaTree`, frozen at the shape it holds when the
  generation starts), with any children scheme: the draft's top-k (``deterministic``), i.i.d.
  draws (``iid``), draws without replacement (``without_replacement``) or SpecHub's hub pair
  (``hub``). Draws come from the generation's Philox counter (``state.sample`` /
  ``state.sample_weights``), from exactly the processed ``q`` that verification reads. A draw
  that finds no mass left (more children without replacement than tokens with ``q > 0``) makes
  the node and its subtree invalid; the tree is then compacted on the device
  (:func:`~specdecode.trees.builders.compact_tree`), so that row has fewer nodes.
- an **EAGLE-2 dynamic tree** (:class:`~specdecode.trees.builders.DynamicTree`) at temperature 0,
  or at any temperature with ``sampled_children=None``: ``max_depth`` levels, each expanding the
  ``top_k`` frontier nodes of highest path value (the product of the draft's probabilities
  along the path) by their ``top_k`` most likely children; then the ``num_nodes`` best nodes
  overall form the tree (:func:`~specdecode.trees.dynamic.prune_on_device`). A builder given
  no ``max_depth`` grows at most :data:`STATIC_DYNAMIC_DEPTH` levels. Every level is
  expanded (the eager builder may stop early when no deeper node can enter: the same tree) and
  nodes are ranked by the draft's own probabilities (the eager builder's measured calibration
  needs the host). When sampling with sampled children, a dynamic tree drafts the Sequoia shape
  of the fixed sampled profile (``SAMPLED_PROFILE``) with those children, as the eager builder
  does.

The drafter provides ``expand``: one draft forward over new nodes, which writes their keys and
values at their *offset* columns after the root (``lengths[b] + offset``) and returns their
logits. :func:`grow_static_tree` calls it once per level that has children to draw.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor

from specdecode.sampling import SamplingParams, processed_probs
from specdecode.trees.builder_base import SAMPLED_PROFILE, StaticTree, TreeBuilder, compact_tree
from specdecode.trees.dynamic import best_first, prune_on_device
from specdecode.trees.sequoia import acceptance_from_conditional, sequoia_shape
from specdecode.trees.shapes import TreeShape

#: The depth of a :class:`~specdecode.trees.builders.DynamicTree` given no ``max_depth``, on the
#: static path (at most): EAGLE-2's depth, the eager builder's default without calibration. The
#: eager calibrated default (``num_nodes - 1``, up to 16) relies on stopping once no deeper node
#: can enter the tree, a host decision; on the static path every level costs a draft forward.
STATIC_DYNAMIC_DEPTH = 6

#: ``expand(offsets [B, n], tokens [B, n], ancestors [B, n, D + 1], depth) -> logits [B, n, V]``:
#: score ``n`` new nodes of depth ``depth`` per row, writing them at columns
#: ``lengths + offsets``; ``ancestors[b, i]`` lists the offsets node ``i`` may attend to after
#: the committed prefix (its ancestors-or-self, the root's offset 0 included), ``-1`` padded.
StaticExpand = Callable[[Tensor, Tensor, Tensor, int], Tensor]


@dataclass(frozen=True)
class StaticTreePlan:
    """What every tree of a static-path generation looks like (see the module docstring).

    ``kind`` is ``"shape"`` (``shape`` drawn with ``children``) or ``"dynamic"`` (EAGLE-2 with
    ``top_k``, deterministic children); ``num_nodes`` counts the root; ``span`` is how many
    columns after the root the draft forwards write (offsets ``1 .. span``).
    """

    kind: str
    num_nodes: int
    max_depth: int
    children: str
    shape: TreeShape | None = None
    top_k: int = 0

    @property
    def key(self) -> tuple:
        """Hashable and equal for equal plans (the layout key of the static path)."""
        return (self.kind, self.num_nodes, self.max_depth, self.children,
                None if self.shape is None else self.shape.parents, self.top_k)

    @property
    def span(self) -> int:
        if self.kind == "dynamic":
            return max(self.num_nodes - 1, (self.max_depth - 1) * self.top_k)
        return self.num_nodes - 1


@dataclass
class StaticTreeDraft:
    """One step's drafted trees.

    Shape:
        tokens, parents: ``[B, N]`` int64 (a :class:`~specdecode.trees.TokenTree`'s layout;
            padding slots repeat node 0 with parent 0).
        num_nodes: ``[B]`` int64 in ``[1, N]``.
        draft_logits: ``[B, N, V]`` float32 (at node v, the logits v's children were drawn
            from; zeros at leaves) or None (deterministic children: no rule reads them).
        offsets: ``[B, N]`` int64 — the offset after the root at which ``expand`` fed each node
            (only nodes with children were fed).
    """

    tokens: Tensor
    parents: Tensor
    num_nodes: Tensor
    draft_logits: Tensor | None
    offsets: Tensor


def plan_static_tree(builder: Any, sampling: SamplingParams, vocab_size: int) -> StaticTreePlan:
    """The fixed plan of ``builder`` (a :class:`~specdecode.trees.builders.TreeBuilder`) for a
    generation with ``sampling`` over ``vocab_size`` tokens; ``ValueError`` naming ``tree`` for
    builders the static path cannot run. The builder is not modified."""
    from specdecode.trees.builders import DynamicTree, SequoiaTree

    greedy = sampling.is_greedy
    if type(builder) is DynamicTree:  # subclasses may build otherwise: refused below
        if greedy or builder.sampled is None:
            k = min(builder.top_k, vocab_size)
            depth = builder.max_depth
            if not getattr(builder, "depth_given", True):  # the eager default relies on stopping early
                depth = min(depth, STATIC_DYNAMIC_DEPTH)
            total = 1 + k + (depth - 1) * k * k
            return StaticTreePlan("dynamic", min(builder.num_nodes, total), depth, "deterministic", top_k=k)
        sampled = builder.sampled
        shape = _sampled_profile_shape(sampled.num_nodes, sampled.max_depth)
        return _shape_plan(shape, sampled.children)
    if type(builder) is SequoiaTree:
        shape = builder.shape
        if not greedy and builder.by_depth and not builder.adapt_sampled and builder.children != "deterministic":
            shape = _sampled_profile_shape(builder.num_nodes, builder.max_depth)
        return _shape_plan(shape, "deterministic" if greedy else builder.children)
    if type(builder) is StaticTree:
        sampled = not greedy and builder.children != "deterministic"
        shape = builder.sampled_shape if sampled and builder.sampled_shape is not None else builder.shape
        return _shape_plan(shape, "deterministic" if greedy else builder.children)
    name = type(builder).__name__ if isinstance(builder, TreeBuilder) else repr(builder)
    raise ValueError(f"tree: {name} builds its trees on the host; the static decode path drafts StaticTree, "
                     "SequoiaTree (its current shape) and DynamicTree trees; use decode_path='eager'")


def _sampled_profile_shape(num_nodes: int, max_depth: int) -> TreeShape:
    return sequoia_shape(acceptance_from_conditional(list(SAMPLED_PROFILE)), num_nodes, max_depth)[0]


def _shape_plan(shape: TreeShape, children: str) -> StaticTreePlan:
    return StaticTreePlan("shape", shape.num_nodes, shape.max_depth, children, shape=shape)


# ---------------------------------------------------------------------------- growing


def grow_static_tree(plan: StaticTreePlan, state: Any, root_tokens: Tensor, root_logits: Tensor,
                     expand: StaticExpand) -> StaticTreeDraft:
    """Draft one tree per row by ``plan``: tensor operations only, coins from ``state``
    (a :class:`~specdecode.drafters.StaticDraftState`), constants kept in its buffers.

    Shape:
        root_tokens: ``[B]`` int64 (each row's pending token); root_logits: ``[B, V]`` float32
            (the draft's logits at the root).
        returns: :class:`StaticTreeDraft` with ``N = plan.num_nodes``.
    """
    if plan.kind == "dynamic":
        return _grow_dynamic(plan, root_tokens, root_logits, expand)
    return _grow_shape(plan, state, root_tokens, root_logits, expand)


@dataclass
class _ShapeConstants:
    """Device tensors of a fixed shape, made once per layout (a CUDA graph may not copy host
    data): per level with children to draw, the nodes drawing, where each child's token comes
    from in the ``[m, k]`` draws and which node it is, its parent, and the nodes fed next."""

    ancestors: Tensor  # [N, D + 1] ancestor-or-self of each node by depth, -1 padded
    parents: Tensor  # [N]
    levels: list[tuple[Tensor, int, Tensor, Tensor, Tensor, Tensor | None]]


def _shape_constants(shape: TreeShape, device: torch.device) -> _ShapeConstants:
    N, D = shape.num_nodes, shape.max_depth
    rows = []
    for v in range(N):
        path, u = [], v
        while u >= 0:
            path.append(u)
            u = shape.parents[u]
        rows.append(list(reversed(path)) + [-1] * (D + 1 - len(path)))
    levels = []
    for depth in range(D):
        drawing = [v for v in range(N) if shape.depth[v] == depth and shape.num_children[v] > 0]
        if not drawing:
            break
        k = max(shape.num_children[v] for v in drawing)
        source, child, parent = [], [], []
        for j, v in enumerate(drawing):
            for r, c in enumerate(shape.children(v)):
                source.append(j * k + r)
                child.append(c)
                parent.append(v)
        fed = [c for c in range(N) if shape.depth[c] == depth + 1 and shape.num_children[c] > 0]

        def t(values: list[int]) -> Tensor:
            return torch.tensor(values, dtype=torch.long, device=device)

        levels.append((t(drawing), k, t(source), t(child), t(parent), t(fed) if fed else None))
    return _ShapeConstants(torch.tensor(rows, dtype=torch.long, device=device),
                           torch.tensor(shape.parents, dtype=torch.long, device=device), levels)


def _grow_shape(plan: StaticTreePlan, state: Any, root_tokens: Tensor, root_logits: Tensor,
                expand: StaticExpand) -> StaticTreeDraft:
    shape = plan.shape
    assert shape is not None
    consts = state.buffer(f"static_tree_shape:{plan.key}", lambda: _shape_constants(shape, root_tokens.device))
    B, V, N = root_tokens.shape[0], root_logits.shape[-1], shape.num_nodes
    tokens = root_tokens[:, None].repeat(1, N)
    valid = torch.ones((B, N), dtype=torch.bool, device=root_tokens.device)
    node_logits = root_logits.new_zeros((B, N, V))
    node_logits[:, 0] = root_logits
    for depth, (drawing, k, source, child, parent, fed) in enumerate(consts.levels):
        kids = _draw(node_logits.index_select(1, drawing), k, plan.children, state)  # [B, m, k]
        kids = kids.flatten(1).index_select(1, source)
        tokens.index_copy_(1, child, kids.clamp_min(0))
        valid.index_copy_(1, child, (kids >= 0) & valid.index_select(1, parent))
        if fed is not None:
            n = fed.shape[0]
            logits = expand(fed.expand(B, n), tokens.index_select(1, fed), consts.ancestors.index_select(0, fed)
                            .expand(B, -1, -1), depth + 1)
            node_logits.index_copy_(1, fed, logits.to(node_logits.dtype))
    draft_logits = None if plan.children == "deterministic" else node_logits
    parents = consts.parents.expand(B, -1)
    offsets = torch.arange(N, device=tokens.device).expand(B, -1)
    if plan.children == "iid" or (plan.children == "deterministic" and max(shape.num_children) <= V):
        num = torch.full((B,), N, dtype=torch.long, device=tokens.device)
        return StaticTreeDraft(tokens, parents.contiguous(), num, draft_logits, offsets.contiguous())
    tree, keep = compact_tree(tokens, parents, valid)  # rows whose draws ran out of mass have fewer nodes
    if draft_logits is not None:
        draft_logits = draft_logits.gather(1, keep[:, :, None].expand(-1, -1, V))
    return StaticTreeDraft(tree.tokens, tree.parents, tree.num_nodes, draft_logits, keep)


def _draw(logits: Tensor, k: int, children: str, state: Any) -> Tensor:
    """``k`` children of each of ``m`` nodes per row by the scheme; ``-1`` where ``q`` ran out.

    Shape:
        logits: ``[B, m, V]``; returns ``[B, m, k]`` int64.
    """
    B, m, V = logits.shape
    if children == "deterministic":
        drawn = logits.topk(min(k, V), dim=-1).indices
        return drawn if k <= V else torch.cat([drawn, drawn.new_full((B, m, k - V), -1)], -1)
    flat = logits.reshape(B * m, V)
    if children == "iid":
        return state.sample(flat.repeat_interleave(k, 0)).view(B, m, k)
    if not needs_processed_probs(children, state.sampling):  # without replacement, temperature only
        return _without_replacement_logits(flat, k, state).view(B, m, k)
    probs = processed_probs(flat, state.sampling)
    state.count_op_sync()
    if children == "without_replacement":
        return _without_replacement(probs, k, state).view(B, m, k)
    # hub: x1 ~ q; the hub (argmax q, lowest id) unless x1 is the hub, then a draw without it;
    # later children without replacement from q without both
    first = _without_replacement(probs, 1, state)[:, 0]
    if k == 1:
        return first.view(B, m, 1)
    ids = torch.arange(V, device=probs.device)[None, :]
    hub = torch.sort(-probs, dim=1, stable=True).indices[:, :1]
    rest = probs.masked_fill(ids == hub, 0.0)
    second = torch.where(first == hub[:, 0], _without_replacement(rest, 1, state)[:, 0], hub[:, 0])
    out = [first[:, None], second[:, None]]
    if k > 2:
        remaining = rest.masked_fill(ids == first[:, None], 0.0).masked_fill(ids == second[:, None], 0.0)
        later = _without_replacement(remaining, k - 2, state)
        out.append(torch.where((second >= 0)[:, None], later, -1))
    return torch.cat(out, 1).view(B, m, k)


def needs_processed_probs(children: str, sampling: SamplingParams) -> bool:
    """Whether drafting ``children`` with ``sampling`` reads the processed ``q`` itself (the
    compiled ``processed_probs``, whose CUDA kernel reads its row statuses on the host, so it
    cannot run inside a CUDA graph): SpecHub's hub pairs, and draws without replacement under a
    top-k / top-p / min-p filter. Without a filter, removing a drawn token's logit leaves the
    rest of ``q = softmax(logits / T)`` proportional, so ``state.sample`` draws them."""
    if sampling.is_greedy:
        return False
    filtered = sampling.top_k > 0 or sampling.top_p < 1.0 or sampling.min_p > 0.0
    return children == "hub" or (children == "without_replacement" and filtered)


def _without_replacement_logits(logits: Tensor, k: int, state: Any) -> Tensor:
    """``k`` draws per row without replacement from the processed ``q`` of ``logits`` when no
    filter is on: each draw by ``state.sample`` from the logits with the earlier draws set to
    ``-inf``; ``-1`` once no finite logit is left.

    Shape:
        logits: ``[M, V]`` float32; returns ``[M, k]`` int64.
    """
    masked = logits.clone()
    out = []
    for _ in range(k):
        left = torch.isfinite(masked).any(1)
        token = torch.where(left, state.sample(torch.where(left[:, None], masked, 0.0)), -1)
        masked.scatter_(1, token.clamp_min(0)[:, None], -torch.inf)  # a row with nothing left has nothing to remove
        out.append(token)
    return torch.stack(out, 1)


def _without_replacement(weights: Tensor, k: int, state: Any) -> Tensor:
    """``k`` draws per row without replacement from ``weights`` (each draw proportional to what
    is left), ``-1`` once nothing is left.

    Shape:
        weights: ``[M, V]`` float64; returns ``[M, k]`` int64.
    """
    remaining = weights.clone()
    out = []
    for _ in range(k):
        left = remaining.sum(1) > 0
        safe = torch.where(left[:, None], remaining, torch.ones_like(remaining))  # a row with no mass draws junk
        token = torch.where(left, state.sample_weights(safe), -1)
        remaining.scatter_(1, token.clamp_min(0)[:, None], 0.0)  # a row with no mass has nothing to remove
        out.append(token)
    return torch.stack(out, 1)


def _grow_dynamic(plan: StaticTreePlan, root_tokens: Tensor, root_logits: Tensor,
                  expand: StaticExpand) -> StaticTreeDraft:
    B, device = root_tokens.shape[0], root_tokens.device
    k, D = plan.top_k, plan.max_depth
    tokens = [root_tokens[:, None]]
    parents = [torch.full((B, 1), -1, dtype=torch.long, device=device)]
    values = [torch.zeros((B, 1), dtype=torch.float32, device=device)]
    offsets = [torch.zeros((B, 1), dtype=torch.long, device=device)]
    frontier = torch.zeros((B, 1), dtype=torch.long, device=device)  # node ids
    ancestors = torch.full((B, 1, D + 1), -1, dtype=torch.long, device=device)
    ancestors[:, :, 0] = 0
    log_q = torch.log_softmax(root_logits.float(), -1)[:, None]
    size = 1
    for depth in range(1, D + 1):
        top = log_q.topk(k, dim=-1)  # [B, f, k]
        base = torch.cat(values, 1).gather(1, frontier)
        cand_values = (base[:, :, None] + top.values).flatten(1)
        cand_tokens, cand_parents = top.indices.flatten(1), frontier[:, :, None].expand(-1, -1, k).flatten(1)
        tokens.append(cand_tokens)
        parents.append(cand_parents)
        values.append(cand_values)
        cand_offsets = torch.full_like(cand_tokens, -1)
        offsets.append(cand_offsets)
        first, size = size, size + cand_tokens.shape[1]
        if depth == D:
            break
        chosen = best_first(cand_values, k)  # [B, k] candidate positions
        fed_offsets = (1 + (depth - 1) * k + torch.arange(k, device=device)).expand(B, -1)
        cand_offsets.scatter_(1, chosen, fed_offsets)
        ancestors = ancestors.gather(1, (chosen // k)[:, :, None].expand(-1, -1, D + 1)).clone()
        ancestors[:, :, depth] = fed_offsets
        frontier = first + chosen
        logits = expand(fed_offsets, cand_tokens.gather(1, chosen), ancestors, depth)
        log_q = torch.log_softmax(logits.float(), -1)
    all_values = torch.cat(values, 1)
    all_values = torch.where(torch.isfinite(all_values), all_values, torch.full_like(all_values, -1e30))
    num_valid = torch.full((B,), size, dtype=torch.long, device=device)
    pruned = prune_on_device(torch.cat(parents, 1), all_values, num_valid, plan.num_nodes)
    keep = pruned.keep
    return StaticTreeDraft(torch.cat(tokens, 1).gather(1, keep), pruned.parents, pruned.num_nodes, None,
                           torch.cat(offsets, 1).gather(1, keep))
