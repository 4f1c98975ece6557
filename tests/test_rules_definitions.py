"""Every built-in rule equals its definition in docs/verification.md, written here independently in plain
Python (not by calling specdecode.reference): greedy (§2, ties to the lowest id), typical
acceptance (§4), top-beta with tolerance (§5), and token / block verification (§1, §3) with
explicit uniforms; the numerical rules of §7 (half-open comparisons, zero-probability tokens,
zero-mass residuals); and the lossy rules measurably shift the output distribution.
"""

from __future__ import annotations

import math

import pytest
import torch

import specdecode
import stat_utils as su

# ------------------------------------------------- definitions from docs/verification.md


def _argmax_lowest(row: list[float]) -> int:
    best = max(row)
    return row.index(best)


def _inverse_cdf(weights: list[float], u: float) -> int:
    """First x whose running (sequential float64) sum exceeds u * total, among positive weights."""
    total = 0.0
    for w in weights:
        total += w
    assert total > 0.0
    cum, last = 0.0, -1
    for x, w in enumerate(weights):
        cum += w
        if w > 0.0:
            last = x
            if cum > u * total:
                return x
    return last


def greedy_def(p, x, n):
    for i in range(n):
        best = _argmax_lowest(p[i])
        if x[i] != best:
            return x[:i] + [best], i
    return x[:n] + [_argmax_lowest(p[n])], n


def typical_def(p, x, n, epsilon, delta, sample_correction, u_emit):
    tau = n
    for i in range(n):
        entropy = -sum(v * math.log(v) for v in p[i] if v > 0.0)
        if not p[i][x[i]] > min(epsilon, delta * math.exp(-entropy)):
            tau = i
            break
    y = _inverse_cdf(p[tau], u_emit) if sample_correction else _argmax_lowest(p[tau])
    return x[:tau] + [y], tau


def top_beta_def(p, x, n, beta, tolerance):
    tau = n
    for i in range(n):
        px = p[i][x[i]]
        rank = sum(1 for v in p[i] if v > px)  # tokens strictly more likely than x_i
        ok = px > 0.0 and rank < beta and math.log(max(p[i])) - math.log(px) <= tolerance
        if not ok:
            tau = i
            break
    return x[:tau] + [_argmax_lowest(p[tau])], tau


def token_def(p, q, x, n, u, u_emit):
    for i in range(n):
        if not u[i] < p[i][x[i]] / q[i][x[i]]:
            residual = [max(a - b, 0.0) for a, b in zip(p[i], q[i])]
            y = _inverse_cdf(residual, u_emit) if sum(residual) > 0 else _inverse_cdf(p[i], u_emit)
            return x[:i] + [y], i
    return x[:n] + [_inverse_cdf(p[n], u_emit)], n


def block_def(p, q, x, n, u, u_emit):
    w = [1.0]
    for i in range(n):
        w.append(min(1.0, w[-1] * (p[i][x[i]] / q[i][x[i]])))
    h = []
    for i in range(1, n + 1):
        if i == n:
            h.append(w[n])
            continue
        z = 0.0
        for a, b in zip(p[i], q[i]):
            z += max(w[i] * a - b, 0.0)
        denom = z + (1.0 - w[i])
        h.append(z / denom if denom > 0 else 1.0)
    tau = max([i for i in range(1, n + 1) if u[i - 1] < h[i - 1]], default=0)
    if tau == n:
        return x[:n] + [_inverse_cdf(p[n], u_emit)], n
    residual = [max(w[tau] * a - b, 0.0) for a, b in zip(p[tau], q[tau])]
    y = _inverse_cdf(residual, u_emit) if sum(residual) > 0 else _inverse_cdf(p[tau], u_emit)
    return x[:tau] + [y], tau


# ---------------------------------------------------------------------------- random inputs


