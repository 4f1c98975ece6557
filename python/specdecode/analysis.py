"""Analysis formulas of speculative decoding (Leviathan et al. 2022, §3; docs/verification.md §9).

>>> round(expected_speedup(alpha=0.8, num_draft_tokens=5, cost_ratio=0.0), 2)
3.69
>>> optimal_num_draft_tokens(alpha=0.8, cost_ratio=0.05)
8
"""

from __future__ import annotations

import torch
from torch import Tensor


def _check_alpha(alpha: float) -> float:
    alpha = float(alpha)
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha: expected an acceptance rate in [0, 1], got {alpha}")
    return alpha


def _check_gamma(num_draft_tokens: int) -> int:
    if isinstance(num_draft_tokens, bool) or int(num_draft_tokens) != num_draft_tokens or num_draft_tokens < 0:
        raise ValueError(f"num_draft_tokens: expected an int >= 0, got {num_draft_tokens!r}")
    return int(num_draft_tokens)


def acceptance_rate(target_probs: Tensor, draft_probs: Tensor) -> Tensor:
    """``beta = sum_x min(p(x), q(x)) = 1 - TV(p, q)`` per distribution pair.

    Shape:
        target_probs, draft_probs: ``[..., V]``; returns ``[...]``.
    """
    if target_probs.shape != draft_probs.shape:
        raise ValueError(
            f"draft_probs: expected the shape of target_probs {tuple(target_probs.shape)}, got {tuple(draft_probs.shape)}"
        )
    return torch.minimum(target_probs, draft_probs).sum(-1)


def expected_tokens_per_call(alpha: float, num_draft_tokens: int) -> float:
    """Expected tokens emitted per target call: ``(1 - alpha^(gamma+1)) / (1 - alpha)``."""
    alpha, gamma = _check_alpha(alpha), _check_gamma(num_draft_tokens)
    if alpha == 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def expected_speedup(alpha: float, num_draft_tokens: int, cost_ratio: float) -> float:
    """Expected wall-time improvement ``(1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1))``,
    with ``c = cost_ratio = t_draft / t_target`` per call."""
    if not cost_ratio >= 0.0:
        raise ValueError(f"cost_ratio: expected c = t_draft / t_target >= 0, got {cost_ratio}")
    gamma = _check_gamma(num_draft_tokens)
    return expected_tokens_per_call(alpha, gamma) / (gamma * cost_ratio + 1.0)


def expected_work_increase(alpha: float, num_draft_tokens: int, cost_ratio: float) -> float:
    """Expected growth of arithmetic work ``(1 - alpha)(gamma c + gamma + 1) / (1 - alpha^(gamma+1))``."""
    gamma = _check_gamma(num_draft_tokens)
    return (gamma * cost_ratio + gamma + 1.0) / expected_tokens_per_call(alpha, gamma)


def optimal_num_draft_tokens(alpha: float, cost_ratio: float, max_num_draft_tokens: int = 64) -> int:
    """The ``gamma`` in ``1..max_num_draft_tokens`` that maximises :func:`expected_speedup`."""
    _check_alpha(alpha)
    if isinstance(max_num_draft_tokens, bool) or int(max_num_draft_tokens) != max_num_draft_tokens or max_num_draft_tokens < 1:
        raise ValueError(f"max_num_draft_tokens: expected an int >= 1, got {max_num_draft_tokens!r}")
    best = max(range(1, max_num_draft_tokens + 1), key=lambda g: (expected_speedup(alpha, g, cost_ratio), -g))
    return best


def cost_aware_speedup(block_efficiency: float, num_draft_tokens: int, draft_call_seconds: float,
                       verify_call_seconds: float, target_step_seconds: float) -> float:
    """Speed-up predicted from measured call costs:
    ``block_efficiency * target_step_seconds / (gamma * draft_call_seconds + verify_call_seconds)``.

    :func:`expected_speedup` assumes that a verify call (one target forward over gamma + 1
    tokens) costs one single-token decode step; on a CPU it often costs more. This uses the
    measured times instead (all in seconds, for the same batch), so only per-step overheads
    (verification, bookkeeping) separate it from a measured speed-up.

    >>> round(cost_aware_speedup(3.0, 5, 0.001, 0.02, 0.01), 2)
    1.2
    """
    gamma = _check_gamma(num_draft_tokens)
    values = {"block_efficiency": block_efficiency, "draft_call_seconds": draft_call_seconds,
              "verify_call_seconds": verify_call_seconds, "target_step_seconds": target_step_seconds}
    for name, value in values.items():
        if not float(value) >= 0.0:
            raise ValueError(f"{name}: expected a value >= 0, got {value}")
    step_cost = gamma * draft_call_seconds + verify_call_seconds
    if step_cost <= 0.0:
        raise ValueError("verify_call_seconds: the draft and verify calls must take some time (> 0 in total)")
    return float(block_efficiency) * float(target_step_seconds) / step_cost
