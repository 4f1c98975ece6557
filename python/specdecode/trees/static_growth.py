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
  overall form the tree (:mod:`specdecode.trees.static_dynamic`). A calibrated builder values
  nodes by the acceptance measured while generating, counted and re-fitted on the device
  (:mod:`specdecode.trees.static_calibration`), as on the eager path. A builder given no
  ``max_depth`` grows as deep as the acceptance it measured in its earlier generations makes
  worth its draft forwards (:mod:`specdecode.trees.static_depth`; before any measurement
  :data:`~specdecode.trees.static_depth.STATIC_DYNAMIC_DEPTH` levels). Every level is expanded
  (the eager builder may stop early when no deeper node can enter: the same tree). When
  sampling with sampled children, a dynamic tree drafts the Sequoia shape of the fixed sampled
  profile (``SAMPLED_PROFILE``) with those children, as the eager builder does.

The drafter provides ``expand``: one draft forward over the new nodes of one level, given as a
:class:`StaticLevel` (their tokens, cache columns, positions and attention mask, built here:
:class:`LevelInputs`), which writes their keys and values at those columns and returns their
logits. :func:`~specdecode.trees.static_draft.grow_static_tree` calls it once per level that has
children to draw.

Kernels: what depends only on the layout (index tables, offsets, the key columns) is made once
per layout and kept in the drafter's state buffers; what depends on the step's lengths (each
row's columns, positions and its root's mask row) once per step; a level then costs the
draft's forward plus a few kernels (for a dynamic tree: one top-k over the frontier's
children, one stable sort of the candidates, gathers of the chosen ones, and its mask rows
gathered from their parents' rows with their own column opened).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor

from specdecode.sampling import SamplingParams, processed_probs
from specdecode.trees.builder_base import SAMPLED_PROFILE, StaticTree, TreeBuilder, compact_tree
from specdecode.trees.calibration import calibration_key
from specdecode.trees.sequoia import acceptance_from_conditional, sequoia_shape
from specdecode.trees.shapes import TreeShape
from specdecode.trees.static_depth import STATIC_DYNAMIC_DEPTH  # noqa: F401 (re-exported)


