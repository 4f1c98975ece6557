"""``HydraDrafter``: Hydra heads, sequentially dependent draft heads on the target's last hidden state.

Indexing as for Medusa (:mod:`specdecode.drafters.medusa`): ``f_t`` is the target's last hidden
state (what its LM head reads) at the row's last committed token ``x_t``, and the pending token
``x_{t+1}`` (the *base* token) was already drawn from the target's own logits. Hydra head ``i``
(0-based) drafts ``x_{t+2+i}`` (draft position ``i + 1``) from ``f_t`` **and** the target's
frozen input embeddings of the tokens before it: the base token and the drafts of heads
``0 .. i-1``::

    u = concat[f_t, e(x_{t+1}), e(d_1), .., e(d_i)]            # [(i + 2) * H]
    h = f_t + SiLU(W_i u + b_i)                                 # input layer, residual on f_t
    h = h + SiLU(W_{i,l} h + b_{i,l})   for l = 1 .. head_layers - 1
    logits = lm_head(h)                                         # the target's, frozen

Every weight starts at zero, so an untrained head is the target's LM head on ``f_t``.
``head_layers`` > 1 is Hydra++'s deeper MLP (default 2: on the demo target, 2 layers drafted
clearly better than 1 for the same training time); the teacher loss (a KL to the target's own
distributions) is how the kit trains them (:mod:`specdecode.training.hydra`).

Proposals:

- chain: draft ``i`` is drawn from head ``i``'s distribution given the drafts before it (after
  the logits processors; argmax at temperature 0), and that distribution is its ``q``: an
  ordinary autoregressive proposal, lossless under every chain rule.
- tree (``tree=`` Medusa-style rank paths, :func:`~specdecode.drafters.medusa.check_choices`):
  the node of path ``(r_0, .., r_{d-1})`` holds the rank-``r_{d-1}`` token of head ``d - 1``
  *conditioned on its own path's tokens*, so every node with children runs its own head call
  (one batched call per depth). Siblings are distinct ranks of one distribution and the tree is
  a function of the context: verified with the ``deterministic`` tree rule.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specdecode.drafters.base import DraftState, Proposal, StaticDraftState
from specdecode.drafters.last_feature import (
    FeatureHeads,
    LastFeatureDrafter,
    check_count,
    check_heads_target,
    check_width,
    draw,
    heads_setup,
    tree_layout,
    tree_proposal,
)
from specdecode.drafters.medusa import check_choices
from specdecode.models import input_device
from specdecode.trees.static_growth import StaticTreeDraft, StaticTreePlan

__all__ = ["HydraDrafter", "HydraHeads"]


class HydraHeads(FeatureHeads):
    """``num_heads`` Hydra heads for ``target`` (only read: its input embedding and LM head are
    used, frozen, and are not part of this module). Head ``i`` reads the feature and ``i + 1``
    token embeddings; ``head_layers`` is the depth of each head's MLP.

    Parameters: ``inputs.{i}`` (``Linear((i + 2) * H, H)``) and ``layers.{i}.{l}``
    (``Linear(H, H)``, ``l < head_layers - 1``), all zero at start; buffer ``head_token_ids
    [N]``: a reduced head's ids, or None (:meth:`set_head_tokens`,
    :class:`~specdecode.drafters.last_feature.FeatureHeads`).
    """

    feature_layers: tuple[int, ...] = (-1,)

    def __init__(self, target: nn.Module, num_heads: int = 4, head_layers: int = 2) -> None:
        super().__init__()
        self.head_layers = check_count("head_layers", head_layers)
        factory = heads_setup(self, target, num_heads)
        hidden = self.hidden_size
        self.inputs = nn.ModuleList(nn.Linear((i + 2) * hidden, hidden, **factory) for i in range(num_heads))
        self.layers = nn.ModuleList(
            nn.ModuleList(nn.Linear(hidden, hidden, **factory) for _ in range(head_layers - 1))
            for _ in range(num_heads))
        for p in self.parameters():
            nn.init.zeros_(p)

    @property
    def dtype(self) -> torch.dtype:
        return self.inputs[0].weight.dtype

    def forward(self, features: Tensor, embeds: Tensor, head: int) -> Tensor:
        """Head ``head``'s hidden state (what the target's LM head reads).

        Shape:
            features: ``[..., H]``; embeds: ``[..., head + 1, H]`` (the base token's embedding,
            then the earlier drafts'); returns ``[..., H]``.
        """
        if not 0 <= head < self.num_heads:
            raise ValueError(f"head: expected 0 <= head < {self.num_heads}, got {head!r}")
        if embeds.shape[-2] != head + 1:
            raise ValueError(f"embeds: head {head} reads {head + 1} token embeddings, got {embeds.shape[-2]}")
        x = features.to(self.dtype)
        u = torch.cat([x, embeds.to(self.dtype).flatten(-2)], -1)
        h = x + F.silu(self.inputs[head](u))
        for layer in self.layers[head]:
            h = h + F.silu(layer(h))
        return h

    def logits(self, features: Tensor, embeds: Tensor, head: int, lm_head: Callable[[Tensor], Tensor],
               vocab_size: int | None = None) -> Tensor:
        """Head ``head``'s logits over the target's first ``vocab_size`` ids (all when None);
        ``lm_head`` is :meth:`output_head` (the target's output layer, or the reduced head), or
        any callable doing the same, frozen.

        Shape:
            features: ``[..., H]``; embeds: ``[..., head + 1, H]``; returns ``[..., vocab_size]``.
        """
        out = lm_head(self(features, embeds, head))
        return out if vocab_size is None else out[..., :vocab_size]


def _tree_levels(paths: list[tuple[int, ...]]) -> list[tuple[Tensor, Tensor, Tensor, Tensor, Tensor, int]]:
    """Per depth ``d`` (the head that drafts depth ``d + 1``): the nodes at depth ``d`` with
    children (``[P]``), each one's path of node indices from the root (``[P, d + 1]``), per
    child at depth ``d + 1``: its node index, its parent's slot in the first list, its rank;
    and the top-k width the level reads (its largest rank + 1), fixed here so that no step
    reads it on the host."""
    index = {(): 0}
    for path in paths:
        index[path] = len(index)
    levels = []
    for d in range(max(len(p) for p in paths)):
        children = [p for p in paths if len(p) == d + 1]
        parents = sorted({p[:-1] for p in children}, key=lambda p: index[p])
        slot = {p: j for j, p in enumerate(parents)}
        walks = [[index[p[:k]] for k in range(d + 1)] for p in parents]
        levels.append((torch.tensor([index[p] for p in parents]), torch.tensor(walks, dtype=torch.long),
                       torch.tensor([index[c] for c in children]), torch.tensor([slot[c[:-1]] for c in children]),
                       torch.tensor([c[-1] for c in children]), max(c[-1] for c in children) + 1))
    return levels


class HydraDrafter(LastFeatureDrafter):
    """Drafts for ``target`` with :class:`HydraHeads` from the last committed feature and the
    tokens drafted so far (usually from :func:`specdecode.load_drafter`, trained by
    ``python -m specdecode train hydra``).

    ``tree``: None for a chain of up to ``num_heads`` drafts, or Medusa rank paths
    (:func:`~specdecode.drafters.medusa.product_tree`, :func:`~specdecode.drafters.medusa.sparse_tree`)
    for a tree whose nodes are conditioned on their paths. Any batch size, left padding. On the
    static decode path (chains, ``num_draft_tokens`` at most ``num_heads``) the heads read the
    feature of each row's last committed column from the engine's device buffer
    (:meth:`static_propose`); trees too, one batched head call per depth
    (:meth:`static_propose_tree`).

    Example:
        >>> drafter = specdecode.load_drafter("runs/demo-hydra", target)      # doctest: +SKIP
        >>> out = specdecode.generate(target, drafter, ids, max_new_tokens=32)  # doctest: +SKIP
    """

    name = "hydra"

    def __init__(self, target: nn.Module, heads: HydraHeads, tree: Sequence[Sequence[int]] | None = None) -> None:
        check_heads_target(target, heads, HydraHeads)
        self.target = target
        self.heads = heads
        self.device = input_device(target)
        self.choices = None if tree is None else check_choices(tree, heads.num_heads)
        if self.choices is None:
            self._parents, self._width, self._levels = None, 0, []
        else:
            _, _, self._parents, self._width = tree_layout(self.choices)
            self._levels = _tree_levels(self.choices)
        self._lm_head = heads.output_head(target)
        self.reset()

    def describe(self) -> dict:
        return {"drafter": self.name, "num_heads": self.heads.num_heads, "head_layers": self.heads.head_layers,
                "head_tokens": self.heads.num_head_tokens,
                "draft_params": sum(p.numel() for p in self.heads.parameters()),
                "tree_nodes": None if self.choices is None else len(self.choices) + 1}

    def _embed(self, tokens: Tensor) -> Tensor:
        """The target's input embeddings. Shape: tokens ``[...]``; returns ``[..., H]``."""
        return self.target.get_input_embeddings()(tokens.to(self.device)).to(self.heads.dtype)

    def _logits(self, state: DraftState | StaticDraftState, feature: Tensor, embeds: Tensor, head: int) -> Tensor:
        """Float32 logits of head ``head`` on the state's device.

        Shape: feature ``[..., H]``, embeds ``[..., head + 1, H]``; returns ``[..., V]``.
        """
        out = self.heads.logits(feature, embeds, head, self._lm_head, state.vocab_size)
        return out.to(device=state.device, dtype=torch.float32)

    @torch.no_grad()
    def propose(self, state: DraftState, num_tokens: int) -> Proposal:
        feature = self._feature(state, self.heads.hidden_size, self.heads.dtype)
        root = state.tokens[:, state.num_columns - 1].to(state.device)
        if self.choices is not None:
            return self._propose_tree(state, feature, root)
        if num_tokens < 1:
            return Proposal(state.tokens[:, :0].to(state.device))
        embeds = [self._embed(root)]
        tokens: list[Tensor] = []
        used: list[Tensor] = []
        for i in range(min(num_tokens, self.heads.num_heads)):
            token, q = draw(state, self._logits(state, feature, torch.stack(embeds, 1), i), tokens)
            tokens.append(token)
            used.append(q)
            embeds.append(self._embed(token))
        return Proposal(torch.stack(tokens, 1), torch.stack(used, 1), forward_calls=len(tokens))

    def _propose_tree(self, state: DraftState, feature: Tensor, root: Tensor) -> Proposal:
        check_width(self._width, state.vocab_size, self.heads)
        b, n = state.batch_size, len(self.choices) + 1
        tokens = root.new_zeros((b, n))
        tokens[:, 0] = root
        for d, (_, walks, children, slots, ranks, width) in enumerate(self._levels):
            walks, children = walks.to(state.device), children.to(state.device)
            embeds = self._embed(tokens[:, walks])  # [b, P, d + 1, H]
            here = feature[:, None].expand(-1, walks.shape[0], -1)
            logits = self._logits(state, here, embeds, d)  # [b, P, V]
            top = logits.topk(width, dim=-1).indices  # distinct ids per parent
            tokens[:, children] = top[:, slots.to(state.device), ranks.to(state.device)]
        return tree_proposal(tokens, self._parents, forward_calls=len(self._levels))

    @torch.no_grad()
    def static_propose(self, state: StaticDraftState, num_tokens: int) -> tuple[Tensor, Tensor]:
        """Draft ``i`` drawn (``state.sample``) from head ``i`` on the last committed feature and
        the embeddings of the pending token and drafts ``0 .. i-1``; no host read.

        Shape: returns ``[B, num_tokens]`` int64 and ``[B, num_tokens, V]`` float32.
        """
        feature = self.static_last_feature(state)
        embeds = [self._embed(state.tokens.gather(1, state.lengths[:, None])[:, 0])]
        tokens: list[Tensor] = []
        used: list[Tensor] = []
        for i in range(num_tokens):
            logits = self._logits(state, feature, torch.stack(embeds, 1), i)
            tokens.append(state.sample(logits))
            used.append(logits)
            embeds.append(self._embed(tokens[-1]))
        return torch.stack(tokens, 1), torch.stack(used, 1)

    @torch.no_grad()
    def static_propose_tree(self, state: StaticDraftState, plan: StaticTreePlan) -> StaticTreeDraft:
        """The tree of the rank paths, one batched head call per depth as :meth:`propose` makes
        them: head ``d`` reads the last committed feature and the embeddings of each parent's
        path (the pending token first) and gives the parent's children their ranks' tokens; the
        tables are fixed device tensors, so no host read.

        Shape: returns a :class:`~specdecode.trees.static_growth.StaticTreeDraft` of
        ``N = len(choices) + 1`` nodes.
        """
        levels = state.buffer(f"hydra_tree:{tuple(self.choices)}", lambda: [
            (walks.flatten().to(state.device), children.to(state.device), (slots * width + ranks).to(state.device),
             walks.shape[0], width) for _, walks, children, slots, ranks, width in self._levels])
        feature = self.static_last_feature(state)
        root = state.tokens.gather(1, state.lengths[:, None])
        B = root.shape[0]
        tokens = root.repeat(1, plan.num_nodes)
        for d, (walks, children, picks, P, width) in enumerate(levels):
            embeds = self._embed(tokens.index_select(1, walks).view(B, P, d + 1))  # [B, P, d + 1, H]
            logits = self._logits(state, feature[:, None].expand(-1, P, -1), embeds, d)  # [B, P, V]
            top = logits.topk(width, dim=-1).indices  # [B, P, width]: distinct ids per parent
            tokens.index_copy_(1, children, top.flatten(1).index_select(1, picks))
        return self._static_tree_draft(state, plan, tokens)
