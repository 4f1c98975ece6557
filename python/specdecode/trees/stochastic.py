"""Drawing the children of a node for the stochastic tree rules (float64 reference).

SpecInfer's multi-step speculative sampling and recursive rejection sampling verify children
that were *sampled* from the draft. They reproduce the target's distribution only when:

1. the number of children of a node is fixed before any of them is drawn: it comes from the
   tree shape, and may depend on the node's ancestors but never on the children themselves;
2. the children are drawn from exactly the draft distribution ``q`` at the node that
   verification reads (the processed distribution: temperature, top-k, top-p, min-p), in rank
   order: the ``r``-th draw is the child of rank ``r`` (index order = draw order);
3. i.i.d. for SpecInfer; without replacement for recursive rejection sampling (after each draw
   the drawn token's probability is set to 0 and the rest renormalised);
4. every drawn child is kept, in draw order.

Drawing several children and keeping the most probable (EAGLE-2's re-ranking applied to
sampled children) breaks 1 and 4: the kept child is no longer a draw from ``q``, and the
emitted tokens no longer follow the target's law. The tests show it by exact enumeration.

:func:`draw_children` is the pure-PyTorch definition of the draws (one uniform per draw,
inverse CDF over a sequential float64 cumulative sum, as the verification ops sample); the
generation engine uses a compiled equivalent.

>>> import torch
>>> q = torch.tensor([[0.5, 0.3, 0.2]], dtype=torch.float64)
>>> u = torch.tensor([[0.1, 0.1]], dtype=torch.float64)
>>> draw_children(q, 2, replacement=True, uniforms=u).tolist()      # i.i.d.: same token twice
[[0, 0]]
>>> draw_children(q, 2, replacement=False, uniforms=u).tolist()     # second draw over {1, 2}
[[0, 1]]
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["draw_children"]

_SUM_TOLERANCE = 1e-6


def draw_children(probs: Tensor, num_children: int, replacement: bool,
                  uniforms: Tensor) -> Tensor:
    """Draw ``num_children`` children per row from ``probs`` with the given uniforms.

    Draw ``j`` returns the first token ``x`` with ``w(x) > 0`` whose cumulative weight exceeds
    ``uniforms[:, j] * total``, where ``w`` is ``probs`` (``replacement=True``: i.i.d. draws)
    or ``probs`` with the earlier draws of the row set to 0 (``replacement=False``; dividing by
    the remaining ``total`` is the renormalisation). When no mass remains (more draws without
    replacement than tokens with ``probs > 0``) the draw is ``-1``.

    Shape:
        probs: ``[B, V]`` float64, rows summing to 1; uniforms: ``[B, num_children]`` float64
        in ``[0, 1)``; returns ``[B, num_children]`` int64.
    """
    if isinstance(num_children, bool) or not isinstance(num_children, int):
        raise TypeError(f"num_children: expected an int, got {type(num_children).__name__}")
    if num_children < 0:
        raise ValueError(f"num_children: expected >= 0, got {num_children}")
    if not isinstance(replacement, bool):
        raise TypeError(f"replacement: expected a bool, got {type(replacement).__name__}")
    for name, tensor in (("probs", probs), ("uniforms", uniforms)):
        if not isinstance(tensor, Tensor) or tensor.dtype != torch.float64:
            raise TypeError(f"{name}: expected a float64 tensor, got "
                            f"{getattr(tensor, 'dtype', type(tensor).__name__)}")
    if probs.dim() != 2 or probs.shape[1] < 1:
        raise ValueError(f"probs: expected shape [B, V] with V >= 1, got {tuple(probs.shape)}")
    batch = probs.shape[0]
    if uniforms.shape != (batch, num_children):
        raise ValueError(f"uniforms: expected shape [{batch}, {num_children}], got "
                         f"{tuple(uniforms.shape)}")
    if uniforms.device != probs.device:
        raise ValueError(f"uniforms: expected device {probs.device}, got {uniforms.device}")
    if not bool(torch.isfinite(probs).all()) or bool((probs < 0).any()):
        raise ValueError("probs: expected finite, non-negative probabilities")
    if batch > 0 and float((probs.sum(dim=1) - 1.0).abs().max()) > _SUM_TOLERANCE:
        raise ValueError(f"probs: every row must sum to 1 (tolerance {_SUM_TOLERANCE:g})")
    if bool(((uniforms < 0) | (uniforms >= 1) | torch.isnan(uniforms)).any()):
        raise ValueError("uniforms: expected values in [0, 1)")

    weights = probs.clone()
    token_ids = torch.arange(probs.shape[1], device=probs.device)
    tokens = torch.full((batch, num_children), -1, dtype=torch.int64, device=probs.device)
    for j in range(num_children):
        cumulative = torch.cumsum(weights, dim=1)
        total = cumulative[:, -1:]
        positive = weights > 0
        hit = (cumulative > uniforms[:, j : j + 1] * total) & positive
        first_hit = torch.where(hit, token_ids, probs.shape[1]).min(dim=1).values
        # u * total rounding up to the total: the last token with positive weight
        last_positive = torch.where(positive, token_ids, -1).max(dim=1).values
        drawn = torch.where(first_hit < probs.shape[1], first_hit, last_positive)
        drawn = torch.where(total[:, 0] > 0, drawn, torch.full_like(drawn, -1))
        tokens[:, j] = drawn
        if not replacement:
            weights = weights.masked_fill(token_ids[None, :] == drawn[:, None], 0.0)
    return tokens