@dataclass(frozen=True)
class StaticTreePlan:
    """What every tree of a static-path generation looks like (see the module docstring).

    ``kind`` is ``"shape"`` (``shape`` drawn with ``children``) or ``"dynamic"`` (EAGLE-2 with
    ``top_k``, deterministic children; ``calibration``: the configuration of the calibration its
    nodes are valued by, :mod:`specdecode.trees.static_calibration`, or None for the draft's
    own probabilities); ``num_nodes`` counts the root; ``span`` is how many columns after the
    root the draft forwards write (offsets ``1 .. span``).
    """

    kind: str
    num_nodes: int
    max_depth: int
    children: str
    shape: TreeShape | None = None
    top_k: int = 0
    calibration: tuple | None = None

    @property
    def key(self) -> tuple:
        """Hashable and equal for equal plans (the layout key of the static path)."""
        return (self.kind, self.num_nodes, self.max_depth, self.children,
                None if self.shape is None else self.shape.parents, self.top_k, self.calibration)

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
            (only nodes with children were fed; ``-1`` for the others of a dynamic tree).
        cells: ``[B, N]`` int64 or None — for a calibrated dynamic tree, each node's calibration
            cell (depth, rank, confidence bucket), counted after verification.

    ``full``: every row has all ``N`` nodes, whatever the step (known from the plan: no
    padding slots to mask; False when unknown).
    """

    tokens: Tensor
    parents: Tensor
    num_nodes: Tensor
    draft_logits: Tensor | None
    offsets: Tensor
    full: bool = False
    cells: Tensor | None = None


@dataclass
class StaticLevel:
    """The ``n`` new nodes per row of one draft forward of a tree step (``depth`` below the root).

    Shape:
        tokens: ``[B, n]`` int64.
        parent_index: ``[B, n]`` int64 — each node's parent among the nodes of the previous
            draft forward of this step (at depth 1: the root forward's one node, 0).
        columns: ``[B, n]`` int64 — the cache columns the forward writes (``lengths + offset``).
        positions: ``[B, n]`` int64 — the root's position plus ``depth``.
        mask: ``[B, 1, n, capacity]`` additive (0 = attend, the dtype's minimum = masked): the
            row's committed columns and the node's ancestors-or-self.
    """

    tokens: Tensor
    parent_index: Tensor
    columns: Tensor
    positions: Tensor
    mask: Tensor
    depth: int


#: ``expand(level) -> logits [B, n, V]``: one draft forward over ``level``'s nodes
#: (:class:`StaticLevel`), writing their keys and values at ``level.columns``.
StaticExpand = Callable[[StaticLevel], Tensor]


def plan_static_tree(builder: Any, sampling: SamplingParams, vocab_size: int) -> StaticTreePlan:
    """The fixed plan of ``builder`` (a :class:`~specdecode.trees.builders.TreeBuilder`) for a
    generation with ``sampling`` over ``vocab_size`` tokens; ``ValueError`` naming ``tree`` for
    builders the static path cannot run. The builder is not modified. A dynamic tree given no
    depth takes the one its measured acceptance chooses (:mod:`specdecode.trees.static_depth`)."""
    from specdecode.trees.builders import DynamicTree, SequoiaTree

    greedy = sampling.is_greedy
    if type(builder) is DynamicTree:  # subclasses may build otherwise: refused below
        if greedy or builder.sampled is None:
            k = min(builder.top_k, vocab_size)
            depth = builder.max_depth
            if not getattr(builder, "depth_given", True):  # the eager default relies on stopping early
                depth = builder.static_depths.choose(depth)
            total = 1 + k + (depth - 1) * k * k
            calibration = calibration_key(builder.calibration) if builder.calibrated else None
            return StaticTreePlan("dynamic", min(builder.num_nodes, total), depth, "deterministic", top_k=k,
                                  calibration=calibration)
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


# ---------------------------------------------------------------------------- level inputs


@dataclass
class _InputConstants:
    slots: Tensor  # [1, span + 1] offsets 0 .. span
    depths: Tensor  # [1, D + 1] depths 0 .. D
    keys: Tensor  # [1, 1, 1, capacity] column indices
    attend: Tensor  # 0-dim, the mask dtype: 0
    masked: Tensor  # 0-dim, the mask dtype: its minimum


class LevelInputs:
    """The inputs of one step's draft forwards over tree nodes, for a plan of ``span`` columns
    after the root and ``max_depth`` levels, masks of ``dtype``: each row's slot columns
    (``lengths + offset``) and positions by depth, computed once per step, and the mask rows of
    the last level fed (:meth:`level`), starting with the root's row (the committed columns
    and the root's). Constants are kept in ``state``'s buffers, once per layout.

    Shape:
        columns: ``[B, span + 1]`` int64; positions: ``[B, max_depth + 1]`` int64.
    """

    def __init__(self, state: Any, span: int, max_depth: int, dtype: torch.dtype) -> None:
        device, capacity = state.device, state.capacity

        def constants() -> _InputConstants:
            return _InputConstants(torch.arange(span + 1, device=device)[None, :],
                                   torch.arange(max_depth + 1, device=device)[None, :],
                                   torch.arange(capacity, device=device)[None, None, None, :],
                                   torch.zeros((), dtype=dtype, device=device),
                                   torch.full((), torch.finfo(dtype).min, dtype=dtype, device=device))

        c = state.buffer(f"static_tree_inputs:{span}:{max_depth}:{dtype}", constants)
        lengths, start = state.lengths, state.start
        self.columns = lengths[:, None] + c.slots
        self.positions = (lengths - start)[:, None] + c.depths
        allowed = (c.keys >= start[:, None, None, None]) & (c.keys <= lengths[:, None, None, None])
        self._rows = torch.where(allowed, c.attend, c.masked)  # [B, 1, 1, capacity]: the root's

    def level(self, tokens: Tensor, parent_index: Tensor, columns: Tensor, depth: int) -> StaticLevel:
        """The next level's :class:`StaticLevel`: each node's mask row is its parent's (among the
        last level's, ``parent_index``) with its own column opened.

        Shape:
            tokens, parent_index, columns: ``[B, n]`` int64.
        """
        B, n = tokens.shape
        rows = self._rows.gather(2, parent_index[:, None, :, None].expand(B, 1, n, self._rows.shape[-1]))
        rows.scatter_(3, columns[:, None, :, None], 0.0)
        self._rows = rows
        return StaticLevel(tokens, parent_index, columns, self.positions[:, depth: depth + 1].expand(B, n), rows,
                           depth)


# ---------------------------------------------------------------------------- growing


@dataclass
class _ShapeConstants:
    """Device tensors of a fixed shape, made once per layout (a CUDA graph may not copy host
    data): per level with children to draw (the nodes of that depth with children, in node
    order: the ones the last forward fed), how many each draws, where each child's token comes
    from in the ``[m, k]`` draws (None: in order) and which node it is, its parent, the nodes
    fed next and their parents among the nodes drawing."""

    parents: Tensor  # [B, N]
    offsets: Tensor  # [B, N]: node i is fed at offset i
    num_nodes: Tensor  # [B]: N
    levels: list[tuple[int, Tensor | None, Tensor, Tensor, Tensor | None, Tensor | None]]


def _shape_constants(shape: TreeShape, batch: int, device: torch.device) -> _ShapeConstants:
    N, D = shape.num_nodes, shape.max_depth

    def t(values: list[int]) -> Tensor:
        return torch.tensor(values, dtype=torch.long, device=device)

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
        fed_parents = [drawing.index(shape.parents[c]) for c in fed]
        levels.append((k, None if source == list(range(len(drawing) * k)) else t(source), t(child), t(parent),
                       t(fed) if fed else None, t(fed_parents) if fed else None))
    return _ShapeConstants(t(list(shape.parents)).expand(batch, -1).contiguous(),
                           t(list(range(N))).expand(batch, -1).contiguous(), t([N] * batch), levels)


def grow_shape(plan: StaticTreePlan, state: Any, root_tokens: Tensor, root_logits: Tensor,
               expand: StaticExpand, inputs: LevelInputs) -> StaticTreeDraft:
    """The trees of a plan of a fixed shape (not ``"dynamic"``): every level's children drawn
    from their parents' logits as ``plan.children`` says, one ``expand`` per level that has
    children to draw. Shape: as :func:`~specdecode.trees.static_draft.grow_static_tree`."""
    shape = plan.shape
    assert shape is not None
    B, V, N = root_tokens.shape[0], root_logits.shape[-1], shape.num_nodes
    consts = state.buffer(f"static_tree_shape:{plan.key}", lambda: _shape_constants(shape, B, root_tokens.device))
    # every child is a node unless draws can run out of mass (then the tree is compacted)
    complete = plan.children == "iid" or (plan.children == "deterministic" and max(shape.num_children) <= V)
    tokens = root_tokens[:, None].repeat(1, N)
    valid = None if complete else torch.ones((B, N), dtype=torch.bool, device=root_tokens.device)
    node_logits = None
    if plan.children != "deterministic":  # the rule reads the q each node's children were drawn from
        node_logits = root_logits.new_zeros((B, N, V))
        node_logits[:, 0] = root_logits
    drawing_logits = root_logits[:, None]  # [B, m, V]: the nodes drawing children, fed by the last forward
    for depth, (k, source, child, parent, fed, fed_parents) in enumerate(consts.levels):
        kids = _draw(drawing_logits, k, plan.children, state).flatten(1)  # [B, m * k]
        if source is not None:
            kids = kids.index_select(1, source)
        tokens.index_copy_(1, child, kids if valid is None else kids.clamp_min(0))
        if valid is not None:
            valid.index_copy_(1, child, (kids >= 0) & valid.index_select(1, parent))
        if fed is not None and fed_parents is not None:
            n = fed.shape[0]
            level = inputs.level(tokens.index_select(1, fed), fed_parents.expand(B, n),
                                 inputs.columns.index_select(1, fed), depth + 1)
            drawing_logits = expand(level).to(root_logits.dtype)
            if node_logits is not None:
                node_logits.index_copy_(1, fed, drawing_logits)
    if valid is None:  # the layout's constants: nothing reads a tree in place
        return StaticTreeDraft(tokens, consts.parents, consts.num_nodes, node_logits, consts.offsets, full=True)
    tree, keep = compact_tree(tokens, consts.parents, valid)  # rows whose draws ran out of mass have fewer nodes
    draft_logits = None if node_logits is None else node_logits.gather(1, keep[:, :, None].expand(-1, -1, V))
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


