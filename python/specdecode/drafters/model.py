"""``ModelDrafter``: a second Hugging Face causal LM drafts, one token per forward, with its own
KV cache laid out on the engine's columns (same holes, same positions)."""

from __future__ import annotations

import torch
from torch import Tensor

from specdecode.drafters.base import CommitUpdate, DrafterBase, DraftState, Proposal
from specdecode.models import facts, kv_cache
from specdecode.sampling import sample_logits


class ModelDrafter(DrafterBase):
    """Drafts with ``model``, any Hugging Face decoder-only causal LM sharing the target's
    vocabulary (checked by :func:`specdecode.check_compatibility`).

    Each proposed token is drawn by :func:`specdecode.sampling.sample_logits` from the draft
    logits after the generation's logits processors, with the generation's sampling settings:
    the very distribution the verification op later computes from the returned logits. At
    temperature 0 the draft proposes its argmax.

    The draft's cache covers the engine's committed columns up to the pending token; a step
    feeds the columns it has not seen (the pending token, and the last accepted draft when a
    whole block was accepted) in one forward, then drafts ``k - 1`` more one token at a time.

    Example:
        >>> drafter = ModelDrafter(draft_model)
        >>> out = specdecode.generate(target, drafter, input_ids, max_new_tokens=32)
    """

    name = "model"

    def __init__(self, model: torch.nn.Module) -> None:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model: expected a Hugging Face causal LM (torch.nn.Module), got {type(model).__name__}")
        self.model = model
        self.device = facts.input_device(model)
        self._logits_to_keep_ok = facts.accepts_logits_to_keep(model)
        self.max_columns = facts.sliding_window(model)
        self.cache = None
        self.cached_columns = 0

    def reset(self) -> None:
        self.cache = None
        self.cached_columns = 0

    def describe(self) -> dict:
        n = sum(p.numel() for p in self.model.parameters())
        return {"drafter": self.name, "draft_model": type(self.model).__name__, "draft_params": n}

    @torch.no_grad()
    def propose(self, state: DraftState, num_tokens: int) -> Proposal:
        if self.cache is None:
            self.cache = kv_cache.new_cache()
            self.cached_columns = 0
        prefill_seconds = 0.0
        prefilling = self.cached_columns == 0
        start = state.clock() if prefilling else 0.0
        pending = state.num_columns - 1
        b, V, dev = state.batch_size, state.vocab_size, self.device
        committed_mask = state.attention_mask[:, : pending + 1].to(dev) if state.has_holes else None
        pending_position = state.positions[:, pending]
        tokens: list[Tensor] = []
        logits_out: list[Tensor] = []
        for i in range(num_tokens):
            if i == 0:
                lo = self.cached_columns
                ids = state.tokens[:, lo: pending + 1]
                positions = state.positions[:, lo: pending + 1]
            else:
                ids = tokens[-1][:, None]
                positions = (pending_position + i)[:, None]
            mask = None
            if committed_mask is not None:
                mask = committed_mask if i == 0 else torch.cat(
                    [committed_mask, torch.ones((b, i), dtype=committed_mask.dtype, device=dev)], 1)
            logits = facts.forward(self.model, ids.to(dev), mask, positions.to(dev), self.cache, last_only=True,
                                   logits_to_keep_ok=self._logits_to_keep_ok)
            if i == 0 and prefilling:
                prefill_seconds = state.clock() - start
            logits = logits[:, :V].to(device=state.device, dtype=torch.float32)
            drafted = torch.stack(tokens, 1) if tokens else state.tokens[:, :0]
            logits = state.process_draft_logits(logits, drafted)
            coins = None if state.sampling.is_greedy else state.uniforms(b)
            tokens.append(sample_logits(logits, state.sampling, uniforms=coins))
            logits_out.append(logits)
        self.cached_columns = pending + num_tokens  # the pending token and x_1 .. x_{k-1}
        return Proposal(torch.stack(tokens, 1), torch.stack(logits_out, 1), forward_calls=num_tokens,
                        prefill_seconds=prefill_seconds)

    def commit(self, update: CommitUpdate) -> None:
        if self.cache is None:
            return
        valid = min(self.cached_columns, update.num_columns - 1)  # everything before the new pending token
        kv_cache.crop(self.cache, valid)
        self.cached_columns = valid
        if update.kept_rows is not None:
            kv_cache.select_rows(self.cache, update.kept_rows.to(self.device))
        order = update.column_order
        if order is not None:
            if self.cached_columns == 0:
                self.reset()
                return
            order = order.to(self.device)
            # Columns the cache never held (the last accepted draft of a fully accepted block)
            # are re-fed at the next step: keep the prefix of new columns that all come from cache.
            fully_cached = (order < self.cached_columns).all(0).long().cumprod(0)
            keep = int(fully_cached.sum())
            kv_cache.gather_columns(self.cache, order.clamp_max(self.cached_columns - 1))
            kv_cache.crop(self.cache, keep)
            self.cached_columns = keep
