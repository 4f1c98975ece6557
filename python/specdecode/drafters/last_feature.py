"""What Medusa and Hydra heads share: drafters that read the target's last hidden state at each
row's last committed token (the one before the pending token), kept from one commit to the next.

:class:`LastFeatureDrafter` keeps that feature (``last_feature``, ``[b, H]``) through
rejections, finished rows and re-packs; :func:`tree_layout` turns rank paths (Medusa's
"choices", checked by :func:`specdecode.drafters.medusa.check_choices`) into per-node tables.

On the static decode path the engine keeps every column's target feature in
``state.features`` (:mod:`specdecode.engine.static_features`); :func:`static_features_at` reads
it inside a step, and :class:`LastFeatureDrafter` drafts chains and trees from the column before
the pending token (:meth:`~LastFeatureDrafter.static_last_feature`). A tree (``choices``) has
one fixed shape, its plan (:meth:`~LastFeatureDrafter.static_tree_plan`); the engine moves the
accepted path's features with its keys/values, so the heads have nothing to move.
"""

from __future__ import annotations

import weakref

import torch
from torch import Tensor, nn

from specdecode.drafters.base import CommitUpdate, DrafterBase, DraftState, Proposal, StaticDraftState
from specdecode.models import vocab_rows
from specdecode.models.reduced_head import check_head_token_ids, output_head
from specdecode.sampling import SamplingParams, sample_logits
from specdecode.trees.shapes import TreeShape
from specdecode.trees.static_growth import StaticTreeDraft, StaticTreePlan
from specdecode.trees.tree import TokenTree

__all__ = ["FeatureHeads", "LastFeatureDrafter", "check_count", "check_heads_target", "check_width", "draw",
           "heads_setup", "static_features_at", "static_rank_tree", "tree_layout",
           "tree_proposal"]


