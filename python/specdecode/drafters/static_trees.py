"""The contract of a drafter that drafts token trees on the static decode path
(:mod:`specdecode.engine.static_tree`), beside :class:`~specdecode.drafters.StaticDrafter`
(which it extends: the same ``static_key`` and ``static_prefill``).

A step on that path has one shape, fixed before the generation by a
:class:`~specdecode.trees.static_growth.StaticTreePlan`: ``num_nodes`` tree slots per row, the
root (each row's pending token, at column ``lengths[b]``) first. The drafter drafts the trees
(:func:`~specdecode.trees.static_draft.grow_static_tree` grows any plan given an ``expand``
that scores one level's new nodes, handed over as a
:class:`~specdecode.trees.static_growth.StaticLevel`: tokens, parents among the previous
forward's nodes, columns, positions and mask; a drafter with a tree builder calls
:func:`~specdecode.trees.static_draft.prepare_static_tree` in its ``static_prefill``, so
that a calibrated dynamic tree starts from its builder's counts); the engine scores every node
with one target forward over columns
``lengths[b] .. lengths[b] + num_nodes - 1``, verifies with the tree rule, and moves the
accepted path's target keys/values (and, for a drafter with ``feature_layers``, the target's
features: :mod:`specdecode.engine.static_features`) to the columns right after the root. It then
calls ``static_accept_path`` so that the drafter moves whatever it keeps per column (its own
cache) the same way. Nothing here may read a tensor on the host: every call may be recorded
into a CUDA graph.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from torch import Tensor

from specdecode.drafters.base import StaticDraftState
from specdecode.sampling import SamplingParams
from specdecode.trees.static_growth import StaticTreeDraft, StaticTreePlan


@runtime_checkable
class StaticTreeDraftState(StaticDraftState, Protocol):
    """What a tree drafter reads on the static path: :class:`~specdecode.drafters.StaticDraftState`
    and two more methods (both graph-safe)."""

    def sample_weights(self, weights: Tensor) -> Tensor:
        """One token per row drawn in proportion to ``weights`` (>= 0, mass in every row),
        unprocessed, coins from the generation's Philox counter: draws ``sample`` does not cover
        (children without replacement from a filtered ``q``).

        Shape:
            weights: ``[M, V]`` float64; returns ``[M]`` int64.
        """
        ...

    def count_op_sync(self) -> None:
        """Count the host synchronisation of a compiled op just run outside a CUDA graph."""
        ...


@runtime_checkable
class StaticTreeDrafter(Protocol):
    """A drafter that drafts token trees on the static decode path.

    - ``static_tree_plan(sampling, vocab_size)``: the fixed plan of this generation (host work,
      before it starts); ``ValueError`` naming ``tree`` when it cannot draft one.
    - ``static_propose_tree(state, plan)``: one tree per row (finished rows too), as a
      :class:`~specdecode.trees.static_growth.StaticTreeDraft` with ``plan.num_nodes`` slots;
      children drawn with ``state.sample`` / ``state.sample_weights`` from the logits returned
      in ``draft_logits`` (as processed by the generation's sampling settings); ``state`` is a
      :class:`StaticTreeDraftState`.
    - ``static_accept_path(state, draft, accepted_nodes, accepted_len)``: after verification,
      before the engine moves ``lengths``: node ``accepted_nodes[b, j]`` (``j = 1 ..
      accepted_len[b]``) becomes column ``lengths[b] + j``.

    Shape:
        accepted_nodes: ``[B, D + 1]`` int64 (the root 0, then the accepted nodes, ``-1``
            padded; ``D = plan.max_depth``); accepted_len: ``[B]`` int64.
    """

    def static_key(self) -> Any: ...

    def static_prefill(self, state: StaticDraftState, num_tokens: int) -> None: ...

    def static_tree_plan(self, sampling: SamplingParams, vocab_size: int) -> StaticTreePlan: ...

    def static_propose_tree(self, state: StaticTreeDraftState, plan: StaticTreePlan) -> StaticTreeDraft: ...

    def static_accept_path(self, state: StaticTreeDraftState, draft: StaticTreeDraft, accepted_nodes: Tensor,
                           accepted_len: Tensor) -> None: ...