def _random_case(B, gamma, V, seed, dtype=torch.float32, ties=True):
    """Rows mixing peaked softmax rows and rows of small integer weights (exact ties and
    zeros); drafts mixing the argmax, tied maxima, random tokens and draft samples."""
    gen = torch.Generator().manual_seed(seed)
    soft = torch.softmax(3.0 * torch.randn(B, gamma + 1, V, generator=gen, dtype=torch.float64), -1)
    if ties:
        ints = torch.randint(0, 4, (B, gamma + 1, V), generator=gen).double()
        ints[..., 0] += (ints.sum(-1) == 0).double()  # no all-zero row
        use_ints = torch.rand(B, gamma + 1, 1, generator=gen) < 0.5
        p = torch.where(use_ints, ints / ints.sum(-1, keepdim=True), soft)
    else:
        p = soft
    q = torch.softmax(torch.log(p[:, :gamma] + 1e-3) + torch.randn(B, gamma, V, generator=gen, dtype=torch.float64), -1)
    p, q = p.to(dtype), q.to(dtype)
    sampled = torch.multinomial(q.double().flatten(0, 1), 1, generator=gen).view(B, gamma)
    argmax = p[:, :gamma].double().argmax(-1)
    # the highest id among tied maxima (greedy must reject it when it is not the lowest)
    pd = p[:, :gamma].double()
    last_max = V - 1 - (pd == pd.amax(-1, keepdim=True)).flip(-1).int().argmax(-1)
    choice = torch.randint(0, 3, (B, gamma), generator=gen)
    x = torch.where(choice == 0, argmax, torch.where(choice == 1, last_max, sampled))
    n = torch.randint(0, gamma + 1, (B,), generator=gen)
    n[: B // 2] = gamma
    u = torch.rand(B, gamma + 1, generator=gen, dtype=torch.float64)
    return p, q, x, n, u


def _rows(p, q, x, n, u, b):
    nb = int(n[b])
    return (p[b].double().tolist(), q[b].double().tolist() if q is not None else None,
            x[b].tolist(), nb, u[b].tolist(), float(u[b, -1]))


def _check_against(definition, out, p, q, x, n, u):
    for b in range(x.shape[0]):
        pb, qb, xb, nb, ub, u_emit = _rows(p, q, x, n, u, b)
        tokens, tau = definition(pb, qb, xb, nb, ub, u_emit)
        got = out.tokens[b].tolist()
        assert int(out.accepted_len[b]) == tau and got[: tau + 1] == tokens and all(t == -1 for t in got[tau + 1 :]), (
            f"row {b}: expected {tokens} (tau {tau}), got {got} (tau {int(out.accepted_len[b])})")


# ------------------------------------------------------------------------------ the rules


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("V", [2, 5, 50])
def test_greedy_definition(V, dtype):
    """Greedy accepts x_i while x_i == argmax p_i and emits argmax p_{tau+1}; ties resolve to
    the lowest token id, so a draft equal to a tied maximum with a higher id is rejected."""
    p, q, x, n, u = _random_case(300, 4, V, seed=V, dtype=dtype)
    out = specdecode.verify(p, None, x, rule="greedy", num_draft_tokens=n, uniforms=u)
    _check_against(lambda pb, qb, xb, nb, ub, ue: greedy_def(pb, xb, nb), out, p, q, x, n, u)


def test_greedy_ties_go_to_lowest_id():
    """A hand-made tie: p_1 = (0.4, 0.4, 0.2). Draft 0 is accepted; draft 1 is rejected and
    replaced by 0; the bonus token is the lowest of the tied maxima of p_2."""
    p = torch.tensor([[[0.4, 0.4, 0.2], [0.1, 0.45, 0.45]]] * 2)
    x = torch.tensor([[0], [1]])
    out = specdecode.verify(p, None, x, rule="greedy")
    assert out.tokens.tolist() == [[0, 1], [0, -1]]
    assert out.accepted_len.tolist() == [1, 0]


@pytest.mark.parametrize("sample_correction", [False, True])
@pytest.mark.parametrize("epsilon,delta", [(0.09, 0.3), (0.3, 0.6), (0.02, 0.05)])
@pytest.mark.parametrize("V", [3, 20])
def test_typical_definition(V, epsilon, delta, sample_correction):
    """Typical acceptance accepts while p_i(x_i) > min(epsilon, delta exp(-H(p_i))), then emits
    argmax p_{tau+1} (or an inverse-CDF draw from p_{tau+1} with the last uniform)."""
    p, q, x, n, u = _random_case(300, 4, V, seed=10 * V + int(100 * epsilon))
    out = specdecode.verify(p, None, x, rule="typical", num_draft_tokens=n, uniforms=u,
                            epsilon=epsilon, delta=delta, sample_correction=sample_correction)
    _check_against(lambda pb, qb, xb, nb, ub, ue: typical_def(pb, xb, nb, epsilon, delta, sample_correction, ue),
                   out, p, q, x, n, u)
    assert 0 < int(out.accepted_len.sum()) < int(n.sum())  # both decisions were exercised


def test_typical_default_options():
    """The defaults are epsilon = 0.09, delta = 0.3, argmax correction (docs/verification.md §4)."""
    p, q, x, n, u = _random_case(200, 3, 6, seed=77)
    out = specdecode.verify(p, None, x, rule="typical", num_draft_tokens=n, uniforms=u)
    _check_against(lambda pb, qb, xb, nb, ub, ue: typical_def(pb, xb, nb, 0.09, 0.3, False, ue), out, p, q, x, n, u)


@pytest.mark.parametrize("beta,tolerance", [(1, 0.0), (1, 5.0), (2, 0.5), (3, 1.0), (5, 0.1), (50, 100.0)])
@pytest.mark.parametrize("V", [4, 30])
def test_top_beta_definition(V, beta, tolerance):
    """Top-beta accepts x_i while fewer than beta tokens are strictly more likely than x_i and
    log p_i(argmax) - log p_i(x_i) <= tolerance (never a token with p = 0), then emits
    argmax p_{tau+1}."""
    p, q, x, n, u = _random_case(300, 4, V, seed=V + beta)
    out = specdecode.verify(p, None, x, rule="top_beta", num_draft_tokens=n, uniforms=u, beta=beta, tolerance=tolerance)
    _check_against(lambda pb, qb, xb, nb, ub, ue: top_beta_def(pb, xb, nb, beta, tolerance), out, p, q, x, n, u)


def test_top_beta_defaults_and_beta_one_is_greedy():
    """Defaults are beta = 3, tolerance = 1.0; with beta = 1 on rows without ties top-beta is
    greedy verification."""
    p, q, x, n, u = _random_case(200, 3, 8, seed=5)
    out = specdecode.verify(p, None, x, rule="top_beta", num_draft_tokens=n, uniforms=u)
    _check_against(lambda pb, qb, xb, nb, ub, ue: top_beta_def(pb, xb, nb, 3, 1.0), out, p, q, x, n, u)
    p, q, x, n, u = _random_case(200, 3, 8, seed=6, ties=False)
    a = specdecode.verify(p, None, x, rule="top_beta", num_draft_tokens=n, uniforms=u, beta=1, tolerance=50.0)
    b = specdecode.verify(p, None, x, rule="greedy", num_draft_tokens=n, uniforms=u)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.accepted_len, b.accepted_len)


