"""The compiled ops against the pure-PyTorch reference (``specdecode.reference``): given the
same uniforms, ``specdecode.verify`` and ``verify_reference`` return IDENTICAL tokens and
accepted lengths for all five rules, every float dtype, ragged draft counts and odd sizes.
``verify_logits`` (float32 inside the kernel) matches ``verify_logits_reference`` (float64)
except where a coin lies within ~1e-6 (relative) of a decision boundary: any mismatch must be
explained by a tiny boundary margin, computed from the reference by :func:`decision_margin`.
Also: temperature 0 is greedy on the argmax of the logits, results do not depend on the
thread count or on memory layout, and the same seed gives the same output.
"""

from __future__ import annotations

import math

import pytest
import torch

import specdecode
from specdecode import reference
import specdecode.sampling

RULES = ["token", "block", "greedy", "typical", "top_beta"]
NEEDS_DRAFT = {"token", "block"}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _probs_case(B, gamma, V, dtype, seed):
    """Peaked, correlated target/draft rows (so every rule accepts a fair share), rounded to
    ``dtype``; drafts sampled from the rounded draft rows (q(x) > 0) or set to the target's
    argmax; ragged draft counts; uniforms with a few exact zeros."""
    gen = torch.Generator().manual_seed(seed)
    logits = 3.0 * torch.randn(B, gamma + 1, V, generator=gen, dtype=torch.float64)
    p = torch.softmax(logits, -1).to(dtype)
    q = torch.softmax(logits[:, :gamma] + torch.randn(B, gamma, V, generator=gen, dtype=torch.float64), -1).to(dtype)
    qd = q.double()
    x = torch.multinomial(qd.flatten(0, 1), 1, generator=gen).view(B, gamma)
    best = p[:, :gamma].double().argmax(-1)
    use_best = (torch.rand(B, gamma, generator=gen) < 0.4) & (qd.gather(2, best[..., None])[..., 0] > 0)
    x = torch.where(use_best, best, x)
    n = torch.randint(0, gamma + 1, (B,), generator=gen)
    n[0] = gamma
    u = torch.rand(B, gamma + 1, generator=gen, dtype=torch.float64)
    u[torch.rand(B, gamma + 1, generator=gen) < 0.05] = 0.0
    return p, q, x, n, u


def _assert_identical(out, ref, what=""):
    assert torch.equal(out.accepted_len, ref.accepted_len), f"{what}: accepted_len {out.accepted_len.tolist()} vs reference {ref.accepted_len.tolist()}"
    assert torch.equal(out.tokens, ref.tokens), f"{what}: tokens {out.tokens.tolist()} vs reference {ref.tokens.tolist()}"


@pytest.mark.parametrize("B", [1, 3, 17])
@pytest.mark.parametrize("V", [7, 111, 32000])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rule", RULES)
def test_verify_equals_reference(rule, dtype, V, B):
    """verify == verify_reference bit for bit (tokens and accepted_len), ragged rows included."""
    gamma = 2 if V > 1000 else 4
    p, q, x, n, u = _probs_case(B, gamma, V, dtype, seed=V + B)
    draft = q if rule in NEEDS_DRAFT else None
    out = specdecode.verify(p, draft, x, rule=rule, num_draft_tokens=n, uniforms=u)
    ref = reference.verify_reference(p, draft, x, rule=rule, num_draft_tokens=n, uniforms=u)
    _assert_identical(out, ref, f"{rule} {dtype} V={V} B={B}")


@pytest.mark.parametrize("rule,options", [
    ("typical", {"epsilon": 0.3, "delta": 0.6}),
    ("typical", {"epsilon": 0.01, "delta": 0.05, "sample_correction": True}),
    ("top_beta", {"beta": 1, "tolerance": 0.0}),
    ("top_beta", {"beta": 2, "tolerance": 0.25}),
    ("top_beta", {"beta": 20, "tolerance": 4.0}),
])
def test_verify_equals_reference_with_options(rule, options):
    """Rule options reach the kernel exactly as the reference reads them."""
    p, q, x, n, u = _probs_case(64, 3, 50, torch.float32, seed=99)
    out = specdecode.verify(p, None, x, rule=rule, num_draft_tokens=n, uniforms=u, **options)
    ref = reference.verify_reference(p, None, x, rule=rule, num_draft_tokens=n, uniforms=u, **options)
    _assert_identical(out, ref, f"{rule} {options}")


