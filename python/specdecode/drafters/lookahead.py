"""``LookaheadDrafter``: Lookahead decoding. Jacobi iteration inside the target's own forward
pass feeds an n-gram pool; the pool's n-grams are the draft. No second model, no training.

One target forward holds two branches (the engine's side tokens,
:class:`~specdecode.drafters.SideTokens`):

- the **lookahead branch**, side tokens the verification never sees: a window of ``W`` columns
  and ``N - 1`` levels. Level 0 is a guess of the ``W`` tokens after the pending token (a
  causal sequence); the token at level ``i``, column ``j`` follows level 0's columns ``0..j``
  and the column's own levels ``1..i``, at position ``pending + 1 + i + j``. The target's
  argmax at the top level of column ``j`` is a new token that extends the column's chain, and
  the column read top to bottom with it is an ``N``-gram: its first token keys the pool, the
  other ``N - 1`` are the continuation. Then every level moves down one (level 0 is dropped)
  and the new tokens become the top level: one Jacobi step per target call, ``W`` n-grams
  harvested.
- the **verification branch**: up to ``max_candidates`` continuations of the pending token,
  from the pool (most recent first) and, with ``use_context``, from earlier occurrences of the
  row's last tokens in its own context (prompt lookup, :mod:`specdecode.drafters.ngram`),
  merged into a trie rooted at the pending token.

On a CPU every side token costs (a forward over 16 tokens costs well over a one-token step),
so the lookahead branch runs only while its n-grams pay: the drafter keeps a moving average
of the tokens accepted per step through a pool continuation (not also proposed from the
context), and while it is below ``min_pool_gain`` the branch runs once every
``explore_every`` steps only (and not in the first step, whose pool is empty).
``min_pool_gain=0`` runs it at every step, as the method was published. A step without the
branch whose trie is a single path in every row (or empty) is proposed as a chain of at most
``num_draft_tokens`` tokens (default: the trie's depth), which the target scores without the
tree path's per-node mask.

The trie is a function of the context and of the drafter's own past (the pool and the
window, which never depend on the generation's coins), so the ``deterministic`` tree rule
verifies it losslessly at any temperature (``greedy`` at temperature 0). The window's update
always takes the argmax: it only shapes what is proposed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from specdecode.drafters.base import CommitUpdate, DrafterBase, DraftState, Proposal, SideTokens
from specdecode.drafters.ngram import check_occurrence, merge_into_trie, ngram_candidates, packed_contexts
from specdecode.trees.tree import TokenTree


def lookahead_mask(window: int, levels: int) -> torch.Tensor:
    """Who sees whom among the lookahead branch's ``levels x window`` side tokens (level-major:
    token ``i * window + j`` is level ``i``, column ``j``): level 0 is causal, and level ``i``
    of column ``j`` sees level 0's columns ``0..j`` and levels ``1..i`` of column ``j``.

    Shape:
        returns ``[levels * window, levels * window]`` bool.
    """
    i = torch.arange(levels).repeat_interleave(window)
    j = torch.arange(window).repeat(levels)
    to_level0 = (i[None, :] == 0) & (j[None, :] <= j[:, None])
    up_the_column = (i[None, :] >= 1) & (i[None, :] <= i[:, None]) & (j[None, :] == j[:, None])
    return to_level0 | up_the_column


def lookahead_offsets(window: int, levels: int) -> torch.Tensor:
    """Each side token's position after the pending token's: ``1 + i + j``. Shape: ``[S]``."""
    return 1 + torch.arange(levels).repeat_interleave(window) + torch.arange(window).repeat(levels)


class LookaheadDrafter(DrafterBase):
    """Lookahead decoding (see the module docstring).

    Args:
        window: ``W``, columns of the lookahead branch (>= 1).
        ngram: ``N``, the n-gram size (>= 2): ``N - 1`` levels, continuations of ``N - 1`` tokens.
        max_candidates: ``G``, continuations merged into the trie (>= 1; None: ``window``).
        use_context: also propose prompt-lookup continuations from the row's own context.
        context_candidates: how many (>= 1), each up to ``context_depth`` (>= 1) tokens long.
        max_pool: continuations kept per key token (>= 1; None: ``max_candidates``).
        min_pool_gain: tokens per step the pool must give (moving average) for the lookahead
            branch to run at every step (>= 0; 0: always).
        explore_every: how often the branch runs otherwise (every that many steps, >= 1).
        seed: seeds the window's first guess (tokens drawn from the row's context).
        occurrence: which earlier occurrence the context continuations copy from first:
            ``"recent"`` or ``"first"`` (as :class:`~specdecode.drafters.NgramDrafter`).

    Every target call scores ``1 + G (N - 1)`` tree nodes at most plus ``W (N - 1)`` side
    tokens: on a GPU nearly free, on a CPU keep ``W`` and ``N`` small.

    Example:
        >>> out = specdecode.generate(target, LookaheadDrafter(window=4, ngram=3), input_ids)
    """

    name = "lookahead"

    def __init__(self, window: int = 4, ngram: int = 3, max_candidates: int | None = None, use_context: bool = True,
                 context_candidates: int = 2, context_depth: int = 6, max_pool: int | None = None,
                 min_pool_gain: float = 0.0, explore_every: int = 4, seed: int = 0, occurrence: str = "recent") -> None:
        _check_int("window", window, 1)
        _check_int("ngram", ngram, 2)
        _check_int("context_candidates", context_candidates, 1)
        _check_int("context_depth", context_depth, 1)
        _check_int("explore_every", explore_every, 1)
        if isinstance(min_pool_gain, bool) or not isinstance(min_pool_gain, (int, float)):
            raise TypeError(f"min_pool_gain: expected a number >= 0, got {min_pool_gain!r}")
        if min_pool_gain < 0:
            raise ValueError(f"min_pool_gain: expected a number >= 0, got {min_pool_gain}")
        if max_candidates is not None:
            _check_int("max_candidates", max_candidates, 1)
        if max_pool is not None:
            _check_int("max_pool", max_pool, 1)
        if not isinstance(use_context, bool):
            raise TypeError(f"use_context: expected a bool, got {use_context!r}")
        _check_int("seed", seed, 0)
        self.occurrence = check_occurrence(occurrence)
        self.window, self.ngram = window, ngram
        self.max_candidates = window if max_candidates is None else max_candidates
        self.max_pool = self.max_candidates if max_pool is None else max_pool
        self.use_context, self.seed = use_context, seed
        self.context_candidates, self.context_depth = context_candidates, context_depth
        self.min_pool_gain, self.explore_every = float(min_pool_gain), explore_every
        # What generate drafts per chain step unless told otherwise: a whole trie path.
        self.default_num_draft_tokens = max(ngram - 1, context_depth if use_context else 0)
        self._mask = lookahead_mask(window, ngram - 1)
        self._offsets = lookahead_offsets(window, ngram - 1)
        self.harvested = 0  # n-grams put into the pools since this drafter was made
        self.reset()

    def reset(self) -> None:
        """Forget every row's window and pool (a new generation)."""
        self._levels: dict[int, np.ndarray] = {}  # caller row -> [N - 1, W] token ids
        self._pools: dict[int, dict[int, list[tuple[int, ...]]]] = {}  # caller row -> key -> continuations
        self._rows: list[int] = []  # the caller rows of the last proposal, in its row order
        self._rng = np.random.default_rng(self.seed)
        self._pool_first: list[set[int]] = []  # per row of the last proposal: first tokens only the pool proposed
        self._tree_tokens: np.ndarray | None = None
        self._ran_side = False
        self.pool_gain = 1.0  # moving average of tokens accepted per step through the pool (optimistic start)
        self._steps = 0

    def describe(self) -> dict[str, Any]:  # noqa: D102
        return {"drafter": self.name, "window": self.window, "ngram": self.ngram, "max_candidates": self.max_candidates}

    # ------------------------------------------------------------------ propose
    def propose(self, state: DraftState, num_tokens: int) -> Proposal:
        """A trie of pool and context continuations, and the lookahead window as side tokens."""
        rows = [int(r) for r in state.row_ids.tolist()]
        contexts = [c.tolist() for c in state.contexts()]
        pool_depth, count = self.ngram - 1, self.max_candidates
        ctx_count = self.context_candidates if self.use_context else 0
        depth = max(pool_depth, self.context_depth if ctx_count else 0)
        paths = np.zeros((len(rows), ctx_count + count, depth), dtype=np.int64)
        lengths = np.zeros((len(rows), ctx_count + count), dtype=np.int64)
        if ctx_count:
            cols = state.num_columns
            packed, real = packed_contexts(state.tokens[:, :cols].cpu().numpy(),
                                           state.attention_mask[:, :cols].cpu().numpy())
            found, found_len = ngram_candidates(packed, real, ctx_count, self.context_depth, 3, 1, extend_period=True,
                                                occurrence=self.occurrence)
            invalid = found >= state.vocab_size
            found_len = np.minimum(found_len, np.where(invalid.any(2), invalid.argmax(2), self.context_depth))
            paths[:, :ctx_count, : self.context_depth], lengths[:, :ctx_count] = found, found_len
        levels, self._pool_first = [], []
        for r, (row, context) in enumerate(zip(rows, contexts)):
            if row not in self._levels:
                self._levels[row] = self._rng.choice(np.asarray(context), size=(pool_depth, self.window))
                self._pools[row] = {}
            for m, continuation in enumerate(self._pools[row].get(context[-1], [])[:count]):
                paths[r, ctx_count + m, : len(continuation)] = continuation
                lengths[r, ctx_count + m] = len(continuation)
            from_context = {int(paths[r, m, 0]) for m in range(ctx_count) if lengths[r, m]}
            self._pool_first.append({int(paths[r, m, 0]) for m in range(ctx_count, ctx_count + count)
                                     if lengths[r, m]} - from_context)
            levels.append(self._levels[row].reshape(-1))
        self._rows = rows
        device = state.device
        pending = state.tokens[:, state.num_columns - 1]
        max_nodes = 1 + int(lengths.sum(1).max(initial=0))
        tokens, parents, num_nodes = merge_into_trie(paths, lengths, max(max_nodes, 2))
        width = int(num_nodes.max())
        self._tree_tokens = tokens[:, : width - 1]
        self._steps += 1
        # When the branch must pay (min_pool_gain > 0), not in a generation's first step: the
        # pool is empty then, and without side tokens a one-path trie is a chain, which the
        # engine scores in the prompt's own forward (one target call fewer).
        first_gated = self._steps == 1 and self.min_pool_gain > 0
        self._ran_side = not first_gated and (self.pool_gain >= self.min_pool_gain
                                              or self._steps % self.explore_every == 0)
        if not self._ran_side and _all_paths(parents[:, : width - 1], num_nodes):
            # No side tokens and every row's trie is one path (or empty): verify it as a chain,
            # which costs less than the tree path's per-node mask (a plain step when it is empty).
            # A chain holds at most num_tokens drafts (default: the trie's depth).
            k = min(width - 1, num_tokens)
            counts = torch.from_numpy(np.minimum(num_nodes - 1, k)).to(state.device) if k else None
            return Proposal(torch.from_numpy(np.ascontiguousarray(tokens[:, :k])).to(state.device), None,
                            num_draft_tokens=counts)
        tree = TokenTree(torch.cat([pending[:, None], torch.from_numpy(tokens[:, : width - 1]).to(device)], 1),
                         torch.cat([torch.full((len(rows), 1), -1, dtype=torch.long),
                                    torch.from_numpy(parents[:, : width - 1])], 1).to(device),
                         torch.from_numpy(num_nodes).to(device))
        side = None
        if self._ran_side:
            position = state.positions[:, state.num_columns - 1]
            side = SideTokens(torch.from_numpy(np.stack(levels)).to(device),
                              position[:, None] + self._offsets.to(device)[None], self._mask)
        return Proposal(tree.tokens, None, tree=tree, children="deterministic", side=side)

    # ------------------------------------------------------------------ commit
    def commit(self, update: CommitUpdate) -> None:
        """One Jacobi step of every row's window from the side tokens' logits; harvest n-grams."""
        if not self._rows:
            return
        self._credit_pool(update)
        if update.side_logits is None:
            self._rows = []
            return
        levels = self.ngram - 1
        top = update.side_logits.argmax(-1).view(len(self._rows), levels, self.window)[:, -1].cpu().numpy()
        for r, row in enumerate(self._rows):
            window = self._levels[row]
            grams = np.concatenate([window, top[r][None]], 0)  # [N, W]: each column one n-gram
            pool = self._pools[row]
            for j in range(self.window):
                key, continuation = int(grams[0, j]), tuple(int(t) for t in grams[1:, j])
                known = pool.setdefault(key, [])
                if continuation in known:
                    known.remove(continuation)
                known.insert(0, continuation)
                del known[self.max_pool:]
                self.harvested += 1
            self._levels[row] = grams[1:]
        self._rows = []

    def _credit_pool(self, update: CommitUpdate) -> None:
        """Move ``pool_gain`` toward this step's tokens accepted through a pool continuation."""
        if self._tree_tokens is None:
            return
        accepted = update.accepted_len.tolist()
        if update.accepted_nodes is None:  # a chain step: its first draft is node 1
            first = [1] * len(accepted)
        else:
            first = update.accepted_nodes[:, 1].tolist() if update.accepted_nodes.shape[1] > 1 else [0] * len(accepted)
        credit = [n if n > 0 and node > 0 and int(self._tree_tokens[r, node - 1]) in self._pool_first[r] else 0
                  for r, (n, node) in enumerate(zip(accepted, first))]
        self.pool_gain = 0.75 * self.pool_gain + 0.25 * (sum(credit) / max(len(credit), 1))


def _all_paths(parents: np.ndarray, num_nodes: np.ndarray) -> bool:
    """True when every row's trie is a single path: node i's parent is node i - 1.

    Shape:
        parents: ``[b, n]`` — the parents of nodes 1..n (node 0, the pending token, left out).
        num_nodes: ``[b]`` — nodes per row, node 0 included.
    """
    chain = np.arange(parents.shape[1])[None, :]
    used = chain < (num_nodes[:, None] - 1)
    return bool(np.all((parents == chain) | ~used))


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int >= {minimum}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value}")
