"""Token trees on the static decode path (:mod:`specdecode.engine.static_loop`): the draft,
score and verify phases of a tree step, with fixed shapes and no host synchronisation.

Every step of a generation drafts trees of one plan
(:class:`~specdecode.trees.static_growth.StaticTreePlan`, fixed by the drafter's builder before
the generation): ``N`` node slots per row, depth at most ``D``. The layout is the static
cache's (:mod:`specdecode.models.static_cache`): row ``b``'s committed tokens are columns
``[start[b], lengths[b])`` and its pending token, the tree's root, column ``lengths[b]``.

- **draft**: the drafter's ``static_propose_tree``
  (:class:`~specdecode.drafters.StaticTreeDrafter`) drafts one tree per row.
- **score**: one target forward over the ``N`` nodes, node ``i`` at column ``lengths[b] + i``,
  position ``lengths[b] - start[b] + depth(i)``, attending to the committed columns and its
  ancestors-or-self (positions and the tree mask from the compiled ``tree_attention_mask``).
  For a feature drafter (one with ``feature_layers``) the same forward writes each node's
  target features at its column (:func:`~specdecode.engine.static_features.target_forward`).
- **verify**: the compiled ``verify_tree_philox`` with the tree rule, coins from the
  generation's Philox counter (the offset advanced on the device), trimmed to ``D + 1``
  columns. Then the accepted path moves into place: for ``j = 1 .. accepted_len[b]`` the
  target's keys/values at column ``lengths[b] + accepted_nodes[b, j]`` are copied to column
  ``lengths[b] + j`` (:func:`~specdecode.models.static_cache.move_columns`: one gather and one
  scatter over every layer, stacked), so are the target's features (``state.features``, for a
  feature drafter), the drafter moves its own columns (``static_accept_path``), and the path's
  tokens are written at those columns. A calibrated dynamic tree's nodes are counted into its
  device calibration (:mod:`specdecode.trees.static_calibration`).
  The chain step's *commit* phase then does the rest unchanged (output, EOS, lengths moved
  past the path, the bonus token as the next pending token, counters).

A drafter drafts trees on this path when it has a tree builder (``tree``: ModelDrafter,
EagleDrafter) or Medusa-style rank paths (``choices``: MedusaDrafter, HydraDrafter); see
:func:`drafts_tree`. The tree rule is checked up front (:func:`check_static_tree`): the one asked for must be
lossless for the plan's children (or indifferent to them), as on the eager path; ``gbv`` needs
a shape of K paths of one length. At temperature 0 every rule is the greedy walk.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor

from specdecode._ops import ops
from specdecode.drafters.static_trees import StaticTreeDrafter
from specdecode.engine.accounting import FIXED_COUNTERS
from specdecode.engine.settings import EngineSettings
from specdecode.engine.static_features import move_columns as move_feature_columns
from specdecode.engine.static_features import target_forward
from specdecode.engine.static_state import StepScratch
from specdecode.engine.step_phases import scored_logits, tree_rule_for
from specdecode.trees.rules import get_tree_rule, tree_rule_params
from specdecode.trees.static_calibration import device_calibration
from specdecode.trees.static_growth import StaticTreePlan, needs_processed_probs


@dataclass(frozen=True)
class TreeSetup:
    """What a static-path generation with trees runs: the plan, the tree rule named in the
    statistics (``rule``), the rule the op runs (``op_rule``: ``greedy`` at temperature 0) and
    its packed options."""

    plan: StaticTreePlan
    rule: str
    op_rule: str
    rule_params: tuple[float, ...]
    needs_draft_logits: bool

    @property
    def key(self) -> tuple:
        return (self.plan.key, self.op_rule, self.rule_params)


def drafts_tree(drafter: Any) -> bool:
    """Whether ``drafter`` drafts token trees: it holds a tree builder (``tree``) or Medusa-style
    rank paths (``choices``, MedusaDrafter and HydraDrafter); None in both drafts chains."""
    return getattr(drafter, "tree", None) is not None or getattr(drafter, "choices", None) is not None


def check_static_tree(drafter: Any, settings: EngineSettings, decode_path: str, *, graphed: bool | None = None,
                      plan: StaticTreePlan | None = None) -> TreeSetup:
    """Refuse what ``decode_path`` (``"static"``, ``"compiled"`` or ``"graphed"``) cannot do
    with ``drafter``'s token trees (``ValueError`` naming the argument); returns the generation's
    :class:`TreeSetup`. ``graphed``: whether the steps are recorded as CUDA graphs (default:
    ``decode_path == "graphed"``; ``"compiled"`` records them on CUDA). ``plan``: the plan of a
    host drafter's tries (:func:`~specdecode.engine.host_drafts.host_tree_plan`; the step's
    trees then come from the host); None asks the drafter."""
    where = f"decode_path={decode_path!r}"
    graphed = decode_path == "graphed" if graphed is None else graphed
    if plan is None and not isinstance(drafter, StaticTreeDrafter):
        raise ValueError(f"tree: {type(drafter).__name__} cannot draft token trees with {where} (it needs "
                         "static_tree_plan, static_propose_tree and static_accept_path: ModelDrafter, "
                         "LayerSkipDrafter, EagleDrafter, MedusaDrafter and HydraDrafter have them); draft a chain "
                         "(tree=None) or use decode_path='eager'")
    if plan is None:
        plan = drafter.static_tree_plan(settings.sampling, settings.vocab_size)
    if graphed and needs_processed_probs(plan.children, settings.sampling):
        when = "" if plan.children == "hub" else " under top_k / top_p / min_p"
        raise ValueError(f"tree_children: {plan.children!r} children{when} are drawn from the processed distribution "
                         "itself (processed_probs), whose CUDA kernel synchronises with the host, so it cannot run "
                         "inside a CUDA graph; use 'iid' children, 'without_replacement' with temperature only, or "
                         "decode_path='static'")
    rule = tree_rule_for(settings.rule, plan.children)
    info = get_tree_rule(rule)
    if not info.compiled:
        raise ValueError(f"rule: tree rule {rule!r} runs in Python only; {where} needs a compiled rule")
    if rule == "gbv" and not _is_paths(plan):
        raise ValueError(f"rule: 'gbv' verifies K paths of one length below the root, but this tree "
                         f"{_describe(plan)}; draft such a shape (e.g. tree=[[0], [1], [0, 0], [1, 0]] with "
                         "tree_children='iid') or use another rule")
    params = tuple(tree_rule_params(info, settings.rule_options if rule == settings.rule else {}))
    op_rule = "greedy" if settings.sampling.is_greedy else rule
    return TreeSetup(plan, rule, op_rule, params if op_rule == rule else (),
                     get_tree_rule(op_rule).needs_draft_logits)


def _is_paths(plan: StaticTreePlan) -> bool:
    """Whether the plan's shape is K >= 1 paths of one length below the root (GBV's layout)."""
    shape = plan.shape
    if shape is None or not shape.children(0):
        return False
    leaf_depths = {shape.depth[v] for v in range(1, shape.num_nodes) if shape.num_children[v] == 0}
    return all(shape.num_children[v] <= 1 for v in range(1, shape.num_nodes)) and len(leaf_depths) == 1


def _describe(plan: StaticTreePlan) -> str:
    return "is a dynamic tree" if plan.shape is None else f"has the shape {plan.shape.paths()}"


def tree_phases(session: Any, scratch: StepScratch, setup: TreeSetup, target: Callable[[], Any],
                dtype: torch.dtype, logits_to_keep_ok: bool, settings: EngineSettings,
                layers: tuple[int, ...] | None = None
                ) -> tuple[Callable[[], None], Callable[[], None], Callable[[], None]]:
    """The draft, score and verify phases of a tree step over ``session``'s buffers (they leave
    ``tokens [B, D + 1]``, ``accepted [B]`` and ``verified [B]`` in ``scratch`` for the chain
    step's commit phase, and for its statistics ``drafted [B]`` and ``stopped_early [B]``: see
    :func:`~specdecode.engine.accounting.tree_step_counters`; ``verified`` is each row's tree
    depth). ``target`` returns the target model (held weakly by the caller);
    ``layers``: the target features the drafter reads (None: none), written by the score
    forward at the nodes' columns and moved along the accepted path with the keys/values."""
    state, plan = session.state, setup.plan
    N, D = plan.num_nodes, plan.max_depth
    device = state.device
    depth_index = torch.arange(1, D + 1, device=device)[None, :]
    node_index = torch.arange(N, device=device)
    drafted_full = torch.full((state.batch_size,), N - 1, dtype=torch.long, device=device)
    no_prefix = torch.zeros((state.batch_size, 0), dtype=torch.bool, device=device)

    host = session.host  # a host drafter's tries, proposed before the step (engine/host_drafts.py), or None

    def draft() -> None:
        scratch.tree = host.tree if host is not None else session.drafter.static_propose_tree(state, plan)

    def score() -> None:
        from specdecode.models.static_cache import tree_inputs

        tree = scratch.tree
        offset = state.lengths - state.start
        positions, _, tree_mask, *_ = ops.tree_attention_mask(tree.parents, tree.num_nodes, no_prefix, offset)
        scratch.depths = positions - offset[:, None]  # each node's depth, for the statistics
        state.count_op_sync()  # on CUDA, outside a graph, the op reads its row statuses on the host
        mask, columns = tree_inputs(state.lengths, state.start, tree_mask, state.capacity, dtype)
        session.cache.columns = columns
        session.cache.feed_tree(tree.parents)  # (a recurrent layer steps each node from its parent)
        logits = target_forward(target(), tree.tokens, mask, positions, session.cache, state, layers,
                                last_only=False, logits_to_keep_ok=logits_to_keep_ok)
        scratch.target_logits = scored_logits(logits, settings.vocab_size, device)

    def verify() -> None:
        from specdecode.models.static_cache import move_columns

        tree = scratch.tree
        draft_logits = tree.draft_logits if setup.needs_draft_logits else None
        tokens, accepted, nodes = ops.verify_tree_philox(
            scratch.target_logits, draft_logits, tree.tokens, tree.parents, tree.num_nodes, state.philox_seed,
            state.philox_offset, *settings.sampling.op_args(), setup.op_rule, list(setup.rule_params))
        state.philox_offset.add_(1)
        state.count_op_sync()
        tokens, nodes = tokens[:, : D + 1], nodes[:, : D + 1]
        lengths = state.lengths[:, None]
        target_columns = lengths + depth_index
        # The path's node at depth d has an index >= d (topological order) and nodes past the
        # path are -1: the maximum is the path's node, or d itself (an identity copy) past it.
        source = lengths + torch.maximum(nodes[:, 1:], depth_index)
        move_columns(session.cache, source, target_columns)
        if layers is not None:
            move_feature_columns(state.features, source, target_columns)
        if host is None:  # (a host drafter keeps nothing per column)
            session.drafter.static_accept_path(state, tree, nodes, accepted)
        state.tokens.scatter_(1, target_columns, tokens[:, :D].clamp_min(0))
        active = ~session.finished
        scratch.tokens, scratch.accepted = tokens, accepted
        if tree.cells is not None:  # a calibrated dynamic tree learns from every step that drafts
            calibration = device_calibration(state, plan)
            if calibration is not None:  # (the eager loop drafts nothing once no row has two tokens left)
                drafting = (active & (session.generated <= settings.max_new_tokens - 2)).any()
                calibration.count(tree.cells, tree.parents, nodes, active & drafting)
        stop = nodes.gather(1, accepted[:, None])  # the accepted path's last node (the root has parent -1)
        session.cache.keep_states(stop[:, 0])  # (recurrent layers: the states after that node)
        has_children = tree.parents == stop
        depths = scratch.depths
        if tree.full:  # no padding slots: every row drafted N - 1 nodes
            scratch.drafted = drafted_full
        else:
            real = node_index[None, :] < tree.num_nodes[:, None]
            has_children, depths = has_children & real, torch.where(real, depths, 0)
            scratch.drafted = tree.num_nodes - 1
        scratch.verified = torch.where(active, depths.amax(1), 0)
        scratch.stopped_early = has_children.any(1)

    return draft, score, verify


