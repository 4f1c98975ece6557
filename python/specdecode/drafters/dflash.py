"""``DFlashDrafter``: block drafting (DFlash) from the target's hidden states, one forward per step.

The network is :class:`~specdecode.drafters.dflash_model.DFlashModel`: the block (the pending
token, then mask tokens) attends, in both directions, to itself and to the context's keys and
values, which every draft layer projects from the target's fused hidden states of the committed
columns. Its output at block position ``j`` is the distribution ``q_j`` of draft ``j`` (1-based),
through the target's own LM head (or a reduced head).

Proposals:

- chain: draft ``j`` is drawn from ``q_j`` (after the logits processors; argmax at temperature 0)
  and ``q_j`` is handed over as its proposal distribution. ``q_j`` does not depend on the earlier
  drafts, which is still an ordinary proposal for every rule: verification only needs the
  distribution each draft was drawn from, given everything before it. At most
  ``block_size - 1`` drafts per step; the block always has its full length (the length it was
  trained at), whatever the number of drafts asked for.
- tree (``tree=`` rank paths, as :class:`~specdecode.drafters.MedusaDrafter`'s): the node of path
  ``(r_1, .., r_d)`` holds the rank-``r_d`` token of ``q_d``. Siblings are distinct ranks of one
  distribution and the tree is a function of the context: verified with the ``deterministic``
  tree rule. :func:`~specdecode.drafters.medusa.sparse_tree` picks the paths most likely accepted
  from measured rank rates (a trained drafter's record holds them: ``rank_rates``).

State: the target's features arrive with each commit
(:attr:`~specdecode.drafters.base.CommitUpdate.features`, the prompt's after the prefill) and are
kept by column; a step projects the columns it has not projected yet (the accepted ones) into
every layer's context keys/values, kept by column too, through rejections, finished rows and
re-packs. On the static decode path the engine's feature buffer replaces the first store, and the
keys/values live in a buffer of the layout's capacity: each step re-projects the ``k + 1``
columns before the pending one (everything the last step can have committed) and runs the block
over all columns with a mask, with no host read (:meth:`DFlashDrafter.static_propose`).

Training: the kit's ``dflash`` kind (:mod:`specdecode.training.dflash`); published checkpoints:
:mod:`specdecode.drafters.dflash_checkpoint`.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from specdecode.drafters.base import CommitUpdate, DrafterBase, DraftState, Proposal, StaticDraftState
from specdecode.drafters.column_store import ColumnStore
from specdecode.drafters.drafter_cache import cached_prefix
from specdecode.drafters.dflash_model import DFlashModel, block_mask, block_positions
from specdecode.drafters.last_feature import draw, static_features_at, static_rank_tree, tree_layout, tree_proposal
from specdecode.drafters.medusa import check_choices
from specdecode.models import input_device, vocab_rows
from specdecode.models.reduced_head import output_head
from specdecode.sampling import SamplingParams
from specdecode.trees.shapes import TreeShape
from specdecode.trees.static_growth import StaticTreeDraft, StaticTreePlan

__all__ = ["DFlashDrafter"]


class DFlashDrafter(DrafterBase):
    """Drafts for ``target`` with a :class:`DFlashModel` (from :func:`specdecode.load_drafter`,
    trained by ``python -m specdecode train dflash``, or a published checkpoint through
    :func:`~specdecode.drafters.dflash_checkpoint.load_dflash`).

    ``tree``: None for chains of up to ``block_size - 1`` drafts, or rank paths (Medusa's
    format: :func:`~specdecode.drafters.medusa.check_choices`, ``product_tree``, ``sparse_tree``)
    at most ``block_size - 1`` deep. Any batch size, left padding; the eager, static, compiled and
    graphed decode paths.

    Example:
        >>> drafter = specdecode.load_drafter("runs/dflash", target)          # doctest: +SKIP
        >>> out = specdecode.generate(target, drafter, ids, max_new_tokens=64)  # doctest: +SKIP
    """

    name = "dflash"

    def __init__(self, target: nn.Module, model: DFlashModel, tree: Sequence[Sequence[int]] | None = None) -> None:
        if not isinstance(target, nn.Module):
            raise TypeError(f"target: expected the target model (a torch.nn.Module), got {type(target).__name__}")
        if not isinstance(model, DFlashModel):
            raise TypeError(f"model: expected a DFlashModel, got {type(model).__name__}")
        if model.target_vocab != vocab_rows(target) or model.config.hidden_size != target.get_input_embeddings().weight.shape[1]:
            raise ValueError(f"model: built for a target with {model.target_vocab} ids and hidden size "
                             f"{model.config.hidden_size}, not for this {type(target).__name__}")
        self.target = target
        self.model = model
        self.feature_layers = model.feature_layers
        self.device = input_device(target)
        self.max_drafts = model.block_size - 1
        self.choices = None if tree is None else check_choices(tree, self.max_drafts)
        self._layout = None if self.choices is None else tree_layout(self.choices)
        ids = model.draft_to_target
        self._head = output_head(target, None if ids is None else ids.cpu(), model.target_vocab)
        self.default_num_draft_tokens = min(self.max_drafts, 7)
        #: per block position, the measured rate of each rank (a trained drafter's record), or None:
        #: ``sparse_tree(drafter.rank_rates, N)`` builds a tree from it
        self.rank_rates: list[list[float]] | None = None
        self.reset()

    def reset(self) -> None:
        self.features = ColumnStore()  # [b, columns, F]: the target's features of committed columns
        # per layer, keys and values [b, kv_heads, columns, head_dim] projected from those features
        self.context = [(ColumnStore(2), ColumnStore(2)) for _ in range(self.model.config.num_layers)]
        self.projected = 0  # columns [0, projected) have their keys/values in self.context

    def describe(self) -> dict:
        c = self.model.config
        return {"drafter": self.name, "block_size": c.block_size, "num_layers": c.num_layers,
                "target_layer_ids": list(c.target_layer_ids), "draft_vocab": self.model.draft_vocab_size,
                "draft_params": sum(p.numel() for p in self.model.parameters()),
                "tree_nodes": None if self.choices is None else len(self.choices) + 1}

    def with_tree(self, tree: str | Sequence[Sequence[int]] | None, num_nodes: int = 16, tree_depth: int | None = None,
                  tree_children: str | None = None) -> "DFlashDrafter":
        """A drafter on the same network drafting a token tree (``generate``'s ``tree=``,
        ``num_nodes`` and ``tree_depth`` land here; this drafter is not modified): rank paths, or
        ``"sparse"``: the ``num_nodes - 1`` paths most likely accepted under the measured
        :attr:`rank_rates` (:func:`~specdecode.drafters.medusa.sparse_tree`), at most
        ``tree_depth`` deep; None for chains. Its children are always ``deterministic``.

        >>> tree_drafter = drafter.with_tree("sparse", num_nodes=12)  # doctest: +SKIP
        """
        if tree_children not in (None, "deterministic"):
            raise ValueError(f"tree_children: a DFlash tree's children are distinct ranks of one distribution "
                             f"('deterministic'), got {tree_children!r}")
        if isinstance(tree, str):
            if tree != "sparse":
                raise ValueError(f"tree: a DFlashDrafter drafts 'sparse' trees (from its measured rank rates) or rank "
                                 f"paths, got {tree!r}")
            if self.rank_rates is None:
                raise ValueError("tree: 'sparse' needs measured rank rates (a trained drafter's record: "
                                 "specdecode.load_drafter); pass rank paths instead, e.g. product_tree([3, 2])")
            from specdecode.drafters.medusa import sparse_tree

            depth = self.max_drafts if tree_depth is None else min(tree_depth, self.max_drafts)
            tree = sparse_tree(torch.tensor(self.rank_rates)[:depth], max(1, num_nodes - 1))
        clone = DFlashDrafter(self.target, self.model, tree=tree)
        clone.rank_rates = self.rank_rates
        clone.default_num_draft_tokens = self.default_num_draft_tokens
        return clone

    # ------------------------------------------------------------------ logits
    def _logits(self, hidden: Tensor, vocab_size: int, device: torch.device) -> Tensor:
        """Draft logits ``[b, n, vocab_size]`` float32 from the network's outputs ``[b, n, H]``."""
        return self._head(hidden)[..., :vocab_size].to(device=device, dtype=torch.float32)

    def _block_logits(self, state: DraftState, count: int | None = None) -> Tensor:
        """The logits of the first ``count`` draft positions (None: all ``block_size - 1``) from
        one forward; the head reads only those. Shape: returns ``[b, count, V]``."""
        pending = state.num_columns - 1
        if pending > self.projected:
            feats = self.features.data
            if feats is None or feats.shape[1] < pending:
                raise RuntimeError("DFlashDrafter: no target features for the committed columns (the engine hands "
                                   "them over with every commit to a drafter with feature_layers)")
            positions = state.positions[:, self.projected: pending].to(self.device)
            pairs = self.model.context_keys_values(feats[:, self.projected: pending], positions)
            for (keys, values), (k, v) in zip(self.context, pairs):
                keys.write(self.projected, k)
                values.write(self.projected, v)
            self.projected = pending
        b, size = state.batch_size, self.model.block_size
        visible = state.attention_mask[:, :pending].to(self.device).bool()
        if pending:
            context = [(keys.columns(pending), values.columns(pending)) for keys, values in self.context]
        else:
            c = self.model.config
            empty = torch.zeros((b, c.num_kv_heads, 0, c.head_dim), dtype=self.model.dtype, device=self.device)
            context = [(empty, empty)] * c.num_layers
        first = state.tokens[:, pending].to(self.device)
        tokens = first[:, None].expand(b, size).contiguous()
        is_mask = torch.arange(size, device=self.device)[None, :].expand(b, size) > 0
        hidden = self.model(self.model.block_embeddings(self.target, tokens, is_mask),
                            block_positions(state.positions[:, pending].to(self.device), size), context,
                            block_mask(visible, size))
        wanted = self.max_drafts if count is None else count
        return self._logits(hidden[:, 1: 1 + wanted], state.vocab_size, state.device)

    # ------------------------------------------------------------------ eager path
    @torch.no_grad()
    def propose(self, state: DraftState, num_tokens: int) -> Proposal:
        if self._layout is not None:
            return self._propose_tree(state, self._block_logits(state, int(self._layout[0].max()) + 1))
        count = min(num_tokens, self.max_drafts)
        logits = self._block_logits(state, max(count, 1))
        tokens: list[Tensor] = []
        used: list[Tensor] = []
        for j in range(count):
            token, q = draw(state, logits[:, j], tokens)
            tokens.append(token)
            used.append(q)
        if not tokens:
            return Proposal(state.tokens[:, :0].to(state.device), forward_calls=1)
        return Proposal(torch.stack(tokens, 1), torch.stack(used, 1), forward_calls=1)

    def _propose_tree(self, state: DraftState, logits: Tensor) -> Proposal:
        positions, ranks, parents, width = self._layout
        self._check_width(width, state.vocab_size)
        depth = int(positions.max()) + 1
        top = logits[:, :depth].topk(width, dim=-1).indices  # [b, depth, width]: distinct ids per position
        nodes = top[:, positions.to(state.device), ranks.to(state.device)]
        root = state.tokens[:, state.num_columns - 1].to(state.device)
        return tree_proposal(torch.cat([root[:, None], nodes], 1), parents, forward_calls=1)

    def _check_width(self, width: int, vocab_size: int) -> None:
        ids = min(vocab_size, self.model.draft_vocab_size or vocab_size)
        if width > ids:
            raise ValueError(f"tree: a path asks for the rank-{width - 1} token of a draft position, but the drafter "
                             f"proposes among {ids} ids")

    def commit(self, update: CommitUpdate) -> None:
        if update.features is not None and update.features.shape[1] > 0:
            m = update.features.shape[1]
            start = update.num_columns - 1 - m
            self.features.write(start, update.features.to(device=self.device, dtype=self.model.dtype))
            self.projected = min(self.projected, start)
        self.projected = min(self.projected, update.num_columns - 1)
        stores = [self.features, *(store for pair in self.context for store in pair)]
        if update.kept_rows is not None:
            for store in stores:
                store.rows(update.kept_rows)
        order = update.column_order
        if order is not None:
            for store in stores:
                store.reorder(order)
            # keep the prefix of columns whose projections all moved from projected columns
            self.projected = cached_prefix(order.to(self.device), self.projected)

    # ------------------------------------------------------------------ static decode path
    def static_key(self) -> tuple:
        return ("dflash", weakref.ref(self.model), weakref.ref(self.target),
                None if self.choices is None else tuple(self.choices))

    def _static_context(self, state: StaticDraftState) -> list[tuple[Tensor, Tensor]]:
        c = self.model.config

        def make() -> list[tuple[Tensor, Tensor]]:
            shape = (state.batch_size, c.num_kv_heads, state.capacity, c.head_dim)
            return [(torch.zeros(shape, dtype=self.model.dtype, device=state.device),
                     torch.zeros(shape, dtype=self.model.dtype, device=state.device)) for _ in range(c.num_layers)]

        return state.buffer("dflash_context", make)

    def _static_project(self, state: StaticDraftState, columns: Tensor) -> None:
        """Project the target features at ``columns`` ``[B, n]`` into every layer's buffer."""
        feats = static_features_at(state, columns)
        positions = (columns - state.start[:, None]).clamp_min(0)
        index = columns.clamp(0, state.capacity - 1)
        for (keys, values), (k, v) in zip(self._static_context(state), self.model.context_keys_values(feats, positions)):
            where = index[:, None, :, None].expand(-1, keys.shape[1], -1, keys.shape[3])
            keys.scatter_(2, where, k.to(keys.dtype))
            values.scatter_(2, where, v.to(values.dtype))

    @torch.no_grad()
    def static_prefill(self, state: StaticDraftState, num_tokens: int) -> None:
        """Project the prompt's columns; ``ValueError`` naming ``num_draft_tokens`` when a step
        asks for more drafts than the block holds."""
        if self.choices is None and num_tokens > self.max_drafts:
            raise ValueError(f"num_draft_tokens: a DFlash block of {self.model.block_size} drafts at most "
                             f"{self.max_drafts} tokens; the static decode path drafts exactly {num_tokens} per step")
        width = state.prompt_columns
        if width > 0:
            columns = torch.arange(width, device=state.device)[None].expand(state.batch_size, -1)
            self._static_project(state, columns)

    def _static_block_logits(self, state: StaticDraftState, window: int, positions: int) -> Tensor:
        """Re-project the ``window`` columns before the pending one, then one block forward; the
        logits of the first ``positions`` draft positions. Shape: returns ``[B, positions, V]`` float32."""
        first = (state.lengths - window).clamp_min(0)
        self._static_project(state, first[:, None] + torch.arange(window, device=state.device))
        size = self.model.block_size
        columns = torch.arange(state.capacity, device=state.device)[None]
        visible = (columns >= state.start[:, None]) & (columns < state.lengths[:, None])
        root = state.tokens.gather(1, state.lengths[:, None])
        B = state.batch_size
        is_mask = state.buffer("dflash_is_mask", lambda: torch.arange(size, device=state.device)[None] > 0)
        embeds = self.model.block_embeddings(self.target, root.expand(B, size), is_mask.expand(B, size))
        hidden = self.model(embeds, block_positions(state.lengths - state.start, size), self._static_context(state),
                            block_mask(visible, size))
        return self._logits(hidden[:, 1: 1 + positions], state.vocab_size, state.device)

    @torch.no_grad()
    def static_propose(self, state: StaticDraftState, num_tokens: int) -> tuple[Tensor, Tensor]:
        """Draft ``j`` drawn with ``state.sample`` from ``q_j`` of one block forward; no host read.

        Shape: returns ``[B, num_tokens]`` int64 and ``[B, num_tokens, V]`` float32.
        """
        logits = self._static_block_logits(state, num_tokens + 1, num_tokens)
        tokens = [state.sample(logits[:, j]) for j in range(num_tokens)]
        return torch.stack(tokens, 1), logits

    def static_tree_plan(self, sampling: SamplingParams, vocab_size: int) -> StaticTreePlan:
        """The tree of the rank paths, the same at every step (``deterministic``); ``ValueError``
        naming ``tree`` for a chain drafter or a rank past the vocabulary."""
        if self.choices is None:
            raise ValueError("tree: this DFlashDrafter drafts chains (tree=None); pass rank paths as tree=")
        _, ranks, parents, width = self._layout
        self._check_width(width, vocab_size)
        shape = TreeShape(tuple(parents.tolist()), child_rank=(-1, *ranks.tolist()))
        return StaticTreePlan("shape", shape.num_nodes, shape.max_depth, "deterministic", shape=shape)

    @torch.no_grad()
    def static_propose_tree(self, state: StaticDraftState, plan: StaticTreePlan) -> StaticTreeDraft:
        """The rank-path tree from one block forward (the window re-projects the ``D + 1``
        columns before the pending one, ``D`` the plan's depth); no host read.

        Shape: returns a :class:`~specdecode.trees.static_growth.StaticTreeDraft` of
        ``len(choices) + 1`` nodes.
        """
        positions, ranks, _, width = self._layout
        picks = state.buffer(f"dflash_tree:{tuple(self.choices)}",
                             lambda: (positions * width + ranks).to(state.device))
        logits = self._static_block_logits(state, plan.max_depth + 1, plan.max_depth)
        top = logits.topk(width, dim=-1).indices  # [B, depth, width]
        root = state.tokens.gather(1, state.lengths[:, None])
        return static_rank_tree(state, plan, torch.cat([root, top.flatten(1).index_select(1, picks)], 1))

    def static_accept_path(self, state: StaticDraftState, draft: StaticTreeDraft, accepted_nodes: Tensor,
                           accepted_len: Tensor) -> None:
        """Nothing to move: the next window re-projects the accepted path's columns from the
        features the engine moved there."""
        return None