def check_count(name: str, value: object) -> int:
    """``value``, or ``ValueError`` naming ``name`` unless it is an int >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: expected an int >= 1, got {value!r}")
    return value


def heads_setup(heads: FeatureHeads, target: nn.Module, num_heads: int) -> dict:
    """Checks ``num_heads`` and ``target`` and records on ``heads`` what a head module built for
    ``target`` keeps (``num_heads``, ``hidden_size``, ``target_vocab``, no reduced head yet);
    returns the ``dtype`` / ``device`` keywords for its parameters (the target's)."""
    check_count("num_heads", num_heads)
    if not isinstance(target, nn.Module):
        raise TypeError(f"target: expected the target model (a torch.nn.Module), got {type(target).__name__}")
    reference = next(target.parameters())
    heads.num_heads = num_heads
    heads.hidden_size = int(target.get_input_embeddings().weight.shape[1])
    heads.target_vocab = vocab_rows(target)
    heads.register_buffer("head_token_ids", None)
    return {"dtype": reference.dtype, "device": reference.device}


class FeatureHeads(nn.Module):
    """What Medusa's and Hydra's head modules share: they end in the target's frozen LM head, or
    in a *reduced head* over ``head_token_ids`` (the buffer; None: every id), the target head's
    rows for the ``N`` tokens the training data uses most (:mod:`specdecode.models.reduced_head`:
    ``q`` is zero outside them, and a draft step computes ``N`` rows instead of ``V``)."""

    head_token_ids: Tensor | None
    target_vocab: int

    def set_head_tokens(self, token_ids: Tensor | None) -> None:
        """Draft over ``token_ids`` only (distinct ids below the target's vocabulary; None: the
        whole head). Set it before building a drafter on these heads.

        Shape:
            token_ids: ``[N]`` integer.

        >>> heads = MedusaHeads(target, num_heads=3)                   # doctest: +SKIP
        >>> heads.set_head_tokens(torch.arange(1024))                  # doctest: +SKIP
        >>> drafter = MedusaDrafter(target, heads)  # drafts over ids 0..1023 only  # doctest: +SKIP
        """
        ids = check_head_token_ids(token_ids)
        if ids is not None and int(ids[-1]) >= self.target_vocab:
            raise ValueError(f"head_token_ids: ids must be below the target's {self.target_vocab} ids, "
                             f"got {int(ids[-1])}")
        reference = next(self.parameters(), None)
        self.head_token_ids = ids if ids is None or reference is None else ids.to(reference.device)

    @property
    def num_head_tokens(self) -> int:
        """The number of ids the heads can draft (``target_vocab`` without a reduced head)."""
        return self.target_vocab if self.head_token_ids is None else int(self.head_token_ids.numel())

    def load_weights(self, state: dict[str, Tensor]) -> None:
        """Load saved weights (float16 ones cast to the heads' dtype) and, when ``state`` holds
        ``head_token_ids``, the reduced head's ids; ``state`` is not modified."""
        state = dict(state)
        ids = state.pop("head_token_ids", None)
        self.set_head_tokens(ids)
        if ids is not None:
            state["head_token_ids"] = self.head_token_ids
        self.load_state_dict(state)

    def output_head(self, target: nn.Module) -> nn.Module:
        """The LM head the heads end in: ``target``'s own, or the reduced head over
        ``head_token_ids`` (its rows copied from ``target`` now)."""
        ids = self.head_token_ids
        return output_head(target, None if ids is None else ids.cpu(), self.target_vocab)


def check_heads_target(target: nn.Module, heads: nn.Module, kind: type) -> None:
    """``TypeError`` naming ``target`` / ``heads`` for objects of the wrong type, ``ValueError``
    naming ``heads`` when they were built for a target of another vocabulary or hidden size."""
    if not isinstance(target, nn.Module):
        raise TypeError(f"target: expected the target model (a torch.nn.Module), got {type(target).__name__}")
    if not isinstance(heads, kind):
        raise TypeError(f"heads: expected {kind.__name__}, got {type(heads).__name__}")
    hidden = int(target.get_input_embeddings().weight.shape[1])
    if heads.target_vocab != vocab_rows(target) or heads.hidden_size != hidden:
        raise ValueError(f"heads: built for a target with {heads.target_vocab} ids and hidden size "
                         f"{heads.hidden_size}, not for this {type(target).__name__}")


def tree_layout(paths: list[tuple[int, ...]]) -> tuple[Tensor, Tensor, Tensor, int]:
    """Per non-root node: its depth - 1 (the head that drafts it) and its rank; per node (root
    first) its parent; the top-k width needed. ``paths`` in a topological order.

    Shape: returns ``[N - 1]``, ``[N - 1]``, ``[N]`` long tensors and an int.
    """
    index = {(): 0}
    parents, heads, ranks = [-1], [], []
    for path in paths:
        index[path] = len(index)
        parents.append(index[path[:-1]])
        heads.append(len(path) - 1)
        ranks.append(path[-1])
    return torch.tensor(heads), torch.tensor(ranks), torch.tensor(parents), max(ranks) + 1


def draw(state: DraftState, logits: Tensor, tokens: list[Tensor]) -> tuple[Tensor, Tensor]:
    """The next chain draft from a head's float32 ``logits`` after the drafts ``tokens`` so far:
    the logits processors applied (these are the draft's ``q``), then sampled with the state's
    coins (argmax at temperature 0).

    Shape:
        logits: ``[b, V]``; tokens: ``[b]`` each. Returns the token ``[b]`` and ``q`` ``[b, V]``.
    """
    drafted = torch.stack(tokens, 1) if tokens else state.tokens[:, :0].to(state.device)
    q = state.process_draft_logits(logits, drafted)
    coins = None if state.sampling.is_greedy else state.uniforms(state.batch_size)
    return sample_logits(q, state.sampling, uniforms=coins), q


def check_width(width: int, vocab_size: int, heads: FeatureHeads) -> None:
    """``ValueError`` naming ``tree`` when a rank path asks for more ranks than there are ids
    (``vocab_size``, or the ids of ``heads``' reduced head)."""
    if width > vocab_size:
        raise ValueError(f"tree: a path asks for the rank-{width - 1} token of a head, but the vocabulary has "
                         f"{vocab_size} ids")
    if width > heads.num_head_tokens:
        raise ValueError(f"tree: a path asks for the rank-{width - 1} token of a head, but the heads draft over "
                         f"{heads.num_head_tokens} ids (a reduced head)")


def tree_proposal(tokens: Tensor, parents: Tensor, forward_calls: int) -> Proposal:
    """A tree whose children are a function of the context (distinct ranks of one distribution),
    verified with the ``deterministic`` rule.

    Shape:
        tokens: ``[b, N]`` (the pending token first); parents: ``[N]`` (the root's ``-1``).
    """
    b, n = tokens.shape
    tree = TokenTree(tokens, parents.to(tokens.device)[None].expand(b, -1).contiguous(),
                     torch.full((b,), n, dtype=torch.long, device=tokens.device))
    return Proposal(tokens, None, tree=tree, children="deterministic", forward_calls=forward_calls)


def static_features_at(state: StaticDraftState, columns: Tensor) -> Tensor:
    """The target's features at ``columns`` of each row, read from ``state.features`` on the
    device; zeros at a column before the row's first real one (left padding, or before a
    prompt's first token: no feature there). The caller reads committed columns only
    (``< lengths``): the others hold stale features.

    Shape:
        columns: ``[B, n]`` int64 (may be negative); returns ``[B, n, F]``.
    """
    features = state.features
    if features is None:
        raise RuntimeError("static features: the engine wrote no target features (the drafter declares no "
                           "feature_layers)")
    B, n = columns.shape
    F = features.shape[-1]
    found = features.gather(1, columns.clamp(0, features.shape[1] - 1)[:, :, None].expand(B, n, F))
    real = (columns >= state.start[:, None])[:, :, None]
    return torch.where(real, found, torch.zeros_like(found))


class LastFeatureDrafter(DrafterBase):
    """A drafter that keeps, per row, the target's last hidden state of its last committed token
    (``last_feature``), from the features the engine hands over at every commit."""

    feature_layers: tuple[int, ...] = (-1,)

    def reset(self) -> None:
        self.last_feature: Tensor | None = None  # [b, H]: the target feature of each row's last committed token

    def _feature(self, state: DraftState, hidden: int, dtype: torch.dtype) -> Tensor:
        """Each row's last committed feature, zeros for a row whose pending token is its first.

        Shape: returns ``[b, H]`` on the drafter's device.
        """
        b = state.batch_size
        feature = self.last_feature
        if feature is None or feature.shape[0] != b:
            feature = torch.zeros((b, hidden), dtype=dtype, device=self.device)
        first = state.positions[:, state.num_columns - 1].to(self.device) == 0
        return torch.where(first[:, None], torch.zeros_like(feature), feature).to(dtype)

    def commit(self, update: CommitUpdate) -> None:
        feats = update.features
        if feats is not None and feats.shape[1] > 0:
            # A step: the columns old pending .. old pending + the longest accepted run of the rows
            # that continue, row r's last real one at index accepted_len[r] (rows that finish may
            # have accepted more: clamped, they leave). After the prefill (accepted_len all zero):
            # the prompt's columns, the last one real in every row that has one.
            m = feats.shape[1]
            accepted = update.accepted_len.to(feats.device).long()
            index = accepted.clamp_max(m - 1) if bool(accepted.any()) else accepted.new_full(accepted.shape, m - 1)
            self.last_feature = feats[torch.arange(feats.shape[0], device=feats.device), index].to(self.device)
        if update.kept_rows is not None and self.last_feature is not None:
            self.last_feature = self.last_feature[update.kept_rows.to(self.device)]

    # ------------------------------------------------------------------ static decode path
    # Subclasses have ``heads`` (the draft network), ``target`` and ``choices`` (None: chains).
    def static_key(self) -> tuple:
        return (self.name, weakref.ref(self.heads), weakref.ref(self.target),
                None if self.choices is None else tuple(self.choices))

    def static_prefill(self, state: StaticDraftState, num_tokens: int) -> None:
        """Nothing to absorb (the engine's prefill wrote the prompt's features); refuses more
        chain drafts per step than there are heads, with a ``ValueError`` naming them (a tree's
        depth is at most the number of heads: :func:`~specdecode.drafters.medusa.check_choices`)."""
        if self.choices is None and num_tokens > self.heads.num_heads:
            raise ValueError(f"num_draft_tokens: {type(self).__name__} has {self.heads.num_heads} heads, one draft "
                             f"each; the static decode path drafts exactly num_draft_tokens = {num_tokens} per step")

    def static_last_feature(self, state: StaticDraftState) -> Tensor:
        """Each row's feature at its last committed column (``lengths - 1``; zeros when the
        pending token is the row's first), in the heads' dtype.

        Shape: returns ``[B, H]``.
        """
        feature = static_features_at(state, (state.lengths - 1)[:, None])[:, 0]
        return feature.to(self.heads.dtype)

    def static_tree_plan(self, sampling: SamplingParams, vocab_size: int) -> StaticTreePlan:
        """The tree of the rank paths (``choices``), the same at every step, its children the
        heads' top-k (``deterministic``); ``ValueError`` naming ``tree`` for a chain drafter or
        a rank past the vocabulary."""
        if self.choices is None:
            raise ValueError(f"tree: this {type(self).__name__} drafts chains (tree=None); pass rank paths as tree=")
        _, ranks, parents, width = tree_layout(self.choices)
        check_width(width, vocab_size, self.heads)
        shape = TreeShape(tuple(parents.tolist()), child_rank=(-1, *ranks.tolist()))
        return StaticTreePlan("shape", shape.num_nodes, shape.max_depth, "deterministic", shape=shape)

    def static_accept_path(self, state: StaticDraftState, draft: StaticTreeDraft, accepted_nodes: Tensor,
                           accepted_len: Tensor) -> None:
        """Nothing to move: the heads keep nothing per column, and the engine moves the accepted
        path's target features with its keys/values."""
        return None

    def _static_tree_draft(self, state: StaticDraftState, plan: StaticTreePlan, tokens: Tensor) -> StaticTreeDraft:
        return static_rank_tree(state, plan, tokens)


def static_rank_tree(state: StaticDraftState, plan: StaticTreePlan, tokens: Tensor) -> StaticTreeDraft:
    """The step's trees from their node tokens (the pending token first), in the plan's shape;
    every node is present (siblings are distinct ranks of one distribution).

    Shape: tokens ``[B, N]`` int64.
    """
    shape = plan.shape
    assert shape is not None
    parents, offsets = state.buffer(f"choices_tree:{plan.key}", lambda: (
        torch.tensor(shape.parents, dtype=torch.long, device=state.device),
        torch.arange(shape.num_nodes, device=state.device)))
    B, N = tokens.shape
    return StaticTreeDraft(tokens, parents.expand(B, -1).contiguous(),
                           torch.full((B,), N, dtype=torch.long, device=state.device), None,
                           offsets.expand(B, -1).contiguous())
