"""The batch of one speculative generation: the column layout shared by the target's KV cache
(and every drafter that keeps one), and each row's output sequence.

Layout
------
All rows share the cache *columns*. Three ``[b, capacity]`` buffers describe them: token ids,
an attention mask (1 = real token, 0 = left padding or a *hole*) and per-row position ids that
count real tokens only. Columns ``[0, pending)`` are in the target's cache; column ``pending``
holds each row's pending token (the last emitted one), which the next target forward starts
from. A step writes the draft at ``pending + 1 ..``; afterwards each row keeps its accepted
drafts, the columns it rejected become holes (mask 0), and the next pending token goes to the
first column after the longest accepted run. Holes are never attended and positions skip them,
so every row sees exactly its own sequence. When holes waste a quarter of the cache, the rows
are *re-packed*: each row's real columns are right-aligned by one gather per cache. Finished
rows leave the batch. With one row there are never holes and no attention mask is passed.

Outputs live apart from the layout, in the caller's row order: ``sequences [B, L + max_new]``
(prompt with its padding, then the emitted tokens, right-padded) and ``generated [B]``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from specdecode.engine.syncs import HostSyncs
from specdecode.models import kv_cache

# Re-pack rows when at least this many cache columns (and this fraction of them) are holes.
REPACK_MIN_WASTE = 32
REPACK_MIN_FRACTION = 0.25


class BatchState:
    """Column buffers, the target cache's layout, and the output sequences of one generation.

    Shape:
        input_ids: ``[B, L]`` int64 (left-padded), attention_mask: ``[B, L]`` 0/1 or None.
    """

    def __init__(self, input_ids: Tensor, attention_mask: Tensor | None, *, device: torch.device,
                 max_new_tokens: int, pad_id: int, max_step_columns: int, syncs: HostSyncs | None = None) -> None:
        B, L = input_ids.shape
        self.device = device
        self.syncs = syncs if syncs is not None else HostSyncs()
        self.batch = B
        self.prompt_len = L
        ids = input_ids.to(device)
        mask = (torch.ones((B, L), dtype=torch.long, device=device) if attention_mask is None
                else attention_mask.to(device=device, dtype=torch.long))
        self.prompt_mask = mask.bool()
        # Outputs (caller's row order). The last column is a trash column for masked writes.
        self.width = L + max_new_tokens + 1
        self.sequences = torch.full((B, self.width), pad_id, dtype=torch.long, device=device)
        self.sequences[:, :L] = ids
        self.generated = torch.zeros(B, dtype=torch.long, device=device)
        # Layout (active rows).
        self.rows = torch.arange(B, device=device)
        self.capacity = L + 2 * (max_step_columns + 2) + 8
        self.tokens = torch.zeros((B, self.capacity), dtype=torch.long, device=device)
        self.mask = torch.zeros_like(self.tokens)
        self.positions = torch.zeros_like(self.tokens)
        self.tokens[:, :L] = ids
        self.mask[:, :L] = mask
        self.positions[:, :L] = (mask.cumsum(1) - 1).clamp_min(0)
        self.pending = L - 1  # column of each row's pending token; the target cache holds [0, pending)
        self.holes = not self.syncs.flag(mask.all())
        self.repacks = 0

    # ------------------------------------------------------------------ views
    @property
    def num_active(self) -> int:
        return int(self.rows.numel())

    def attention(self, upto: int) -> Tensor | None:
        """The 0/1 attention mask over columns ``[0, upto)``, or None when there are no holes."""
        return self.mask[:, :upto].contiguous() if self.holes else None

    def contexts(self) -> list[Tensor]:
        """Real tokens of every active row: prompt without padding, then the emitted tokens."""
        out = []
        rows, counts = self.syncs.fetch(torch.stack([self.rows, self.generated[self.rows]])).tolist()
        for row, n in zip(rows, counts):
            prompt = self.sequences[row, : self.prompt_len][self.prompt_mask[row]]
            out.append(torch.cat([prompt, self.sequences[row, self.prompt_len: self.prompt_len + n]]))
        return out

    # ------------------------------------------------------------------ layout changes
    def ensure_capacity(self, needed: int) -> None:
        """Grow the column buffers to at least ``needed`` columns."""
        if needed <= self.capacity:
            return
        extra = max(needed, 2 * self.capacity) - self.capacity
        pad = torch.zeros((self.tokens.shape[0], extra), dtype=torch.long, device=self.device)
        self.tokens = torch.cat([self.tokens, pad], 1)
        self.mask = torch.cat([self.mask, pad], 1)
        self.positions = torch.cat([self.positions, pad], 1)
        self.capacity += extra

    def write_draft(self, draft_tokens: Tensor, num_draft_tokens: Tensor | None) -> None:
        """Put ``draft_tokens [b, k]`` after the pending column, with positions pending + 1..k;
        unused tail drafts of a row (beyond ``num_draft_tokens``) are written as holes."""
        k = draft_tokens.shape[1]
        p = self.pending
        self.ensure_capacity(p + k + 2)
        self.tokens[:, p + 1: p + 1 + k] = draft_tokens
        used = torch.ones_like(draft_tokens)
        if num_draft_tokens is not None:
            used = (torch.arange(k, device=self.device)[None, :] < num_draft_tokens[:, None]).long()
            if not self.syncs.flag(used.all()):
                self.holes = True
        self.mask[:, p + 1: p + 1 + k] = used
        self.positions[:, p + 1: p + 1 + k] = self.positions[:, p: p + 1] + torch.arange(1, k + 1, device=self.device)

    def advance(self, accepted_len: Tensor, next_tokens: Tensor, num_draft: int, max_accepted: int) -> int:
        """After verification: every row keeps its ``accepted_len`` drafts, its rejected drafts
        become holes, and its next pending token goes to the column after the longest accepted
        run (``max_accepted``, over the rows that continue). Returns that column, the new
        ``pending``.

        Shape:
            accepted_len, next_tokens: ``[b]`` int64.
        """
        p = self.pending
        if num_draft > 0:
            kept = (torch.arange(num_draft, device=self.device)[None, :] < accepted_len[:, None]).long()
            self.mask[:, p + 1: p + 1 + num_draft] *= kept
            if max_accepted > 0 and not self.holes:
                self.holes = self.syncs.flag((self.mask[:, p + 1: p + 1 + max_accepted] == 0).any())
        new = p + max_accepted + 1
        self.tokens[:, new] = next_tokens
        self.mask[:, new] = 1
        self.positions[:, new] = self.positions[:, p] + accepted_len + 1
        self.pending = new
        return new

    def keep_rows(self, index: Tensor, caches: list[Any]) -> None:
        """Drop finished rows: keep ``index [b']`` (positions among the active rows)."""
        self.rows = self.rows[index]
        self.tokens, self.mask, self.positions = self.tokens[index], self.mask[index], self.positions[index]
        for cache in caches:
            kv_cache.select_rows(cache, index)
        self.holes = not self.syncs.flag(self.mask[:, : self.pending + 1].all())

    def repack_order(self, force: bool = False) -> Tensor | None:
        """The per-row column order that right-aligns real columns, when holes waste enough of
        the cache (always when ``force``), else None. Shape: ``[b, n]`` over cache columns."""
        if not self.holes or self.pending == 0:
            return None
        W = self.pending
        real = self.mask[:, :W]
        new_width = self.syncs.integer(real.sum(1).max())
        waste = W - new_width
        if waste <= 0 or (not force and waste < max(REPACK_MIN_WASTE, REPACK_MIN_FRACTION * W)):
            return None
        return torch.sort(real, dim=1, stable=True).indices[:, W - new_width:]

    def repack(self, order: Tensor, target_cache: Any) -> None:
        """Apply a :meth:`repack_order` to the buffers and the target's cache."""
        W = self.pending
        new_width = order.shape[1]
        kv_cache.gather_columns(target_cache, order)
        for t in (self.tokens, self.mask, self.positions):
            gathered = t[:, :W].gather(1, order)
            pending = t[:, W].clone()
            t[:, :new_width] = gathered
            t[:, new_width] = pending
        self.pending = new_width
        self.holes = not self.syncs.flag(self.mask[:, : new_width + 1].all())
        self.repacks += 1
