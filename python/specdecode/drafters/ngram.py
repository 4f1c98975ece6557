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

import numpy as np
import torch
from torch import Tensor

from specdecode.drafters.base import CommitUpdate, DrafterBase, DraftState, Proposal


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


def ngram_lookup(context: np.ndarray, lengths: np.ndarray, num_tokens: int, max_ngram: int, min_ngram: int,
                 extend_period: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The prompt-lookup proposal of every row of a packed batch (see :func:`packed_contexts`).

    For ``n`` from ``max_ngram`` down to ``min_ngram``, the first ``n`` for which the row's last
    ``n`` tokens occur earlier in the row decides, and its most recent earlier occurrence is
    used (occurrences may overlap the row's last tokens, never its left padding). The proposal
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
    num_ends = width - 1  # a match must end before the last token, so that something follows it
    if num_ends <= 0 or num_tokens <= 0:
        zeros = np.zeros(b, dtype=np.int64)
        return np.zeros((b, max(num_tokens, 0)), dtype=np.int64), zeros, zeros.copy()
    ends = np.arange(num_ends)
    last_end = np.zeros(b, dtype=np.int64)
    ngram = np.zeros(b, dtype=np.int64)
    matches = np.ones((b, num_ends), dtype=bool)
    for n in range(1, min(max_ngram, num_ends) + 1):
        i = n - 1  # compare the token i places before a match's end with the row's i-th last token
        if i:
            matches[:, :i] = False
        matches[:, i:] &= context[:, : num_ends - i] == context[:, width - 1 - i, None]
        if n < min_ngram:
            continue
        usable = matches & (lengths > i)[:, None]  # a row shorter than n has no n-gram of its own
        end = np.where(usable, ends, -1).max(1)  # the most recent occurrence
        hit = end >= 0
        last_end = np.where(hit, end, last_end)  # a longer n-gram overrides a shorter one
        ngram = np.where(hit, n, ngram)
    start = last_end + 1
    period = width - start  # tokens after the occurrence (>= 1)
    steps = np.arange(num_tokens)
    if extend_period:
        index = start[:, None] + steps[None, :] % period[:, None]
        counts = np.where(ngram > 0, num_tokens, 0)
    else:
        index = np.minimum(start[:, None] + steps[None, :], width - 1)
        counts = np.where(ngram > 0, np.minimum(period, num_tokens), 0)
    draft = np.take_along_axis(context, index, 1)
    draft = np.where(steps[None, :] >= counts[:, None], context[:, -1:], draft)
    return draft, counts, ngram


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

    Args:
        max_ngram: longest suffix to look up (>= 1).
        min_ngram: shortest suffix to look up (1 <= min_ngram <= max_ngram).
        max_lookback: search only the last ``max_lookback`` tokens of each row (None: all), to
            bound the per-step cost on very long contexts.
        extend_period: continue a copy that reaches the end of the context periodically.
        min_acceptance: cut proposals where the estimated acceptance probability of a position
            falls below this, in [0, 1) (0: never cut).
        prior_accepted, prior_rejected: pseudo-counts (> 0) of the per-position acceptance
            estimate before anything was verified.

    Example:
        >>> out = specdecode.generate(target, NgramDrafter(max_ngram=3), input_ids, num_draft_tokens=5)
    """

    name = "ngram"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, max_lookback: int | None = None,
                 extend_period: bool = True, min_acceptance: float = 0.2, prior_accepted: float = 3.0,
                 prior_rejected: float = 1.0) -> None:
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
                "min_acceptance": self.min_acceptance}

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

    def propose(self, state: DraftState, num_tokens: int) -> Proposal:
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
        draft, counts, ngram = ngram_lookup(context, lengths, num_tokens, self.max_ngram, self.min_ngram,
                                            self.extend_period)
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


def _host(tensor: Tensor) -> np.ndarray:
    """A tensor's values as a NumPy array (no copy for a CPU tensor)."""
    return tensor.detach().cpu().numpy()
