"""``ModelDrafter``: a second Hugging Face causal LM drafts, one token per forward, with its own
KV cache laid out on the engine's columns (same holes, same positions)."""

from __future__ import annotations

import weakref

import torch
from torch import Tensor

from specdecode.drafters.base import (CommitUpdate, DrafterBase, DraftState, Proposal, StaticDraftState,
                                      TreeBuilderDrafter)
from specdecode.drafters.drafter_cache import repack_cache
from specdecode.drafters.static_trees import StaticTreeDraftState
from specdecode.models import facts, kv_cache
from specdecode.sampling import SamplingParams, sample_logits
from specdecode.trees.builders import TreeBuilder
from specdecode.trees.static_draft import grow_static_tree, prepare_static_tree
from specdecode.trees.static_growth import StaticLevel, StaticTreeDraft, StaticTreePlan, plan_static_tree


class ModelDrafter(TreeBuilderDrafter, DrafterBase):
    """Drafts with ``model``, any Hugging Face decoder-only causal LM sharing the target's
    vocabulary (checked by :func:`specdecode.check_compatibility`).

    Each proposed token is drawn by :func:`specdecode.sampling.sample_logits` from the draft
    logits after the generation's logits processors, with the generation's sampling settings:
    the very distribution the verification op later computes from the returned logits. At
    temperature 0 the draft proposes its argmax.

    The draft's cache covers the engine's committed columns up to the pending token; a step
    feeds the columns it has not seen (the pending token, and the last accepted draft when a
    whole block was accepted) in one forward, then drafts ``k - 1`` more one token at a time.

    On the static decode path (:class:`~specdecode.drafters.StaticDrafter`) the draft keeps a
    :class:`~specdecode.models.static_cache.ColumnCache` on the engine's columns: each step feeds
    the last committed column and the pending token in one forward (the last committed column is
    re-fed: it is the one draft token the previous step never fed when it was accepted), then
    ``k - 1`` one-token forwards; rolling back is the engine moving the row lengths.

    With ``tree`` (a :class:`~specdecode.trees.builders.TreeBuilder`) it drafts a token tree
    instead: one draft forward per depth scores all the new nodes of that depth at once with a
    tree attention mask; afterwards the draft's cache keeps only the committed columns (the
    accepted path is fed with the next step's first forward). On the static path
    (:class:`~specdecode.drafters.StaticTreeDrafter`) the tree follows the builder's fixed plan
    (:mod:`specdecode.trees.static_growth`), its nodes written at the columns after the root, and
    the accepted path's draft keys/values are moved next to the root after verification.

    Example:
        >>> drafter = ModelDrafter(draft_model)
        >>> out = specdecode.generate(target, drafter, input_ids, max_new_tokens=32)
    """

    name = "model"

    def __init__(self, model: torch.nn.Module, tree: TreeBuilder | None = None) -> None:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model: expected a Hugging Face causal LM (torch.nn.Module), got {type(model).__name__}")
        if tree is not None and not isinstance(tree, TreeBuilder):
            raise TypeError(f"tree: expected a TreeBuilder or None, got {type(tree).__name__}")
        if kv_cache.has_recurrent_layers(model):
            raise ValueError(f"model: {type(model).__name__} ({model.config.model_type}) has recurrent layers; a draft "
                             "model's cache is cropped back to the committed tokens after every step, which a "
                             "recurrent state cannot be (use it as the target, or draft with another model)")
        self.tree = tree
        self.model = model
        self.device = facts.input_device(model)
        self._logits_to_keep_ok = facts.accepts_logits_to_keep(model)
        self.cache = None
        self.cached_columns = 0

    def reset(self) -> None:
        self.cache = None
        self.cached_columns = 0

    def describe(self) -> dict:
        n = sum(p.numel() for p in self.model.parameters())
        return {"drafter": self.name, "draft_model": type(self.model).__name__, "draft_params": n}

    def _feed(self, state: DraftState, ids: Tensor, positions: Tensor, mask: Tensor | None, last_only: bool) -> Tensor:
        """One draft forward appending ``ids`` to the draft cache; float32 logits on the state's
        device, over the shared vocabulary."""
        logits = facts.forward(self.model, ids.to(self.device), mask, positions.to(self.device), self.cache,
                               last_only=last_only, logits_to_keep_ok=self._logits_to_keep_ok)
        return logits[..., : state.vocab_size].to(device=state.device, dtype=torch.float32)

    def _catch_up(self, state: DraftState) -> tuple[Tensor, float]:
        """Feed every committed column the cache has not seen, the pending token last; returns
        the draft logits at the pending token and the prefill seconds (0 after the first step)."""
        if self.cache is None:
            self.cache = kv_cache.new_cache()
            self.cached_columns = 0
        prefilling = self.cached_columns == 0
        start = state.clock() if prefilling else 0.0
        pending = state.num_columns - 1
        lo = self.cached_columns
        mask = state.attention_mask[:, : pending + 1].to(self.device) if state.has_holes else None
        logits = self._feed(state, state.tokens[:, lo: pending + 1], state.positions[:, lo: pending + 1], mask, True)
        self.cached_columns = pending + 1
        return logits, (state.clock() - start if prefilling else 0.0)

    @torch.no_grad()
    def propose(self, state: DraftState, num_tokens: int) -> Proposal:
        if self.tree is not None:
            return self._propose_tree(state)
        logits, prefill_seconds = self._catch_up(state)
        pending = state.num_columns - 1
        b = state.batch_size
        committed_mask = state.attention_mask[:, : pending + 1].to(self.device) if state.has_holes else None
        pending_position = state.positions[:, pending]
        tokens: list[Tensor] = []
        logits_out: list[Tensor] = []
        for i in range(num_tokens):
            if i > 0:
                mask = None
                if committed_mask is not None:
                    mask = torch.cat([committed_mask, committed_mask.new_ones((b, i))], 1)
                logits = self._feed(state, tokens[-1][:, None], (pending_position + i)[:, None], mask, True)
            drafted = torch.stack(tokens, 1) if tokens else state.tokens[:, :0]
            logits = state.process_draft_logits(logits, drafted)
            coins = None if state.sampling.is_greedy else state.uniforms(b)
            tokens.append(sample_logits(logits, state.sampling, uniforms=coins))
            logits_out.append(logits)
        self.cached_columns = pending + num_tokens  # the pending token and x_1 .. x_{k-1}
        return Proposal(torch.stack(tokens, 1), torch.stack(logits_out, 1), forward_calls=num_tokens,
                        prefill_seconds=prefill_seconds)

    def _propose_tree(self, state: DraftState) -> Proposal:
        """Draft a token tree with the builder: one forward per depth over that depth's new nodes."""
        root_logits, prefill_seconds = self._catch_up(state)
        pending = state.num_columns - 1
        b = state.batch_size
        prefix = state.attention_mask[:, : pending + 1].to(device=self.device, dtype=torch.bool)
        root_position = state.positions[:, pending].to(self.device)
        dtype = self.model.dtype if hasattr(self.model, "dtype") else torch.float32
        slots = _TreeSlots(b, self.device)

        def expand(node_ids: Tensor, tokens: Tensor, parents: Tensor, depth: int) -> Tensor:
            visible = slots.add(node_ids.to(self.device), parents.to(self.device))  # [b, n, S]
            n = tokens.shape[1]
            allowed = torch.cat([prefix[:, None, :].expand(-1, n, -1), visible], 2)[:, None]
            mask = torch.zeros(allowed.shape, dtype=dtype, device=self.device).masked_fill(
                ~allowed, torch.finfo(dtype).min)
            positions = (root_position + depth)[:, None].expand(-1, n)
            return self._feed(state, tokens, positions, mask, False)

        built = self.tree.build(state.tokens[:, pending], root_logits, expand, state.sampling, state.uniforms)
        kv_cache.crop(self.cache, pending + 1)  # keep the committed columns only
        self.cached_columns = pending + 1
        return Proposal(built.tree.tokens, built.draft_logits, tree=built.tree, children=built.children,
                        forward_calls=1 + built.forward_calls, prefill_seconds=prefill_seconds)

    def crop_columns(self, columns: int) -> None:
        """Keep the draft cache's entries of the engine's first ``columns`` columns (no-op when it
        holds no more). The one place the cache is cut by column: a drafter whose cache does not
        hold every column (:class:`~specdecode.drafters.PartialCacheDrafter`) translates here."""
        kv_cache.crop(self.cache, columns)

    def commit(self, update: CommitUpdate) -> None:
        if self.tree is not None and update.accepted_nodes is not None:
            self.tree.record(update.accepted_nodes)  # builders that learn from each step's accepted path
        if self.cache is None:
            return
        valid = min(self.cached_columns, update.num_columns - 1)  # everything before the new pending token
        self.crop_columns(valid)
        self.cached_columns = valid
        if update.kept_rows is not None:
            kv_cache.select_rows(self.cache, update.kept_rows.to(self.device))
        order = update.column_order
        if order is not None:
            if self.cached_columns == 0:
                self.reset()
                return
            # Columns the cache never held (the last accepted draft of a fully accepted block)
            # are re-fed at the next step: keep the prefix of new columns that all come from cache.
            self.cached_columns = repack_cache(self.cache, order.to(self.device), self.cached_columns)


    # ------------------------------------------------------------------ static decode path
    def static_key(self) -> tuple:
        return ("model", weakref.ref(self.model))

    def _static_inputs(self, state: StaticDraftState, first: Tensor, num_columns: int) -> tuple[Tensor, Tensor, Tensor]:
        from specdecode.models.static_cache import column_inputs

        dtype = self.model.dtype if hasattr(self.model, "dtype") else torch.float32
        return column_inputs(first, state.start, num_columns, state.capacity, dtype)

    def _static_forward(self, state: StaticDraftState, inputs: tuple[Tensor, Tensor, Tensor], ids: Tensor | None
                        ) -> Tensor:
        columns, positions, mask = inputs
        if ids is None:
            ids = state.tokens.gather(1, columns)
        self._static_cache.columns = columns
        logits = facts.forward(self.model, ids, mask, positions, self._static_cache, last_only=True,
                               logits_to_keep_ok=self._logits_to_keep_ok)
        return logits[:, : state.vocab_size].float()

    @torch.no_grad()
    def static_prefill(self, state: StaticDraftState, num_tokens: int) -> None:
        from specdecode.models.static_cache import ColumnCache, prefill_inputs

        self._static_cache = state.buffer("draft_cache", lambda: ColumnCache(state.capacity))
        prepare_static_tree(state, self.tree)
        width = state.prompt_columns - 1  # the first step feeds the last prompt column with the pending token
        if width > 0:
            dtype = self.model.dtype if hasattr(self.model, "dtype") else torch.float32
            with prefill_inputs(self._static_cache, state.start, width, dtype) as inputs:
                self._static_forward(state, inputs, None)

    def static_propose(self, state: StaticDraftState, num_tokens: int) -> tuple[Tensor, Tensor]:
        logits = self._static_forward(state, self._static_inputs(state, state.lengths - 1, 2), None)
        tokens = [state.sample(logits)]
        all_logits = [logits]
        if num_tokens > 1:
            # The one-token forwards i = 1 .. k-1 feed columns lengths + i: their masks and positions
            # are the rows of one (k-1)-column layout, built once.
            columns, positions, mask = self._static_inputs(state, state.lengths + 1, num_tokens - 1)
            for i in range(1, num_tokens):
                j = slice(i - 1, i)
                logits = self._static_forward(state, (columns[:, j], positions[:, j], mask[:, :, j]),
                                              tokens[-1][:, None])
                tokens.append(state.sample(logits))
                all_logits.append(logits)
        return torch.stack(tokens, 1), torch.stack(all_logits, 1)

    def static_tree_plan(self, sampling: SamplingParams, vocab_size: int) -> StaticTreePlan:
        return plan_static_tree(self.tree, sampling, vocab_size)

    def static_propose_tree(self, state: StaticTreeDraftState, plan: StaticTreePlan) -> StaticTreeDraft:
        """Feed the last committed column and the pending token (the root), then one forward per
        level of the tree over its new nodes, written at columns ``lengths + offset`` of the
        draft's cache (:func:`~specdecode.trees.static_draft.grow_static_tree`)."""
        root_logits = self._static_forward(state, self._static_inputs(state, state.lengths - 1, 2), None)
        dtype = self.model.dtype if hasattr(self.model, "dtype") else torch.float32

        def expand(level: StaticLevel) -> Tensor:
            self._static_cache.columns = level.columns
            logits = facts.forward(self.model, level.tokens, level.mask, level.positions, self._static_cache,
                                   last_only=False, logits_to_keep_ok=False)
            return logits[..., : state.vocab_size].float()

        root = state.tokens.gather(1, state.lengths[:, None])[:, 0]
        return grow_static_tree(plan, state, root, root_logits, expand, dtype)

    def static_accept_path(self, state: StaticTreeDraftState, draft: StaticTreeDraft, accepted_nodes: Tensor,
                           accepted_len: Tensor) -> None:
        """Move the draft cache's entries of the accepted nodes that were fed (all but the last
        one, which the next step re-feeds with the new pending token, and may move as well) next
        to the root: one gather and one scatter over the draft's stacked layers.

        Shape:
            accepted_nodes: ``[B, D + 1]`` int64 (root first, ``-1`` padded); accepted_len: ``[B]``.
        """
        from specdecode.models.static_cache import move_columns

        D = accepted_nodes.shape[1] - 1
        depth = state.buffer(f"tree_path_depths:{D}", lambda: torch.arange(1, D + 1, device=state.device)[None, :])
        # A fed node of depth d sits at an offset >= d; past the path the root's offset 0 is
        # gathered, and a node never fed has -1: the maximum with d then copies column d onto itself.
        offsets = draft.offsets.gather(1, accepted_nodes[:, 1:].clamp_min(0))
        columns = state.lengths[:, None] + depth
        move_columns(self._static_cache, state.lengths[:, None] + torch.maximum(offsets, depth), columns)


