"""``EagleDrafter``: a feature drafter (EAGLE). It drafts from the target's own hidden states.

The network (:class:`EagleModel`) reads, at each position ``t``, the target's feature of the
previous position ``f_{t-1}`` (its hidden state at ``feature_layers``; by default the last one,
the vector the target's LM head reads) and the embedding of token ``x_t`` (the target's own,
frozen, embedding): ``fc([f_{t-1}, e(x_t)])`` goes through one decoder layer of the target's
architecture (with its own final norm), whose output predicts ``f_t``; a head turns it into the
distribution of ``x_{t+1}``. The head is the target's own (frozen) LM head, or a *reduced*
head over the ``Vd`` most frequent tokens with a map ``draft_to_target`` to the target's ids
(a draft step then costs ``Vd / V`` of a full head). A reduced head's logits are ``-inf`` on
every other token: the proposal ``q`` puts no mass there, which verification handles like any
other zero of ``q`` (such a token is never proposed; the target may still emit it).

Drafting one step: the target features of the committed columns arrive with each commit
(:attr:`~specdecode.drafters.base.CommitUpdate.features`, from the verification forward; the
prompt's after the prefill) and are kept, with the network's KV cache, in a
:class:`~specdecode.drafters.drafter_cache.DrafterCache` (``memory``), which each commit moves.
``propose`` feeds the columns the drafter's KV cache has not seen (the pending token last), each
paired with the feature of the row's previous real column, and then continues on its *own*
predicted features: draft ``i + 1`` reads ``[h_i, e(x_i)]``.
Trees (``tree=``, a :class:`~specdecode.trees.builders.TreeBuilder`) expand one depth per
forward; a node's input is its parent's predicted feature and its own token.

On the static decode path the features come from the engine's device buffer
(:mod:`specdecode.engine.static_features`) and the network keeps a static cache on the engine's
columns: each step feeds the ``k + 1`` columns up to the pending one with their true features,
then ``k - 1`` one-token forwards on its own predictions (:meth:`EagleDrafter.static_propose`).
Trees feed the ``D + 1`` columns up to the pending one (``D`` the plan's depth: the longest
path the last step can have accepted), then one forward per depth over that depth's nodes, each
at its column after the root (:meth:`EagleDrafter.static_propose_tree`).

Its training recipe is the kit's ``eagle`` kind (:mod:`specdecode.training.eagle`).
"""

from __future__ import annotations

import copy
import weakref

import torch
from torch import Tensor, nn

from specdecode.drafters.base import (CommitUpdate, DrafterBase, DraftState, Proposal, StaticDraftState,
                                      TreeBuilderDrafter)
from specdecode.drafters.drafter_cache import DrafterCache
from specdecode.drafters.last_feature import static_features_at
from specdecode.drafters.static_trees import StaticTreeDraftState
from specdecode.drafters.model import _TreeSlots
from specdecode.models import cache_kwargs, check_feature_layers, input_device, vocab_rows
from specdecode.sampling import SamplingParams, sample_logits
from specdecode.trees.builders import TreeBuilder
from specdecode.trees.static_draft import grow_static_tree, prepare_static_tree
from specdecode.trees.static_growth import StaticLevel, StaticTreeDraft, StaticTreePlan, plan_static_tree

__all__ = ["EagleDrafter", "EagleModel", "decoder_config"]


def decoder_config(target: nn.Module) -> object:
    """The target's configuration cut to one decoder layer (a copy; per-layer lists such as
    ``layer_types`` keep their last entry)."""
    config = copy.deepcopy(target.config)
    total = int(config.num_hidden_layers)
    config.num_hidden_layers = 1
    # a hybrid target (recurrent mixers between attention layers): the entries of its last
    # attention layer, since an EAGLE layer attends over the drafted columns
    kinds = getattr(config, "layer_types", None)
    keep = total - 1
    if isinstance(kinds, list) and len(kinds) == total:
        attending = [i for i, kind in enumerate(kinds) if kind in ("full_attention", "sliding_attention", "attention")]
        keep = attending[-1] if attending else keep
    for key, value in list(vars(config).items()):
        if "layer" in key and isinstance(value, list) and len(value) == total:
            setattr(config, key, value[keep: keep + 1])
    return config


