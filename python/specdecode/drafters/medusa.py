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

from specdecode.drafters.base import CommitUpdate, DrafterBase, DraftState, Proposal
from specdecode.models import input_device, vocab_rows
from specdecode.sampling import sample_logits
from specdecode.trees.tree import TokenTree

__all__ = ["MedusaDrafter", "MedusaHeads", "check_choices", "product_tree", "sparse_tree"]


class MedusaHeads(nn.Module):
    """``num_heads`` Medusa-1 heads for ``target`` (only read; its LM head is used, frozen, and
    is not part of this module). Each head's linear layer starts at zero, so an untrained head
    is the target's own LM head on the feature.

    Parameters: ``weight [K, H, H]``, ``bias [K, H]`` (``H`` the target's hidden size).
    """

    feature_layers: tuple[int, ...] = (-1,)

    def __init__(self, target: nn.Module, num_heads: int = 4) -> None:
        super().__init__()
        if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
            raise ValueError(f"num_heads: expected an int >= 1, got {num_heads!r}")
        if not isinstance(target, nn.Module):
            raise TypeError(f"target: expected the target model (a torch.nn.Module), got {type(target).__name__}")
        hidden = int(target.get_input_embeddings().weight.shape[1])
        reference = next(target.parameters())
        factory = {"dtype": reference.dtype, "device": reference.device}
        self.num_heads = num_heads
        self.hidden_size = hidden
        self.target_vocab = vocab_rows(target)
        self.weight = nn.Parameter(torch.zeros((num_heads, hidden, hidden), **factory))
        self.bias = nn.Parameter(torch.zeros((num_heads, hidden), **factory))

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
        ``lm_head`` is the target's output layer (or any callable doing the same, frozen).

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


class MedusaDrafter(DrafterBase):
    """Drafts for ``target`` with :class:`MedusaHeads` from the last committed feature (usually
    from :func:`specdecode.load_drafter`, trained by ``python -m specdecode train medusa``).

    ``tree``: None for a chain of up to ``num_heads`` drafts, or Medusa rank paths (see
    :func:`check_choices`, :func:`product_tree`, :func:`sparse_tree`) for a tree. Any batch
    size, left padding; the static decode path refuses it (it reads target features at commit).

    Example:
        >>> drafter = specdecode.load_drafter("runs/medusa", target)         # doctest: +SKIP
        >>> out = specdecode.generate(target, drafter, ids, max_new_tokens=32)  # doctest: +SKIP
    """

    name = "medusa"
    feature_layers: tuple[int, ...] = (-1,)

    def __init__(self, target: nn.Module, heads: MedusaHeads,
                 tree: Sequence[Sequence[int]] | None = None) -> None:
        if not isinstance(target, nn.Module):
            raise TypeError(f"target: expected the target model (a torch.nn.Module), got {type(target).__name__}")
        if not isinstance(heads, MedusaHeads):
            raise TypeError(f"heads: expected MedusaHeads, got {type(heads).__name__}")
        hidden = int(target.get_input_embeddings().weight.shape[1])
        if heads.target_vocab != vocab_rows(target) or heads.hidden_size != hidden:
            raise ValueError(f"heads: built for a target with {heads.target_vocab} ids and hidden size "
                             f"{heads.hidden_size}, not for this {type(target).__name__}")
        self.target = target
        self.heads = heads
        self.device = input_device(target)
        self.choices = None if tree is None else check_choices(tree, heads.num_heads)
        self._layout = None if self.choices is None else self._tree_layout(self.choices)
        self.reset()

    @staticmethod
    def _tree_layout(paths: list[tuple[int, ...]]) -> tuple[Tensor, Tensor, Tensor, int]:
        """Per non-root node: its head (depth - 1), its rank; per node its parent; the top-k
        width needed."""
        index = {(): 0}
        parents, heads, ranks = [-1], [], []
        for path in paths:
            index[path] = len(index)
            parents.append(index[path[:-1]])
            heads.append(len(path) - 1)
            ranks.append(path[-1])
        return (torch.tensor(heads), torch.tensor(ranks), torch.tensor(parents), max(ranks) + 1)

    def reset(self) -> None:
        self.last_feature: Tensor | None = None  # [b, H]: the target feature of each row's last committed token

    def describe(self) -> dict:
        return {"drafter": self.name, "num_heads": self.heads.num_heads,
                "draft_params": sum(p.numel() for p in self.heads.parameters()),
                "tree_nodes": None if self.choices is None else len(self.choices) + 1}

    def _head_logits(self, state: DraftState) -> Tensor:
        """Every head's float32 logits from each row's last committed feature (zeros for a row
        whose pending token is its first). Shape: returns ``[b, K, V]`` on the state's device."""
        b, H = state.batch_size, self.heads.hidden_size
        feature = self.last_feature
        if feature is None or feature.shape[0] != b:
            feature = torch.zeros((b, H), dtype=self.heads.weight.dtype, device=self.device)
        first = state.positions[:, state.num_columns - 1].to(self.device) == 0
        feature = torch.where(first[:, None], torch.zeros_like(feature), feature)
        logits = self.heads.logits(feature, self.target.get_output_embeddings(), state.vocab_size)
        return logits.to(device=state.device, dtype=torch.float32)

    @torch.no_grad()
    def propose(self, state: DraftState, num_tokens: int) -> Proposal:
        logits = self._head_logits(state)
        if self._layout is not None:
            return self._propose_tree(state, logits)
        b = state.batch_size
        if num_tokens < 1:
            return Proposal(state.tokens[:, :0].to(state.device))
        tokens: list[Tensor] = []
        used: list[Tensor] = []
        for i in range(min(num_tokens, self.heads.num_heads)):
            drafted = torch.stack(tokens, 1) if tokens else state.tokens[:, :0].to(state.device)
            q = state.process_draft_logits(logits[:, i], drafted)
            coins = None if state.sampling.is_greedy else state.uniforms(b)
            tokens.append(sample_logits(q, state.sampling, uniforms=coins))
            used.append(q)
        return Proposal(torch.stack(tokens, 1), torch.stack(used, 1), forward_calls=1)

    def _propose_tree(self, state: DraftState, logits: Tensor) -> Proposal:
        heads, ranks, parents, width = self._layout
        heads, ranks, parents = heads.to(state.device), ranks.to(state.device), parents.to(state.device)
        if width > state.vocab_size:
            raise ValueError(f"tree: a path asks for the rank-{width - 1} token of a head, but the vocabulary has "
                             f"{state.vocab_size} ids")
        b = state.batch_size
        depth = int(heads.max()) + 1
        top = logits[:, :depth].topk(width, dim=-1).indices  # [b, depth, width]: distinct ids per head
        nodes = top[:, heads, ranks]  # [b, N - 1]
        root = state.tokens[:, state.num_columns - 1].to(state.device)
        tokens = torch.cat([root[:, None], nodes], 1)
        n = tokens.shape[1]
        tree = TokenTree(tokens, parents[None].expand(b, -1).contiguous(),
                         torch.full((b,), n, dtype=torch.long, device=state.device))
        return Proposal(tokens, None, tree=tree, children="deterministic", forward_calls=1)

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