@pytest.mark.parametrize("rule", RULES)
def test_verify_float64_and_draft_given_to_draftless_rules(rule):
    """float64 inputs are accepted too, and passing draft_probs to a rule that does not read
    them changes nothing."""
    p, q, x, n, u = _probs_case(9, 3, 40, torch.float64, seed=5)
    out = specdecode.verify(p, q, x, rule=rule, num_draft_tokens=n, uniforms=u)
    ref = reference.verify_reference(p, q if rule in NEEDS_DRAFT else None, x, rule=rule, num_draft_tokens=n, uniforms=u)
    _assert_identical(out, ref, rule)


@pytest.mark.parametrize("rule", RULES)
def test_thread_count_and_layout_do_not_matter(rule):
    """Rows are independent: one or several intra-op threads, contiguous or strided inputs,
    give the same result."""
    p, q, x, n, u = _probs_case(17, 2, 4000, torch.float32, seed=3)
    draft = q if rule in NEEDS_DRAFT else None
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = specdecode.verify(p, draft, x, rule=rule, num_draft_tokens=n, uniforms=u)
        torch.set_num_threads(max(2, before))
        many = specdecode.verify(p, draft, x, rule=rule, num_draft_tokens=n, uniforms=u)
    finally:
        torch.set_num_threads(before)
    _assert_identical(many, one, f"{rule} threads")
    # strided copies: the vocabulary dimension first in memory
    p_t = p.transpose(1, 2).contiguous().transpose(1, 2)
    d_t = draft.transpose(1, 2).contiguous().transpose(1, 2) if draft is not None else None
    x_t = x.t().contiguous().t()
    u_t = u.t().contiguous().t()
    assert not p_t.is_contiguous()
    strided = specdecode.verify(p_t, d_t, x_t, rule=rule, num_draft_tokens=n, uniforms=u_t)
    _assert_identical(strided, one, f"{rule} strided")


@pytest.mark.parametrize("rule", RULES)
def test_same_seed_same_output(rule):
    """A generator with the same seed gives the same output; different seeds give different
    outputs (on a batch large enough that a coincidence is impossible)."""
    p, q, x, n, u = _probs_case(200, 3, 30, torch.float32, seed=8)
    draft = q if rule in NEEDS_DRAFT else None
    opts = {"sample_correction": True} if rule == "typical" else {}

    def run(seed):
        return specdecode.verify(p, draft, x, rule=rule, generator=torch.Generator().manual_seed(seed), **opts)

    a, b, c = run(1), run(1), run(2)
    _assert_identical(a, b, f"{rule} same seed")
    if rule in ("token", "block", "typical"):  # greedy / top_beta use no randomness at all
        assert not torch.equal(a.tokens, c.tokens)
    else:
        _assert_identical(a, c, f"{rule} deterministic rule")


def test_verify_logits_same_seed_same_output():
    """verify_logits: same seed, same output; different seeds differ."""
    gen = torch.Generator().manual_seed(0)
    tl, dl = torch.randn(100, 4, 20, generator=gen), torch.randn(100, 3, 20, generator=gen)
    x = torch.randint(0, 20, (100, 3), generator=gen)

    def run(seed):
        return specdecode.verify_logits(tl, dl, x, rule="block", top_k=10, generator=torch.Generator().manual_seed(seed))

    assert torch.equal(run(4).tokens, run(4).tokens)
    assert not torch.equal(run(4).tokens, run(5).tokens)


# ------------------------------------------------------------------------- decision margins


def _coin_margin(u: float, threshold: float) -> float:
    """Relative distance of a coin from the boundary it is compared with."""
    return abs(u - threshold) / max(abs(threshold), 1e-300) if math.isfinite(threshold) else math.inf


def _sample_margin(weights: torch.Tensor, u: float) -> float:
    """Relative distance of ``u * total`` from the nearest cumulative boundary of an
    inverse-CDF draw (0 when the coin sits exactly on a boundary)."""
    cumulative = torch.cumsum(weights, 0)
    total = float(cumulative[-1])
    if not total > 0:
        return math.inf
    return float((cumulative - u * total).abs().min()) / total


