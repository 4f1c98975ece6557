"""Cascades: drafters composed of drafters, with no change to the engine.

- :class:`VerticalCascadeDrafter`: a draft model that is itself sped up by speculative decoding
  with a cheaper drafter inside (prompt lookup). The draft model still proposes a chain drawn
  from its own distribution ``q``, token by token, but one forward scores its next token *and*
  the n-gram guesses for the tokens after it; while the token it draws equals the guess, the
  logits for the following token are already computed.
- :class:`HorizontalCascadeDrafter`: different drafters by position. The first drafter (a
  model) drafts the first positions; prompt lookup continues the chain from there.

Why both stay lossless (the proof in our words is in docs/cascades.md):

- Vertical: token ``i`` is drawn from ``q(. | context, y_1..y_{i-1})`` with the same coin a
  plain :class:`~specdecode.drafters.ModelDrafter` would use; the inner guesses only decide
  *which forward* computed those logits. A guess is trusted only when the drawn token equals it
  (the draft's own greedy/sampled verification of the inner chain: accepting a point-mass guess
  ``c`` with probability ``q(c)`` and otherwise drawing from ``q`` without ``c`` is the same as
  drawing from ``q`` and comparing). So the outer proposal is distributed exactly as the draft
  model's chain, and its logits are the ``q`` it was drawn from.
- Horizontal: positions of the first drafter carry its logits; prompt-lookup positions are a
  deterministic function of the context and the tokens drafted before them, so their ``q`` is a
  point mass (:func:`~specdecode.drafters.point_mass_logits`). Every lossless chain rule checks
  each position against the distribution it was drawn from.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from specdecode.drafters.base import CommitUpdate, DrafterBase, DraftState, Proposal, point_mass_logits
from specdecode.drafters.model import ModelDrafter
from specdecode.drafters.ngram import NgramDrafter, ngram_lookup, packed_contexts
from specdecode.models import kv_cache
from specdecode.sampling import sample_logits

__all__ = ["HorizontalCascadeDrafter", "VerticalCascadeDrafter"]


def _model_drafter(draft: Any, arg: str) -> ModelDrafter:
    if isinstance(draft, ModelDrafter):
        if draft.tree is not None:
            raise ValueError(f"{arg}: cascades draft chains; pass a ModelDrafter without tree=")
        return draft
    if isinstance(draft, torch.nn.Module):
        return ModelDrafter(draft)
    raise TypeError(f"{arg}: expected a draft model or a ModelDrafter (LayerSkipDrafter, ExitAdapterDrafter, "
                    f"PartialCacheDrafter, ...), got {type(draft).__name__}")


def _host(tensor: Tensor) -> np.ndarray:
    return tensor.detach().cpu().numpy()


class VerticalCascadeDrafter(DrafterBase):
    """A draft model (``draft``: a model or any chain :class:`ModelDrafter`, e.g. an
    :class:`~specdecode.drafters.ExitAdapterDrafter`) drafting with prompt lookup inside.

    Each draft forward feeds the token drawn last and up to ``inner_tokens`` n-gram guesses
    for the tokens after it (``inner``'s ``max_ngram`` / ``min_ngram`` / ``extend_period``,
    looked up in the row's context followed by the tokens drafted so far). Position ``i`` of
    the proposal is drawn from the draft's logits after the Hugging Face processors, with the
    generation's sampling settings and one coin per row, exactly as :class:`ModelDrafter`
    draws it; a new forward is needed only for rows whose drawn token differs from their guess
    (or that ran out of guesses). Rows advance together, one draft position at a time; a row
    that still has valid logits feeds masked placeholder columns when another row needs a
    forward. At temperature 0 the proposal equals the draft model's greedy chain.

    The guesses' columns stay in the draft's cache during the step (masked for rows they do
    not belong to; columns no row uses are cut off at once). When, at the end of the step, every
    remaining column is valid for every row (always at batch 1) they are the drafted tokens in
    order and are kept like :class:`ModelDrafter` keeps its drafts; otherwise ``commit`` drops
    them and the next step feeds the accepted drafts again in its first forward.

    Example:
        >>> drafter = VerticalCascadeDrafter(draft_model, NgramDrafter(max_ngram=3), inner_tokens=4)
        >>> out = specdecode.generate(target, drafter, input_ids, num_draft_tokens=6)
    """

    name = "cascade_vertical"

    def __init__(self, draft: Any, inner: NgramDrafter | None = None, inner_tokens: int = 4) -> None:
        self.drafter = _model_drafter(draft, "draft")
        if inner is None:
            inner = NgramDrafter()
        if not isinstance(inner, NgramDrafter) or inner.num_nodes is not None:
            raise TypeError(f"inner: expected an NgramDrafter drafting chains, got {type(inner).__name__}")
        if isinstance(inner_tokens, bool) or not isinstance(inner_tokens, int) or inner_tokens < 1:
            raise ValueError(f"inner_tokens: expected an int >= 1, got {inner_tokens!r}")
        self.inner = inner
        self.inner_tokens = inner_tokens
        self.model = self.drafter.model  # the model the engine may put on the CPU fast path
        self.device = self.drafter.device
        self.max_columns = self.drafter.max_columns
        self.guessed = 0  # n-gram guesses fed to the draft model, over this drafter's life
        self.guesses_used = 0  # guesses that held (each saved the draft a forward for that row)

    def reset(self) -> None:
        self.drafter.reset()

    def commit(self, update: CommitUpdate) -> None:
        self.drafter.commit(update)

    def describe(self) -> dict[str, Any]:
        inner = {f"inner_{k}": v for k, v in self.inner.describe().items() if k in ("max_ngram", "min_ngram")}
        return {**self.drafter.describe(), "drafter": self.name, "draft_drafter": self.drafter.name,
                "inner_tokens": self.inner_tokens, **inner}

    def _guesses(self, context: np.ndarray, lengths: np.ndarray, drafted: list[Tensor], count: int, vocab: int
                 ) -> tuple[np.ndarray, np.ndarray]:
        """Up to ``count`` prompt-lookup guesses per row after its context and ``drafted``."""
        if drafted:
            context = np.concatenate([context, _host(torch.stack(drafted, 1))], 1)
            lengths = lengths + len(drafted)
        guess, counts, _ = ngram_lookup(context, lengths, count, self.inner.max_ngram, self.inner.min_ngram,
                                        self.inner.extend_period, self.inner.occurrence)
        invalid = guess >= vocab
        counts = np.minimum(counts, np.where(invalid.any(1), invalid.argmax(1), count))
        return np.where(invalid, 0, guess), counts

    @staticmethod
    def _verify_guess(drawn: Tensor, guess: Tensor, has_guess: Tensor) -> tuple[Tensor, Tensor]:
        """The draft's own check of the inner guess at one position: ``(token, holds)``. The
        token is always the one drawn from ``q`` (a point-mass guess accepted with probability
        ``q(guess)``, else a draw from ``q`` without it, is the same law); the guess holds
        where it equals the drawn token, and only there do the logits computed after the guess
        condition on the drafted prefix.

        Shape:
            drawn, guess: ``[b]`` int64; has_guess: ``[b]`` bool. Returns two ``[b]`` tensors.
        """
        return drawn, has_guess & (drawn == guess)

    @torch.no_grad()
    def propose(self, state: DraftState, num_tokens: int) -> Proposal:
        d = self.drafter
        if d.cache is None:
            d.cache = kv_cache.new_cache()
            d.cached_columns = 0
        prefilling = d.cached_columns == 0
        start = state.clock() if prefilling else 0.0
        pending = state.num_columns - 1
        b, dev = state.batch_size, d.device
        rows = torch.arange(b, device=dev)
        committed = (state.attention_mask[:, : pending + 1].to(device=dev, dtype=torch.bool) if state.has_holes
                     else torch.ones((b, pending + 1), dtype=torch.bool, device=dev))
        pending_position = state.positions[:, pending].to(dev)
        context, lengths = packed_contexts(_host(state.tokens[:, : pending + 1]),
                                           _host(state.attention_mask[:, : pending + 1]))
        width = self.inner_tokens + 1
        local = torch.zeros((b, 0), dtype=torch.bool, device=dev)  # validity of the step's own columns
        block_logits = block_guess = block_count = first_column = ptr = None
        need = torch.ones(b, dtype=torch.bool, device=dev)
        tokens: list[Tensor] = []
        logits_out: list[Tensor] = []
        forwards = 0
        for i in range(num_tokens):
            if i == 0 or bool(need.any()):
                m = min(self.inner_tokens, num_tokens - 1 - i)  # guesses that can still be used
                guess_np, count_np = self._guesses(context, lengths, tokens, m, state.vocab_size) if m > 0 else (
                    np.zeros((b, 0), np.int64), np.zeros(b, np.int64))
                m = guess_np.shape[1]
                guess = torch.from_numpy(guess_np).to(dev)
                count = torch.from_numpy(count_np).to(dev)
                if i == 0:
                    lo = d.cached_columns
                    ids = torch.cat([state.tokens[:, lo: pending + 1].to(dev), guess], 1)
                    positions = torch.cat([state.positions[:, lo: pending + 1].to(dev),
                                           pending_position[:, None] + 1 + torch.arange(m, device=dev)], 1)
                    new_first = torch.zeros(b, dtype=torch.long, device=dev)
                    fed_mask = torch.arange(m, device=dev)[None, :] < count[:, None]
                else:
                    ids = torch.cat([tokens[-1][:, None].to(dev), guess], 1)
                    positions = pending_position[:, None] + i + torch.arange(1 + m, device=dev)
                    new_first = torch.full((b,), local.shape[1] + 1, dtype=torch.long, device=dev)
                    fed_mask = torch.cat([torch.ones((b, 1), dtype=torch.bool, device=dev),
                                          torch.arange(m, device=dev)[None, :] < count[:, None]], 1)
                    fed_mask &= need[:, None]  # placeholder columns for rows that still have logits
                local = torch.cat([local, fed_mask], 1)
                mask = torch.cat([committed, local], 1)
                logits = d._feed(state, ids, positions, None if bool(mask.all()) else mask.long(), False)
                d.cached_columns = pending + 1  # what stays valid after the step: the committed columns
                forwards += 1
                fresh = logits[:, -(1 + m):]
                fresh = torch.cat([fresh, fresh.new_zeros((b, width - fresh.shape[1], fresh.shape[2]))], 1)
                fresh_guess = torch.cat([guess, guess.new_zeros((b, width - 1 - m))], 1)
                if block_logits is None:
                    block_logits, block_guess, block_count, first_column = fresh, fresh_guess, count, new_first
                    ptr = torch.zeros(b, dtype=torch.long, device=dev)
                else:
                    block_logits = torch.where(need[:, None, None], fresh, block_logits)
                    block_guess = torch.where(need[:, None], fresh_guess, block_guess)
                    block_count = torch.where(need, count, block_count)
                    first_column = torch.where(need, new_first, first_column)
                    ptr = torch.where(need, torch.zeros_like(ptr), ptr)
                self.guessed += int(count[need].sum()) if i else int(count.sum())
            logits = block_logits[rows, ptr].to(device=state.device, dtype=torch.float32)
            drafted = torch.stack(tokens, 1) if tokens else state.tokens[:, :0]
            logits = state.process_draft_logits(logits, drafted)
            coins = None if state.sampling.is_greedy else state.uniforms(b)
            drawn = sample_logits(logits, state.sampling, uniforms=coins)
            guess_here = block_guess[rows, ptr.clamp_max(width - 2)]
            token, holds = self._verify_guess(drawn.to(dev), guess_here, ptr < block_count)
            tokens.append(token.to(state.device))
            logits_out.append(logits)
            self.guesses_used += int(holds.sum())
            # Columns from the failed guess on no longer condition on this row's prefix.
            stale = torch.arange(local.shape[1], device=dev)[None, :] >= (first_column + ptr)[:, None]
            local &= ~(stale & ~holds[:, None])
            ptr = ptr + holds.long()
            need = ~holds
            # Columns no row uses any more leave the cache (at batch 1: every failed guess), so
            # later forwards need no mask where nothing else is masked.
            used = local.any(0).nonzero()
            keep = int(used[-1]) + 1 if used.numel() else 0
            if keep < local.shape[1]:
                d.crop_columns(pending + 1 + keep)
                local = local[:, :keep]
        # Where every step column is valid for every row (always at batch 1, once unused columns
        # are gone), they hold y_1 .. y_L in order: the engine's next columns, kept like
        # ModelDrafter keeps its drafts (commit cuts them back to the accepted ones).
        d.cached_columns = pending + 1 + (local.shape[1] if bool(local.all()) else 0)
        return Proposal(torch.stack(tokens, 1), torch.stack(logits_out, 1), forward_calls=forwards,
                        prefill_seconds=state.clock() - start if prefilling else 0.0)


class _ExtendedState:
    """A :class:`DraftState` whose rows continue with ``drafted`` (all real tokens): what a
    later-position drafter of a horizontal cascade reads."""

    def __init__(self, state: DraftState, drafted: Tensor) -> None:
        self._state = state
        n = state.num_columns
        k = drafted.shape[1]
        self.tokens = torch.cat([state.tokens[:, :n], drafted.to(state.tokens.device)], 1)
        ones = state.attention_mask.new_ones((state.batch_size, k))
        self.attention_mask = torch.cat([state.attention_mask[:, :n], ones], 1)
        steps = torch.arange(1, k + 1, device=state.positions.device)
        self.positions = torch.cat([state.positions[:, :n], state.positions[:, n - 1: n] + steps], 1)
        self.num_columns = n + k

    def contexts(self) -> list[Tensor]:
        return [row[mask.bool()] for row, mask in zip(self.tokens, self.attention_mask)]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._state, name)


class HorizontalCascadeDrafter(DrafterBase):
    """Different drafters by position: ``first`` (a draft model or any chain drafter) drafts the
    first ``first_tokens`` positions, then ``then`` (prompt lookup, an :class:`NgramDrafter`)
    continues the chain from the context followed by ``first``'s tokens, up to the number of
    tokens asked for.

    The proposal mixes sampled and deterministic positions: ``first``'s positions keep its
    logits (a point mass when ``first`` is deterministic), prompt-lookup positions get a point
    mass. Rows whose lookup finds nothing, or whose ``first`` proposal was shorter, propose
    fewer tokens. ``then`` learns its own draft length (its ``min_acceptance``) from how far
    its positions were accepted.

    Example:
        >>> drafter = HorizontalCascadeDrafter(draft_model, NgramDrafter(), first_tokens=2)
        >>> out = specdecode.generate(target, drafter, input_ids, num_draft_tokens=6)
    """

    name = "cascade_horizontal"

    def __init__(self, first: Any, then: NgramDrafter | None = None, first_tokens: int = 2) -> None:
        if isinstance(first, torch.nn.Module):
            first = ModelDrafter(first)
        if not all(callable(getattr(first, f, None)) for f in ("propose", "commit", "reset")):
            raise TypeError(f"first: expected a draft model or a drafter, got {type(first).__name__}")
        if getattr(first, "tree", None) is not None or getattr(first, "num_nodes", None) is not None:
            raise ValueError("first: cascades draft chains; pass a drafter without a tree")
        if then is None:
            then = NgramDrafter()
        if not isinstance(then, NgramDrafter) or then.num_nodes is not None:
            raise TypeError(f"then: expected an NgramDrafter drafting chains, got {type(then).__name__}")
        if isinstance(first_tokens, bool) or not isinstance(first_tokens, int) or first_tokens < 1:
            raise ValueError(f"first_tokens: expected an int >= 1, got {first_tokens!r}")
        self.first, self.then, self.first_tokens = first, then, first_tokens
        model = getattr(first, "model", None)
        if isinstance(model, torch.nn.Module):
            self.model = model  # the model the engine may put on the CPU fast path
        for attr in ("device", "max_columns"):
            if getattr(first, attr, None) is not None:
                setattr(self, attr, getattr(first, attr))
        self._first_len = 0
        self.tail_tokens = 0  # prompt-lookup tokens proposed after ``first``'s, over this drafter's life

    def reset(self) -> None:
        self.first.reset()
        self.then.reset()
        self._first_len = 0

    def describe(self) -> dict[str, Any]:
        first = self.first.describe() if callable(getattr(self.first, "describe", None)) else {}
        return {**first, "drafter": self.name, "first": getattr(self.first, "name", type(self.first).__name__),
                "first_tokens": self.first_tokens, "then": self.then.name}

    @staticmethod
    def _tail_logits(tokens: Tensor, vocab_size: int) -> Tensor:
        """The ``q`` of prompt-lookup positions: a point mass on each token.

        Shape:
            tokens: ``[b, m]`` int64; returns ``[b, m, vocab_size]``.
        """
        return point_mass_logits(tokens, vocab_size)

    def propose(self, state: DraftState, num_tokens: int) -> Proposal:
        first = self.first.propose(state, min(self.first_tokens, num_tokens))
        if first.tree is not None:
            raise ValueError("first: proposed a tree; a horizontal cascade drafts chains")
        k1 = first.num_tokens
        self._first_len = k1
        b, device, vocab = state.batch_size, state.device, state.vocab_size
        full = torch.full((b,), k1, dtype=torch.long, device=device)
        counts1 = full if first.num_draft_tokens is None else first.num_draft_tokens
        q1 = first.draft_logits if first.draft_logits is not None else point_mass_logits(first.draft_tokens, vocab)
        if num_tokens <= k1 or k1 == 0:
            return first
        tail = self.then.propose(_ExtendedState(state, first.draft_tokens), num_tokens - k1)
        counts2 = tail.num_draft_tokens if tail.num_draft_tokens is not None else torch.full_like(full, tail.num_tokens)
        counts2 = torch.where(counts1 == k1, counts2, torch.zeros_like(counts2))
        if tail.num_tokens == 0 or not bool((counts2 > 0).any()):
            return first
        tokens = torch.cat([first.draft_tokens, tail.draft_tokens], 1)
        logits = torch.cat([q1.to(torch.float32), self._tail_logits(tail.draft_tokens, vocab)], 1)
        counts = counts1 + counts2
        self.tail_tokens += int(counts2.sum())
        ragged = bool((counts != tokens.shape[1]).any())
        return Proposal(tokens, logits, counts if ragged else None, forward_calls=first.forward_calls,
                        prefill_seconds=first.prefill_seconds)

    def commit(self, update: CommitUpdate) -> None:
        self.first.commit(update)
        shifted = CommitUpdate(update.accepted_len - self._first_len, update.num_columns, update.kept_rows,
                               update.column_order)
        self.then.commit(shifted)
