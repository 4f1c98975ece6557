"""Hugging Face logits processors and stopping criteria, applied as plain ``generate`` would.

A processor (repetition penalty, n-gram blocking, minimum length, ...) sees ``input_ids`` of the
*whole* original batch, all rows of one length, and some keep per-row state. Speculative rows
have different lengths, so the active rows are grouped by generated length and each group is
shown the batch exactly as ``generate`` would have at that length (the other rows' entries are
ignored). Draft positions see the row's sequence extended by the drafts before them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from specdecode.engine.batch import BatchState
from specdecode.engine.syncs import HostSyncs


class ProcessorRunner:
    """Applies ``processors`` (a ``LogitsProcessorList`` or None) and ``stopping`` (a
    ``StoppingCriteriaList`` without the EOS / max-length criteria, or None) for one batch."""

    def __init__(self, batch: BatchState, processors: Any, stopping: Any, pad_id: int,
                 syncs: HostSyncs | None = None) -> None:
        self.batch = batch
        self.syncs = syncs if syncs is not None else HostSyncs()
        self.processors = processors
        self.stopping = stopping
        self.pad_id = pad_id
        self.groups: list[tuple[int, Tensor | None]] = []

    @property
    def active(self) -> bool:
        return self.processors is not None or self.stopping is not None

    def start_step(self) -> None:
        """Group the active rows by generated length (call once per step, before any use)."""
        if not self.active:
            return
        values = self.syncs.fetch(self.batch.generated[self.batch.rows]).tolist()
        distinct = sorted(set(values))
        if len(distinct) == 1:
            self.groups = [(distinct[0], None)]
            return
        by_value: dict[int, list[int]] = {}
        for i, v in enumerate(values):
            by_value.setdefault(v, []).append(i)
        device = self.batch.device
        self.groups = [(v, torch.tensor(m, device=device)) for v, m in sorted(by_value.items())]

    def _context(self, length: int, members: Tensor | None, extra: Tensor | None) -> tuple[Tensor, Tensor]:
        """``input_ids [B, L + length (+ extra)]`` from the outputs (the rows of ``members``
        count), and the original row index of each member."""
        b = self.batch
        active = b.rows if members is None else b.rows[members]
        ctx = b.sequences[:, : b.prompt_len + length]
        if extra is not None and extra.shape[1] > 0:
            tail = torch.zeros((b.batch, extra.shape[1]), dtype=torch.long, device=b.device)
            tail[active] = extra if members is None else extra[members]
            ctx = torch.cat([ctx, tail], dim=1)
        return ctx, active

    def process(self, scores: Tensor, extra: Tensor | None) -> Tensor:
        """Processed ``scores [b, V]``; active row r's context is its output so far followed by
        ``extra[r]`` (``[b, i]``, the drafts before this position, or None)."""
        if self.processors is None:
            return scores
        b = self.batch
        identity = b.rows.numel() == b.batch  # no row dropped yet: active order == batch order
        result = scores.clone() if len(self.groups) > 1 else scores
        for g, members in self.groups:
            ctx, active = self._context(g, members, extra)
            if identity and members is None:
                return self.processors(ctx, scores)
            full = torch.zeros((b.batch, scores.shape[1]), dtype=scores.dtype, device=b.device)
            full[active] = scores if members is None else scores[members]
            new = self.processors(ctx, full)[active].to(scores.dtype)
            if members is None:
                result = new
            else:
                result[members] = new
        return result

    def check_stopping(self, keep: Tensor) -> tuple[Tensor, Tensor]:
        """Stopping criteria after every emitted token of every row (tokens already written to
        the outputs, ``generated`` not yet advanced). Returns the new kept counts ``[b]`` and
        which rows stopped ``[b]`` (bool); tokens after a stop are overwritten with padding."""
        b = self.batch
        keep_l, g_l = self.syncs.fetch(torch.stack([keep, b.generated[b.rows]])).tolist()
        stopped = [False] * len(keep_l)
        new_keep = list(keep_l)
        for j in range(max(keep_l) if keep_l else 0):
            groups: dict[int, list[int]] = {}
            for r, k in enumerate(keep_l):
                if not stopped[r] and k > j:
                    groups.setdefault(g_l[r] + j + 1, []).append(r)
            for length, members in groups.items():
                ctx, active = self._context(length, torch.tensor(members, device=b.device), None)
                done = self.stopping(ctx, None)
                if isinstance(done, Tensor) and done.numel() > 1:
                    done_l = self.syncs.fetch(done.reshape(-1)[active]).tolist()
                else:
                    done_l = [self.syncs.flag(done) if isinstance(done, Tensor) else bool(done)] * len(members)
                for r, d in zip(members, done_l):
                    if d:
                        stopped[r] = True
                        new_keep[r] = j + 1
        rows_l = None
        for r, (k_old, k_new) in enumerate(zip(keep_l, new_keep)):
            if k_new < k_old:
                if rows_l is None:
                    rows_l = self.syncs.fetch(b.rows).tolist()
                row = rows_l[r]
                b.sequences[row, b.prompt_len + g_l[r] + k_new: b.prompt_len + g_l[r] + k_old] = self.pad_id
        return (torch.tensor(new_keep, dtype=torch.long, device=b.device),
                torch.tensor(stopped, dtype=torch.bool, device=b.device))