@pytest.mark.parametrize("rule,definition", [("token", token_def), ("block", block_def)])
@pytest.mark.parametrize("V", [3, 17])
def test_token_and_block_definitions(rule, definition, V):
    """With explicit uniforms, token and block verification make exactly the decisions of
    docs/verification.md §1 / §3 (coin u_i of draft i in column i-1, the emitted token's inverse-CDF coin in
    the last column)."""
    p, q, x, n, u = _random_case(300, 4, V, seed=3 * V, ties=False)
    x = torch.multinomial(q.double().flatten(0, 1), 1, generator=torch.Generator().manual_seed(V)).view(x.shape)
    out = specdecode.verify(p, q, x, rule=rule, num_draft_tokens=n, uniforms=u)
    _check_against(lambda pb, qb, xb, nb, ub, ue: definition(pb, qb, xb, nb, ub, ue), out, p, q, x, n, u)
    assert 0 < int(out.accepted_len.sum()) < int(n.sum())


# -------------------------------------------------------------------- numerics (docs/verification.md §7)


@pytest.mark.parametrize("rule", ["token", "block"])
def test_zero_uniform_never_accepts_zero_probability(rule):
    """u = 0 must not accept a drafted token with p = 0 (half-open comparison u < ratio)."""
    p = torch.tensor([[[0.0, 0.5, 0.5], [0.2, 0.3, 0.5]]])
    q = torch.tensor([[[0.5, 0.25, 0.25]]])
    out = specdecode.verify(p, q, torch.tensor([[0]]), rule=rule, uniforms=torch.zeros(1, 2, dtype=torch.float64))
    assert int(out.accepted_len[0]) == 0
    assert int(out.tokens[0, 0]) in (1, 2)


@pytest.mark.parametrize("rule", ["token", "block", "typical"])
@pytest.mark.parametrize("u_emit", [0.0, 0.5, 1.0 - 2.0**-53])
def test_emitted_token_has_positive_probability(rule, u_emit):
    """Whatever the emitting coin (0, 1/2, the largest double below 1), the emitted token has
    positive probability: zero-probability tokens at either end are never drawn."""
    p = torch.tensor([[[0.0, 0.0, 0.3, 0.7, 0.0], [0.0, 0.6, 0.0, 0.4, 0.0]]], dtype=torch.float64)
    q = torch.tensor([[[0.0, 0.0, 0.9, 0.1, 0.0]]], dtype=torch.float64)
    u = torch.tensor([[0.999, u_emit]], dtype=torch.float64)  # rejects the draft (ratio 1/3)
    opts = {"sample_correction": True} if rule == "typical" else {}
    out = specdecode.verify(p, q if rule != "typical" else None, torch.tensor([[2]]), rule=rule, uniforms=u, **opts)
    tau = int(out.accepted_len[0])
    y = int(out.tokens[0, tau])
    assert float(p[0, tau, y]) > 0.0
    if rule == "token":  # residual (p - q)+ = (0, 0, 0, 0.6, 0): only token 3
        assert (tau, y) == (0, 3)


