"""A *reduced head*: the rows of a model's LM head for ``N`` of its token ids, scattered into
full-vocabulary logits that are ``-inf`` everywhere else.

Drafters that read the target's head (the exit adapter, Medusa and Hydra heads) may draft over
the ``N`` tokens their training data uses most: the proposal ``q`` is then zero outside them,
which every lossless rule accepts (verification only needs ``q > 0`` on drafted tokens), and a
draft step computes ``N`` rows of the head instead of ``V``. The rows are copied from the target
once, when the drafter is built; a saved drafter holds only the token ids.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["ReducedHead", "check_head_token_ids", "output_head"]


def check_head_token_ids(token_ids: Tensor | None) -> Tensor | None:
    """``token_ids`` as a sorted tensor of distinct int64 ids on the CPU (None stays None), or
    ``ValueError`` naming ``head_token_ids`` unless it is a non-empty 1-D tensor of ids >= 0.

    Shape:
        token_ids: ``[N]``; returns ``[N']`` (``N' <= N``: repeats dropped).

    >>> check_head_token_ids(torch.tensor([7, 2, 7])).tolist()
    [2, 7]
    """
    if token_ids is None:
        return None
    if (not isinstance(token_ids, Tensor) or token_ids.dim() != 1 or token_ids.numel() == 0
            or token_ids.is_floating_point() or token_ids.is_complex() or token_ids.dtype == torch.bool):
        raise ValueError("head_token_ids: expected a non-empty 1-D integer tensor of token ids")
    ids = torch.unique(token_ids.long().cpu())  # sorted, distinct
    if int(ids[0]) < 0:
        raise ValueError(f"head_token_ids: ids must be >= 0, got {int(ids[0])}")
    return ids


class ReducedHead(nn.Module):
    """The target head's rows for ``token_ids`` (copied once), scattered into full-vocabulary
    logits that are ``-inf`` everywhere else.

    Shape:
        hidden: ``[..., H]``; returns ``[..., V]``.

    >>> head = ReducedHead(target.get_output_embeddings(), torch.tensor([2, 7]), 111)  # doctest: +SKIP
    >>> head(hidden).isfinite().sum(-1)  # two finite logits per row                  # doctest: +SKIP
    """

    def __init__(self, head: nn.Module, token_ids: Tensor, vocab_size: int) -> None:
        super().__init__()
        weight = head.weight.detach()
        if int(token_ids.max()) >= min(weight.shape[0], vocab_size):
            raise ValueError(f"head_token_ids: ids must be below the head's {min(weight.shape[0], vocab_size)} rows")
        ids = token_ids.to(weight.device)
        bias = getattr(head, "bias", None)
        self.proj = nn.Linear(weight.shape[1], ids.numel(), bias=bias is not None, dtype=weight.dtype,
                              device=weight.device)
        with torch.no_grad():
            self.proj.weight.copy_(weight[ids])
            if bias is not None:
                self.proj.bias.copy_(bias.detach()[ids])
        self.proj.requires_grad_(False)
        self.register_buffer("token_ids", ids)
        self.vocab_size = vocab_size

    def forward(self, hidden: Tensor) -> Tensor:
        kept = self.proj(hidden)
        logits = kept.new_full((*kept.shape[:-1], self.vocab_size), float("-inf"))
        return logits.index_copy_(-1, self.token_ids, kept)


def output_head(target: nn.Module, token_ids: Tensor | None, vocab_size: int) -> nn.Module:
    """What a drafter reading ``target``'s head calls: the head itself (``token_ids`` None) or a
    :class:`ReducedHead` over ``token_ids`` giving ``vocab_size`` logits; ``ValueError`` naming
    ``target`` when it has no LM head with a weight.

    >>> logits = output_head(target, torch.tensor([2, 7]), 111)(hidden)  # [..., 111]  # doctest: +SKIP
    """
    head = target.get_output_embeddings()
    if token_ids is None:
        return head
    if head is None or not isinstance(getattr(head, "weight", None), Tensor):
        raise ValueError("target: a reduced head needs the target's output embeddings (an LM head with .weight)")
    return ReducedHead(head, token_ids, vocab_size)