class _TreeSlots:
    """Which tree nodes a draft forward has already fed (its *slots*, in feeding order), and
    for each slot the slots of its ancestors-or-self, per row."""

    def __init__(self, batch: int, device: torch.device) -> None:
        self.slot_of = torch.full((batch, 1), -1, dtype=torch.long, device=device)  # node id -> slot (root: -1)
        self.ancestors = torch.zeros((batch, 0, 0), dtype=torch.bool, device=device)

    def add(self, node_ids: Tensor, parents: Tensor) -> Tensor:
        """Register new nodes (``[b, n]`` ids and their parents' ids) as the next slots;
        returns which slots each new node may attend to, ``[b, n, S_after]``."""
        b, n = node_ids.shape
        S = self.ancestors.shape[1]
        needed = int(node_ids.max()) + 1
        if needed > self.slot_of.shape[1]:
            grow = self.slot_of.new_full((b, needed - self.slot_of.shape[1]), -1)
            self.slot_of = torch.cat([self.slot_of, grow], 1)
        parent_slot = self.slot_of.gather(1, parents.clamp_min(0))
        parent_slot = torch.where(parents >= 0, parent_slot, torch.full_like(parent_slot, -1))
        inherited = self.ancestors.gather(1, parent_slot.clamp_min(0)[:, :, None].expand(-1, -1, S)) if S else \
            self.ancestors.new_zeros((b, n, 0))
        inherited = inherited & (parent_slot >= 0)[:, :, None]
        rows = torch.cat([inherited, torch.eye(n, dtype=torch.bool, device=node_ids.device).expand(b, -1, -1)], 2)
        grown = torch.zeros((b, S + n, S + n), dtype=torch.bool, device=node_ids.device)
        grown[:, :S, :S] = self.ancestors
        grown[:, S:, :] = rows
        self.ancestors = grown
        self.slot_of.scatter_(1, node_ids, torch.arange(S, S + n, device=node_ids.device).expand(b, -1).contiguous())
        return rows