def _filter_margin(logits: torch.Tensor, temperature: float, top_p: float, min_p: float, top_k: int) -> float:
    """How close any token of a logit row is to the top-p or min-p cut (relative)."""
    margin = math.inf
    if temperature == 0.0:
        return margin
    logits = logits.double()
    scaled = torch.exp((logits - logits.max()) / temperature)
    keep = torch.ones_like(scaled, dtype=torch.bool)
    if 0 < top_k < logits.numel():
        keep &= logits >= torch.topk(logits, top_k).values[-1]
    if top_p < 1.0:
        kept = scaled * keep
        ascending, order = torch.sort(logits)
        cumulative = torch.cumsum(kept[order], 0)
        total = float(cumulative[-1])
        last_of_tie = torch.searchsorted(ascending, ascending, right=True) - 1
        mass_above = total - cumulative[last_of_tie]  # mass strictly above each (sorted) token
        margin = min(margin, float((mass_above - top_p * total).abs().min()) / total)
    if min_p > 0.0:
        margin = min(margin, float((scaled - min_p).abs().min()) / min_p)
    return margin


def decision_margin(p, q, x, n, u, rule, **options) -> float:
    """Smallest relative distance of any decision the reference takes for one row to its
    boundary. Shape: p ``[n+1, V]`` / q ``[n, V]`` float64 processed rows (q None for rules
    without it), x ``[n]``, u ``[gamma+1]`` (last entry the emitting coin)."""
    margins = [math.inf]
    u_emit = float(u[-1])
    if rule == "token":
        tau = n
        for i in range(n):
            ratio = float(p[i, x[i]]) / float(q[i, x[i]]) if float(q[i, x[i]]) > 0 else math.inf
            margins.append(_coin_margin(float(u[i]), ratio))
            if not float(u[i]) < ratio:
                tau = i
                break
        weights = p[n] if tau == n else (p[tau] - q[tau]).clamp_min(0)
        margins.append(_sample_margin(weights if float(weights.sum()) > 0 else p[tau], u_emit))
    elif rule == "block":
        w = [1.0]
        for i in range(n):
            w.append(reference.block_weight(w[-1], float(p[i, x[i]]), float(q[i, x[i]])))
        tau = 0
        for i in range(1, n + 1):
            if i == n:
                h = w[n]
            else:
                z = float((w[i] * p[i] - q[i]).clamp_min(0).sum())
                h = z / (z + 1 - w[i]) if z + 1 - w[i] > 0 else 1.0
            margins.append(_coin_margin(float(u[i - 1]), h))
            if float(u[i - 1]) < h:
                tau = i
        weights = p[n] if tau == n else (w[tau] * p[tau] - q[tau]).clamp_min(0)
        margins.append(_sample_margin(weights if float(weights.sum()) > 0 else p[tau], u_emit))
    elif rule == "typical":
        tau = n
        for i in range(n):
            threshold = min(options.get("epsilon", 0.09), options.get("delta", 0.3) * math.exp(-reference.entropy(p[i])))
            margins.append(_coin_margin(float(p[i, x[i]]), threshold))
            if not float(p[i, x[i]]) > threshold:
                tau = i
                break
        if options.get("sample_correction"):
            margins.append(_sample_margin(p[tau], u_emit))
    elif rule == "top_beta":
        for i in range(n):
            px = float(p[i, x[i]])
            if not px > 0:
                break
            gaps = (p[i] - px).abs()
            gaps = gaps[gaps > 0]  # exact ties (equal logits) are exact in the kernel too: no excuse
            if gaps.numel():
                margins.append(float(gaps.min()) / px)
            log_gap = math.log(float(p[i].max())) - math.log(px)
            margins.append(_coin_margin(log_gap, options.get("tolerance", 1.0)))
            if not (int((p[i] > px).sum()) < options.get("beta", 3) and log_gap <= options.get("tolerance", 1.0)):
                break
    return min(margins)


