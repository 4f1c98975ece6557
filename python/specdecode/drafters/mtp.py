"""``MTPDrafter``: the multi-token-prediction (MTP) layers a model ships with, as a drafter.

Some models are trained with extra layers that predict tokens further ahead than the next one
(DeepSeek-V3, GLM-4-MoE and others; ``num_mtp_layers`` in the text config). Transformers builds
them as an :class:`transformers.modeling_layers.MtpModel` next to the main model (it shares the
main model's embedding, LM head and rotary embedding) and loads their weights from the main
model's checkpoint (``MtpModel.from_pretrained(model)``, what ``model.generate(..., use_mtp=True)``
runs).

MTP layer ``k`` (``k = 0, 1, ...``) reads, at each position ``t``, a hidden state and the
embedding of the token ``k + 1`` places ahead: ``eh_proj([enorm(e(x_{t+k+1})), hnorm(h)])``
goes through one decoder layer of the model's architecture (and a norm); the shared head turns
the result into the distribution of ``x_{t+k+2}``. Layer 0 reads the target's last hidden state
``h(t)``; layer ``k > 0`` reads layer ``k - 1``'s output at the same ``t``. Each layer attends
over its own keys and values, one entry per position, at position id ``pos(x_{t+1}) + k``.

Drafting one step: the target's last hidden states of the committed columns arrive with each
commit (:attr:`~specdecode.drafters.base.CommitUpdate.features`) and are kept, with the layers'
KV cache, in a :class:`~specdecode.drafters.drafter_cache.DrafterCache` (``memory``), which each
commit moves. ``propose`` feeds every layer the same window of columns (those its cache lacks,
the pending token last): layer 0 pairs each column's token with the target feature of the row's
previous real column (the first real column of a row has none; it is hidden from every other
query, as Hugging Face keeps no entry for the first token), layer ``k`` pairs layer ``k - 1``'s
output with the token ``k`` real columns further on (past the pending column: the drafts).
Draft ``k + 1`` comes from layer ``k``'s output at the pending column, so a chain has at most
``num_mtp_layers`` drafts (what transformers drafts too: one per layer). An entry whose tokens
reach past the pending column was computed from drafts and is dropped after the proposal; the
next step feeds it again.

Trees (``tree=``, rank paths as Medusa's): the node of path ``(r_1, .., r_d)`` is the
rank-``r_d`` token of layer ``d - 1`` after the path's first ``d - 1`` tokens, exactly what a chain
of those tokens reads (:meth:`MTPDrafter._tree`); verified with the ``deterministic`` rule.

The static decode path (chains and trees, :mod:`specdecode.drafters.mtp_static`) reads the
features from the engine's device buffer and keeps the layers' cache on the engine's columns.

Not supported (a ``ValueError`` naming ``mtp_model``): MTP layers with sliding-window or linear
attention, and attention implementations other than ``"sdpa"`` / ``"eager"``.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from specdecode.drafters.base import CommitUpdate, DrafterBase, DraftState, Proposal, StaticDraftState
from specdecode.drafters.drafter_cache import DrafterCache
from specdecode.drafters.last_feature import draw, tree_layout, tree_proposal
from specdecode.drafters.medusa import check_choices
from specdecode.models import kv_cache, vocab_rows

__all__ = ["MTPDrafter", "mtp_layer_count"]

_ATTENTION = ("sdpa", "eager")


def mtp_layer_count(target: nn.Module) -> int:
    """``num_mtp_layers`` of ``target``'s text config; ``ValueError`` naming ``target`` when it
    has none (a model without MTP layers) or it is not an int >= 1."""
    config = getattr(target, "config", None)
    if not isinstance(target, nn.Module) or config is None:
        raise TypeError(f"target: expected a Hugging Face model (a torch.nn.Module with a config), got "
                        f"{type(target).__name__}")
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    count = getattr(text, "num_mtp_layers", None)
    if count is None:
        raise ValueError(f"target: {type(target).__name__}'s config has no num_mtp_layers: the model ships no "
                         f"multi-token-prediction layers")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"target: num_mtp_layers must be an int >= 1, got {count!r}")
    return count


class MTPDrafter(DrafterBase):
    """Drafts for ``target`` with its multi-token-prediction layers, ``mtp_model`` (Hugging
    Face's :class:`~transformers.modeling_layers.MtpModel` for ``target``: it shares the target's
    embedding and head). Usually built with :meth:`from_target`, which loads the layers from the
    target's checkpoint as ``target.generate(..., use_mtp=True)`` does.

    A chain of ``k`` drafts uses the first ``k`` layers in turn (draft ``i`` from layer
    ``i - 1``; on the eager path every layer still feeds the window, so that the layers' caches
    stay in step); asked for more drafts than there are layers, it proposes one per layer (as
    transformers does; :attr:`default_num_draft_tokens` is the number of layers; the static
    path, which drafts exactly ``num_draft_tokens``, refuses). Drafts are drawn by
    :func:`specdecode.sampling.sample_logits` from the layer's logits after the generation's
    logits processors (argmax at temperature 0), and those logits are returned as ``q``.
    ``tree``: None for chains, or rank paths (:func:`~specdecode.drafters.medusa.check_choices`,
    at most ``num_mtp_layers`` deep; e.g. ``product_tree([3, 2])``) for a tree whose children
    are the layers' top ranks on their logits before the processors (the ``deterministic``
    rule: lossless whatever the ranks are taken on). Any batch size, left padding,
    finished rows and re-packs; the eager, static and compiled decode paths.

    Example:
        >>> target = AutoModelForCausalLM.from_pretrained(path)              # doctest: +SKIP
        >>> drafter = specdecode.drafters.MTPDrafter.from_target(target)     # doctest: +SKIP
        >>> out = specdecode.generate(target, drafter, ids, max_new_tokens=32)  # doctest: +SKIP
    """

    name = "mtp"
    feature_layers: tuple[int, ...] = (-1,)  # the target's last hidden state, as transformers reads it

    def __init__(self, target: nn.Module, mtp_model: nn.Module, tree: Sequence[Sequence[int]] | None = None
                 ) -> None:
        count = mtp_layer_count(target)
        layers = getattr(mtp_model, "layers", None)
        if not isinstance(mtp_model, nn.Module) or not isinstance(layers, nn.ModuleList) or not hasattr(
                mtp_model, "shared_head") or not hasattr(mtp_model, "embed_tokens"):
            raise TypeError(f"mtp_model: expected transformers' MtpModel built for the target, got "
                            f"{type(mtp_model).__name__}")
        if len(layers) == 0 or len(layers) > count:
            raise ValueError(f"mtp_model: has {len(layers)} layers; the target's config names {count}")
        hidden = int(target.get_input_embeddings().weight.shape[1])
        if int(mtp_model.embed_tokens.weight.shape[1]) != hidden or vocab_rows(target) != int(
                mtp_model.shared_head.weight.shape[0]):
            raise ValueError(f"mtp_model: built for another model than this {type(target).__name__} (its embedding "
                             f"or head does not match the target's)")
        config = mtp_model.config
        kinds = set(getattr(config, "layer_types", None) or ["full_attention"])
        if kinds != {"full_attention"}:
            raise ValueError(f"mtp_model: MTPDrafter drafts with full-attention MTP layers only, got layer types "
                             f"{sorted(kinds)}")
        attention = getattr(config, "_attn_implementation", None) or "eager"
        if attention not in _ATTENTION:
            raise ValueError(f"mtp_model: attention implementation {attention!r} is not supported (use one of "
                             f"{_ATTENTION}, e.g. attn_implementation='sdpa' when loading the target)")
        self.target = target
        self.mtp_model = mtp_model
        self.model = mtp_model  # where the engine looks for a drafter's network (device checks)
        self.num_layers = len(layers)
        self.choices = None if tree is None else check_choices(tree, self.num_layers)
        self._layout = None if self.choices is None else tree_layout(self.choices)
        if self._layout is not None:
            parents = self._layout[2].tolist()
            family = torch.eye(len(parents) - 1, dtype=torch.bool)  # ancestor-or-self, non-root nodes
            for node in range(1, len(parents)):
                up = parents[node]
                while up > 0:
                    family[node - 1, up - 1] = True
                    up = parents[up]
            self._ancestry = family
            depth = self._layout[0]  # per non-root node: its depth - 1
            # per layer j >= 1 of a tree step: the nodes it feeds (depth <= j), those it drafts (depth j + 1)
            self._levels = [((depth < j).nonzero()[:, 0], (depth == j).nonzero()[:, 0])
                            for j in range(1, int(depth.max()) + 1)]
        self.default_num_draft_tokens = self.num_layers
        self.device = next(layers.parameters()).device  # (transformers puts them by the target's last layer)
        self.reset()

    @classmethod
    def from_target(cls, target: nn.Module, tree: Sequence[Sequence[int]] | None = None, **kwargs: Any
                    ) -> MTPDrafter:
        """The drafter of ``target``'s own MTP layers, loaded from its checkpoint
        (``target.config.name_or_path``) by ``MtpModel.from_pretrained(target, **kwargs)``, as
        ``target.generate(..., use_mtp=True)`` loads them; by default on the device of the
        target's last decoder layer. ``ValueError`` naming ``target`` for a model without MTP
        layers or whose config has no ``dtype`` (a model built from a config rather than loaded:
        set ``target.config.dtype`` first)."""
        from transformers.modeling_layers import MtpModel

        mtp_layer_count(target)
        if getattr(target.config, "dtype", None) is None:
            raise ValueError("target: its config has no dtype (a model built from a config, not loaded); set "
                             "target.config.dtype before loading its MTP layers")
        if "device_map" not in kwargs:
            decoder = target.get_decoder() if hasattr(target, "get_decoder") else target
            last = decoder.layers[-1] if hasattr(decoder, "layers") else decoder
            kwargs["device_map"] = {"": next(last.parameters()).device}
        return cls(target, MtpModel.from_pretrained(target, **kwargs).eval(), tree=tree)

    def reset(self) -> None:
        # one cache layer per MTP layer, one column per engine column; the target's last hidden state per column
        self.memory = DrafterCache(self.device)

    def describe(self) -> dict:
        n = sum(p.numel() for layer in self.mtp_model.layers for p in layer.parameters())
        return {"drafter": self.name, "mtp_layers": self.num_layers, "draft_params": n,
                "tree_nodes": None if self.choices is None else len(self.choices) + 1}

    # ------------------------------------------------------------------ the layers
    def _dtype(self) -> torch.dtype:
        return self.mtp_model.layers[0].eh_proj.weight.dtype

    def _run_layer(self, k: int, tokens: Tensor, hidden: Tensor, positions: Tensor, mask: Tensor, cache: Any
                   ) -> Tensor:
        """MTP layer ``k`` over one window, writing its keys / values into ``cache``.

        Shape: tokens, positions ``[b, n]``; hidden ``[b, n, H]``; mask ``[b, 1, n, keys]``
        additive; returns ``[b, n, H]``."""
        model = self.mtp_model
        embeds = model.embed_tokens(tokens.to(model.embed_tokens.weight.device)).to(hidden.device, hidden.dtype)
        rotary = getattr(model, "rotary_emb", None)
        position_embeddings = None
        if rotary is not None:
            extra = {"layer_type": model.config.layer_types[k]} if getattr(model, "has_per_layer_rope", False) else {}
            position_embeddings = rotary(embeds, position_ids=positions, **extra)
        out = model.layers[k](embeds, hidden, position_embeddings=position_embeddings, attention_mask=mask,
                              position_ids=positions, cache=cache)
        if getattr(model, "use_shared_post_norm", False):
            out = model.shared_post_norm(out)
        return out

    def _logits(self, state: DraftState, hidden: Tensor) -> Tensor:
        """The shared head's logits over the first ``vocab_size`` ids, float32.

        Shape: hidden ``[b, H]``; returns ``[b, V]``."""
        logits = self.mtp_model._project_to_logits(hidden)
        return logits[..., : state.vocab_size].to(device=state.device, dtype=torch.float32)

    # ------------------------------------------------------------------ drafting
    @torch.no_grad()
    def propose(self, state: DraftState, num_tokens: int) -> Proposal:
        k = min(num_tokens, self.num_layers)
        if self._layout is None and k <= 0:
            return Proposal(state.tokens[:, :0].to(state.device), None)
        clock = state.clock() if self.memory.cached_columns == 0 else None
        self.memory.open()
        draws = 0 if self._layout is not None else k
        tokens, q, outs, window = self._window(state, draws)
        proposal = self._tree(state, outs, window) if self._layout is not None else Proposal(
            torch.stack(tokens, 1), torch.stack(q, 1), forward_calls=self.num_layers)
        self.memory.keep(window["keep"])  # the window's prefix whose every layer read committed tokens only
        proposal.prefill_seconds = state.clock() - clock if clock is not None else 0.0
        return proposal

    def _window(self, state: DraftState, draws: int) -> tuple[list[Tensor], list[Tensor], list[Tensor], dict]:
        """Feed every layer the columns its cache lacks, the pending one last; layer ``j < draws``
        draws draft ``j + 1`` at the pending column (``q``: its logits after the processors).
        Returns the drafts ``[b]``, their ``q`` ``[b, V]``, each layer's outputs ``[b, n, H]``
        and what the window was (``lo``, ``pending``, ``real`` ``[b, pending + 1]``, ``keep``:
        the columns whose every layer read committed tokens only)."""
        pending = state.num_columns - 1
        lo, L, dev, b = self.memory.cached_columns, self.num_layers, self.device, state.batch_size
        n = pending + 1 - lo
        real = state.attention_mask[:, : pending + 1].to(dev).bool()
        cols = torch.arange(pending + 1 + L, device=dev)
        # past the pending column: the drafts (the pending token repeated where none is drawn: those
        # entries reach past the pending column and are dropped)
        ext_real = torch.cat([real, real.new_ones((b, L))], 1)
        ext = torch.cat([state.tokens[:, : pending + 1].to(dev),
                         state.tokens[:, pending: pending + 1].to(dev).expand(-1, L)], 1).clone()
        # next real column after each column (beyond the end: the last column)
        index = torch.where(ext_real, cols, torch.full_like(cols, cols.numel() - 1))
        following = torch.flip(torch.cummin(torch.flip(index, [1]), 1).values, [1])
        after = torch.cat([following[:, 1:], following[:, -1:]], 1)
        first = torch.cummax(real.long(), 1).values.cumsum(1) == 1  # each row's first real column
        keys = torch.arange(pending + 1, device=dev)[None, None, :]
        query = (lo + torch.arange(n, device=dev))[None, :, None]
        allowed = ((real & ~first)[:, None, :] & (keys <= query)) | (keys == query)  # every query sees itself
        dtype = self._dtype()
        mask = torch.zeros(allowed.shape, dtype=dtype, device=dev).masked_fill(~allowed, torch.finfo(dtype).min)
        positions = state.positions[:, lo: pending + 1].to(dev)
        window = cols[lo: pending + 1][None].expand(b, -1)
        column = window  # layer j reads the token j real columns on
        hidden = self.memory.previous_features(real, lo, pending + 1, self.mtp_model.embed_tokens.weight.shape[1],
                                               dtype)
        tokens: list[Tensor] = []
        q: list[Tensor] = []
        outs: list[Tensor] = []
        for j in range(L):
            hidden = self._run_layer(j, ext.gather(1, column), hidden, positions + j, mask[:, None],
                                     self.memory.cache)
            outs.append(hidden)
            if j < draws:
                token, logits = draw(state, self._logits(state, hidden[:, -1]), tokens)
                tokens.append(token)
                q.append(logits)
                ext[:, pending + 1 + j] = token.to(dev)
            column = after.gather(1, column)
        keep = lo + int((after_k(after, window, L - 1) <= pending).sum(1).min())
        return tokens, q, outs, {"lo": lo, "pending": pending, "real": real, "keep": keep}

    def _tree(self, state: DraftState, outs: list[Tensor], window: dict) -> Proposal:
        """The rank-path tree: the children of a node at depth ``i`` are the top ranks of layer
        ``i``'s logits for the node's path, exactly what a chain of those tokens would read.

        Layer ``j``'s entries at the last ``j`` real columns read draft tokens: along a path, the
        entry ``j - i`` real columns before the pending one reads the path's depth-``i`` node. So
        for nodes of depth ``1 .. j`` (one forward of layer ``j``) a node is fed with its parent's
        layer ``j - 1`` output (a depth-1 node: layer ``j - 1``'s window output at the real column
        ``j - 1`` before the pending one) at the pending position plus its depth, and sees the
        window's entries that read committed tokens only, its ancestors and itself."""
        depth_of, ranks, parents, width = self._layout
        if width > state.vocab_size:
            raise ValueError(f"tree: a path asks for the rank-{width - 1} token, but the vocabulary has "
                             f"{state.vocab_size} ids")
        lo, pending, real = window["lo"], window["pending"], window["real"]
        dev, b, dtype = self.device, state.batch_size, self._dtype()
        nodes = depth_of.to(dev) + 1  # the depth of each non-root node
        family = self._ancestry.to(dev)  # [N - 1, N - 1]: ancestor-or-self among the non-root nodes
        rank = real.long().cumsum(1) - 1  # each real column's index among the row's real columns
        top = rank[:, pending]  # the pending column's
        root_position = state.positions[:, pending].to(dev)
        tokens = state.tokens[:, pending].to(dev)[:, None].repeat(1, nodes.numel() + 1)
        pick = self._logits(state, outs[0][:, -1]).topk(width, -1).indices.to(dev)
        tokens[:, 1:] = torch.where(nodes == 1, pick.gather(1, ranks.to(dev)[None].expand(b, -1)), tokens[:, 1:])
        calls, table = self.num_layers, None  # table: [b, N - 1, H] the last layer's output per node
        for j, (fed, here) in enumerate(self._levels, start=1):
            fed, here = fed.to(dev), here.to(dev)  # the nodes layer j feeds, those it drafts
            m = fed.numel()
            at = (top - j + 1)[:, None]  # the depth-1 nodes' input: layer j - 1 at that real index
            column = ((rank == at) & real).long().argmax(1).clamp_min(lo) - lo
            root_hidden = outs[j - 1].gather(1, column[:, None, None].expand(b, 1, outs[j - 1].shape[-1]))
            parent = parents[1:].to(dev)[fed] - 1  # -1 for the root
            hidden = root_hidden.expand(b, m, -1) if table is None else torch.where(
                (parent < 0)[None, :, None], root_hidden, table.gather(1, parent.clamp_min(0)[None, :, None].expand(
                    b, m, table.shape[-1])))
            seen = (real & (rank >= 1) & (rank <= (top - j)[:, None]))[:, None, :].expand(b, m, -1)
            exists = (top[:, None] - j + nodes[fed][None, :]) >= 1  # [b, m]: the entry a tree key stands for
            among = family[fed][:, fed][None] & exists[:, None, :] | torch.eye(m, dtype=torch.bool, device=dev)
            allowed = torch.cat([seen, among.expand(b, -1, -1)], 2)
            mask = torch.zeros(allowed.shape, dtype=dtype, device=dev).masked_fill(~allowed, torch.finfo(dtype).min)
            positions = root_position[:, None] + nodes[fed][None, :]
            out = self._run_layer(j, tokens[:, 1:][:, fed], hidden, positions, mask[:, None], self.memory.cache)
            kv_cache.drop_columns(self.memory.cache, pending + 1, pending + 1 + m)  # only layer j held them
            calls += 1
            table = out.new_zeros((b, nodes.numel(), out.shape[-1])).index_copy(1, fed, out)
            parent_out = table.index_select(1, parents[1:].to(dev)[here] - 1)  # each drafted node's parent
            pick = self._logits(state, parent_out).topk(width, -1).indices.to(dev)  # [b, |here|, width]
            tokens[:, 1 + here] = pick.gather(2, ranks.to(dev)[here][None, :, None].expand(b, -1, 1))[:, :, 0]
        return tree_proposal(tokens, parents, forward_calls=calls)

    # ------------------------------------------------------------------ commit
    def commit(self, update: CommitUpdate) -> None:
        self.memory.commit(update)

    # ------------------------------------------------------------------ static decode path
    # (specdecode.drafters.mtp_static: chains and rank-path trees)
    def static_key(self) -> tuple:
        return ("mtp", weakref.ref(self.mtp_model), weakref.ref(self.target),
                None if self.choices is None else tuple(self.choices))

    def static_prefill(self, state: StaticDraftState, num_tokens: int) -> None:
        """See :func:`specdecode.drafters.mtp_static.prefill`."""
        from specdecode.drafters import mtp_static

        mtp_static.prefill(self, state, num_tokens)

    def static_propose(self, state: StaticDraftState, num_tokens: int) -> tuple[Tensor, Tensor]:
        """See :func:`specdecode.drafters.mtp_static.propose_chain`.

        Shape: returns ``[B, num_tokens]`` int64 and ``[B, num_tokens, V]`` float32."""
        from specdecode.drafters import mtp_static

        return mtp_static.propose_chain(self, state, num_tokens)

    def static_tree_plan(self, sampling: Any, vocab_size: int) -> Any:
        """See :func:`specdecode.drafters.mtp_static.tree_plan`."""
        from specdecode.drafters import mtp_static

        return mtp_static.tree_plan(self, vocab_size)

    def static_propose_tree(self, state: Any, plan: Any) -> Any:
        """See :func:`specdecode.drafters.mtp_static.propose_tree`."""
        from specdecode.drafters import mtp_static

        return mtp_static.propose_tree(self, state, plan)

    def static_accept_path(self, state: Any, draft: Any, accepted_nodes: Tensor, accepted_len: Tensor) -> None:
        """Nothing to move: the next window feeds the accepted path's columns again."""
        return None

def after_k(after: Tensor, column: Tensor, times: int) -> Tensor:
    """``column`` moved ``times`` real columns on through ``after`` (the next real column of
    each column).

    Shape: after ``[b, C]``, column ``[b, n]`` int64; returns ``[b, n]``."""
    for _ in range(times):
        column = after.gather(1, column)
    return column
