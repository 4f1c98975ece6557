"""Reduced vocabularies in training: which ids a reduced head keeps (the ones the data uses
most), and the target head over them.

A drafter with a reduced head (EAGLE's ``draft_vocab_size``, the exit adapter's, Medusa's and
Hydra's ``head_tokens``) computes logits for ``N`` of the target's ``V`` ids; its loss scores them
as :class:`~specdecode.training.losses.SubsetLogits` (:func:`column_map` says where each target id
sits among them).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["check_head_tokens", "column_map", "draft_vocabulary", "subset_head"]


def draft_vocabulary(examples: list[Any], vocab_size: int, size: int) -> Tensor:
    """The ``size`` ids most frequent in ``examples`` (their tokens and the target's top-1
    predictions at the positions that count, from ``start`` on), most frequent first, ties by id.
    Shape: returns ``[size]`` int64."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for e in examples:
        counts += torch.bincount(e.input_ids.long().clamp(0, vocab_size - 1), minlength=vocab_size)
        counts += torch.bincount(e.top_ids[e.start:, 0].long().clamp(0, vocab_size - 1), minlength=vocab_size)
    order = sorted(range(vocab_size), key=lambda i: (-int(counts[i]), i))
    return torch.tensor(order[:size], dtype=torch.long)


def column_map(token_ids: Tensor, vocab_size: int) -> Tensor:
    """Each target id's column among ``token_ids`` (-1: not kept), on ``token_ids``' device.

    Shape: token_ids ``[N]``; returns ``[vocab_size]`` int64.

    >>> column_map(torch.tensor([5, 2]), 6).tolist()
    [-1, -1, 1, -1, -1, 0]
    """
    columns = torch.full((vocab_size,), -1, dtype=torch.long, device=token_ids.device)
    columns[token_ids.long()] = torch.arange(token_ids.numel(), device=token_ids.device)
    return columns


def subset_head(target: nn.Module, token_ids: Tensor | None, vocab_size: int) -> Callable[[Tensor], Tensor]:
    """The target's LM head as a function of hidden states, with detached weights (gradients
    reach its input only): over ``token_ids`` (their order) or, when None, the target's first
    ``vocab_size`` ids. The rows are read now, once: make one per training forward.

    Shape:
        hidden ``[..., H]`` -> ``[..., N]`` (``[..., vocab_size]`` when ``token_ids`` is None).

    >>> head = subset_head(target, torch.tensor([5, 9]), vocab_rows(target))  # doctest: +SKIP
    >>> head(hidden).shape[-1]                                                # doctest: +SKIP
    2
    """
    head = target.get_output_embeddings()
    weight = head.weight.detach()
    bias = None if getattr(head, "bias", None) is None else head.bias.detach()
    if token_ids is None:
        return lambda hidden: F.linear(hidden, weight, bias)[..., :vocab_size]
    ids = token_ids.to(weight.device)
    rows, row_bias = weight[ids], None if bias is None else bias[ids]
    return lambda hidden: F.linear(hidden, rows, row_bias)


def check_head_tokens(head_tokens: Any) -> int | None:
    """``head_tokens`` (a reduced head's size), or ``ValueError`` naming it unless it is an int
    >= 1 or None."""
    if head_tokens is not None and (isinstance(head_tokens, bool) or not isinstance(head_tokens, int)
                                    or head_tokens < 1):
        raise ValueError(f"head_tokens: expected an int >= 1 or None, got {head_tokens!r}")
    return head_tokens