def test_decision_margin_helper():
    """The margin helper itself: a coin placed exactly on the acceptance ratio has margin 0,
    one far from every boundary a large margin."""
    p = torch.tensor([[0.2, 0.8], [0.5, 0.5]], dtype=torch.float64)
    q = torch.tensor([[0.4, 0.6]], dtype=torch.float64)
    x = torch.tensor([0])
    assert decision_margin(p, q, x, 1, torch.tensor([0.5, 0.25]), "token") == 0.0  # u == p/q
    assert decision_margin(p, q, x, 1, torch.tensor([0.9, 0.1]), "token") > 0.05
    assert decision_margin(p, q, x, 1, torch.tensor([0.5, 0.25]), "block") == 0.0  # u == h_1 = w_1
    assert decision_margin(p, q, x, 1, torch.tensor([0.1, 0.5]), "block") == 0.0  # u_emit on a cdf step of p_2
    assert _filter_margin(torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64).log(), 1.0, 0.8, 0.0, 0) < 1e-12  # mass above 0.2 is 0.8


# --------------------------------------------------------------------------- verify_logits

SAMPLING = [  # (temperature, top_k, top_p, min_p)
    (1.0, 0, 1.0, 0.0),
    (0.7, 0, 1.0, 0.0),
    (1.6, 0, 1.0, 0.0),
    (1.0, 1, 1.0, 0.0),
    (1.0, 5, 1.0, 0.0),
    (1.0, 0, 0.9, 0.0),
    (1.0, 0, 0.3, 0.0),
    (1.0, 0, 1.0, 0.1),
    (0.5, 50, 0.8, 0.05),
    (1.3, 20, 0.95, 0.02),
]


def _logits_case(B, gamma, V, dtype, seed, sampling):
    gen = torch.Generator().manual_seed(seed)
    target = 3.0 * torch.randn(B, gamma + 1, V, generator=gen)
    target[:, :, :3] = target[:, :, 3:4]  # exact logit ties
    draft = target[:, :gamma] + torch.randn(B, gamma, V, generator=gen)
    target, draft = target.to(dtype), draft.to(dtype)
    q = reference.process_logits(draft, *sampling)
    x = torch.multinomial(q.flatten(0, 1), 1, generator=gen).view(B, gamma)
    best = target[:, :gamma].float().argmax(-1)
    x = torch.where(torch.rand(B, gamma, generator=gen) < 0.3, best, x)
    n = torch.randint(0, gamma + 1, (B,), generator=gen)
    n[0] = gamma
    u = torch.rand(B, gamma + 1, generator=gen, dtype=torch.float64)
    return target, draft, x, n, u


