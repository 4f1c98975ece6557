"""``SuffixDrafter``: retrieval from earlier generations and a corpus of token sequences
(SuffixDecoding, Oliaro et al. 2024; REST, He et al. 2023, for a fixed datastore); no model.

Each step, every row looks for its own last tokens in a haystack made of a shared
:class:`TokenCorpus` (documents the user added, and by default every generation the drafter
finished) followed by the row's own context. Among the occurrences whose match with the row's
suffix is longest, it counts what followed them: each continuation prefix ``x_1..x_j`` gets the
fraction ``c / M`` of the ``M`` occurrences it followed, the empirical probability that the
text goes on that way. The proposal keeps the most frequent prefixes (a tree) or follows the most
frequent next token (a chain), as long as that fraction stays at or above ``min_token_prob``, and
never deeper than ``max_spec_factor`` times the match length: a long match is a strong hint, a
one-token match a weak one.

Matching is vectorised over the haystack (NumPy, on the host): ``max_ngram`` elementwise
comparisons find the occurrences of the row's last ``n <= max_ngram`` tokens; the candidates at the
longest ``n`` are then extended backwards, up to ``max_match`` tokens, to measure their true match
length. The cost per row and step is ``O(H * max_ngram)`` for a haystack of ``H`` tokens, which
``TokenCorpus(max_tokens=...)`` bounds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from specdecode.drafters.base import CommitUpdate, DrafterBase, DraftState, Proposal
from specdecode.drafters.ngram import TRIE, _check_int, _host, packed_contexts, trie_copy
from specdecode.trees.tree import TokenTree

_SEPARATOR = -1  # between documents of a haystack: nothing matches it and no continuation crosses it


class TokenCorpus:
    """Token sequences a :class:`SuffixDrafter` retrieves from, shared by reference: every
    drafter given the same corpus reads it and (with ``remember=True``) adds its finished
    generations to it. The oldest documents are dropped once the corpus holds more than
    ``max_tokens`` tokens.

    Args:
        sequences: documents to start with (each a 1-D sequence of token ids: a list, a tuple, a
            NumPy array or a tensor), or None.
        max_tokens: the most tokens kept (an int >= 1).

    Example:
        >>> corpus = TokenCorpus([[5, 6, 7, 8]], max_tokens=10_000)
        >>> corpus.add([torch.tensor([5, 6, 9])])
        >>> corpus.num_documents, corpus.num_tokens
        (2, 7)
    """

    def __init__(self, sequences: Iterable[Any] | None = None, max_tokens: int = 200_000) -> None:
        _check_int("max_tokens", max_tokens, 1)
        self.max_tokens = max_tokens
        self._documents: list[np.ndarray] = []
        self._num_tokens = 0
        self._haystack: np.ndarray | None = None  # the documents joined, rebuilt after a change
        if sequences is not None:
            self.add(sequences)

    @property
    def num_documents(self) -> int:
        return len(self._documents)

    @property
    def num_tokens(self) -> int:
        return self._num_tokens

    def add(self, sequences: Iterable[Any]) -> None:
        """Add documents (copies: the caller's sequences are not kept), dropping the oldest
        ones past ``max_tokens``. Each must be a 1-D sequence of non-negative integer ids."""
        if isinstance(sequences, (str, bytes)) or not isinstance(sequences, Iterable):
            raise TypeError(f"sequences: expected an iterable of token-id sequences, got {type(sequences).__name__}")
        documents = [_as_document(s, i) for i, s in enumerate(sequences)]
        for doc in documents:
            if len(doc):
                self._documents.append(doc)
                self._num_tokens += len(doc)
        while self._num_tokens > self.max_tokens and self._documents:
            self._num_tokens -= len(self._documents.pop(0))
        self._haystack = None

    def clear(self) -> None:
        """Forget every document."""
        self._documents, self._num_tokens, self._haystack = [], 0, None

    def haystack(self) -> np.ndarray:
        """The documents in order, each followed by a separator (-1).

        Shape:
            returns ``[num_tokens + num_documents]`` int64.
        """
        if self._haystack is None:
            parts = [np.append(doc, _SEPARATOR) for doc in self._documents]
            self._haystack = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        return self._haystack


def _as_document(sequence: Any, index: int) -> np.ndarray:
    if isinstance(sequence, Tensor):
        sequence = sequence.detach().cpu().numpy()
    array = np.asarray(sequence)
    if array.ndim != 1 or not (np.issubdtype(array.dtype, np.integer) or array.size == 0):
        raise TypeError(f"sequences[{index}]: expected a 1-D sequence of integer token ids, got shape "
                        f"{array.shape} of {array.dtype}")
    if array.size and int(array.min()) < 0:
        raise ValueError(f"sequences[{index}]: token ids must be >= 0, got {int(array.min())}")
    return array.astype(np.int64, copy=True)


def longest_matches(haystack: np.ndarray, context_len: int, max_ngram: int, min_ngram: int, max_match: int
                    ) -> tuple[np.ndarray, int]:
    """The occurrences of the haystack's own suffix that match it longest.

    The haystack ends with the row's context (its last ``context_len`` tokens); an occurrence
    ends at ``e`` when the tokens ending at ``e`` equal the haystack's last tokens, something
    other than a separator follows ``e``, and ``e`` is not the last position. The longest ``n``
    in ``[min_ngram, max_ngram]`` with an occurrence is found first; its occurrences are then
    extended backwards up to ``max_match`` tokens (never across a separator, never beyond the
    context's first token), and those with the longest match are returned, oldest first.

    Shape:
        haystack: ``[H]`` int64. Returns ``(ends [M] int64, match length)``; ``M = 0`` (and
        length 0) when nothing matches ``min_ngram`` tokens.
    """
    size = len(haystack)
    num_ends = size - 1
    if num_ends <= 0 or context_len < min_ngram:
        return np.zeros(0, dtype=np.int64), 0
    matches = haystack[1:] != _SEPARATOR  # something follows the end
    best = np.zeros(0, dtype=np.int64)
    found = 0
    for n in range(1, min(max_ngram, context_len, num_ends) + 1):
        i = n - 1
        if i:
            matches[:i] = False
        matches[i:] &= haystack[: num_ends - i] == haystack[size - 1 - i]
        if n >= min_ngram:
            ends = np.flatnonzero(matches)
            if not len(ends):
                break
            best, found = ends, n
    if not found:
        return best, 0
    if found == max_ngram and max_match > found:  # measure how far the longest ones really match
        back = np.arange(found, min(max_match, context_len))
        index = best[:, None] - back[None, :]
        ok = index >= 0
        same = ok & (haystack[np.maximum(index, 0)] == haystack[size - 1 - back][None, :])
        extra = np.logical_and.accumulate(same, axis=1).sum(1) if len(back) else np.zeros(len(best), np.int64)
        longest = int(extra.max())
        return best[extra == longest], found + longest
    return best, found


def continuations(haystack: np.ndarray, ends: np.ndarray, depth: int, vocab_size: int) -> list[tuple[int, ...]]:
    """What followed each occurrence, up to ``depth`` tokens, cut at a separator, at the end of
    the haystack and at the first id the target cannot score (``>= vocab_size``).

    Shape:
        haystack: ``[H]`` int64; ends: ``[M]`` int64 positions in it. Returns ``M`` tuples of at
        most ``depth`` ids, in the order of ``ends``.
    """
    out = []
    size = len(haystack)
    for end in ends.tolist():
        follow = haystack[end + 1: min(end + 1 + depth, size)]
        stop = np.flatnonzero((follow < 0) | (follow >= vocab_size))
        out.append(tuple(follow[: stop[0] if len(stop) else len(follow)].tolist()))
    return out


def frequent_prefixes(paths: list[tuple[int, ...]], max_nodes: int, min_token_prob: float
                      ) -> list[tuple[int, ...]]:
    """The prefixes of ``paths`` (most recent last) followed by the largest fraction of them,
    at most ``max_nodes``, each followed by at least ``min_token_prob`` of all paths; most
    frequent first, then shallower, then the most recently seen. The list is prefix-closed and
    every prefix comes after its own prefixes (a prefix is never rarer than its extensions)."""
    counts: dict[tuple[int, ...], int] = {}
    recency: dict[tuple[int, ...], int] = {}
    for rank, path in enumerate(paths):
        for j in range(1, len(path) + 1):
            prefix = path[:j]
            counts[prefix] = counts.get(prefix, 0) + 1
            recency[prefix] = rank
    floor = min_token_prob * len(paths)
    kept = [p for p, c in counts.items() if c >= floor]
    kept.sort(key=lambda p: (-counts[p], len(p), -recency[p]))
    return kept[:max_nodes]


def frequent_path(paths: list[tuple[int, ...]], max_tokens: int, min_token_prob: float) -> tuple[int, ...]:
    """Follow the most frequent next token (ties: the most recently seen) while the prefix so
    far is followed by at least ``min_token_prob`` of all paths, at most ``max_tokens`` tokens."""
    chosen: tuple[int, ...] = ()
    alive = list(range(len(paths)))
    floor = min_token_prob * len(paths)
    while len(chosen) < max_tokens:
        counts: dict[int, int] = {}
        recency: dict[int, int] = {}
        for rank in alive:
            path = paths[rank]
            if len(path) > len(chosen):
                token = path[len(chosen)]
                counts[token] = counts.get(token, 0) + 1
                recency[token] = rank
        if not counts:
            break
        token = max(counts, key=lambda t: (counts[t], recency[t]))
        if counts[token] < floor:
            break
        chosen += (token,)
        alive = [rank for rank in alive if len(paths[rank]) > len(chosen) - 1 and paths[rank][len(chosen) - 1] == token]
    return chosen


class SuffixDrafter(DrafterBase):
    """SuffixDecoding: drafts what most often followed the row's last tokens in earlier
    generations, in documents you give it and in the row's own context; no model.

    Each step, for every row: the occurrences of its suffix in its :class:`TokenCorpus` and in
    its own context (the longest ``n <= max_ngram`` with any occurrence, extended backwards up to
    ``max_match`` tokens; the occurrences matching longest are kept, at most ``max_candidates``,
    the most recent), then what followed them, counted (see :func:`frequent_prefixes`). A chain
    follows the most frequent next token; a trie (``num_nodes``) keeps the most frequent
    continuation prefixes. Either stops where the fraction of occurrences that continue that way
    falls below ``min_token_prob``, and at ``max_spec_factor * match length`` tokens deep.

    **Memory** (``remember=True``): at :meth:`reset` (the start of the next generation) the
    contexts of the generation just finished, prompt and output as last seen by :meth:`propose`,
    join the corpus, so repeated or similar requests (the same prompt sampled again, an agent's
    next turn, a rollout of the same task) draft from what the target wrote before. Drafters
    given the same ``corpus`` share it.

    The proposal is a deterministic function of the context and of the corpus fixed before the
    generation started, so it is verified against a point mass (chains: ``q`` one-hot; tries: the
    ``deterministic`` tree rule, ``greedy`` at temperature 0, distinct siblings): sampling keeps
    the target's distribution and greedy output is the target's.

    Args:
        corpus: a :class:`TokenCorpus` (shared by reference), a list of token sequences (a new
            corpus of them), or None (a new empty corpus).
        remember: add every finished generation to the corpus.
        max_ngram: longest suffix found by the vectorised search (>= 1); longer matches are
            measured from its occurrences.
        min_ngram: shortest suffix that counts as a match (1 <= min_ngram <= max_ngram).
        max_match: longest match measured (>= max_ngram).
        max_candidates: most occurrences counted per row and step (>= 1).
        min_token_prob: the smallest fraction of occurrences a drafted prefix must be followed
            by, in [0, 1] (the paper's default is 0.1; 0.4 with the factor 2 was chosen on
            SmolLM2's tune inputs, where every verified column costs the CPU a little).
        max_spec_factor: drafts at most ``ceil(max_spec_factor * match length)`` tokens deep
            (> 0; the paper's default is 1).
        num_nodes: None (chains) or the largest trie, root included (an int >= 2).
        tree_depth: the deepest trie path (>= 1).

    Example:
        >>> drafter = SuffixDrafter()  # remembers what it generated
        >>> for prompt in prompts:
        ...     out = specdecode.generate(target, drafter, prompt, num_draft_tokens=8)
        >>> drafter = SuffixDrafter(TokenCorpus(tokenized_documents), num_nodes=16)  # a datastore, tries
    """

    name = "suffix"
    #: Its chains and tries run on the static decode path too, proposed on the host between steps.
    static_host_drafts = True
    #: Chains ``generate`` drafts when not told (chosen with ``min_token_prob`` and
    #: ``max_spec_factor`` on the tune inputs of ``benchmarks/bench_suffix.py``).
    default_num_draft_tokens = 12

    def __init__(self, corpus: TokenCorpus | Iterable[Any] | None = None, remember: bool = True, max_ngram: int = 4,
                 min_ngram: int = 1, max_match: int = 32, max_candidates: int = 64, min_token_prob: float = 0.4,
                 max_spec_factor: float = 2.0, num_nodes: int | None = None, tree_depth: int = 8) -> None:
        if corpus is None:
            corpus = TokenCorpus()
        elif not isinstance(corpus, TokenCorpus):
            if isinstance(corpus, (str, bytes)) or not isinstance(corpus, Iterable):
                raise TypeError(f"corpus: expected a TokenCorpus, token-id sequences or None, got "
                                f"{type(corpus).__name__}")
            try:
                corpus = TokenCorpus(corpus)
            except (TypeError, ValueError) as exc:  # name the argument the caller passed
                raise type(exc)(f"corpus: {exc}") from None
        if not isinstance(remember, bool):
            raise TypeError(f"remember: expected a bool, got {remember!r}")
        for arg, value, minimum in (("max_ngram", max_ngram, 1), ("min_ngram", min_ngram, 1),
                                    ("max_match", max_match, 1), ("max_candidates", max_candidates, 1),
                                    ("tree_depth", tree_depth, 1)):
            _check_int(arg, value, minimum)
        if min_ngram > max_ngram:
            raise ValueError(f"min_ngram: expected min_ngram <= max_ngram = {max_ngram}, got {min_ngram}")
        if max_match < max_ngram:
            raise ValueError(f"max_match: expected max_match >= max_ngram = {max_ngram}, got {max_match}")
        for arg, value in (("min_token_prob", min_token_prob), ("max_spec_factor", max_spec_factor)):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{arg}: expected a float, got {value!r}")
        if not 0.0 <= min_token_prob <= 1.0:
            raise ValueError(f"min_token_prob: expected a float in [0, 1], got {min_token_prob}")
        if not 0.0 < max_spec_factor < math.inf:
            raise ValueError(f"max_spec_factor: expected a finite float > 0, got {max_spec_factor}")
        if num_nodes is not None:
            _check_int("num_nodes", num_nodes, 2)
        self.corpus = corpus
        self.remember = remember
        self.max_ngram, self.min_ngram, self.max_match = max_ngram, min_ngram, max_match
        self.max_candidates = max_candidates
        self.min_token_prob = float(min_token_prob)
        self.max_spec_factor = float(max_spec_factor)
        self.num_nodes, self.tree_depth = num_nodes, tree_depth
        self._seen: dict[int, np.ndarray] = {}  # caller's row -> its context at the last proposal

    def reset(self) -> None:
        if self.remember and self._seen:
            self.corpus.add(self._seen[row] for row in sorted(self._seen))
        self._seen = {}

    def describe(self) -> dict[str, Any]:
        return {"drafter": self.name, "corpus_tokens": self.corpus.num_tokens, "remember": self.remember,
                "max_ngram": self.max_ngram, "max_match": self.max_match, "min_token_prob": self.min_token_prob,
                "max_spec_factor": self.max_spec_factor, "num_nodes": self.num_nodes,
                "tree_depth": self.tree_depth if self.num_nodes else None}

    def with_tree(self, tree: Any = TRIE, num_nodes: int = 16, tree_depth: int | None = None,
                  tree_children: str | None = None) -> SuffixDrafter:
        """A copy of this drafter that drafts tries (``generate``'s ``tree=`` arguments land
        here); it shares this drafter's corpus, so what it generates is remembered there.
        ``tree`` must be ``"trie"`` (the other builders rank children by draft probabilities),
        ``tree_children`` None or ``"deterministic"``; ``tree_depth`` None keeps this one's."""
        clone = trie_copy(self, tree, num_nodes, tree_depth, tree_children, "retrieved continuations")
        clone._seen = {}
        return clone

    def _row_paths(self, corpus: np.ndarray, context: np.ndarray, depth: int, vocab_size: int
                   ) -> tuple[list[tuple[int, ...]], int]:
        """The continuations counted for one row (oldest first) and its match length."""
        haystack = np.concatenate([corpus, context])
        ends, length = longest_matches(haystack, len(context), self.max_ngram, self.min_ngram, self.max_match)
        if not length:
            return [], 0
        ends = ends[-self.max_candidates:]
        depth = min(depth, max(1, math.ceil(self.max_spec_factor * length)))
        return continuations(haystack, ends, depth, vocab_size), length

    def propose(self, state: DraftState, num_tokens: int) -> Proposal:
        columns = state.num_columns
        packed, lengths = packed_contexts(_host(state.tokens[:, :columns]), _host(state.attention_mask[:, :columns]))
        corpus = self.corpus.haystack()
        row_ids = _host(state.row_ids).tolist()
        tree = self.num_nodes is not None
        depth = self.tree_depth if tree else num_tokens
        drafts: list[Any] = []
        for r in range(state.batch_size):
            context = packed[r, packed.shape[1] - int(lengths[r]):]
            if self.remember:
                self._seen[row_ids[r]] = context.copy()
            paths, _ = self._row_paths(corpus, context, depth, state.vocab_size)
            if tree:
                drafts.append(frequent_prefixes(paths, self.num_nodes - 1, self.min_token_prob) if paths else [])
            else:
                drafts.append(frequent_path(paths, num_tokens, self.min_token_prob) if paths else ())
        if tree:
            return self._trie_proposal(state, drafts)
        counts = np.array([len(d) for d in drafts], dtype=np.int64)
        longest = int(counts.max()) if len(counts) else 0
        tokens = np.zeros((state.batch_size, longest), dtype=np.int64)
        for r, draft in enumerate(drafts):
            tokens[r, : len(draft)] = draft
            tokens[r, len(draft):] = draft[-1] if draft else 0
        device = state.device
        return Proposal(torch.from_numpy(tokens).to(device), None, torch.from_numpy(counts).to(device))

    def _trie_proposal(self, state: DraftState, rows: list[list[tuple[int, ...]]]) -> Proposal:
        width = 1 + max((len(nodes) for nodes in rows), default=0)
        if width <= 1:  # no row found anything: a plain decoding step
            return Proposal(state.tokens.new_zeros((state.batch_size, 0)))
        tokens = np.zeros((state.batch_size, width), dtype=np.int64)
        parents = np.full((state.batch_size, width), -1, dtype=np.int64)
        for r, nodes in enumerate(rows):
            index = {(): 0}
            for i, prefix in enumerate(nodes, start=1):
                index[prefix] = i
                tokens[r, i] = prefix[-1]
                parents[r, i] = index[prefix[:-1]]
        device = state.device
        tokens[:, 0] = _host(state.tokens[:, state.num_columns - 1])
        num_nodes = np.array([1 + len(nodes) for nodes in rows], dtype=np.int64)
        tree = TokenTree(torch.from_numpy(tokens).to(device), torch.from_numpy(parents).to(device),
                         torch.from_numpy(num_nodes).to(device))
        return Proposal(tree.tokens, None, tree=tree, children="deterministic")

    def commit(self, update: CommitUpdate) -> None:
        return None
