"""``PartialCacheDrafter``: the target drafts for itself over a partial KV cache (TriForce's
middle drafter): attention sinks plus a recent window.

The drafter runs the target model itself, unchanged, but with its own KV cache, from which the
middle of a long context is evicted: it keeps the first ``num_sink_tokens`` tokens (attention
sinks, StreamingLLM) and the ``window`` most recent columns. Kept keys stay where they were
computed, at their true positions (RoPE rotations included), and new tokens get their true
position ids, so on a context no longer than ``window`` plus the sinks the draft logits are the
target's own; on a longer one they approximate them, at the cost of a short attention.

Stacked under it, a cheaper drafter makes the hierarchy (TriForce-style): a
:class:`~specdecode.drafters.VerticalCascadeDrafter` with this drafter as its ``draft`` drafts
with prompt lookup inside: one forward of the partial-cache target scores its next token and
the n-gram guesses after it.

Everything else (drawing the tokens with the generation's sampling settings, the ``q`` handed
to verification, rolling back) is :class:`~specdecode.drafters.ModelDrafter`'s, so verification
stays lossless whatever the cache keeps.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from specdecode.drafters.base import CommitUpdate, DraftState, StaticDraftState
from specdecode.drafters.model import ModelDrafter
from specdecode.models import kv_cache

__all__ = ["PartialCacheDrafter"]


class PartialCacheDrafter(ModelDrafter):
    """Drafts with ``target`` (the model passed to :func:`specdecode.generate` as the target,
    shared, never copied) over a KV cache of its own that keeps the sink columns and the
    ``window`` most recent committed columns before the pending token (then the pending token
    and the step's drafts).

    The sink columns are the first ``num_sink_tokens`` real tokens of every row: with a
    left-padded batch, the first ``num_sink_tokens`` columns after the longest padding (rows
    with less padding keep a few more). The cache is built from the whole context at the first
    step (one forward of the target over the prompt: this drafter's prefill), evicted down to
    the sinks and the window before the first draft, and again at every commit (so a step that
    catches up with one accepted draft holds one column more until its commit). The evicted
    columns are one contiguous run between the sinks and the window, so the cache is addressed
    by the engine's columns through one offset.

    When the engine re-packs the batch (squeezing out holes of a batch whose rows accepted
    different numbers of drafts) after columns were evicted, the drafter drops its cache and
    rebuilds it from the context at the next step.

    Chains only (no token trees), on the eager decode path.

    Example:
        >>> drafter = PartialCacheDrafter(target, window=512, num_sink_tokens=4)
        >>> hierarchy = VerticalCascadeDrafter(drafter, NgramDrafter(), inner_tokens=4)
        >>> out = specdecode.generate(target, hierarchy, input_ids, num_draft_tokens=6)
    """

    name = "partial_cache"

    def __init__(self, target: torch.nn.Module, window: int = 512, num_sink_tokens: int = 4) -> None:
        if not isinstance(target, torch.nn.Module) or not hasattr(target, "config"):
            raise TypeError(f"target: expected a Hugging Face causal LM (a torch.nn.Module with .config), "
                            f"got {type(target).__name__}")
        if isinstance(window, bool) or not isinstance(window, int):
            raise TypeError(f"window: expected an int >= 1 (recent columns kept), got {window!r}")
        if window < 1:
            raise ValueError(f"window: expected an int >= 1 (recent columns kept), got {window}")
        if isinstance(num_sink_tokens, bool) or not isinstance(num_sink_tokens, int):
            raise TypeError(f"num_sink_tokens: expected an int >= 0, got {num_sink_tokens!r}")
        if num_sink_tokens < 0:
            raise ValueError(f"num_sink_tokens: expected an int >= 0, got {num_sink_tokens}")
        super().__init__(target)
        self.window = window
        self.num_sink_tokens = num_sink_tokens
        self.sink_columns: int | None = None  # columns kept at the start (set by the first forward)
        self.evicted = 0  # columns dropped after the sinks: column c >= sinks + evicted is cache slot c - evicted
        self.evictions = 0  # eviction passes, over this drafter's life


    def with_tree(self, tree: Any = "dynamic", num_nodes: int = 16, tree_depth: int | None = None,
                  tree_children: str | None = None) -> Any:
        """Refused: a partial-cache drafter drafts chains only (its cache keeps a sliding window
        of committed columns, which tree nodes would break)."""
        raise ValueError(f"tree: {type(self).__name__} drafts chains only; pass num_draft_tokens= instead of tree=")
    def reset(self) -> None:
        super().reset()
        self.sink_columns = None
        self.evicted = 0

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "drafter": self.name, "window": self.window,
                "num_sink_tokens": self.num_sink_tokens}

    @staticmethod
    def _sink_columns(attention_mask: Tensor, num_sink_tokens: int) -> int:
        """Columns that hold every row's first ``num_sink_tokens`` real tokens.

        Shape:
            attention_mask: ``[b, n]`` 0/1, left-padded rows.
        """
        padding = (attention_mask.cumsum(1) == 0).sum(1)
        return int(padding.max()) + num_sink_tokens

    def _feed(self, state: DraftState, ids: Tensor, positions: Tensor, mask: Tensor | None, last_only: bool) -> Tensor:
        """:meth:`ModelDrafter._feed` on the partial cache. The prefill (the first forward after
        a reset) is split: the committed columns before the pending token go in first, the cache
        is evicted down to the sinks and the window, then the rest (the pending token, and the
        guesses of a cascade) is fed over the partial cache. Without ``last_only`` it returns the
        logits of that rest only, ``[b, n_rest, V]`` (callers read the trailing columns)."""
        if self.sink_columns is None:
            self.sink_columns = self._sink_columns(state.attention_mask[:, : state.num_columns], self.num_sink_tokens)
        before_pending = state.num_columns - 1 - self.cached_columns
        if self.cached_columns == 0 and 0 < before_pending < ids.shape[1]:
            self._forward(state, ids[:, :before_pending], positions[:, :before_pending],
                          None if mask is None else mask[:, :before_pending], True)
            self.cached_columns = before_pending
            self._evict()
            ids, positions = ids[:, before_pending:], positions[:, before_pending:]
        return self._forward(state, ids, positions, mask, last_only)

    def _forward(self, state: DraftState, ids: Tensor, positions: Tensor, mask: Tensor | None, last_only: bool
                 ) -> Tensor:
        """One forward appending ``ids``; ``mask`` (2D, over the engine's columns up to and
        including ``ids``) is narrowed to the columns the cache holds."""
        if mask is not None and self.evicted:
            lo = self.sink_columns
            mask = torch.cat([mask[:, :lo], mask[:, lo + self.evicted:]], 1)
        return super()._feed(state, ids, positions, mask, last_only)

    def _evict(self) -> None:
        """Drop the columns between the sinks and the ``window`` most recent cached columns (called
        when the cache holds the committed columns before the pending token)."""
        if self.cache is None or self.sink_columns is None:
            return
        kept_from = self.sink_columns + self.evicted
        new_from = self.cached_columns - self.window
        if new_from <= kept_from:
            return
        kv_cache.drop_columns(self.cache, self.sink_columns, new_from - self.evicted)
        self.evicted = new_from - self.sink_columns
        self.evictions += 1

    def crop_columns(self, columns: int) -> None:
        if self.evicted and columns < self.sink_columns + self.evicted:
            raise RuntimeError(f"PartialCacheDrafter: cannot roll back to column {columns}, which was evicted "
                               f"(the cache keeps columns from {self.sink_columns + self.evicted} on)")
        kv_cache.crop(self.cache, columns - self.evicted)

    def commit(self, update: CommitUpdate) -> None:
        if self.evicted and update.column_order is not None:
            self.reset()  # the re-packed columns may come from evicted ones: rebuild at the next step
            return
        super().commit(update)
        self._evict()

    def static_prefill(self, state: StaticDraftState, num_tokens: int) -> None:
        raise ValueError("decode_path: PartialCacheDrafter drafts on the eager decode path only (its cache evicts "
                         "columns); use decode_path='eager'")