def test_zero_mass_residual_falls_back_to_p():
    """A rejection whose residual (p - q)+ is 0 everywhere (q >= p entrywise, possible only by
    rounding) emits from p itself, never an arbitrary token."""
    p = torch.tensor([[[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]]], dtype=torch.float32)
    q = torch.tensor([[[0.5, 0.50001, 0.0]]], dtype=torch.float32)
    for u_emit, expected in [(0.1, 0), (0.9, 1)]:
        u = torch.tensor([[1.0 - 1e-9, u_emit]], dtype=torch.float64)
        for rule in ("token", "block"):
            out = specdecode.verify(p, q, torch.tensor([[1]]), rule=rule, uniforms=u)
            assert (int(out.accepted_len[0]), int(out.tokens[0, 0])) == (0, expected), rule


@pytest.mark.parametrize("rule", ["token", "block"])
def test_one_hot_target_reduces_to_greedy(rule):
    """At temperature 0 (one-hot p) token and block verification give exactly the greedy
    result for any draft distribution and any uniforms."""
    gen = torch.Generator().manual_seed(9)
    B, gamma, V = 400, 4, 6
    p = torch.nn.functional.one_hot(torch.randint(0, V, (B, gamma + 1), generator=gen), V).float()
    q = torch.softmax(torch.randn(B, gamma, V, generator=gen), -1)
    x = torch.where(torch.rand(B, gamma, generator=gen) < 0.7, p[:, :gamma].argmax(-1),
                    torch.randint(0, V, (B, gamma), generator=gen))
    out = specdecode.verify(p, q, x, rule=rule, generator=gen)
    ref = specdecode.verify(p, None, x, rule="greedy")
    assert torch.equal(out.tokens, ref.tokens) and torch.equal(out.accepted_len, ref.accepted_len)


def test_verify_logits_zero_draft_probability_rule():
    """verify_logits: a drafted token that the processed draft gives probability 0 (drafted
    with other settings) counts as accepted iff the processed target gives it probability > 0."""
    target = torch.tensor([[[0.0, 1.0, 2.0], [0.0, 0.0, 0.0]], [[0.0, -math.inf, 2.0], [0.0, 0.0, 0.0]]])
    draft = torch.tensor([[[-math.inf, 1.0, 2.0]], [[0.0, -math.inf, 2.0]]])
    out = specdecode.verify_logits(target, draft, torch.tensor([[0], [1]]), rule="token",
                                   uniforms=torch.full((2, 2), 0.999, dtype=torch.float64))
    assert out.accepted_len.tolist() == [1, 0]


# ------------------------------------------------------------------------ lossy rules shift


@pytest.mark.parametrize("rule,options", [
    ("typical", {}),
    ("typical", {"sample_correction": True}),
    ("top_beta", {}),
    ("top_beta", {"beta": 2, "tolerance": 0.3}),
])
def test_lossy_rules_shift_the_distribution(rule, options):
    """Typical and top-beta acceptance are lossy: on a random context-dependent pair their
    output joint (completed from the target) measurably differs from the target's joint,
    under the same harness that the lossless rules pass. (The table is one where these rules
    accept a good share of the drafts: a rule that rejects everything and samples y ~ p, as
    typical with sample_correction does on a peaked root row, is trivially lossless.)"""
    run = su.run_lossless_experiment(su.make_tables(4, 3, 3), rule, 100_000, 3, pass_draft=False, **options)
    assert float(run.accepted_len.double().mean()) > 0.5
    assert run.fit.pvalue < 1e-8, f"{rule} {options}: expected a measurable shift ({run.fit})"


def test_lossless_flags():
    """list_rules marks token and block lossless, greedy lossless at temperature 0 only (so not
    lossless), typical and top_beta lossy."""
    flags = {r.name: r.lossless for r in specdecode.list_rules() if r.builtin}
    assert flags == {"token": True, "block": True, "greedy": False, "typical": False, "top_beta": False}
