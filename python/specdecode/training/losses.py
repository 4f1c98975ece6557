"""Distillation losses against the target's (top-k) token distributions, and the acceptance
estimates that come with them.

With the target's top-k log-probabilities ``log p_i`` (ids ``x_i``) and the drafter's full
``log q``:

* ``kl``: ``sum_i p_i (log p_i - log q(x_i))``, forward KL(p || q) over the kept ids (exact
  when k covers the vocabulary); it pushes q to cover p, which the acceptance
  ``sum_x min(p, q)`` rewards.
* ``tvd``: total variation ``(sum_i |p_i - q(x_i)| + |p_rest - q_rest|) / 2``, where ``rest``
  is the mass outside the kept ids (exact when k covers the vocabulary; a lower bound
  otherwise). ``1 - TVD`` is the sampled acceptance rate itself (DistillSpec).

A drafter with a reduced head (logits over ``N`` of the target's ``V`` ids) hands over
:class:`SubsetLogits`: ``q`` is the softmax over its ``N`` ids, and a kept target id outside
them gets ``log q`` = the smallest ``log q`` of the row minus 10 (a detached floor: it has no
gradient, and keeps the loss finite where the target's top tokens fall outside the head).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["LOSSES", "DistillMetrics", "PlacedLogits", "SubsetLogits", "distill_loss", "placed_loss"]

LOSSES: tuple[str, ...] = ("kl", "tvd")


@dataclass
class SubsetLogits:
    """A drafter's logits over a subset of the target's vocabulary.

    Shape:
        logits: ``[b, t, N]``; token_ids: ``[N]`` int64, the target id of each column;
        column_of: ``[V]`` int64, the column of each target id (-1: not in the subset).
    """

    logits: Tensor
    token_ids: Tensor
    column_of: Tensor


@dataclass
class PlacedLogits:
    """Draft logits whose labels sit at other positions of the batch: row ``(b, i)`` is trained
    toward the target's distribution at position ``source[b, i]`` of row ``b`` (a block drafter
    predicts several positions from one anchor, and a position from several anchors), weighed
    ``weights[b, i]`` in the loss.

    Shape:
        logits: ``[b, m, V]`` (or :class:`SubsetLogits` of ``[b, m, N]``); source: ``[b, m]``
        int64 in ``[0, t)``; counted: ``[b, m]`` bool (rows that count, before the batch's own
        ``counted`` at ``source`` is applied); weights: ``[b, m]`` float or None (all 1).
    """

    logits: Tensor | SubsetLogits
    source: Tensor
    counted: Tensor
    weights: Tensor | None = None


def placed_loss(placed: PlacedLogits, top_logp: Tensor, top_ids: Tensor, counted: Tensor, loss: str = "kl"
                ) -> "DistillMetrics":
    """:func:`distill_loss` of :class:`PlacedLogits`: the labels gathered at ``source`` (a row
    counts where ``placed.counted`` and the batch's ``counted`` at its source both hold).

    Shape: top_logp, top_ids ``[b, t, k]``; counted ``[b, t]`` bool.
    """
    index = placed.source[..., None].expand(-1, -1, top_ids.shape[-1])
    mask = placed.counted & counted.gather(1, placed.source)
    return distill_loss(placed.logits, top_logp.gather(1, index), top_ids.gather(1, index), mask, loss,
                        weights=placed.weights)


@dataclass
class DistillMetrics:
    """Means over the counted positions: the loss, greedy agreement (the draft's argmax is the
    target's: a greedy draft token is accepted) and the sampled acceptance ``sum min(p, q)``
    over the kept ids (exact when they cover the vocabulary, a lower bound otherwise)."""

    loss: Tensor
    greedy_acceptance: float
    sampled_acceptance: float
    positions: int


def distill_loss(draft_logits: Tensor | SubsetLogits, top_logp: Tensor, top_ids: Tensor, mask: Tensor,
                 loss: str = "kl", weights: Tensor | None = None) -> DistillMetrics:
    """The distillation loss and acceptance estimates of one batch (``weights``: the loss is the
    weighted mean over the counted positions; the estimates stay plain means).

    Shape:
        draft_logits: ``[b, t, V]`` the drafter's next-token logits (or :class:`SubsetLogits`).
        top_logp: ``[b, t, k]`` the target's largest log-probabilities, decreasing.
        top_ids: ``[b, t, k]`` int, their token ids.
        mask: ``[b, t]`` bool, the positions that count.
        weights: ``[b, t]`` float or None.
    """
    if loss not in LOSSES:
        raise ValueError(f"loss: expected one of {', '.join(LOSSES)}, got {loss!r}")
    ids = top_ids.long()
    if isinstance(draft_logits, SubsetLogits):
        log_q = torch.log_softmax(draft_logits.logits.float(), dim=-1)
        columns = draft_logits.column_of[ids]
        floor = log_q.detach().amin(-1, keepdim=True) - 10.0
        log_q_top = torch.where(columns >= 0, log_q.gather(-1, columns.clamp_min(0)), floor)
        argmax = draft_logits.token_ids[log_q.argmax(-1)]
    else:
        log_q = torch.log_softmax(draft_logits.float(), dim=-1)
        log_q_top = log_q.gather(-1, ids)
        argmax = log_q.argmax(-1)
    log_p = top_logp.float()
    p = log_p.exp()
    q_top = log_q_top.exp()
    if loss == "kl":
        # ids the drafter cannot propose (a reduced draft vocabulary: -inf logits) are left out
        # of the KL; their mass still lowers the acceptance estimates
        outside = torch.isneginf(log_q_top)
        per_position = torch.where(outside, torch.zeros_like(p), p * (log_p - log_q_top)).sum(-1)
    else:
        rest = (q_top.sum(-1) - p.sum(-1)).abs()
        per_position = 0.5 * ((p - q_top).abs().sum(-1) + rest)
    count = int(mask.sum())
    if weights is None:
        value = (per_position * mask).sum() / max(count, 1)
    else:
        weighted = weights.float() * mask
        value = (per_position * weighted).sum() / weighted.sum().clamp_min(1e-9)
    with torch.no_grad():
        greedy = ((argmax == ids[..., 0]) & mask).sum().item() / max(count, 1)
        sampled = (torch.minimum(p, q_top).sum(-1) * mask).sum().item() / max(count, 1)
    return DistillMetrics(value, greedy, sampled, count)
