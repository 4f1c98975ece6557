"""``NgramDrafter``: prompt lookup. Each row drafts by copying what followed an earlier
occurrence of its own last few tokens; no model.

Matching is a handful of vectorised array operations over the whole batch, on the host (NumPy:
a few microseconds per operation, where a PyTorch CPU operation costs several times that and
the arrays are small; from a GPU the context crosses once per step, about ``8 * b * W`` bytes).
The rows' real tokens are first packed to the right of one ``[b, W]`` array (left padding and
the holes of rejected drafts squeezed out, ``-1`` in front); then for ``n = 1 .. max_ngram`` a
boolean ``[b, W]`` map marks the positions ``e`` where the ``n`` tokens ending at ``e`` equal
the row's last ``n`` tokens (each ``n`` adds one comparison to the map of ``n - 1``). The cost
per step is ``O(b * W * max_ngram)`` elementwise work, with no Python loop over rows or
positions.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
from torch import Tensor

from specdecode.drafters.base import CommitUpdate, DrafterBase, DraftState, Proposal
from specdecode.trees.tree import TokenTree

#: The one ``tree=`` value an n-gram drafter takes (see :meth:`NgramDrafter.with_tree`).
TRIE = "trie"


def packed_contexts(tokens: np.ndarray, attention_mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every row's real tokens, in order, right-aligned in one array padded with ``-1`` on the
    left; and each row's number of real tokens.

    Shape:
        tokens, attention_mask: ``[b, W]`` integers (mask 1 = real token, 0 = padding or a hole).
        returns: ``([b, W]`` int64, ``[b]`` int64).
    """
    b, width = tokens.shape
    real = attention_mask.astype(bool)
    lengths = real.sum(1)
    packed = np.full((b, width), -1, dtype=np.int64)
    # row-major order on both sides: row r's real tokens fill its last lengths[r] columns, in order
    packed[np.arange(width)[None, :] >= (width - lengths)[:, None]] = tokens[real]
    return packed, lengths


def match_levels(context: np.ndarray, lengths: np.ndarray, max_ngram: int, min_ngram: int) -> np.ndarray:
    """For every position ``e`` of a packed batch (see :func:`packed_contexts`) that something
    follows, the longest ``n`` in ``[min_ngram, max_ngram]`` such that the ``n`` tokens ending at
    ``e`` equal the row's last ``n`` tokens (0: none). Occurrences may overlap the row's last
    tokens, never its left padding.

    Shape:
        context: ``[b, W]`` int64; lengths: ``[b]`` int64. Returns ``[b, W - 1]`` int64.
    """
    b, width = context.shape
    num_ends = max(width - 1, 0)  # a match must end before the last token, so that something follows it
    level = np.zeros((b, num_ends), dtype=np.int64)
    matches = np.ones((b, num_ends), dtype=bool)
    for n in range(1, min(max_ngram, num_ends) + 1):
        i = n - 1  # compare the token i places before a match's end with the row's i-th last token
        if i:
            matches[:, :i] = False
        matches[:, i:] &= context[:, : num_ends - i] == context[:, width - 1 - i, None]
        if n >= min_ngram:
            level[matches & (lengths > i)[:, None]] = n  # a row shorter than n has no n-gram of its own
    return level


def _continuations(context: np.ndarray, ends: np.ndarray, found: np.ndarray, num_tokens: int,
                   extend_period: bool) -> tuple[np.ndarray, np.ndarray]:
    """What followed the occurrences ending at ``ends`` (``[b, M]``), ``num_tokens`` tokens each
    (periodically extended, or cut at the end of the context); ``(tokens [b, M, num_tokens],
    lengths [b, M])``, length 0 where ``found`` is False."""
    width = context.shape[1]
    start = ends + 1
    period = width - start  # tokens after the occurrence (>= 1)
    steps = np.arange(num_tokens)
    if extend_period:
        index = start[..., None] + steps % period[..., None]
        counts = np.full(ends.shape, num_tokens, dtype=np.int64)
    else:
        index = np.minimum(start[..., None] + steps, width - 1)
        counts = np.minimum(period, num_tokens)
    b = context.shape[0]
    tokens = np.take_along_axis(context, index.reshape(b, -1), 1).reshape(index.shape)
    return tokens, np.where(found, counts, 0)