class EagleModel(nn.Module):
    """The trainable part of an EAGLE drafter for ``target`` (only read here).

    ``feature_layers``: indices into the target's ``hidden_states`` whose concatenation is the
    feature (default ``(-1,)``); several layers (EAGLE-3 style) are first projected to the
    hidden size. ``draft_vocab``: None for the target's own head, or ``[Vd]`` int64 distinct
    target ids (a reduced head, started from the target head's rows of those ids).
    ``init_from_target``: start the decoder from the target's first layer (see
    :meth:`_start_from_target`) rather than at random (training; loading overwrites both).
    """

    def __init__(self, target: nn.Module, feature_layers: tuple[int, ...] = (-1,),
                 draft_vocab: Tensor | None = None, init_from_target: bool = False) -> None:
        super().__init__()
        from transformers import AutoModel

        self.feature_layers = check_feature_layers(target, feature_layers)
        hidden = int(target.get_input_embeddings().weight.shape[1])
        self.hidden_size = hidden
        self.feature_size = hidden * len(self.feature_layers)
        reference = next(target.parameters())
        factory = {"dtype": reference.dtype, "device": reference.device}
        self.reduce = nn.Linear(self.feature_size, hidden, bias=False, **factory) if len(
            self.feature_layers) > 1 else None
        self.fc = nn.Linear(2 * hidden, hidden, bias=True, **factory)
        config = decoder_config(target)
        self.decoder = AutoModel.from_config(config, dtype=reference.dtype,
                                             attn_implementation=target.config._attn_implementation)
        self.decoder.set_input_embeddings(nn.Embedding(1, hidden, **factory))  # inputs come as embeddings
        self.decoder.to(reference.device).eval()
        if init_from_target:
            self._start_from_target(target)
        self.target_vocab = vocab_rows(target)
        if draft_vocab is None:
            self.lm_head = None
            self.register_buffer("draft_to_target", torch.zeros(0, dtype=torch.long, device=reference.device))
        else:
            if not isinstance(draft_vocab, Tensor) or draft_vocab.dim() != 1 or draft_vocab.numel() == 0:
                raise ValueError("draft_vocab: expected a non-empty 1-D tensor of target token ids")
            ids = draft_vocab.to(device=reference.device, dtype=torch.long)
            if int(ids.min()) < 0 or int(ids.max()) >= self.target_vocab or ids.unique().numel() != ids.numel():
                raise ValueError(f"draft_vocab: expected distinct token ids in [0, {self.target_vocab})")
            self.lm_head = nn.Linear(hidden, ids.numel(), bias=False, **factory)
            with torch.no_grad():
                self.lm_head.weight.copy_(target.get_output_embeddings().weight[ids])
            self.register_buffer("draft_to_target", ids)

    def _start_from_target(self, target: nn.Module) -> None:
        """Start as a one-layer layer-skip drafter: the decoder takes the target's first layer,
        final norm (and position embeddings, where the architecture has them), and ``fc`` passes
        the token embedding through (the feature part starts at zero, training brings it in)."""
        prefix = getattr(target, "base_model_prefix", "model") + "."
        source = target.state_dict()
        own = self.decoder.state_dict()
        embedding = "embed" if "embed_tokens.weight" in own else "wte"
        state = {k: source[prefix + k] for k in own
                 if not k.startswith(embedding) and prefix + k in source and source[prefix + k].shape == own[k].shape}
        self.decoder.load_state_dict(state, strict=False)
        with torch.no_grad():
            self.fc.weight.zero_()
            self.fc.bias.zero_()
            self.fc.weight[:, self.hidden_size:].copy_(torch.eye(self.hidden_size))

    @property
    def draft_vocab_size(self) -> int | None:
        """``Vd`` for a reduced head, None for the target's."""
        return None if self.lm_head is None else int(self.draft_to_target.numel())

    def input_features(self, target_features: Tensor) -> Tensor:
        """Target features as the decoder reads them (projected when several layers).

        Shape:
            target_features: ``[b, n, feature_size]``; returns ``[b, n, hidden]``.
        """
        return target_features if self.reduce is None else self.reduce(target_features)

    def forward(self, features: Tensor, embeds: Tensor, attention_mask: Tensor | None, position_ids: Tensor,
                cache: object | None = None) -> Tensor:
        """Predicted features ``[b, n, hidden]`` (appending to ``cache`` when given).

        Shape:
            features: ``[b, n, hidden]`` (already through :meth:`input_features`, or the
                drafter's own predictions); embeds: ``[b, n, hidden]`` the tokens' embeddings;
            attention_mask: 2D ``[b, cached + n]`` 0/1, 4D, or None; position_ids: ``[b, n]``.
        """
        x = self.fc(torch.cat([features, embeds], -1))
        extra = cache_kwargs(self.decoder, cache) if cache is not None else {"use_cache": False}
        out = self.decoder(inputs_embeds=x, attention_mask=attention_mask, position_ids=position_ids, **extra)
        return out.last_hidden_state

    def logits(self, hidden: Tensor, target_head: nn.Module, vocab_size: int) -> Tensor:
        """Draft logits over the target's first ``vocab_size`` ids, ``-inf`` outside a reduced
        vocabulary.

        Shape:
            hidden: ``[..., hidden]``; returns ``[..., vocab_size]`` in the head's dtype.
        """
        if self.lm_head is None:
            return target_head(hidden)[..., :vocab_size]
        small = self.lm_head(hidden)
        # placed over every target id (the map's ids are < target_vocab), then cut to vocab_size:
        # no value of the map is read on the host, so a draft step never waits for the device
        full = small.new_full((*small.shape[:-1], max(vocab_size, self.target_vocab)), float("-inf"))
        return full.index_copy_(-1, self.draft_to_target, small)[..., :vocab_size]


