"""Where a row's generation stops, the same on both decode paths.

A step proposes ``k`` drafts and verification returns ``k + 1`` tokens per row, of which the
first ``accepted_len + 1`` are the row's new tokens. What a row may keep of them is cut at its
first end-of-sequence token and capped by what ``max_new_tokens`` leaves; a row finishes on EOS
or when it has generated ``max_new_tokens`` (the eager loop adds Hugging Face stopping criteria).

These are tensor operations only, with no read on the host: the static path records them into
CUDA graphs, the eager loop runs them on its active rows.
"""

from __future__ import annotations

import torch
from torch import Tensor


def verify_budget(remaining: Tensor, num_drafts: int) -> Tensor:
    """Drafts worth verifying per row ``[b]``: a step emits the accepted drafts plus one more
    token, so a row with ``remaining`` tokens left to generate verifies at most ``remaining - 1``
    of its ``num_drafts`` drafts."""
    return (remaining - 1).clamp(0, num_drafts)


def emitted_lengths(tokens: Tensor, accepted_len: Tensor, remaining: Tensor, eos: Tensor | None,
                    index: Tensor) -> tuple[Tensor, Tensor]:
    """How many of ``tokens`` each row keeps, and whether an EOS token ended the row.

    The first ``accepted_len + 1`` tokens are kept, up to and including the first EOS among them,
    and never more than ``remaining``.

    Shape:
        tokens: ``[b, w]`` int64; accepted_len, remaining: ``[b]`` int64; eos: ``[e]`` int64 or
        None (no EOS); index: ``arange(w)``. Returns ``([b] int64, [b] bool)``.
    """
    keep = accepted_len + 1
    has_eos = torch.zeros_like(keep, dtype=torch.bool)
    if eos is not None:
        is_eos = torch.isin(tokens, eos) & (index[None, :] < keep[:, None])
        has_eos = is_eos.any(1)
        keep = torch.where(has_eos, is_eos.to(torch.int8).argmax(1) + 1, keep)
    return torch.minimum(keep, remaining), has_eos


def output_columns(keep: Tensor, first: Tensor, index: Tensor, trash: int) -> Tensor:
    """The output column of each emitted token ``[b, w]``: row ``r`` writes its ``keep[r]`` kept
    tokens from column ``first[r]`` on, and the rest into the ``trash`` column (whose content is
    never read), so that every row writes the same number of values.

    Shape:
        keep, first: ``[b]`` int64; index: ``arange(w)``.
    """
    return torch.where(index[None, :] < keep[:, None], first[:, None] + index[None, :], trash)


def finished_rows(ended: Tensor, generated: Tensor, max_new_tokens: int) -> Tensor:
    """Rows that are done ``[b]`` bool: ended (EOS, a stopping criterion) or at ``max_new_tokens``
    tokens (``generated``: each row's count after this step)."""
    return ended | (generated >= max_new_tokens)
