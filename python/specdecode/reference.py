"""Pure-PyTorch reference of every built-in verification rule, written straight from
``docs/verification.md``. It is the documentation of the math and the oracle the
tests compare the compiled ops against.

Every function works on one row at a time, in float64, with plain tensor operations, so each
line can be read against that page. Given the same uniforms, :func:`verify_reference` returns
exactly the tokens and accepted lengths of the compiled ``verify`` op: both sample with the
same inverse CDF (a sequential float64 cumulative sum), compare ``u < ratio`` on half-open
intervals, and clip the block weights in the same order.

Uniforms layout (shared with the ops): ``uniforms[b, i]`` for ``i < num_draft_tokens[b]`` is
the acceptance coin ``u_{i+1}`` of draft token ``i``; ``uniforms[b, gamma]`` (the last column)
is the coin of the emitted token's inverse-CDF draw. Other columns are unused.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor


class VerifyOutput(NamedTuple):
    """Result of one verification call.

    Shape:
        tokens: ``[B, gamma+1]`` int64 — the accepted drafts, then the one emitted token,
            then ``-1`` padding.
        accepted_len: ``[B]`` int64 — ``tau``, the number of accepted drafts per row; each row
            emits ``tau + 1`` tokens.
    """

    tokens: Tensor
    accepted_len: Tensor

    @property
    def emitted_len(self) -> Tensor:
        """Tokens emitted per row (``accepted_len + 1``). Shape: ``[B]``."""
        return self.accepted_len + 1


# --------------------------------------------------------------------------- sampling helpers


def sample_inverse_cdf(weights: Tensor, u: float) -> int:
    """Index ``x`` of the first cumulative weight above ``u * total`` (docs/verification.md §7).

    Shape:
        weights: ``[V]`` non-negative float64 (need not be normalised).

    The cumulative sum is sequential float64 (``torch.cumsum`` on the CPU), so ``total`` and
    every partial sum equal the compiled kernel's. A zero weight never raises the cumulative
    sum, so a zero-probability token is never returned. Returns -1 when the mass is 0.
    """
    cumulative = torch.cumsum(weights, 0)
    total = float(cumulative[-1])
    if not (total > 0.0) or not math.isfinite(total):
        return -1
    hits = torch.nonzero((cumulative > u * total) & (weights > 0)).flatten()
    if hits.numel() > 0:
        return int(hits[0])
    return int(torch.nonzero(weights > 0).flatten()[-1])


def sample_residual(residual: Tensor, fallback: Tensor, u: float) -> int:
    """``y ~ norm(residual)``; a residual with zero mass falls back to ``fallback`` (docs/verification.md §7)."""
    y = sample_inverse_cdf(residual, u)
    return y if y >= 0 else sample_inverse_cdf(fallback, u)


def argmax_lowest(p: Tensor) -> int:
    """argmax with ties broken towards the lowest id (``torch.argmax`` on the CPU does this)."""
    return int(torch.argmax(p))


# ----------------------------------------------------------------------------- the five rules


def token_verify_row(p: Tensor, q: Tensor, x: Tensor, u: Tensor, u_emit: float) -> tuple[list[int], int]:
    """Token verification (Leviathan et al. 2022 Alg. 1; Chen et al. 2023). Lossless.

    Shape:
        p: ``[n+1, V]`` float64 target distributions; q: ``[n, V]`` draft distributions;
        x: ``[n]`` drafted tokens; u: ``[n]`` acceptance coins.

    Returns the emitted tokens (``tau`` accepted drafts and ``y``) and ``tau``.
    """
    n = x.numel()
    for i in range(n):
        xi = int(x[i])
        p_x, q_x = float(p[i, xi]), float(q[i, xi])
        accept = (float(u[i]) < p_x / q_x) if q_x > 0 else (p_x > 0)
        if not accept:
            y = sample_residual((p[i] - q[i]).clamp_min(0.0), p[i], u_emit)
            return [int(t) for t in x[:i]] + [y], i
    return [int(t) for t in x] + [sample_inverse_cdf(p[n], u_emit)], n


def block_weight(w_prev: float, p_x: float, q_x: float) -> float:
    """``min(1, w_prev * p / q)``; ``q = 0`` with ``p > 0`` is an infinite ratio."""
    if w_prev == 0.0 or p_x == 0.0:
        return 0.0
    if not q_x > 0.0:
        return 1.0
    return min(1.0, w_prev * (p_x / q_x))


def block_verify_row(p: Tensor, q: Tensor, x: Tensor, u: Tensor, u_emit: float) -> tuple[list[int], int]:
    """Block verification (Sun et al.). Lossless and optimal. Shapes as :func:`token_verify_row`.

    ``w_i = min(1, w_{i-1} p_i(x_i)/q_i(x_i))``; ``h_i = Z_i / (Z_i + 1 - w_i)`` with
    ``Z_i = sum_x (w_i p_{i+1}(x) - q_{i+1}(x))_+`` for ``i < n`` and ``h_n = w_n``;
    ``tau = max{i : u_i < h_i}``; ``y ~ norm((w_tau p_{tau+1} - q_{tau+1})_+)`` or ``p_{n+1}``.
    """
    n = x.numel()
    w = [1.0]
    for i in range(n):
        xi = int(x[i])
        w.append(block_weight(w[-1], float(p[i, xi]), float(q[i, xi])))
    h = []
    for i in range(1, n + 1):
        if i == n:
            h.append(w[n])
            continue
        z = float(torch.cumsum((w[i] * p[i] - q[i]).clamp_min(0.0), 0)[-1])  # sequential sum
        denom = z + (1.0 - w[i])
        h.append(z / denom if denom > 0.0 else 1.0)
    tau = 0
    for i in range(1, n + 1):
        if float(u[i - 1]) < h[i - 1]:
            tau = i
    accepted = [int(t) for t in x[:tau]]
    if tau == n:
        return accepted + [sample_inverse_cdf(p[n], u_emit)], n
    residual = (w[tau] * p[tau] - q[tau]).clamp_min(0.0)
    return accepted + [sample_residual(residual, p[tau], u_emit)], tau


def greedy_verify_row(p: Tensor, x: Tensor) -> tuple[list[int], int]:
    """Greedy verification: accept while ``x_i == argmax p_i``; ``y = argmax p_{tau+1}``."""
    n = x.numel()
    for i in range(n):
        best = argmax_lowest(p[i])
        if int(x[i]) != best:
            return [int(t) for t in x[:i]] + [best], i
    return [int(t) for t in x] + [argmax_lowest(p[n])], n


def entropy(p: Tensor) -> float:
    """``H(p) = -sum p log p`` with ``0 log 0 = 0``."""
    positive = p[p > 0]
    return float(-(positive * positive.log()).sum())


def typical_verify_row(
    p: Tensor, x: Tensor, epsilon: float, delta: float, sample_correction: bool, u_emit: float
) -> tuple[list[int], int]:
    """Typical acceptance (Medusa). Lossy.

    Accept while ``p_i(x_i) > min(epsilon, delta * exp(-H(p_i)))``; then ``y = argmax p_{tau+1}``
    (or ``y ~ p_{tau+1}`` with ``sample_correction``).
    """
    n = x.numel()
    tau = n
    for i in range(n):
        threshold = min(epsilon, delta * math.exp(-entropy(p[i])))
        if not float(p[i, int(x[i])]) > threshold:
            tau = i
            break
    y = sample_inverse_cdf(p[tau], u_emit) if sample_correction else argmax_lowest(p[tau])
    return [int(t) for t in x[:tau]] + [y], tau


def top_beta_verify_row(p: Tensor, x: Tensor, beta: int, tolerance: float) -> tuple[list[int], int]:
    """Top-beta with tolerance (SpecDec). Lossy.

    Accept while fewer than ``beta`` tokens are strictly more likely than ``x_i`` and
    ``log p_i(argmax) - log p_i(x_i) <= tolerance`` (never a token with ``p = 0``);
    then ``y = argmax p_{tau+1}``.
    """
    n = x.numel()
    tau = n
    for i in range(n):
        p_x = float(p[i, int(x[i])])
        accept = p_x > 0.0
        if accept:
            more_likely = int((p[i] > p_x).sum())
            accept = more_likely < beta and math.log(float(p[i].max())) - math.log(p_x) <= tolerance
        if not accept:
            tau = i
            break
    return [int(t) for t in x[:tau]] + [argmax_lowest(p[tau])], tau


# ------------------------------------------------------------------- standardized sampling


def process_logits(
    logits: Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0
) -> Tensor:
    """Logits to the processed distribution that both target and draft are verified with.

    Shape:
        logits: ``[..., V]``; returns float64 probabilities of the same shape.

    Order (each step renormalises): temperature ``T`` (``T = 0``: one-hot on the argmax, lowest
    id on ties); top-k keeps every token whose logit ties or beats the k-th largest; top-p keeps
    token ``x`` iff the mass of tokens *strictly* more likely than ``x`` is below ``top_p``
    (ties are kept together); min-p keeps ``x`` iff ``p(x) >= min_p * max p``.
    """
    logits = logits.double()
    V = logits.shape[-1]
    if temperature == 0.0:
        return torch.nn.functional.one_hot(logits.argmax(-1), V).double()
    scaled_exp = torch.exp((logits - logits.amax(-1, keepdim=True)) / temperature)  # max -> 1
    keep = torch.ones_like(logits, dtype=torch.bool)
    if 0 < top_k < V:
        kth_largest = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        keep &= logits >= kth_largest
    if top_p < 1.0:
        kept_exp = scaled_exp * keep
        ascending, order = torch.sort(logits, dim=-1)
        cumulative = torch.cumsum(torch.gather(kept_exp, -1, order), -1)
        # mass of tokens with a logit <= logits[x], then everything above it
        upto = torch.searchsorted(ascending.contiguous(), logits.contiguous(), right=True) - 1
        mass_above = cumulative[..., -1:] - torch.gather(cumulative, -1, upto)
        keep &= mass_above < top_p * cumulative[..., -1:]
    if min_p > 0.0:
        keep &= scaled_exp >= min_p
    kept = scaled_exp * keep
    return kept / kept.sum(-1, keepdim=True)


# ------------------------------------------------------------------------- batched entry points


def verify_reference(
    target_probs: Tensor,
    draft_probs: Tensor | None,
    draft_tokens: Tensor,
    *,
    rule: str,
    num_draft_tokens: Tensor,
    uniforms: Tensor,
    epsilon: float = 0.09,
    delta: float = 0.3,
    sample_correction: bool = False,
    beta: int = 3,
    tolerance: float = 1.0,
) -> VerifyOutput:
    """Row-by-row reference of ``specdecode.verify`` for the built-in rules.

    Shape:
        target_probs: ``[B, gamma+1, V]``; draft_probs: ``[B, gamma, V]`` or None;
        draft_tokens: ``[B, gamma]``; num_draft_tokens: ``[B]``; uniforms: ``[B, gamma+1]``.
    """
    B, gamma = draft_tokens.shape
    tokens = torch.full((B, gamma + 1), -1, dtype=torch.int64)
    accepted_len = torch.zeros(B, dtype=torch.int64)
    for b in range(B):
        n = int(num_draft_tokens[b])
        p = target_probs[b, : n + 1].double().cpu()
        q = draft_probs[b, :n].double().cpu() if draft_probs is not None else None
        x = draft_tokens[b, :n].cpu()
        u = uniforms[b].double().cpu()
        u_emit = float(u[gamma])
        if rule == "token":
            row, tau = token_verify_row(p, q, x, u[:n], u_emit)
        elif rule == "block":
            row, tau = block_verify_row(p, q, x, u[:n], u_emit)
        elif rule == "greedy":
            row, tau = greedy_verify_row(p, x)
        elif rule == "typical":
            row, tau = typical_verify_row(p, x, epsilon, delta, sample_correction, u_emit)
        elif rule == "top_beta":
            row, tau = top_beta_verify_row(p, x, beta, tolerance)
        else:
            raise ValueError(f"rule: the reference has no built-in rule {rule!r}")
        tokens[b, : len(row)] = torch.tensor(row, dtype=torch.int64)
        accepted_len[b] = tau
    return VerifyOutput(tokens.to(draft_tokens.device), accepted_len.to(draft_tokens.device))


def verify_logits_reference(
    target_logits: Tensor,
    draft_logits: Tensor | None,
    draft_tokens: Tensor,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    rule: str,
    num_draft_tokens: Tensor,
    uniforms: Tensor,
    **rule_options: float,
) -> VerifyOutput:
    """Reference of ``specdecode.verify_logits``: :func:`process_logits`, then
    :func:`verify_reference`. Temperature 0 turns every built-in rule into greedy."""
    target_probs = process_logits(target_logits, temperature, top_k, top_p, min_p)
    draft_probs = None
    if draft_logits is not None:
        draft_probs = process_logits(draft_logits, temperature, top_k, top_p, min_p)
    if temperature == 0.0:
        rule, rule_options = "greedy", {}
    return verify_reference(
        target_probs,
        draft_probs,
        draft_tokens,
        rule=rule,
        num_draft_tokens=num_draft_tokens,
        uniforms=uniforms,
        **rule_options,
    )