def record_tree_acceptance(drafter: Any, setup: TreeSetup, state: Any, counters: list[int]) -> None:
    """After a generation (outside the steps): hand what it measured to the drafter's tree
    builder when it drafted a dynamic plan: the acceptance by depth (``counters``, the
    :func:`~specdecode.engine.accounting.step_counters` layout summed over the steps, read on
    the host) to its ``static_depths`` (:class:`~specdecode.trees.static_depth.DepthAcceptance`:
    its next plans' depth), and for a calibrated one the calibration counts the steps added on
    the device to its ``calibration`` (one more read: :mod:`specdecode.trees.static_calibration`)."""
    builder = getattr(drafter, "tree", None)
    record = getattr(builder, "static_depths", None)
    if setup.plan.kind != "dynamic" or record is None:
        return
    D = setup.plan.max_depth
    accepted = counters[FIXED_COUNTERS + D: FIXED_COUNTERS + 2 * D]
    reached = counters[FIXED_COUNTERS + 2 * D: FIXED_COUNTERS + 3 * D]
    record.add(D, reached, accepted)
    calibration = device_calibration(state, setup.plan)
    if calibration is not None:
        calibration.save(builder.calibration, state.syncs)


def tree_span(setup: TreeSetup | None, gamma: int) -> int:
    """Columns after the pending one that a step writes: ``gamma`` for chains."""
    return gamma if setup is None else setup.plan.span