class EagleDrafter(TreeBuilderDrafter, DrafterBase):
    """Drafts for ``target`` with an :class:`EagleModel` (usually from
    :func:`specdecode.load_drafter`, trained by ``python -m specdecode train eagle``).

    Draft tokens are drawn by :func:`specdecode.sampling.sample_logits` from the draft logits
    after the generation's logits processors (argmax at temperature 0), and those logits are
    returned as ``q``, as :class:`~specdecode.drafters.ModelDrafter` does; ``tree=`` drafts a
    token tree with a builder instead. Chains and trees, any batch size, left padding; also on
    the static decode path (:meth:`static_propose`, :meth:`static_propose_tree`).

    Example:
        >>> drafter = specdecode.load_drafter("runs/eagle", target)        # doctest: +SKIP
        >>> out = specdecode.generate(target, drafter, ids, max_new_tokens=32)  # doctest: +SKIP
    """

    name = "eagle"

    def __init__(self, target: nn.Module, model: EagleModel, tree: TreeBuilder | None = None) -> None:
        if not isinstance(target, nn.Module):
            raise TypeError(f"target: expected the target model (a torch.nn.Module), got {type(target).__name__}")
        if not isinstance(model, EagleModel):
            raise TypeError(f"model: expected an EagleModel, got {type(model).__name__}")
        if tree is not None and not isinstance(tree, TreeBuilder):
            raise TypeError(f"tree: expected a TreeBuilder or None, got {type(tree).__name__}")
        if model.target_vocab != vocab_rows(target) or model.hidden_size != target.get_input_embeddings().weight.shape[1]:
            raise ValueError(f"model: built for a target with {model.target_vocab} ids and hidden size "
                             f"{model.hidden_size}, not for this {type(target).__name__}")
        self.target = target
        self.model = model
        self.tree = tree
        self.feature_layers = model.feature_layers
        self.device = input_device(target)
        self.reset()

    def reset(self) -> None:
        self.memory = DrafterCache(self.device)  # its KV cache and the target's feature at each column

    def describe(self) -> dict:
        n = sum(p.numel() for p in self.model.parameters())
        return {"drafter": self.name, "draft_params": n, "feature_layers": list(self.feature_layers),
                "draft_vocab": self.model.draft_vocab_size}

    # ------------------------------------------------------------------ drafting
    def _embed(self, ids: Tensor) -> Tensor:
        return self.target.get_input_embeddings()(ids.to(self.device))

    def _logits(self, state: DraftState | StaticDraftState, hidden: Tensor) -> Tensor:
        head = self.target.get_output_embeddings()
        return self.model.logits(hidden, head, state.vocab_size).to(device=state.device, dtype=torch.float32)

    def _catch_up(self, state: DraftState) -> tuple[Tensor, float]:
        """Feed every committed column the cache has not seen, the pending one last; returns the
        predicted feature at the pending column ``[b, hidden]`` and the prefill seconds."""
        memory = self.memory
        cache = memory.open()
        prefilling = memory.cached_columns == 0
        start = state.clock() if prefilling else 0.0
        pending = state.num_columns - 1
        lo = memory.cached_columns
        mask = state.attention_mask[:, : pending + 1].to(self.device)
        previous = memory.previous_features(mask, lo, pending + 1, self.model.feature_size, self.model.fc.weight.dtype)
        hidden = self.model(self.model.input_features(previous), self._embed(state.tokens[:, lo: pending + 1]),
                            mask if state.has_holes else None, state.positions[:, lo: pending + 1].to(self.device),
                            cache)
        memory.cached_columns = pending + 1
        return hidden[:, -1], (state.clock() - start if prefilling else 0.0)

    @torch.no_grad()
    def propose(self, state: DraftState, num_tokens: int) -> Proposal:
        if self.tree is not None:
            return self._propose_tree(state)
        hidden, prefill_seconds = self._catch_up(state)
        pending = state.num_columns - 1
        b = state.batch_size
        committed = state.attention_mask[:, : pending + 1].to(self.device) if state.has_holes else None
        position = state.positions[:, pending].to(self.device)
        tokens: list[Tensor] = []
        logits_out: list[Tensor] = []
        for i in range(num_tokens):
            if i > 0:
                mask = None if committed is None else torch.cat([committed, committed.new_ones((b, i))], 1)
                hidden = self.model(hidden[:, None], self._embed(tokens[-1][:, None]), mask,
                                    (position + i)[:, None], self.memory.cache)[:, 0]
            drafted = torch.stack(tokens, 1) if tokens else state.tokens[:, :0]
            logits = state.process_draft_logits(self._logits(state, hidden), drafted)
            coins = None if state.sampling.is_greedy else state.uniforms(b)
            tokens.append(sample_logits(logits, state.sampling, uniforms=coins))
            logits_out.append(logits)
        # Keep only columns fed with the target's features: accepted drafts are fed again at the
        # next step, with the target's features instead of the drafter's own predictions.
        self.memory.keep(pending + 1)
        return Proposal(torch.stack(tokens, 1), torch.stack(logits_out, 1), forward_calls=num_tokens,
                        prefill_seconds=prefill_seconds)

    def _propose_tree(self, state: DraftState) -> Proposal:
        """One forward per depth over that depth's new nodes; a node reads its parent's
        predicted feature."""
        root_hidden, prefill_seconds = self._catch_up(state)
        pending = state.num_columns - 1
        b = state.batch_size
        prefix = state.attention_mask[:, : pending + 1].to(device=self.device, dtype=torch.bool)
        root_position = state.positions[:, pending].to(self.device)
        dtype = self.model.fc.weight.dtype
        slots = _TreeSlots(b, self.device)
        node_hidden = {"h": root_hidden[:, None]}  # [b, nodes so far, hidden], by node id

        def expand(node_ids: Tensor, tokens: Tensor, parents: Tensor, depth: int) -> Tensor:
            node_ids, parents = node_ids.to(self.device), parents.to(self.device)
            visible = slots.add(node_ids, parents)
            n = tokens.shape[1]
            allowed = torch.cat([prefix[:, None, :].expand(-1, n, -1), visible], 2)[:, None]
            mask = torch.zeros(allowed.shape, dtype=dtype, device=self.device).masked_fill(
                ~allowed, torch.finfo(dtype).min)
            table = node_hidden["h"]
            parent_hidden = table.gather(1, parents.clamp_min(0)[:, :, None].expand(-1, -1, table.shape[-1]))
            positions = (root_position + depth)[:, None].expand(-1, n)
            hidden = self.model(parent_hidden, self._embed(tokens), mask, positions, self.memory.cache)
            needed = int(node_ids.max()) + 1
            if needed > table.shape[1]:
                table = torch.cat([table, table.new_zeros((b, needed - table.shape[1], table.shape[-1]))], 1)
            table = table.scatter(1, node_ids[:, :, None].expand(-1, -1, table.shape[-1]), hidden)
            node_hidden["h"] = table
            return self._logits(state, hidden)

        root_logits = self._logits(state, root_hidden)
        built = self.tree.build(state.tokens[:, pending], root_logits, expand, state.sampling, state.uniforms)
        self.memory.keep(pending + 1)  # keep the committed columns only
        return Proposal(built.tree.tokens, built.draft_logits, tree=built.tree, children=built.children,
                        forward_calls=1 + built.forward_calls, prefill_seconds=prefill_seconds)

    # ------------------------------------------------------------------ commit
    def commit(self, update: CommitUpdate) -> None:
        self.memory.commit(update)

    # ------------------------------------------------------------------ static decode path
    def static_key(self) -> tuple:
        return ("eagle", weakref.ref(self.model), weakref.ref(self.target))

    def _static_window(self, state: StaticDraftState, inputs: tuple[Tensor, Tensor, Tensor]) -> Tensor:
        """Feed the columns of ``inputs`` (:func:`~specdecode.models.static_cache.column_inputs`)
        with their tokens and the target feature of the column before each (zeros before the
        row's first real column).

        Shape:
            inputs: columns ``[B, n]``, positions ``[B, n]``, mask ``[B, 1, n, K]``; returns the
            predicted features ``[B, n, hidden]``.
        """
        columns, positions, mask = inputs
        dtype = self.model.fc.weight.dtype
        features = self.model.input_features(static_features_at(state, columns - 1).to(dtype))
        self._static_cache.columns = columns
        return self.model(features, self._embed(state.tokens.gather(1, columns)), mask, positions, self._static_cache)

    @torch.no_grad()
    def static_prefill(self, state: StaticDraftState, num_tokens: int) -> None:
        """Feed the prompt's columns the first step does not re-feed (it feeds the
        ``num_tokens + 1`` columns up to the pending one; for trees ``num_tokens`` is the
        plan's depth)."""
        from specdecode.models.static_cache import ColumnCache, prefill_inputs

        self._static_cache = state.buffer("eagle_cache", lambda: ColumnCache(state.capacity))
        prepare_static_tree(state, self.tree)
        width = state.prompt_columns - num_tokens
        if width > 0:
            with prefill_inputs(self._static_cache, state.start, width, self.model.fc.weight.dtype) as inputs:
                self._static_window(state, inputs)

    def _static_root(self, state: StaticDraftState, num_tokens: int) -> Tensor:
        """One forward over the ``num_tokens + 1`` columns up to the pending one, fed with true
        target features (it re-feeds the columns the last step fed with predicted ones, now
        committed; any column beyond the pending one is overwritten before it is read); returns
        the predicted feature at the pending column.

        Shape: returns ``[B, hidden]``.
        """
        from specdecode.models.static_cache import column_inputs

        dtype = self.model.fc.weight.dtype
        first = (state.lengths - num_tokens).clamp_min(0)  # a short prompt: the window starts at column 0
        window = self._static_window(state, column_inputs(first, state.start, num_tokens + 1, state.capacity, dtype))
        at_pending = (state.lengths - first)[:, None, None].expand(-1, 1, window.shape[-1])
        return window.gather(1, at_pending)[:, 0]

    @torch.no_grad()
    def static_propose(self, state: StaticDraftState, num_tokens: int) -> tuple[Tensor, Tensor]:
        """The window (:meth:`_static_root`: the accepted drafts re-fed with their true
        features), then ``num_tokens - 1`` one-token forwards on the network's own predicted
        features. Each draft is drawn with ``state.sample`` from the logits returned for it; no
        host read.

        Shape: returns ``[B, num_tokens]`` int64 and ``[B, num_tokens, V]`` float32.
        """
        from specdecode.models.static_cache import column_inputs

        dtype = self.model.fc.weight.dtype
        hidden = self._static_root(state, num_tokens)
        logits = self._logits(state, hidden)
        tokens, used = [state.sample(logits)], [logits]
        if num_tokens > 1:
            # The one-token forwards i = 1 .. k-1 feed columns lengths + i: the rows of one layout.
            columns, positions, mask = column_inputs(state.lengths + 1, state.start, num_tokens - 1, state.capacity,
                                                     dtype)
            for i in range(1, num_tokens):
                j = slice(i - 1, i)
                self._static_cache.columns = columns[:, j]
                hidden = self.model(hidden[:, None], self._embed(tokens[-1][:, None]), mask[:, :, j], positions[:, j],
                                    self._static_cache)[:, 0]
                logits = self._logits(state, hidden)
                tokens.append(state.sample(logits))
                used.append(logits)
        return torch.stack(tokens, 1), torch.stack(used, 1)

    def static_tree_plan(self, sampling: SamplingParams, vocab_size: int) -> StaticTreePlan:
        return plan_static_tree(self.tree, sampling, vocab_size)

    @torch.no_grad()
    def static_propose_tree(self, state: StaticTreeDraftState, plan: StaticTreePlan) -> StaticTreeDraft:
        """The window over the ``D + 1`` columns up to the pending one (``D = plan.max_depth``:
        it re-feeds the longest path the last step can have accepted with true features), then
        one forward per depth over the nodes with children
        (:func:`~specdecode.trees.static_draft.grow_static_tree`): a node at offset ``s`` is fed
        at column ``lengths + s`` with its parent's predicted feature and its own token, at the
        root's position plus its depth, seeing the committed columns and its ancestors'.

        Shape: returns a :class:`~specdecode.trees.static_growth.StaticTreeDraft` of
        ``plan.num_nodes`` nodes.
        """
        root_hidden = self._static_root(state, plan.max_depth)
        B, H = root_hidden.shape
        fed = [root_hidden[:, None]]  # the predicted features of the nodes of the last forward

        def expand(level: StaticLevel) -> Tensor:
            n = level.tokens.shape[1]
            parents = fed[0].gather(1, level.parent_index[:, :, None].expand(B, n, H))
            self._static_cache.columns = level.columns
            fed[0] = self.model(parents, self._embed(level.tokens), level.mask, level.positions, self._static_cache)
            return self._logits(state, fed[0])

        root = state.tokens.gather(1, state.lengths[:, None])[:, 0]
        return grow_static_tree(plan, state, root, self._logits(state, root_hidden), expand,
                                self.model.fc.weight.dtype)

    def static_accept_path(self, state: StaticTreeDraftState, draft: StaticTreeDraft, accepted_nodes: Tensor,
                           accepted_len: Tensor) -> None:
        """Nothing to move: the next window re-feeds every column of the accepted path with its
        true feature (which the engine moved there), replacing what the tree fed."""
        return None
