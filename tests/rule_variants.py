"""Vectorised PyTorch verification rules for the statistical harness of ``stat_utils.py``:
token (speculative sampling) and block verification written plainly, as controls, and the
deliberately broken variants (no residual, a wrong acceptance test, block verification's
``h`` replaced by ``w``) that the exact tests must reject.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from stat_utils import inverse_cdf
from torch import Tensor


def _assemble(draft_tokens: Tensor, tau: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    B, g = draft_tokens.shape
    pos = torch.arange(g + 1, device=draft_tokens.device)[None, :]
    padded = torch.cat([draft_tokens, draft_tokens.new_zeros(B, 1)], 1)
    tokens = torch.where(pos < tau[:, None], padded, torch.full_like(padded, -1))
    tokens = torch.where(pos == tau[:, None], y[:, None].expand(-1, g + 1), tokens)
    return tokens, tau


def _leading_true(mask: Tensor) -> Tensor:
    """Number of leading True entries per row. ``[B, g]`` bool -> ``[B]`` int64."""
    return mask.long().cumprod(-1).sum(-1)


def make_token_rule(*, residual: bool = True, accept: str = "ratio") -> Callable:
    """A vectorised PyTorch token-verification rule for :func:`specdecode.register_rule`.

    ``residual=True, accept="ratio"`` is the correct rule (a control the harness must pass).
    Broken variants: ``residual=False`` emits ``y ~ p_{tau+1}`` after a rejection instead of
    the residual; ``accept="p"`` accepts with probability ``p(x)`` instead of ``min(1, p/q)``;
    ``accept="always"`` accepts every draft (the draft's distribution is emitted).
    """

    def rule(target_probs, draft_probs, draft_tokens, *, num_draft_tokens, uniforms):
        p, q = target_probs.double(), draft_probs.double()
        B, g = draft_tokens.shape
        V = p.shape[2]
        x = draft_tokens.clamp(0, V - 1)
        p_x = p[:, :g].gather(2, x[..., None])[..., 0]
        q_x = q.gather(2, x[..., None])[..., 0]
        if accept == "ratio":
            ok = uniforms[:, :g] < p_x / q_x
        elif accept == "p":
            ok = uniforms[:, :g] < p_x
        elif accept == "always":
            ok = torch.ones_like(p_x, dtype=torch.bool)
        else:
            raise ValueError(accept)
        used = torch.arange(g, device=x.device)[None, :] < num_draft_tokens[:, None]
        tau = _leading_true(ok & used)
        rows = torch.arange(B, device=x.device)
        p_next = p[rows, tau]
        q_next = q[rows, tau.clamp(max=g - 1)]
        full = tau == num_draft_tokens
        if residual:
            weights = torch.where(full[:, None], p_next, (p_next - q_next).clamp_min(0.0))
        else:
            weights = p_next
        u = uniforms[:, g]
        y = inverse_cdf(weights, u)
        y = torch.where(y < 0, inverse_cdf(p_next, u), y)
        return _assemble(draft_tokens, tau, y)

    return rule


def make_block_rule(*, h: str = "correct") -> Callable:
    """A vectorised PyTorch block-verification rule (docs/verification.md §3). ``h="correct"`` is the lossless
    rule (a control); ``h="w"`` is the broken variant that uses ``h_i = w_i`` for every i."""

    def rule(target_probs, draft_probs, draft_tokens, *, num_draft_tokens, uniforms):
        p, q = target_probs.double(), draft_probs.double()
        B, g = draft_tokens.shape
        V = p.shape[2]
        dev = draft_tokens.device
        x = draft_tokens.clamp(0, V - 1)
        p_x = p[:, :g].gather(2, x[..., None])[..., 0]
        q_x = q.gather(2, x[..., None])[..., 0]
        ratio = torch.where(q_x > 0, p_x / q_x.clamp_min(1e-300), torch.where(p_x > 0, math.inf, 0.0))
        w = [torch.ones(B, dtype=torch.float64, device=dev)]
        for i in range(g):
            w.append(torch.where((w[-1] == 0) | (p_x[:, i] == 0), 0.0, torch.clamp(w[-1] * ratio[:, i], max=1.0)))
        W = torch.stack(w, 1)  # [B, g+1], W[:, i] = w_i
        hs = []
        for i in range(1, g + 1):
            if h == "w" or i == g:
                hs.append(W[:, i])
                continue
            z = (W[:, i, None] * p[:, i] - q[:, i]).clamp_min(0.0).sum(-1)
            denom = z + (1.0 - W[:, i])
            formula = torch.where(denom > 0, z / denom.clamp_min(1e-300), 1.0)
            hs.append(torch.where(num_draft_tokens == i, W[:, i], formula))  # h_n = w_n
        H = torch.stack(hs, 1)  # [B, g], H[:, i-1] = h_i
        idx = torch.arange(1, g + 1, device=dev)[None, :]
        accepted = (uniforms[:, :g] < H) & (idx <= num_draft_tokens[:, None])
        tau = torch.where(accepted, idx, 0).amax(-1)
        rows = torch.arange(B, device=dev)
        p_next = p[rows, tau]
        q_next = q[rows, tau.clamp(max=g - 1)]
        full = tau == num_draft_tokens
        w_tau = W[rows, tau]
        weights = torch.where(full[:, None], p_next, (w_tau[:, None] * p_next - q_next).clamp_min(0.0))
        u = uniforms[:, g]
        y = inverse_cdf(weights, u)
        y = torch.where(y < 0, inverse_cdf(p_next, u), y)
        return _assemble(draft_tokens, tau, y)

    return rule
