"""``Gemma4AssistantDrafter``: Gemma 4's assistant model (``Gemma4AssistantForCausalLM``) as a drafter.

The assistant is a small decoder whose layers own no key/value projections: every one of its
attention layers attends to the keys and values of the target's last layer of the same type (one
full-attention and one sliding-window layer of the target; Hugging Face calls them the *shared*
key/value states). Its input at a draft step is one vector: the target's input embedding of the
last token, next to a hidden state of size ``backbone_hidden_size`` (the target's last hidden
state of the token before it at the first step, the assistant's own projected output afterwards);
every step sits at one position, the pending token's. So each draft costs one small forward over
a single query, and the drafts of one step add nothing to any cache.

Decode paths: eager and static (chains and trees; on the static path the keys/values live in
buffers of the layout's capacity, re-projected for the columns the last step can have committed,
with no host read while proposing). Documented in ``docs/gemma4-assistant.md``.

What the drafter reads from the target: the target's hidden states at the inputs of those two
producer layers and its final hidden state, for every committed column
(``feature_layers``; handed over with each commit as to any feature drafter). It projects the
producer layers' keys/values from them with the target's own modules (input norm, key/value
projections and norms, rotary embedding at the column's position), column by column, and keeps
them through rejections, finished rows and re-packs: the same keys/values the target's cache
holds for its committed columns, without reading or changing that cache.

The assistant's masks (Hugging Face's, for a query at the pending position ``P``): the
full-attention layers see every committed real token; the sliding ones the real tokens at
positions ``P - W - 1 .. P - 1`` (``W`` the assistant's ``sliding_window``).

Proposals:

- chain: draft ``j`` is drawn from the assistant's ``q_j`` (after the logits processors; argmax
  at temperature 0), and ``q_j`` is handed over (Hugging Face drafts the argmax even when it
  samples);
- tree (``tree=`` rank paths, :func:`~specdecode.drafters.medusa.check_choices`): the node of
  path ``(r_1, .., r_d)`` holds the rank-``r_d`` token of the assistant's distribution after its
  parent's path; one assistant forward per depth drafts every node of that depth (its queries are
  independent). Siblings are distinct ranks of one distribution: the ``deterministic`` tree rule.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from specdecode.drafters.base import CommitUpdate, DrafterBase, DraftState, Proposal, StaticDraftState
from specdecode.drafters.column_store import ColumnStore
from specdecode.drafters.drafter_cache import cached_prefix
from specdecode.drafters.last_feature import (draw, static_features_at, static_rank_tree, tree_layout,
                                              tree_proposal)
from specdecode.drafters.medusa import check_choices
from specdecode.models import input_device, vocab_rows
from specdecode.models.facts import decoder_layers, decoder_layers_path
from specdecode.sampling import SamplingParams
from specdecode.trees.shapes import TreeShape
from specdecode.trees.static_growth import StaticTreeDraft, StaticTreePlan

__all__ = ["Gemma4AssistantDrafter", "producer_layers"]

#: Deepest rank path accepted (the assistant has no head count to bound it).
MAX_TREE_DEPTH = 32


def producer_layers(target: nn.Module) -> dict[str, int]:
    """Layer type -> index of the target's decoder layer whose keys/values the assistant reads
    (Hugging Face's ``"store"`` layers: the last layer of each type that computes its own).
    ``ValueError`` naming ``target`` for a model that has none (not a Gemma 4 text model)."""
    config = getattr(target, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    modes = getattr(text, "kv_sharing_modes", None) if text is not None else None
    types = getattr(text, "layer_types", None) if text is not None else None
    if not isinstance(modes, (list, tuple)) or not isinstance(types, (list, tuple)):
        name = type(target).__name__
        raise ValueError(f"target: expected a Gemma 4 model (its layers share key/value states with the assistant), "
                         f"got {name}")
    producers = {str(types[i]): i for i, mode in enumerate(modes) if mode == "store"}
    if not producers:
        raise ValueError(f"target: this {type(target).__name__} computes no key/value states of its own (an "
                         f"assistant itself?); pass the Gemma 4 model the assistant drafts for")
    return producers


def _is_assistant(model: object) -> bool:
    """Whether ``model`` is a ``transformers`` ``Gemma4AssistantForCausalLM``."""
    try:
        from transformers import Gemma4AssistantForCausalLM
    except ImportError:  # a transformers without Gemma 4's assistant: nothing can be one
        return False
    return isinstance(model, Gemma4AssistantForCausalLM)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary embedding of ``x`` ``[b, n, h, d]`` with ``cos`` / ``sin`` ``[b, n, d]`` (halves rotated)."""
    half = x.shape[-1] // 2
    turned = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos[:, :, None] + turned * sin[:, :, None]


def _levels(layout: tuple[Tensor, Tensor, Tensor, int]) -> list[tuple[list[int], list[tuple[int, int]]]]:
    """Per depth of a rank-path tree (nodes in a topological order, depth by depth, as
    :func:`~specdecode.drafters.medusa.check_choices` sorts them): the parent nodes drafted from,
    and per child node in order its parent's slot among them and its rank."""
    depths, ranks, parents, _ = layout
    levels = []
    for d in range(int(depths.max()) + 1):
        nodes = [j + 1 for j in range(len(ranks)) if int(depths[j]) == d]
        sources = list(dict.fromkeys(int(parents[j]) for j in nodes))
        levels.append((sources, [(sources.index(int(parents[j])), int(ranks[j - 1])) for j in nodes]))
    return levels


class Gemma4AssistantDrafter(DrafterBase):
    """Drafts for a Gemma 4 ``target`` with its assistant, ``assistant_model`` (a
    ``transformers`` ``Gemma4AssistantForCausalLM``), reading the target's features as
    :class:`~specdecode.drafters.EagleDrafter` does.

    ``tree``: None for chains (any length), or rank paths (Medusa's format:
    ``product_tree([3, 2])``, ``[(0,), (1,), (0, 0)]``) for a deterministic top-k tree. Any batch
    size, left padding; the eager and static decode paths (chains and trees).

    Example:
        >>> from transformers import Gemma4AssistantForCausalLM, Gemma4ForCausalLM       # doctest: +SKIP
        >>> target = Gemma4ForCausalLM.from_pretrained("google/gemma-4-e2b-it")          # doctest: +SKIP
        >>> assistant = Gemma4AssistantForCausalLM.from_pretrained("google/gemma-4-e2b-it-assistant")  # doctest: +SKIP
        >>> drafter = Gemma4AssistantDrafter(assistant, target)                          # doctest: +SKIP
        >>> out = specdecode.generate(target, drafter, ids, max_new_tokens=64)           # doctest: +SKIP
    """

    name = "gemma4_assistant"

    def __init__(self, assistant_model: nn.Module, target: nn.Module,
                 tree: Sequence[Sequence[int]] | None = None) -> None:
        if not isinstance(target, nn.Module):
            raise TypeError(f"target: expected the target model (a torch.nn.Module), got {type(target).__name__}")
        if not _is_assistant(assistant_model):
            raise TypeError(f"assistant_model: expected a Gemma4AssistantForCausalLM, got "
                            f"{type(assistant_model).__name__}")
        self.producers = producer_layers(target)
        self._check_pair(assistant_model, target)
        self.assistant_model = assistant_model
        self.target = target
        self.types = tuple(self.producers)
        self.feature_layers = (*(self.producers[t] for t in self.types), -1)
        self.device = input_device(target)
        self.hidden_size = int(target.get_input_embeddings().weight.shape[1])
        self.choices = None if tree is None else check_choices(tree, MAX_TREE_DEPTH)
        self._layout = None if self.choices is None else tree_layout(self.choices)
        self._levels = [] if self._layout is None else _levels(self._layout)
        assistant_tokens = getattr(getattr(assistant_model, "generation_config", None), "num_assistant_tokens", None)
        if isinstance(assistant_tokens, int) and not isinstance(assistant_tokens, bool) and assistant_tokens > 0:
            self.default_num_draft_tokens = assistant_tokens
        self.reset()

    def _check_pair(self, assistant: nn.Module, target: nn.Module) -> None:
        """``ValueError`` naming ``assistant_model`` when it was not built for ``target``."""
        text = assistant.config.get_text_config()
        hidden = int(target.get_input_embeddings().weight.shape[1])
        if int(assistant.config.backbone_hidden_size) != hidden:
            raise ValueError(f"assistant_model: built for a target of hidden size {assistant.config.backbone_hidden_size}"
                             f", not for this {type(target).__name__} of hidden size {hidden}")
        if int(text.vocab_size) != vocab_rows(target):
            raise ValueError(f"assistant_model: drafts over {text.vocab_size} ids, the target has {vocab_rows(target)}")
        layers = decoder_layers(target)
        for kind in dict.fromkeys(text.layer_types):
            if kind not in self.producers:
                raise ValueError(f"assistant_model: its {kind} layers read the target's {kind} keys/values, which "
                                 f"this {type(target).__name__} does not have")
            attention = layers[self.producers[kind]].self_attn
            mine = next(layer.self_attn for layer, t in zip(assistant.model.layers, text.layer_types) if t == kind)
            heads = attention.k_proj.out_features // attention.head_dim
            if mine.head_dim != attention.head_dim or text.num_attention_heads % heads:
                raise ValueError(f"assistant_model: its {kind} layers attend with head size {mine.head_dim}, the "
                                 f"target's keys/values have {heads} heads of size {attention.head_dim}")

    def reset(self) -> None:
        self.features = ColumnStore()  # [b, columns, F]: the target's features of committed columns
        # per layer type, the producer layer's keys / values [b, kv_heads, columns, head_dim]
        self.context = {kind: (ColumnStore(2), ColumnStore(2)) for kind in self.types}
        self.projected = 0  # columns [0, projected) have their keys/values in self.context

    def describe(self) -> dict:
        return {"drafter": self.name, "producer_layers": dict(self.producers),
                "draft_params": sum(p.numel() for p in self.assistant_model.parameters()),
                "tree_nodes": None if self.choices is None else len(self.choices) + 1}

    def with_tree(self, tree: Sequence[Sequence[int]] | None, num_nodes: int = 16, tree_depth: int | None = None,
                  tree_children: str | None = None) -> Gemma4AssistantDrafter:
        """A drafter on the same models drafting the rank-path tree ``tree`` (None: chains);
        ``generate``'s ``tree=`` lands here. This drafter is not modified."""
        if tree_children not in (None, "deterministic"):
            raise ValueError(f"tree_children: the assistant's tree children are distinct ranks of one distribution "
                             f"('deterministic'), got {tree_children!r}")
        if isinstance(tree, str):
            raise ValueError(f"tree: a Gemma4AssistantDrafter drafts rank paths such as product_tree([3, 2]), got "
                             f"{tree!r}")
        clone = Gemma4AssistantDrafter(self.assistant_model, self.target, tree=tree)
        clone.default_num_draft_tokens = self.default_num_draft_tokens
        return clone

    # ------------------------------------------------------------------ the target's keys/values
    def _keys_values(self, kind: str, hidden: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """The producer layer of ``kind``'s keys and values from its input ``hidden`` ``[b, n, H]``
        at ``positions`` ``[b, n]``, with the target's own modules. Returns ``[b, h, n, d]`` each."""
        layer = decoder_layers(self.target)[self.producers[kind]]
        attention = layer.self_attn
        x = layer.input_layernorm(hidden)
        shape = (*x.shape[:-1], -1, attention.head_dim)
        raw_keys = attention.k_proj(x).view(shape)
        raw_values = attention.v_proj(x).view(shape) if attention.v_proj is not None else raw_keys
        cos, sin = self._rotary()(x, positions, kind)
        keys = _rotate(attention.k_norm(raw_keys), cos, sin)
        values = attention.v_norm(raw_values)
        return keys.transpose(1, 2), values.transpose(1, 2)

    def _rotary(self) -> nn.Module:
        module = self.target
        for name in decoder_layers_path(self.target).split(".")[:-1]:
            module = getattr(module, name)
        return module.rotary_emb

    def _project(self, state: DraftState, pending: int) -> None:
        """Keys/values of the columns ``[projected, pending)`` from their stored features."""
        if pending <= self.projected:
            return
        feats = self.features.data
        if feats is None or feats.shape[1] < pending:
            raise RuntimeError("Gemma4AssistantDrafter: no target features for the committed columns (the engine "
                               "hands them over with every commit to a drafter with feature_layers)")
        positions = state.positions[:, self.projected: pending].to(self.device)
        H = self.hidden_size
        for i, kind in enumerate(self.types):
            keys, values = self._keys_values(kind, feats[:, self.projected: pending, i * H: (i + 1) * H], positions)
            self.context[kind][0].write(self.projected, keys)
            self.context[kind][1].write(self.projected, values)
        self.projected = pending

    def commit(self, update: CommitUpdate) -> None:
        if update.features is not None and update.features.shape[1] > 0:
            m = update.features.shape[1]
            start = update.num_columns - 1 - m
            self.features.write(start, update.features.to(self.device))
            self.projected = min(self.projected, start)
        self.projected = min(self.projected, update.num_columns - 1)
        stores = [self.features, *(store for pair in self.context.values() for store in pair)]
        if update.kept_rows is not None:
            for store in stores:
                store.rows(update.kept_rows)
        if update.column_order is not None:
            order = update.column_order
            for store in stores:
                store.reorder(order)
            self.projected = cached_prefix(order.to(self.device), self.projected)  # what moved from projected columns

    # ------------------------------------------------------------------ the assistant
    def _masks(self, real: Tensor, key_positions: Tensor, position: Tensor) -> dict[str, Tensor]:
        """Additive masks ``[b, 1, 1, T]`` per layer type for a query at ``position`` ``[b]``:
        the keys that are ``real`` ``[b, T]`` bool, in the sliding layers also no more than
        ``W + 1`` positions back (``key_positions`` ``[b, T]``)."""
        dtype = self.assistant_model.dtype
        low = torch.finfo(dtype).min
        window = int(self.assistant_model.config.get_text_config().sliding_window)
        masks = {}
        for kind in self.types:
            keep = real
            if kind == "sliding_attention":
                keep = keep & (key_positions >= position[:, None] - window - 1)
            masks[kind] = torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill_(~keep, low)[:, None, None]
        return masks

    def _head(self, hidden: Tensor) -> Tensor:
        """The assistant's logits from its last hidden state ``[b, n, h]``: its LM head, or (ordered
        embeddings) the head's rows of the top centroids' tokens, every other token at the row's
        lowest such logit minus one. Shape: returns ``[b, n, V]``."""
        model = self.assistant_model
        weight = model.lm_head.weight
        embedder = model.masked_embedding
        if embedder is None:
            return model.lm_head(hidden)
        b, n, _ = hidden.shape
        per_cluster = embedder.vocab_size // embedder.num_centroids
        top = embedder.centroids(hidden).topk(embedder.centroid_intermediate_top_k, dim=-1).indices
        ids = embedder.token_ordering.long().view(embedder.num_centroids, per_cluster)[top].reshape(b, n, -1)
        chosen = (weight[ids] @ hidden[..., None])[..., 0]  # [b, n, top_k * per_cluster]
        floor = chosen.flatten(1).min(1).values[:, None, None] - 1.0
        logits = floor.expand(b, n, embedder.vocab_size).clone()
        return logits.scatter_(2, ids, chosen)

    def _assist(self, tokens: Tensor, hidden: Tensor, position: Tensor, context: dict[str, tuple[Tensor, Tensor]],
                masks: dict[str, Tensor], vocab_size: int) -> tuple[Tensor, Tensor]:
        """One assistant forward over independent queries at one position per row (``masks``
        from :meth:`_masks`).

        Shape:
            tokens: ``[b, n]`` int64; hidden: ``[b, n, H]`` (the target's width); position: ``[b]``.
            Returns float32 logits ``[b, n, vocab_size]`` and the projected hidden ``[b, n, H]``.
        """
        model = self.assistant_model
        embeds = self.target.get_input_embeddings()(tokens)
        x = model.pre_projection(torch.cat([embeds, hidden.to(embeds.dtype)], -1).to(model.dtype))
        n = tokens.shape[1]
        positions = position[:, None].expand(-1, n)
        # every query is kept; said as indices, since an int asks the model to slice its inputs
        # (which it cannot do without per-layer inputs, which the assistant has none of)
        keep = torch.arange(n, device=x.device)
        masks = {kind: mask.expand(-1, -1, n, -1) for kind, mask in masks.items()}
        out = model.model(inputs_embeds=x, attention_mask=masks, position_ids=positions, shared_kv_states=context,
                          use_cache=False, logits_to_keep=keep).last_hidden_state
        logits = self._head(out)[..., :vocab_size].to(dtype=torch.float32, device=tokens.device)
        return logits, model.post_projection(out)

    def _start(self, state: DraftState, pending: int) -> tuple[Tensor, dict, Tensor, dict]:
        """Each row's last committed feature ``[b, H]`` (zeros for a row without a committed
        token), the keys/values, each row's pending position ``[b]`` and the masks."""
        self._project(state, pending)
        real = state.attention_mask[:, :pending].to(self.device).bool()
        columns = torch.arange(pending, device=self.device)
        last = torch.where(real, columns, -1).max(1).values
        feats = self.features.columns(pending)[:, :, -self.hidden_size:]
        found = feats[torch.arange(feats.shape[0], device=self.device), last.clamp_min(0)]
        feature = torch.where((last >= 0)[:, None], found, torch.zeros_like(found))
        context = {kind: (keys.columns(pending), values.columns(pending)) for kind, (keys, values) in
                   self.context.items()}
        position = state.positions[:, pending].to(self.device)
        masks = self._masks(real, state.positions[:, :pending].to(self.device), position)
        return feature, context, position, masks

    @torch.no_grad()
    def propose(self, state: DraftState, num_tokens: int) -> Proposal:
        pending = state.num_columns - 1
        if pending == 0 or (num_tokens <= 0 and self._layout is None):
            return Proposal(state.tokens[:, :0].to(state.device))  # nothing committed yet: nothing to attend to
        feature, context, position, masks = self._start(state, pending)
        token = state.tokens[:, pending].to(self.device)
        if self._layout is not None:
            width = self._layout[3]
            if width > state.vocab_size:
                raise ValueError(f"tree: a path asks for the rank-{width - 1} token of a draft position, but the "
                                 f"vocabulary has {state.vocab_size} ids")
            tokens = self._tree_tokens(token, feature, position, context, masks, state.vocab_size)
            return tree_proposal(tokens.to(state.device), self._layout[2], forward_calls=len(self._levels))
        tokens: list[Tensor] = []
        used: list[Tensor] = []
        hidden = feature[:, None]
        for _ in range(num_tokens):
            logits, hidden = self._assist(token[:, None], hidden, position, context, masks, state.vocab_size)
            token, q = draw(state, logits[:, 0].to(state.device), tokens)
            tokens.append(token)
            used.append(q)
            token = token.to(self.device)
        return Proposal(torch.stack(tokens, 1), torch.stack(used, 1), forward_calls=len(tokens))

    def _tree_tokens(self, root: Tensor, feature: Tensor, position: Tensor, context: dict, masks: dict,
                     vocab_size: int) -> Tensor:
        """The rank-path tree's tokens ``[b, N]`` (``root`` ``[b]`` first), one assistant forward
        per depth over the nodes of the depth above that have children."""
        width = self._layout[3]
        node_tokens: list[Tensor] = [root]
        node_hidden: list[Tensor] = [feature]
        for sources, children in self._levels:
            logits, hidden = self._assist(torch.stack([node_tokens[s] for s in sources], 1),
                                          torch.stack([node_hidden[s] for s in sources], 1), position, context,
                                          masks, vocab_size)
            top = logits.topk(width, dim=-1).indices  # [b, sources, width]: distinct ids per parent
            for slot, rank in children:
                node_tokens.append(top[:, slot, rank])
                node_hidden.append(hidden[:, slot])
        return torch.stack(node_tokens, 1)

    # ------------------------------------------------------------------ static decode path
    def static_key(self) -> tuple:
        return ("gemma4_assistant", weakref.ref(self.assistant_model), weakref.ref(self.target),
                None if self.choices is None else tuple(self.choices))

    def _static_context(self, state: StaticDraftState) -> dict[str, tuple[Tensor, Tensor]]:
        """Per layer type, the producer layer's keys / values for every column of the layout
        ``[B, kv_heads, capacity, head_dim]`` (persistent buffers)."""
        def make() -> dict[str, tuple[Tensor, Tensor]]:
            buffers = {}
            for kind in self.types:
                attention = decoder_layers(self.target)[self.producers[kind]].self_attn
                shape = (state.batch_size, attention.k_proj.out_features // attention.head_dim, state.capacity,
                         attention.head_dim)
                dtype = attention.k_proj.weight.dtype
                buffers[kind] = (torch.zeros(shape, dtype=dtype, device=state.device),
                                 torch.zeros(shape, dtype=dtype, device=state.device))
            return buffers

        return state.buffer("gemma4_assistant_context", make)

    def _static_project(self, state: StaticDraftState, columns: Tensor) -> None:
        """Project the target features at ``columns`` ``[B, n]`` into the keys/values buffers."""
        feats = static_features_at(state, columns)
        positions = (columns - state.start[:, None]).clamp_min(0)
        index = columns.clamp(0, state.capacity - 1)
        H = self.hidden_size
        for i, kind in enumerate(self.types):
            keys, values = self._static_context(state)[kind]
            k, v = self._keys_values(kind, feats[..., i * H: (i + 1) * H], positions)
            where = index[:, None, :, None].expand(-1, keys.shape[1], -1, keys.shape[3])
            keys.scatter_(2, where, k.to(keys.dtype))
            values.scatter_(2, where, v.to(values.dtype))

    @torch.no_grad()
    def static_prefill(self, state: StaticDraftState, num_tokens: int) -> None:
        """Project the prompt's columns."""
        width = state.prompt_columns
        if width > 0:
            self._static_project(state, torch.arange(width, device=state.device)[None].expand(state.batch_size, -1))

    def _static_start(self, state: StaticDraftState, window: int) -> tuple[Tensor, Tensor, Tensor, dict, dict]:
        """Re-project the ``window`` columns before the pending one (all a step can commit); each
        row's pending token ``[B]``, last committed feature ``[B, H]``, pending position ``[B]``,
        the keys/values and the masks over every column."""
        first = (state.lengths - window).clamp_min(0)
        self._static_project(state, first[:, None] + torch.arange(window, device=state.device))
        feature = static_features_at(state, (state.lengths - 1)[:, None])[:, 0, -self.hidden_size:]
        columns = torch.arange(state.capacity, device=state.device)[None]
        real = (columns >= state.start[:, None]) & (columns < state.lengths[:, None])
        position = state.lengths - state.start
        masks = self._masks(real, columns - state.start[:, None], position)
        root = state.tokens.gather(1, state.lengths[:, None])[:, 0]
        return root, feature, position, self._static_context(state), masks

    @torch.no_grad()
    def static_propose(self, state: StaticDraftState, num_tokens: int) -> tuple[Tensor, Tensor]:
        """Draft ``j`` drawn with ``state.sample`` from the assistant's ``q_j``; no host read.

        Shape: returns ``[B, num_tokens]`` int64 and ``[B, num_tokens, V]`` float32.
        """
        token, feature, position, context, masks = self._static_start(state, num_tokens + 1)
        hidden = feature[:, None]
        tokens, used = [], []
        for _ in range(num_tokens):
            logits, hidden = self._assist(token[:, None], hidden, position, context, masks, state.vocab_size)
            token = state.sample(logits[:, 0])
            tokens.append(token)
            used.append(logits[:, 0])
        return torch.stack(tokens, 1), torch.stack(used, 1)

    def static_tree_plan(self, sampling: SamplingParams, vocab_size: int) -> StaticTreePlan:
        """The tree of the rank paths, the same at every step (``deterministic``); ``ValueError``
        naming ``tree`` for a chain drafter or a rank past the vocabulary."""
        if self._layout is None:
            raise ValueError("tree: this Gemma4AssistantDrafter drafts chains (tree=None); pass rank paths as tree=")
        _, ranks, parents, width = self._layout
        if width > vocab_size:
            raise ValueError(f"tree: a path asks for the rank-{width - 1} token of a draft position, but the "
                             f"vocabulary has {vocab_size} ids")
        shape = TreeShape(tuple(parents.tolist()), child_rank=(-1, *ranks.tolist()))
        return StaticTreePlan("shape", shape.num_nodes, shape.max_depth, "deterministic", shape=shape)

    @torch.no_grad()
    def static_propose_tree(self, state: StaticDraftState, plan: StaticTreePlan) -> StaticTreeDraft:
        """The rank-path tree, one assistant forward per depth; no host read."""
        root, feature, position, context, masks = self._static_start(state, plan.max_depth + 1)
        return static_rank_tree(state, plan, self._tree_tokens(root, feature, position, context, masks,
                                                               state.vocab_size))

    def static_accept_path(self, state: StaticDraftState, draft: StaticTreeDraft, accepted_nodes: Tensor,
                           accepted_len: Tensor) -> None:
        """Nothing to move: the next window re-projects the accepted path's columns from the
        features the engine moved there."""
        return None
