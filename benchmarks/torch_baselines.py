"""Token and block verification written with batched PyTorch tensor ops over all rows, as a
PyTorch user would write them: the baseline that bench_verify.py (CPU) and
cuda_verify_bench.py (GPU, also under torch.compile) measure specdecode against.

Coins come from explicit ``uniforms`` [B, gamma+1] (the ops' layout), so nothing syncs with
the host and the same call can be compiled.
"""

from __future__ import annotations

import torch


def _probs_at_drafts(target_logits: torch.Tensor, draft_logits: torch.Tensor, draft_tokens: torch.Tensor):
    """Softmax of both, and p_i(x_i), q_i(x_i) for every draft position: [B, gamma] each."""
    gamma = draft_tokens.shape[1]
    p = torch.softmax(target_logits.float(), -1)
    q = torch.softmax(draft_logits.float(), -1)
    p_x = p[:, :gamma].gather(-1, draft_tokens[..., None])[..., 0]
    q_x = q.gather(-1, draft_tokens[..., None])[..., 0]
    return p, q, p_x, q_x


def _inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One draw per row from non-negative weights [N, V] with coins u [N]."""
    cum = weights.cumsum(-1)
    idx = torch.searchsorted(cum, (u * cum[:, -1])[:, None], right=True)[:, 0]
    return idx.clamp(max=weights.shape[-1] - 1)


def _emit(p, q, draft_tokens, accepted_len, weight, u_emit):
    """y ~ norm((weight p_{tau+1} - q_{tau+1})_+), or p_{gamma+1} when all were accepted."""
    B, gamma = draft_tokens.shape
    rows = torch.arange(B, device=p.device)
    p_next = p[rows, accepted_len]
    q_next = q[rows, accepted_len.clamp(max=gamma - 1)]
    residual = (weight[:, None] * p_next - q_next).clamp_min(0)
    residual = torch.where((accepted_len < gamma)[:, None], residual, p_next)
    y = _inverse_cdf(residual, u_emit)
    pos = torch.arange(gamma + 1, device=p.device)[None]
    padded = torch.cat([draft_tokens, draft_tokens[:, :1]], 1)
    tokens = torch.where(pos < accepted_len[:, None], padded,
                         torch.where(pos == accepted_len[:, None], y[:, None], -1))
    return tokens, accepted_len


def torch_token(target_logits: torch.Tensor, draft_logits: torch.Tensor, draft_tokens: torch.Tensor,
                uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Token verification. Shape: logits [B, gamma+1, V] / [B, gamma, V], tokens [B, gamma],
    uniforms [B, gamma+1]; returns tokens [B, gamma+1] (-1 padded) and accepted_len [B]."""
    B, gamma = draft_tokens.shape
    p, q, p_x, q_x = _probs_at_drafts(target_logits, draft_logits, draft_tokens)
    accepted_len = (uniforms[:, :gamma] < (p_x / q_x).double()).int().cumprod(-1).sum(-1)
    return _emit(p, q, draft_tokens, accepted_len, torch.ones(B, device=p.device), uniforms[:, gamma].float())


def torch_block(target_logits: torch.Tensor, draft_logits: torch.Tensor, draft_tokens: torch.Tensor,
                uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Block verification; shapes as :func:`torch_token`."""
    B, gamma = draft_tokens.shape
    p, q, p_x, q_x = _probs_at_drafts(target_logits, draft_logits, draft_tokens)
    weights = [torch.ones(B, device=p.device)]
    for i in range(gamma):  # w_i = min(1, w_{i-1} p_i(x_i) / q_i(x_i))
        weights.append(torch.clamp(weights[-1] * (p_x[:, i] / q_x[:, i]), max=1.0))
    w = torch.stack(weights, 1)  # [B, gamma+1], w[:, 0] = 1
    z = (w[:, 1:gamma, None] * p[:, 1:gamma] - q[:, 1:]).clamp_min(0).sum(-1)
    denom = z + 1 - w[:, 1:gamma]
    h = torch.cat([torch.where(denom > 0, z / denom, torch.ones_like(z)), w[:, -1:]], 1)
    hits = (uniforms[:, :gamma] < h.double()).int() * torch.arange(1, gamma + 1, device=p.device)
    accepted_len = hits.amax(-1)
    rows = torch.arange(B, device=p.device)
    return _emit(p, q, draft_tokens, accepted_len, w[rows, accepted_len], uniforms[:, gamma].float())


TORCH_IMPLS = {"token": torch_token, "block": torch_block}
