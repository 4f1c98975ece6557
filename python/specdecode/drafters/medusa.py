"""``MedusaDrafter``: Medusa-1 heads on the target's last hidden state.

Indexing. Write ``f_t`` for the target's last hidden state (after its final norm: what its LM
head reads) at the position of token ``x_t``; the LM head on ``f_t`` gives the distribution of
``x_{t+1}``. Head ``i`` (0-based) is a residual block ``r_i(f) = f + SiLU(W_i f + b_i)``
followed by the target's frozen LM head, and predicts ``x_{t+2+i}`` from ``f_t``.

In the engine, at each step the last committed column before the pending token holds ``x_t``
and the pending token is ``x_{t+1}`` (already drawn from the target's own logits). So from
``f_t`` head 0 drafts ``x_{t+2}``, the token *after* the pending one (the first draft position),
head ``i`` draft position ``i + 1``: exactly Medusa-1, where the target's own logits provide
the next token. The feature arrives with each commit
(:attr:`~specdecode.drafters.base.CommitUpdate.features`): the columns of the old pending token
and the accepted drafts; a row that accepted ``a`` drafts has its last real one at index ``a``.

Proposals:

- chain: draft ``i`` is drawn from head ``i``'s distribution (after the logits processors;
  argmax at temperature 0) and head ``i``'s logits are its ``q``. ``q_i`` does not depend on
  the earlier drafts, which is still a valid proposal for every rule.
- tree (``tree=`` a list of rank paths, Medusa's "choices"): the node of path ``(r_0, ..,
  r_{d-1})`` holds the rank-``r_{d-1}`` token of head ``d - 1``; siblings are distinct ranks,
  hence distinct tokens, and the whole tree is a function of the context, so it is verified with
  the ``deterministic`` tree rule. :func:`product_tree` builds a full top-k product;
  :func:`sparse_tree` keeps the paths most likely accepted under measured rank accuracies.

Training: the kit's ``medusa`` kind (:mod:`specdecode.training.medusa`).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specdecode.drafters.base import DraftState, Proposal, StaticDraftState
from specdecode.drafters.last_feature import (
    FeatureHeads,
    LastFeatureDrafter,
    check_heads_target,
    check_width,
    draw,
    heads_setup,
    tree_layout,
    tree_proposal,
)
from specdecode.models import input_device
from specdecode.trees.static_growth import StaticTreeDraft, StaticTreePlan

__all__ = ["MedusaDrafter", "MedusaHeads", "check_choices", "product_tree", "sparse_tree"]


class MedusaHeads(FeatureHeads):
    """``num_heads`` Medusa-1 heads for ``target`` (only read; its LM head is used, frozen, and
    is not part of this module). Each head's linear layer starts at zero, so an untrained head
    is the target's own LM head on the feature. With :meth:`set_head_tokens` the heads draft
    over a reduced head (:class:`~specdecode.drafters.last_feature.FeatureHeads`).

    Parameters: ``weight [K, H, H]``, ``bias [K, H]`` (``H`` the target's hidden size); buffer
    ``head_token_ids [N]`` (a reduced head's ids, or None).
    """

    feature_layers: tuple[int, ...] = (-1,)

    def __init__(self, target: nn.Module, num_heads: int = 4) -> None:
        super().__init__()
        factory = heads_setup(self, target, num_heads)
        hidden = self.hidden_size
        self.weight = nn.Parameter(torch.zeros((num_heads, hidden, hidden), **factory))
        self.bias = nn.Parameter(torch.zeros((num_heads, hidden), **factory))

    @property
    def dtype(self) -> torch.dtype:
        return self.weight.dtype

    def forward(self, features: Tensor) -> Tensor:
        """Each head's residual block on the features.

        Shape:
            features: ``[..., H]``; returns ``[..., K, H]``.
        """
        x = features.to(self.weight.dtype)
        inner = torch.einsum("...h,kgh->...kg", x, self.weight) + self.bias
        return x.unsqueeze(-2) + F.silu(inner)

    def logits(self, features: Tensor, lm_head: Callable[[Tensor], Tensor], vocab_size: int | None = None) -> Tensor:
        """Every head's logits over the target's first ``vocab_size`` ids (all when None);
        ``lm_head`` is :meth:`output_head` (the target's output layer, or the reduced head), or
        any callable doing the same, frozen.

        Shape:
            features: ``[..., H]``; returns ``[..., K, vocab_size]`` in the head's dtype.
        """
        out = lm_head(self(features))
        return out if vocab_size is None else out[..., :vocab_size]


def check_choices(choices: Sequence[Sequence[int]], num_heads: int | None = None) -> list[tuple[int, ...]]:
    """A Medusa tree's paths of ranks, checked: non-empty tuples of ints >= 0, no repeats,
    every path's parent present (the root's children are the 1-tuples), depth at most
    ``num_heads``. Returns them sorted by depth, then ranks (a topological order whose siblings
    come in rank order)."""
    if isinstance(choices, (str, bytes)) or not isinstance(choices, Sequence) or not choices:
        raise ValueError(f"tree: expected a non-empty list of rank paths such as [(0,), (1,), (0, 0)], got {choices!r}")
    paths = []
    for path in choices:
        if (not isinstance(path, Sequence) or isinstance(path, (str, bytes)) or not path
                or not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in path)):
            raise ValueError(f"tree: every path must be a non-empty tuple of ranks >= 0, got {path!r}")
        paths.append(tuple(path))
    if len(set(paths)) != len(paths):
        raise ValueError("tree: a path appears twice")
    present = set(paths)
    for path in paths:
        if len(path) > 1 and path[:-1] not in present:
            raise ValueError(f"tree: path {path} has no parent path {path[:-1]}")
        if num_heads is not None and len(path) > num_heads:
            raise ValueError(f"tree: path {path} is deeper than the {num_heads} heads")
    return sorted(paths, key=lambda p: (len(p), p))


def product_tree(widths: Sequence[int]) -> list[tuple[int, ...]]:
    """Every path whose rank at depth ``d`` is below ``widths[d]``: the full top-k product
    (``product_tree([3, 2])``: 3 first drafts, each with 2 children)."""
    if isinstance(widths, (str, bytes)) or not isinstance(widths, Sequence) or not widths or not all(
            isinstance(w, int) and not isinstance(w, bool) and w >= 1 for w in widths):
        raise ValueError(f"widths: expected a non-empty list of ints >= 1, got {widths!r}")
    paths: list[tuple[int, ...]] = []
    level: list[tuple[int, ...]] = [()]
    for width in widths:
        level = [p + (r,) for p in level for r in range(width)]
        paths += level
    return paths


def sparse_tree(accuracies: Tensor | Sequence[Sequence[float]], num_nodes: int) -> list[tuple[int, ...]]:
    """Medusa's sparse tree: the ``num_nodes`` paths with the largest estimated acceptance
    ``prod_d accuracies[d][r_d]`` (head ``d``'s rank-``r`` token being the target's), grown best
    first from the root, so every kept path's parent is kept.

    Shape:
        accuracies: ``[K, R]`` — per head, the rate at which its rank-``r`` token is right.
    """
    acc = torch.as_tensor(accuracies, dtype=torch.float64)
    if acc.dim() != 2 or acc.numel() == 0 or bool((acc < 0).any()) or bool((acc > 1).any()):
        raise ValueError(f"accuracies: expected a [K, R] table of rates in [0, 1], got shape {tuple(acc.shape)}")
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 1:
        raise ValueError(f"num_nodes: expected an int >= 1, got {num_nodes!r}")
    depth, ranks = acc.shape
    frontier = [(-float(acc[0, r]), (r,)) for r in range(ranks)]
    heapq.heapify(frontier)
    paths: list[tuple[int, ...]] = []
    while frontier and len(paths) < num_nodes:
        score, path = heapq.heappop(frontier)
        paths.append(path)
        if len(path) < depth:
            for r in range(ranks):
                heapq.heappush(frontier, (score * float(acc[len(path), r]), path + (r,)))
    return paths


class MedusaDrafter(LastFeatureDrafter):
    """Drafts for ``target`` with :class:`MedusaHeads` from the last committed feature (usually
    from :func:`specdecode.load_drafter`, trained by ``python -m specdecode train medusa``).

    ``tree``: None for a chain of up to ``num_heads`` drafts, or Medusa rank paths (see
    :func:`check_choices`, :func:`product_tree`, :func:`sparse_tree`) for a tree. Any batch
    size, left padding. On the static decode path (chains of at most ``num_heads`` drafts, and
    trees) one head call per step reads the feature of each row's last committed column from
    the engine's device buffer (:meth:`static_propose`, :meth:`static_propose_tree`).

    Example:
        >>> drafter = specdecode.load_drafter("runs/medusa", target)         # doctest: +SKIP
        >>> out = specdecode.generate(target, drafter, ids, max_new_tokens=32)  # doctest: +SKIP
    """

    name = "medusa"

    def __init__(self, target: nn.Module, heads: MedusaHeads,
                 tree: Sequence[Sequence[int]] | None = None) -> None:
        check_heads_target(target, heads, MedusaHeads)
        self.target = target
        self.heads = heads
        self.device = input_device(target)
        self.choices = None if tree is None else check_choices(tree, heads.num_heads)
        self._layout = None if self.choices is None else tree_layout(self.choices)
        self._lm_head = heads.output_head(target)
        self.reset()

    def describe(self) -> dict:
        return {"drafter": self.name, "num_heads": self.heads.num_heads, "head_tokens": self.heads.num_head_tokens,
                "draft_params": sum(p.numel() for p in self.heads.parameters()),
                "tree_nodes": None if self.choices is None else len(self.choices) + 1}

    def _head_logits(self, state: DraftState) -> Tensor:
        """Every head's float32 logits from each row's last committed feature (zeros for a row
        whose pending token is its first). Shape: returns ``[b, K, V]`` on the state's device."""
        feature = self._feature(state, self.heads.hidden_size, self.heads.weight.dtype)
        logits = self.heads.logits(feature, self._lm_head, state.vocab_size)
        return logits.to(device=state.device, dtype=torch.float32)

    @torch.no_grad()
    def propose(self, state: DraftState, num_tokens: int) -> Proposal:
        logits = self._head_logits(state)
        if self._layout is not None:
            return self._propose_tree(state, logits)
        if num_tokens < 1:
            return Proposal(state.tokens[:, :0].to(state.device))
        tokens: list[Tensor] = []
        used: list[Tensor] = []
        for i in range(min(num_tokens, self.heads.num_heads)):
            token, q = draw(state, logits[:, i], tokens)
            tokens.append(token)
            used.append(q)
        return Proposal(torch.stack(tokens, 1), torch.stack(used, 1), forward_calls=1)

    def _propose_tree(self, state: DraftState, logits: Tensor) -> Proposal:
        heads, ranks, parents, width = self._layout
        heads, ranks = heads.to(state.device), ranks.to(state.device)
        check_width(width, state.vocab_size, self.heads)
        depth = int(heads.max()) + 1
        top = logits[:, :depth].topk(width, dim=-1).indices  # [b, depth, width]: distinct ids per head
        nodes = top[:, heads, ranks]  # [b, N - 1]
        root = state.tokens[:, state.num_columns - 1].to(state.device)
        return tree_proposal(torch.cat([root[:, None], nodes], 1), parents, forward_calls=1)

    @torch.no_grad()
    def static_propose(self, state: StaticDraftState, num_tokens: int) -> tuple[Tensor, Tensor]:
        """Draft ``i`` drawn (``state.sample``) from head ``i``'s logits on the last committed
        feature; no host read.

        Shape: returns ``[B, num_tokens]`` int64 and ``[B, num_tokens, V]`` float32.
        """
        feature = self.static_last_feature(state)
        logits = self.heads.logits(feature, self._lm_head, state.vocab_size)
        logits = logits[:, :num_tokens].float()
        tokens = [state.sample(logits[:, i]) for i in range(num_tokens)]
        return torch.stack(tokens, 1), logits

    @torch.no_grad()
    def static_propose_tree(self, state: StaticDraftState, plan: StaticTreePlan) -> StaticTreeDraft:
        """The tree of the rank paths from one head call on the last committed feature: the
        node of path ``(r_0, .., r_{d-1})`` is the rank-``r_{d-1}`` token of head ``d - 1``
        (the heads' top-``width`` picked by a fixed table, as :meth:`propose` does); no host read.

        Shape: returns a :class:`~specdecode.trees.static_growth.StaticTreeDraft` of
        ``N = len(choices) + 1`` nodes.
        """
        heads, ranks, _, width = self._layout
        picks = state.buffer(f"medusa_tree:{tuple(self.choices)}",
                             lambda: (heads * width + ranks).to(state.device))  # [N - 1] into [depth * width]
        feature = self.static_last_feature(state)
        logits = self.heads.logits(feature, self._lm_head, state.vocab_size)
        top = logits[:, : plan.max_depth].float().topk(width, dim=-1).indices  # [B, depth, width]: distinct per head
        root = state.tokens.gather(1, state.lengths[:, None])
        return self._static_tree_draft(state, plan, torch.cat([root, top.flatten(1).index_select(1, picks)], 1))