def ngram_lookup(context: np.ndarray, lengths: np.ndarray, num_tokens: int, max_ngram: int, min_ngram: int,
                 extend_period: bool = True, occurrence: str = "recent") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The prompt-lookup proposal of every row of a packed batch (see :func:`packed_contexts`).

    For ``n`` from ``max_ngram`` down to ``min_ngram``, the first ``n`` for which the row's last
    ``n`` tokens occur earlier in the row decides, and its most recent earlier occurrence is
    used (``occurrence="first"``: its earliest, as Hugging Face's prompt lookup does;
    occurrences may overlap the row's last tokens, never its left padding). The proposal
    is what followed that occurrence, up to ``num_tokens`` tokens. When fewer follow it (the
    occurrence is ``P`` tokens before the row's end, ``P < num_tokens``), ``extend_period``
    continues the copy into the tokens just proposed, i.e. the last ``P`` tokens repeat, as an
    overlapping copy would; otherwise the row proposes only those ``P``. A row without any
    match proposes nothing.

    Shape:
        context: ``[b, W]`` int64, real tokens right-aligned, ``-1`` in front.
        lengths: ``[b]`` int64 real tokens per row.
        returns: ``(draft_tokens [b, num_tokens], num_draft_tokens [b], ngram [b])`` int64 —
        entries of a row beyond its count repeat its last token; ``ngram`` is the matched ``n``
        (0: none).
    """
    b, width = context.shape
    if width <= 1 or num_tokens <= 0:
        zeros = np.zeros(b, dtype=np.int64)
        return np.zeros((b, max(num_tokens, 0)), dtype=np.int64), zeros, zeros.copy()
    level = match_levels(context, lengths, max_ngram, min_ngram)
    # the longest n first, then its most recent (or earliest) occurrence
    best = (level * level.shape[1] + _occurrence_order(level.shape[1], occurrence)).argmax(1)
    ngram = np.take_along_axis(level, best[:, None], 1)[:, 0]
    draft, counts = _continuations(context, best[:, None], (ngram > 0)[:, None], num_tokens, extend_period)
    draft, counts = draft[:, 0], counts[:, 0]
    draft = np.where(np.arange(num_tokens)[None, :] >= counts[:, None], context[:, -1:], draft)
    return draft, counts, ngram


def ngram_candidates(context: np.ndarray, lengths: np.ndarray, num_candidates: int, num_tokens: int,
                     max_ngram: int, min_ngram: int, extend_period: bool = True, occurrence: str = "recent"
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Several prompt-lookup continuations per row, best first: the earlier occurrences of the
    row's suffix ordered by the length ``n`` of the suffix they match (longest first), then by
    recency (most recent first; ``occurrence="first"``: earliest first); each position counts
    once (at its longest ``n``). The first candidate is :func:`ngram_lookup`'s proposal.
    Missing candidates have length 0.

    Shape:
        context: ``[b, W]`` int64 packed; lengths: ``[b]`` int64.
        returns: ``(paths [b, M, num_tokens], path_lengths [b, M])`` int64 with
        ``M = num_candidates``.
    """
    b, width = context.shape
    if width <= 1:
        return np.zeros((b, num_candidates, num_tokens), dtype=np.int64), np.zeros((b, num_candidates), np.int64)
    level = match_levels(context, lengths, max_ngram, min_ngram)
    num_ends = level.shape[1]
    key = np.where(level > 0, level * num_ends + _occurrence_order(num_ends, occurrence), -1)
    take = min(num_candidates, num_ends)
    ends = np.argsort(-key, axis=1, kind="stable")[:, :take]
    found = np.take_along_axis(key, ends, 1) >= 0
    paths, path_lengths = _continuations(context, ends, found, num_tokens, extend_period)
    if take < num_candidates:
        paths = np.concatenate([paths, np.zeros((b, num_candidates - take, num_tokens), np.int64)], 1)
        path_lengths = np.concatenate([path_lengths, np.zeros((b, num_candidates - take), np.int64)], 1)
    return paths, path_lengths


OCCURRENCES = ("recent", "first")


def _occurrence_order(num_ends: int, occurrence: str) -> np.ndarray:
    """Rank of each match end among matches of one length: larger is preferred."""
    order = np.arange(num_ends)
    return order if occurrence == "recent" else num_ends - 1 - order


def check_occurrence(occurrence: Any, name: str = "occurrence") -> str:
    """``occurrence`` if it is one of :data:`OCCURRENCES`, else a ``ValueError`` naming ``name``."""
    if not isinstance(occurrence, str) or occurrence not in OCCURRENCES:
        raise ValueError(f"{name}: expected 'recent' or 'first', got {occurrence!r}")
    return occurrence


def merge_into_trie(paths: np.ndarray, path_lengths: np.ndarray, max_nodes: int
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merge every row's paths (in priority order) into one trie under a root, with at most
    ``max_nodes`` nodes, root included.

    The paths are inserted one after the other: a path's longest prefix already in the trie is
    shared, its remaining tokens become new nodes (so siblings are always distinct tokens, in
    the order of the first path that reached them), and insertion stops once ``max_nodes - 1``
    draft nodes exist (the last path may be cut). Nodes are numbered in insertion order, which
    is topological; node 0 is the root.

    Shape:
        paths: ``[b, M, D]`` int64; path_lengths: ``[b, M]`` int64 in ``[0, D]``.
        returns: ``(tokens [b, max_nodes - 1], parents [b, max_nodes - 1], num_nodes [b])`` int64
        — draft node ``j`` is tree node ``j + 1``; its parent is a tree node index (0: the
        root); slots beyond a row's nodes hold token 0 and parent -1; ``num_nodes`` counts the
        root.
    """
    b, M, D = paths.shape
    valid = np.arange(D)[None, None, :] < path_lengths[:, :, None]  # [b, M, D]
    # same_prefix[r, m, m2, d]: paths m and m2 agree on their first d + 1 tokens (both that long)
    same_prefix = np.logical_and.accumulate((paths[:, :, None, :] == paths[:, None, :, :]) & valid[:, None, :, :], 3)
    owner = same_prefix.argmax(2)  # the first path that reached the node (m, d); m itself when valid
    new = valid & (owner == np.arange(M)[None, :, None])
    order = new.reshape(b, M * D).cumsum(1).reshape(b, M, D)  # tree index of each new node
    kept = new & (order <= max_nodes - 1)
    own_index = np.where(kept, order, -1)
    index = np.take_along_axis(own_index, owner, 1)  # tree index of (m, d), -1 if not in the trie
    parent = np.concatenate([np.zeros((b, M, 1), np.int64), index[:, :, :-1]], 2)
    rows, ms, ds = np.nonzero(kept)
    slots = order[rows, ms, ds] - 1
    tokens = np.zeros((b, max_nodes - 1), dtype=np.int64)
    parents = np.full((b, max_nodes - 1), -1, dtype=np.int64)
    tokens[rows, slots] = paths[rows, ms, ds]
    parents[rows, slots] = parent[rows, ms, ds]
    return tokens, parents, 1 + kept.sum((1, 2))


class NgramDrafter(DrafterBase):
    """Prompt lookup decoding: each row proposes the tokens that followed the most recent
    earlier occurrence of its last ``n`` tokens in its own context (prompt and generated
    tokens), trying ``n = max_ngram`` first, down to ``min_ngram``.

    The proposal is what followed that occurrence, up to ``k`` tokens. When the occurrence is
    so recent that only ``P < k`` tokens follow it (a repetition, e.g. a loop of ``P``
    tokens), ``extend_period=True`` keeps copying into the tokens just proposed, so the last
    ``P`` tokens repeat (an overlapping copy); with ``extend_period=False`` the row proposes
    only those ``P``. Rows without a match propose nothing; when no row has a match the step is
    a plain decoding step.

    **Learned draft length** (``min_acceptance > 0``): a match on one token is a much weaker
    hint than a match on three, and every proposed token costs the target a column of its
    verification forward. The drafter counts, during each generation, how often draft
    position ``i`` was accepted after an ``n``-gram match (from the accepted lengths the engine
    commits; a prior of ``prior_accepted`` / ``prior_rejected`` pseudo-counts per position),
    and cuts each row's proposal before the first position whose estimated probability of
    being accepted is below ``min_acceptance``. ``min_acceptance=0`` always proposes the whole
    match (as Hugging Face's prompt lookup does). Set it near the cost of one verified column
    relative to a plain decoding step: larger on a CPU, small on a GPU at small batch.

    The proposal is a deterministic function of the context and of past acceptance counts, so
    it is verified against a point mass (``q`` one-hot on each proposed token): token
    verification accepts a proposed ``x`` with probability ``p(x)`` and otherwise samples from
    ``p`` without ``x``, which keeps sampling exactly the target's distribution; at temperature
    0 the output is the target's greedy output.

    **Trees** (``num_nodes``): instead of one continuation, each row collects several earlier
    occurrences of its suffix (longest ``n`` first, then most recent: the chain's proposal comes
    first) and merges what followed them into a trie of at most ``num_nodes`` nodes (root
    included; see :func:`merge_into_trie`): continuations that agree share one path, and where
    they diverge the distinct next tokens become siblings, in priority order. Each path is at
    most ``tree_depth`` tokens long. The trie is a deterministic function of the context, so it
    is verified with the ``deterministic`` tree rule (``greedy`` at temperature 0), which is
    lossless for distinct siblings. ``specdecode.generate(target, NgramDrafter(), ids,
    tree="trie", num_nodes=16)`` does the same through :meth:`with_tree`. The learned draft
    length (``min_acceptance``) applies to chains only; in a tree ``num_nodes`` bounds the cost.

    Args:
        max_ngram: longest suffix to look up (>= 1).
        min_ngram: shortest suffix to look up (1 <= min_ngram <= max_ngram).
        max_lookback: search only the last ``max_lookback`` tokens of each row (None: all), to
            bound the per-step cost on very long contexts.
        extend_period: continue a copy that reaches the end of the context periodically.
        occurrence: which earlier occurrence of the suffix to copy from: ``"recent"`` (the most
            recent) or ``"first"`` (the earliest, as Hugging Face's prompt lookup; it follows
            the prompt when the answer rewrites text given there).
        min_acceptance: cut proposals where the estimated acceptance probability of a position
            falls below this, in [0, 1) (0: never cut).
        prior_accepted: pseudo-count (> 0) of accepted drafts in the per-position acceptance
            estimate before anything was verified.
        prior_rejected: pseudo-count (> 0) of rejected drafts, likewise.
        num_nodes: None (chains), or the largest trie, root included (an int >= 2).
        tree_depth: the longest path of a trie (an int >= 1).

    Example:
        >>> out = specdecode.generate(target, NgramDrafter(max_ngram=3), input_ids, num_draft_tokens=5)
        >>> out = specdecode.generate(target, NgramDrafter(num_nodes=16), input_ids)  # tries
    """

    name = "ngram"
    #: Its chains and tries run on the static decode path too, proposed on the host between steps.
    static_host_drafts = True

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, max_lookback: int | None = None,
                 extend_period: bool = True, min_acceptance: float = 0.2, prior_accepted: float = 3.0,
                 prior_rejected: float = 1.0, num_nodes: int | None = None, tree_depth: int = 8,
                 occurrence: str = "recent") -> None:
        for arg, value in (("max_ngram", max_ngram), ("min_ngram", min_ngram)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{arg}: expected an int >= 1, got {value!r}")
            if value < 1:
                raise ValueError(f"{arg}: expected an int >= 1, got {value}")
        if min_ngram > max_ngram:
            raise ValueError(f"min_ngram: expected min_ngram <= max_ngram = {max_ngram}, got {min_ngram}")
        if max_lookback is not None:
            if isinstance(max_lookback, bool) or not isinstance(max_lookback, int):
                raise TypeError(f"max_lookback: expected an int >= 2 or None, got {max_lookback!r}")
            if max_lookback < 2:
                raise ValueError(f"max_lookback: expected an int >= 2 or None, got {max_lookback}")
        if not isinstance(extend_period, bool):
            raise TypeError(f"extend_period: expected a bool, got {extend_period!r}")
        for arg, value in (("min_acceptance", min_acceptance), ("prior_accepted", prior_accepted),
                           ("prior_rejected", prior_rejected)):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{arg}: expected a float, got {value!r}")
        if not 0.0 <= min_acceptance < 1.0:
            raise ValueError(f"min_acceptance: expected a float in [0, 1), got {min_acceptance}")
        for arg, value in (("prior_accepted", prior_accepted), ("prior_rejected", prior_rejected)):
            if not value > 0.0 or value == float("inf"):
                raise ValueError(f"{arg}: expected a finite float > 0, got {value}")
        if num_nodes is not None:
            _check_int("num_nodes", num_nodes, 2)
        _check_int("tree_depth", tree_depth, 1)
        self.occurrence = check_occurrence(occurrence)
        self.num_nodes = num_nodes
        self.tree_depth = tree_depth
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.max_lookback = max_lookback
        self.extend_period = extend_period
        self.min_acceptance = float(min_acceptance)
        self.prior_accepted = float(prior_accepted)
        self.prior_rejected = float(prior_rejected)
        self.reset()

    def reset(self) -> None:
        # verified[n, i] / accepted[n, i]: draft position i (0-based) after an n-gram match
        self.verified = np.zeros((self.max_ngram + 1, 0))
        self.accepted = np.zeros_like(self.verified)
        self._last: tuple[np.ndarray, np.ndarray] | None = None  # (ngram [b], counts [b]) of the last proposal

    def describe(self) -> dict:
        return {"drafter": self.name, "max_ngram": self.max_ngram, "min_ngram": self.min_ngram,
                "max_lookback": self.max_lookback, "extend_period": self.extend_period,
                "min_acceptance": self.min_acceptance, "occurrence": self.occurrence, "num_nodes": self.num_nodes,
                "tree_depth": self.tree_depth if self.num_nodes else None}

    def with_tree(self, tree: Any = TRIE, num_nodes: int = 16, tree_depth: int | None = None,
                  tree_children: str | None = None) -> NgramDrafter:
        """A copy of this drafter that drafts tries (``generate``'s ``tree=`` arguments land
        here; this drafter is not modified). ``tree`` must be ``"trie"``: the tree builders of
        draft models (``"dynamic"``, ``"sequoia"``, ``"static"``, shapes) rank or sample
        children by draft probabilities, which prompt lookup does not have, so they are refused.
        ``tree_children`` may only be None or ``"deterministic"``; ``tree_depth`` None keeps
        this drafter's."""
        clone = trie_copy(self, tree, num_nodes, tree_depth, tree_children, "n-gram matches")
        clone.reset()
        return clone

    def acceptance_estimates(self, num_tokens: int) -> np.ndarray:
        """Estimated probability that draft position ``i`` is accepted after an ``n``-gram match
        (the product of the per-position acceptance estimates up to ``i``).

        Shape:
            returns ``[max_ngram + 1, num_tokens]`` float64 (row ``n``; row 0 unused).
        """
        self._grow(num_tokens)
        a, r = self.prior_accepted, self.prior_rejected
        rate = (self.accepted[:, :num_tokens] + a) / (self.verified[:, :num_tokens] + a + r)
        return rate.cumprod(1)

    def _grow(self, num_tokens: int) -> None:
        extra = num_tokens - self.verified.shape[1]
        if extra > 0:
            pad = np.zeros((self.max_ngram + 1, extra))
            self.verified = np.concatenate([self.verified, pad], 1)
            self.accepted = np.concatenate([self.accepted, pad], 1)

    def _context(self, state: DraftState) -> tuple[np.ndarray, np.ndarray]:
        """The rows' real tokens, packed (see :func:`packed_contexts`), within ``max_lookback``."""
        columns = state.num_columns
        lo = 0
        if self.max_lookback is not None and not state.has_holes:
            lo = max(columns - self.max_lookback, 0)
        tokens = _host(state.tokens[:, lo:columns])
        if state.has_holes:
            context, lengths = packed_contexts(tokens, _host(state.attention_mask[:, :columns]))
            if self.max_lookback is not None and context.shape[1] > self.max_lookback:
                context = context[:, -self.max_lookback:]
                lengths = np.minimum(lengths, self.max_lookback)
        else:  # every column is a real token (batch 1, or no padding and no rejected drafts)
            context = tokens
            lengths = np.full(state.batch_size, columns - lo, dtype=np.int64)
        return context, lengths

    def propose(self, state: DraftState, num_tokens: int) -> Proposal:
        context, lengths = self._context(state)
        if self.num_nodes is not None:
            return self._propose_trie(state, context, lengths)
        draft, counts, ngram = ngram_lookup(context, lengths, num_tokens, self.max_ngram, self.min_ngram,
                                            self.extend_period, self.occurrence)
        if self.min_acceptance > 0.0:
            keep = self.acceptance_estimates(num_tokens) >= self.min_acceptance
            limit = keep.cumprod(1).sum(1)  # [max_ngram + 1]: positions before the first cut
            counts = np.minimum(counts, limit[ngram])
        # Ids the target cannot score (prompt ids beyond its logits) end a row's proposal.
        invalid = draft >= state.vocab_size
        counts = np.minimum(counts, np.where(invalid.any(1), invalid.argmax(1), num_tokens))
        draft = np.where(invalid, 0, draft)
        longest = int(counts.max()) if counts.size else 0
        self._last = (ngram, counts) if longest else None
        device = state.device
        return Proposal(torch.from_numpy(np.ascontiguousarray(draft[:, :longest])).to(device), None,
                        torch.from_numpy(counts.astype(np.int64)).to(device))

    def _propose_trie(self, state: DraftState, context: np.ndarray, lengths: np.ndarray) -> Proposal:
        """A trie of the continuations of several matches per row (``num_tokens`` is not used:
        ``num_nodes`` and ``tree_depth`` size the tree)."""
        assert self.num_nodes is not None
        # up to twice as many matches as draft nodes: identical continuations merge into one path
        paths, path_lengths = ngram_candidates(context, lengths, 2 * (self.num_nodes - 1), self.tree_depth,
                                               self.max_ngram, self.min_ngram, self.extend_period, self.occurrence)
        invalid = paths >= state.vocab_size  # ids the target cannot score end a path
        path_lengths = np.minimum(path_lengths, np.where(invalid.any(2), invalid.argmax(2), self.tree_depth))
        tokens, parents, num_nodes = merge_into_trie(paths, path_lengths, self.num_nodes)
        width = int(num_nodes.max()) if num_nodes.size else 1
        device = state.device
        if width <= 1:  # no row found anything: a plain decoding step
            return Proposal(state.tokens.new_zeros((state.batch_size, 0)))
        root = state.tokens[:, state.num_columns - 1]
        tree = TokenTree(torch.cat([root[:, None], torch.from_numpy(tokens[:, : width - 1]).to(device)], 1),
                         torch.from_numpy(np.concatenate([np.full((len(parents), 1), -1), parents[:, : width - 1]],
                                                         1)).to(device),
                         torch.from_numpy(num_nodes).to(device))
        return Proposal(tree.tokens, None, tree=tree, children="deterministic")

    def commit(self, update: CommitUpdate) -> None:
        last, self._last = self._last, None
        if last is None:
            return
        ngram, counts = last
        accepted = _host(update.accepted_len)
        k = int(counts.max())
        self._grow(k)
        positions = np.arange(k)
        # position i was verified when the proposal reached it and every earlier draft was accepted
        verified = positions[None, :] < np.minimum(accepted + 1, counts)[:, None]
        taken = positions[None, :] < accepted[:, None]
        for n in np.unique(ngram[counts > 0]):
            rows = ngram == n
            self.verified[n, :k] += verified[rows].sum(0)
            self.accepted[n, :k] += taken[rows].sum(0)


def trie_copy(drafter: Any, tree: Any, num_nodes: int, tree_depth: int | None, tree_children: str | None,
              what: str) -> Any:
    """A shallow copy of a drafter that drafts its own deterministic trie of ``what``, with
    ``num_nodes`` and ``tree_depth`` (None: the drafter's) set, after checking ``generate``'s
    ``tree=`` arguments: ``tree`` must be ``"trie"`` and ``tree_children`` None or
    ``"deterministic"``. The caller clears the copy's per-generation state."""
    who = type(drafter).__name__
    if not (isinstance(tree, str) and tree == TRIE):
        raise ValueError(
            f"tree: {who} drafts its own trie of {what} (tree={TRIE!r}), got {tree!r}; the 'dynamic', 'sequoia' and "
            f"'static' builders and tree shapes choose children by draft-model probabilities, which {who} does not have"
        )
    if tree_children not in (None, "deterministic"):
        raise ValueError(f"tree_children: the children of a {who} trie are deterministic (None or 'deterministic'), "
                         f"got {tree_children!r}")
    _check_int("num_nodes", num_nodes, 2)
    clone = copy.copy(drafter)
    clone.num_nodes = num_nodes
    if tree_depth is not None:
        _check_int("tree_depth", tree_depth, 1)
        clone.tree_depth = tree_depth
    return clone


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int >= {minimum}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value}")


def _host(tensor: Tensor) -> np.ndarray:
    """A tensor's values as a NumPy array (no copy for a CPU tensor)."""
    return tensor.detach().cpu().numpy()
