"""Speculative steps on a target whose cache *replays*: recurrent layers (Mamba, gated delta
rule, short convolutions) whose states cannot be cropped back to before a rejected draft
(:func:`specdecode.models.kv_cache.replays`).

The design: before each verification forward the engine copies the recurrent states
(:func:`~specdecode.models.kv_cache.checkpoint`); after verification, when a row rejected part
of its draft, it puts the copies back, crops the attention layers
(:func:`~specdecode.models.kv_cache.rewind`) and feeds the kept tokens again (one more target
forward over at most ``k + 1`` tokens). A state holds no columns, so rows cannot keep
different numbers of draft tokens the way attention layers do (holes): every row of a step
keeps the same number ``m``, the smallest any row accepted (:func:`common_acceptance`).

Why that is lossless: take one row, and let ``m'`` be the smallest number the *other* rows
accepted. The rows' drafts and coins are independent, so ``m'`` is a number fixed without
this row's randomness. If the row accepted fewer than ``m'`` drafts, it keeps its own outcome
(its accepted drafts and the rule's next token); else it keeps ``m'`` drafts and its next token
is a fresh sample of the target's distribution after them. Both together are exactly verifying
a draft of ``m'`` tokens, which the rule makes lossless. In terms of ``m``: a row keeps the
rule's next token only when it alone accepted ``m`` drafts; every other row takes a fresh
sample at position ``m`` (a row that merely tied for the fewest is cut at the others' ``m``, so
its own rejection is not used either).

The cost: one more forward on every step where some row rejected a draft (none when every
draft is accepted), and in a batch the acceptance of its least lucky row.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specdecode.sampling import SamplingParams, sample_logits

__all__ = ["common_acceptance"]


def common_acceptance(tokens: Tensor, accepted_len: Tensor, common: int, target_logits: Tensor,
                      sampling: SamplingParams, uniforms: Tensor | None) -> tuple[Tensor, Tensor]:
    """Every row keeps ``common`` (the smallest accepted length) drafts; the row that alone
    accepted that few keeps the rule's next token, every other row takes a fresh sample of
    ``target_logits`` at position ``common`` (see the module docstring).

    Shape:
        tokens: ``[b, k + 1]`` (a verification's emitted tokens); accepted_len: ``[b]``;
        target_logits: ``[b, k + 1, V]`` (processed); uniforms: ``[b]`` or None (greedy).
        returns ``(tokens [b, k + 1], accepted_len [b])``.
    """
    fewest = accepted_len == common
    own = fewest & (fewest.sum() == 1)
    fresh = sample_logits(target_logits[:, common], sampling, uniforms=uniforms).to(tokens.device)
    tokens = tokens.clone()
    tokens[:, common] = torch.where(own, tokens[:, common], fresh)
    return tokens, torch.full_like(accepted_len, common)