def _check_logits_against_reference(target, draft, x, n, u, rule, sampling, **options):
    temperature, top_k, top_p, min_p = sampling
    kwargs = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, rule=rule,
                  num_draft_tokens=n, uniforms=u)
    out = specdecode.verify_logits(target, draft, x, **kwargs, **options)
    ref = reference.verify_logits_reference(target, draft, x, **kwargs, **options)
    bad = ~((out.tokens == ref.tokens).all(1) & (out.accepted_len == ref.accepted_len))
    if not bool(bad.any()):
        return 0
    # Rare mismatches are allowed only where the reference's decision sits within 1e-5
    # (relative) of a boundary: the kernel computes the distributions in float32.
    p = reference.process_logits(target, *sampling)
    q = reference.process_logits(draft, *sampling) if draft is not None else None
    effective = "greedy" if temperature == 0.0 else rule
    for b in torch.nonzero(bad).flatten().tolist():
        nb = int(n[b])
        margin = decision_margin(p[b, : nb + 1], q[b, :nb] if q is not None else None, x[b, :nb], nb, u[b],
                                 effective, **options)
        for row in list(target[b, : nb + 1]) + (list(draft[b, :nb]) if draft is not None else []):
            margin = min(margin, _filter_margin(row, temperature, top_p, min_p, top_k))
        assert margin < 1e-5, (
            f"row {b}: kernel {out.tokens[b].tolist()} (tau {int(out.accepted_len[b])}) vs reference "
            f"{ref.tokens[b].tolist()} (tau {int(ref.accepted_len[b])}), decision margin {margin:.3g}")
    assert int(bad.sum()) <= max(1, bad.numel() // 100), "more than 1% of rows differ"
    return int(bad.sum())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("sampling", SAMPLING, ids=lambda s: "T{}-k{}-p{}-m{}".format(*s))
@pytest.mark.parametrize("rule", RULES)
def test_verify_logits_equals_reference(rule, sampling, dtype):
    """verify_logits == verify_logits_reference for every rule under temperature / top-k /
    top-p / min-p combinations, V = 111, ragged rows (mismatches only at boundary margins)."""
    target, draft, x, n, u = _logits_case(17, 3, 111, dtype, seed=SAMPLING.index(sampling), sampling=sampling)
    _check_logits_against_reference(target, draft if rule in NEEDS_DRAFT else None, x, n, u, rule, sampling)


@pytest.mark.parametrize("sampling", [(1.0, 0, 1.0, 0.0), (0.8, 40, 1.0, 0.01), (1.0, 0, 0.9, 0.0)],
                         ids=lambda s: "T{}-k{}-p{}-m{}".format(*s))
@pytest.mark.parametrize("rule", RULES)
def test_verify_logits_equals_reference_large_vocab(rule, sampling):
    """The same at V = 32000 (B = 3, gamma = 2)."""
    target, draft, x, n, u = _logits_case(3, 2, 32000, torch.float32, seed=1, sampling=sampling)
    _check_logits_against_reference(target, draft if rule in NEEDS_DRAFT else None, x, n, u, rule, sampling)


@pytest.mark.parametrize("rule,options", [("typical", {"sample_correction": True, "epsilon": 0.2}),
                                          ("top_beta", {"beta": 2, "tolerance": 0.5})])
def test_verify_logits_options_equal_reference(rule, options):
    """Rule options through verify_logits match the reference too."""
    sampling = (0.9, 30, 0.95, 0.0)
    target, draft, x, n, u = _logits_case(17, 3, 111, torch.float32, seed=21, sampling=sampling)
    _check_logits_against_reference(target, None, x, n, u, rule, sampling, **options)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rule", RULES)
def test_temperature_zero_is_greedy_on_logits(rule, dtype):
    """temperature = 0 turns every built-in rule into greedy verification on the argmax of
    the logits (ties to the lowest id), whatever top-k / top-p / min-p say; the draft logits
    are not needed."""
    target, draft, x, n, u = _logits_case(17, 3, 111, dtype, seed=2, sampling=(1.0, 0, 1.0, 0.0))
    for sampling in [(0.0, 0, 1.0, 0.0), (0.0, 3, 0.5, 0.2)]:
        _check_logits_against_reference(target, draft if rule in NEEDS_DRAFT else None, x, n, u, rule, sampling)
        out = specdecode.verify_logits(target, None, x, temperature=0.0, top_k=sampling[1], top_p=sampling[2],
                                       min_p=sampling[3], rule=rule, num_draft_tokens=n, uniforms=u)
        best = target.float().argmax(-1)  # torch.argmax: lowest id on ties
        for b in range(17):
            nb = int(n[b])
            tau = next((i for i in range(nb) if int(x[b, i]) != int(best[b, i])), nb)
            expected = x[b, :tau].tolist() + [int(best[b, tau])]
            assert out.tokens[b, : tau + 1].tolist() == expected and int(out.accepted_len[b]) == tau, f"row {b}"


# ------------------------------------------------------------- float32 accuracy of the kernels


BOUNDARY_SAMPLING = [(1.0, 0, 1.0, 0.0), (0.6, 0, 1.0, 0.0), (1.6, 0, 1.0, 0.0), (0.9, 200, 0.99, 0.0)]


@pytest.mark.parametrize("V,dtype,sampling", [
    *[(V, dtype, s) for V in (111, 32000) for dtype in DTYPES for s in BOUNDARY_SAMPLING],
    (128256, torch.float32, BOUNDARY_SAMPLING[0]), (128256, torch.bfloat16, BOUNDARY_SAMPLING[2]),
], ids=lambda v: str(v) if not isinstance(v, tuple) else "T{}-k{}-p{}-m{}".format(*v))
def test_acceptance_boundary_within_documented_margin(V, dtype, sampling):
    """The documented margin, probed directly: token verification accepts x iff u < p(x)/q(x);
    the kernel's p and q are float32 weights times a normaliser (one online pass for an
    unfiltered row, a pass after the filters otherwise), so its boundary may sit slightly off
    the float64 ratio, by about 1e-6 at most. Coins 2e-6 (relative) below the float64 ratio
    must be accepted and coins 2e-6 above must be rejected, for probes among each row's likely
    tokens (|log-weight| small, where float32 rounding of the scaled logit stays below 1e-6)."""
    temperature, top_k, top_p, min_p = sampling
    gen = torch.Generator().manual_seed(V + int(10 * temperature))
    num_probes = 12
    target = (3.0 * torch.randn(num_probes, 2, V, generator=gen)).to(dtype)
    draft = (target[:, :1].float() + torch.randn(num_probes, 1, V, generator=gen)).to(dtype)
    p = reference.process_logits(target[:, 0], *sampling)
    q = reference.process_logits(draft[:, 0], *sampling)
    ratio = p / q.clamp_min(1e-300)
    likely = (q >= q.amax(-1, keepdim=True) * 1e-3) & (ratio > 0.05) & (ratio < 0.95)
    x = torch.stack([torch.nonzero(row).flatten()[0] for row in likely])  # lowest-id likely token
    r = ratio.gather(1, x[:, None])[:, 0]
    margin = 2e-6
    u = torch.stack([torch.cat([r * (1 - margin), r * (1 + margin)]), torch.full((2 * num_probes,), 0.5,
                                                                                 dtype=torch.float64)], 1)
    out = specdecode.verify_logits(
        target.repeat(2, 1, 1), draft.repeat(2, 1, 1), x.repeat(2)[:, None], temperature=temperature, top_k=top_k,
        top_p=top_p, min_p=min_p, rule="token", uniforms=u)
    assert out.accepted_len[:num_probes].tolist() == [1] * num_probes, "a coin just below p/q was rejected"
    assert out.accepted_len[num_probes:].tolist() == [0] * num_probes, "a coin just above p/q was accepted"


@pytest.mark.parametrize("isa", ["avx2", "baseline"])
def test_narrower_instruction_sets_agree_with_reference(isa):
    """The logit loops are compiled for AVX-512, AVX2 and baseline x86-64 and the widest the
    CPU runs is picked at run time; SPECDECODE_CPU_ISA narrows the pick. Every variant must
    pass the reference comparisons: a sample of this module's and test_sampling's logit tests
    runs in a subprocess with each narrower instruction set (the default one is the rest of
    the suite)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "SPECDECODE_CPU_ISA": isa}
    probe = subprocess.run([sys.executable, "-c", "import specdecode._ops as o; print(o.build_info()['cpu_isa'])"],
                           env=env, capture_output=True, text=True, check=True)
    if probe.stdout.strip() != isa:
        pytest.skip(f"this CPU cannot run the {isa} loops (it runs {probe.stdout.strip()})")
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    selection = ("large_vocab or (verify_logits_equals_reference and bfloat16 and (token or block or typical)) "
                 "or (sample_logits_equals and 32000) or (acceptance_boundary and 32000-torch.float32)")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", selection,
         os.path.join(tests_dir, "test_reference_equality.py"), os.path.join(tests_dir, "test_sampling.py")],
        env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"{isa} loops:\n{run.stdout[-4000:]}\n{run.stderr[-2000:]}"
    assert " passed" in run.stdout and "failed" not in run.stdout


@pytest.mark.parametrize("rule", RULES)
def test_tiny_temperature_matches_reference(rule):
    """A positive temperature so small that 1/T overflows float32 (found by fuzzing: every row
    lost its mass and the op raised "no positive mass"): the kernels clamp 1/T to the largest
    float, which keeps only the max logit(s), as the reference's float64 division does."""
    sampling = (1e-40, 0, 1.0, 0.0)
    target, draft, x, n, u = _logits_case(17, 3, 111, torch.float32, seed=4, sampling=sampling)
    _check_logits_against_reference(target, draft if rule in NEEDS_DRAFT else None, x, n, u, rule, sampling)
    logits = target[:, 0]
    tokens = specdecode.sampling.sample_logits(logits, specdecode.sampling.SamplingParams(1e-40),
                                               uniforms=u[:, 0])
    assert torch.equal(tokens, logits.argmax(-1))
