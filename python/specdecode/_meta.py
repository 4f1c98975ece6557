"""Fake (meta) implementations of every op, so torch.compile and FakeTensor tracing know the
output shapes without running a kernel."""

from __future__ import annotations

from typing import Sequence

import torch

from specdecode import _ops  # noqa: F401  (the schemas must exist first)
from torch import Tensor


def _verify_outputs(draft_tokens: Tensor) -> tuple[Tensor, Tensor]:
    B, gamma = draft_tokens.shape
    return draft_tokens.new_empty((B, gamma + 1)), draft_tokens.new_empty((B,))


@torch.library.register_fake("specdecode::verify_probs")
def _verify_probs_fake(
    target_probs: Tensor,
    draft_probs: Tensor | None,
    draft_tokens: Tensor,
    num_draft_tokens: Tensor,
    uniforms: Tensor,
    rule: str,
    rule_params: Sequence[float],
) -> tuple[Tensor, Tensor]:
    torch._check(target_probs.dim() == 3, lambda: "target_probs: expected shape [B, gamma+1, V]")
    return _verify_outputs(draft_tokens)


@torch.library.register_fake("specdecode::verify_logits")
def _verify_logits_fake(
    target_logits: Tensor,
    draft_logits: Tensor | None,
    draft_tokens: Tensor,
    num_draft_tokens: Tensor,
    uniforms: Tensor,
    temperature: float,
    top_k: int,
    top_p: float,
    min_p: float,
    rule: str,
    rule_params: Sequence[float],
) -> tuple[Tensor, Tensor]:
    torch._check(target_logits.dim() == 3, lambda: "target_logits: expected shape [B, gamma+1, V]")
    return _verify_outputs(draft_tokens)
