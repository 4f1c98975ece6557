"""The CUDA implementations of the verify / sample / tree-verify ops and processed_probs
(csrc/ops/verify_cuda.cpp, sample_cuda.cpp, tree_verify_cuda.cpp, host code, over the
torch-free kernels in csrc/kernels/cuda/).

Every test that needs a GPU takes the ``cuda`` fixture, which skips when
``torch.cuda.is_available()`` is false (checked when the test runs, never at import) and fails
when a GPU is there but specdecode was built without its CUDA kernels. The Philox
known-answer test needs no GPU. (tests/test_cuda_emulation.py runs the same kernels without a
GPU, under a CPU emulator.)

What is checked:
  * CPU vs CUDA agreement on tokens and accepted lengths with the SAME uniforms (rules of
    tests/cuda_agreement.py), for V in {111, 32000, 128256, 151936}, B in {1, 17, 64}, every
    rule, both verify ops and sample_logits, float32 / float16 / bfloat16, plus top-k / top-p /
    min-p with tied logits, ragged rows, float64, non-contiguous inputs, gamma up to 8000 (no
    per-row shared-memory limit any more), an empty batch; repeated calls give identical
    results (deterministic reductions);
  * token / greedy / typical / top-beta never validate a position after the first rejection;
  * every error of every op, triggered in a subprocess (a crash fails one test instead of
    killing pytest), raises the CPU op's exception type and message; mixed devices raise a
    ValueError naming the device;
  * the exact joint-distribution test of docs/verification.md section 8 for token and block
    verification on the GPU, and a deliberately broken variant that the same test must reject;
  * torch.library.opcheck with CUDA inputs for every op;
  * processed_probs equal to the CPU's distribution.
The graph-safe Philox ops: tests/test_cuda_philox.py; verify_tree / verify_tree_philox:
tests/test_cuda_tree_rules.py (both take this file's ``cuda`` fixture).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import specdecode
from specdecode.bench.harness import capture_with_offset
from specdecode.reference import VerifyOutput

import op_error_cases
import stat_utils as su
from cuda_agreement import (RULES, assert_agree, assert_processed_probs_agree, assert_samples_agree, logit_inputs,
                            prob_inputs, to_device)
from philox_ref import philox_uniforms  # Python reference of kernels/philox.h

OPS = torch.ops.specdecode
pytestmark = pytest.mark.cuda


@pytest.fixture
def cuda() -> torch.device:
    """The CUDA device; skips without one (queried at test time, not at import)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    for op in ("verify_probs", "verify_logits", "verify_probs_philox", "verify_logits_philox", "sample_logits",
               "sample_logits_philox", "processed_probs", "verify_tree", "verify_tree_philox"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"specdecode::{op}", "CUDA"), (
            f"a CUDA device is available but specdecode::{op} has no CUDA kernel: the extension was built "
            "without CUDA (python -m specdecode.info shows the build)"
        )
    return torch.device("cuda")


def _run_both_probs(rule, params, target, draft, drafts, num, u, device):
    needs = rule in ("token", "block")
    cpu = OPS.verify_probs(target, draft if needs else None, drafts, num, u, rule, params)
    gpu = OPS.verify_probs(*to_device(device, target, draft if needs else None, drafts, num, u), rule, params)
    return cpu, gpu


def _run_both_logits(rule, params, sampling, target, draft, drafts, num, u, device):
    needs = rule in ("token", "block")
    cpu = OPS.verify_logits(target, draft if needs else None, drafts, num, u, *sampling, rule, params)
    gpu = OPS.verify_logits(*to_device(device, target, draft if needs else None, drafts, num, u), *sampling, rule, params)
    return cpu, gpu


# ------------------------------------------------------------------------ agreement tests

VOCABS = [111, 32000, 128256, 151936]
BATCHES = [1, 17, 64]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SAMPLINGS = [(1.0, 0, 1.0, 0.0), (0.8, 50, 0.9, 0.05)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("B", BATCHES)
@pytest.mark.parametrize("V", VOCABS)
def test_cpu_cuda_agree_probs(cuda, V, B, dtype):
    """verify_probs: every rule gives the CPU's tokens and accepted lengths with the same
    uniforms (ragged rows included)."""
    gamma = 4
    target, draft, drafts, num, u = prob_inputs(B, gamma, V, dtype, seed=V + B)
    for rule, params in RULES:
        cpu, gpu = _run_both_probs(rule, params, target, draft, drafts, num, u, cuda)
        assert gpu[0].is_cuda and gpu[1].is_cuda
        assert_agree("probs", rule, params, cpu, gpu, target, draft, drafts, num, u)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("B", BATCHES)
@pytest.mark.parametrize("V", VOCABS)
def test_cpu_cuda_agree_logits(cuda, V, B, dtype):
    """verify_logits: every rule, plain sampling and temperature + top-k + top-p + min-p."""
    gamma = 4
    target, draft, drafts, num, u = logit_inputs(B, gamma, V, dtype, seed=2 * V + B)
    for sampling in SAMPLINGS:
        for rule, params in RULES:
            cpu, gpu = _run_both_logits(rule, params, sampling, target, draft, drafts, num, u, cuda)
            assert_agree("logits", rule, params, cpu, gpu, target, draft, drafts, num, u, sampling)


@pytest.mark.parametrize(
    "sampling",
    [(1.0, 1, 1.0, 0.0), (1.0, 7, 1.0, 0.0), (0.6, 0, 0.5, 0.0), (1.5, 0, 0.99, 0.0), (1.0, 0, 1.0, 0.3),
     (0.9, 40, 0.7, 0.02), (1.0, 200000, 0.95, 0.0), (0.0, 0, 1.0, 0.0)],
    ids=lambda s: "T{}-k{}-p{}-m{}".format(*s),
)
@pytest.mark.parametrize("V", [111, 32000])
def test_cpu_cuda_agree_filters_with_ties(cuda, V, sampling):
    """Top-k / top-p / min-p thresholds with many exactly tied logits (bf16 and half-step
    quantised float32), top-k >= V, and temperature 0 (greedy)."""
    for dtype, quantize in [(torch.bfloat16, False), (torch.float32, True)]:
        target, draft, drafts, num, u = logit_inputs(9, 3, V, dtype, seed=V, quantize=quantize)
        for rule, params in RULES:
            cpu, gpu = _run_both_logits(rule, params, sampling, target, draft, drafts, num, u, cuda)
            assert_agree("logits", rule, params, cpu, gpu, target, draft, drafts, num, u, sampling)


def test_cpu_cuda_agree_float64_and_masked(cuda):
    """float64 inputs, -inf logits masking part of a row, zero-probability rows of p == q
    (zero residual: falls back to p), one-hot rows with coins exactly 0 and just below 1."""
    B, gamma, V = 6, 3, 300
    target, draft, drafts, num, u = logit_inputs(B, gamma, V, torch.float64, seed=5)
    target[0, :, : V // 2] = -math.inf
    draft[1, :, V // 3 :] = -math.inf
    for rule, params in RULES:
        cpu, gpu = _run_both_logits(rule, params, (0.9, 0, 0.9, 0.0), target, draft, drafts, num, u, cuda)
        assert_agree("logits", rule, params, cpu, gpu, target, draft, drafts, num, u, (0.9, 0, 0.9, 0.0))
    p = torch.softmax(torch.randn(B, gamma + 1, V, dtype=torch.float64), -1)
    q = p[:, :gamma].clone()  # p == q: accept everything, zero residual
    one_hot = torch.zeros(B, gamma + 1, V, dtype=torch.float64)
    one_hot[..., 7] = 1.0
    for coin in (0.0, 1.0 - 2.0**-53):
        uu = torch.full((B, gamma + 1), coin, dtype=torch.float64)
        for tgt, dft in [(p, q), (one_hot, torch.softmax(torch.randn(B, gamma, V, dtype=torch.float64), -1))]:
            for rule, params in RULES:
                cpu, gpu = _run_both_probs(rule, params, tgt, dft, drafts, num, uu, cuda)
                assert_agree("probs", rule, params, cpu, gpu, tgt, dft, drafts, num, uu)


def test_cpu_cuda_agree_noncontiguous_and_large_gamma(cuda):
    """Non-contiguous inputs are made contiguous; gamma = 1000 and gamma = 8000 (the scratch
    lives in global memory: no per-row shared-memory limit) match the CPU."""
    target, draft, drafts, num, u = logit_inputs(5, 3, 1000, torch.float32, seed=9)
    t_nc = target.transpose(0, 1).contiguous().transpose(0, 1)
    d_nc = draft.transpose(0, 1).contiguous().transpose(0, 1)
    assert not t_nc.is_contiguous()
    for rule, params in RULES:
        cpu, gpu = _run_both_logits(rule, params, (1.0, 0, 1.0, 0.0), t_nc, d_nc, drafts, num, u, cuda)
        assert_agree("logits", rule, params, cpu, gpu, target, draft, drafts, num, u, (1.0, 0, 1.0, 0.0))
    for gamma, V in [(1000, 64), (8000, 8)]:
        g = torch.Generator().manual_seed(gamma)
        t = torch.randn(2, gamma + 1, V, generator=g) * 0.1
        d = t[:, :gamma] + 0.05 * torch.randn(2, gamma, V, generator=g)
        x = torch.multinomial(torch.softmax(d, -1).reshape(-1, V), 1, generator=g).view(2, gamma)
        n = torch.tensor([gamma, gamma // 2])
        uu = torch.rand(2, gamma + 1, dtype=torch.float64, generator=g) * 0.2  # accept most drafts
        for rule, params in RULES:
            cpu, gpu = _run_both_logits(rule, params, (1.0, 0, 1.0, 0.0), t, d, x, n, uu, cuda)
            assert_agree("logits", rule, params, cpu, gpu, t, d, x, n, uu, (1.0, 0, 1.0, 0.0))
            p, q = torch.softmax(t, -1), torch.softmax(d, -1)
            cpu, gpu = _run_both_probs(rule, params, p, q, x, n, uu, cuda)
            assert_agree("probs", rule, params, cpu, gpu, p, q, x, n, uu)


def test_cuda_results_are_deterministic(cuda):
    """Reductions have a fixed order (no float atomics): repeated calls, with filters on a
    large batch, return identical tensors."""
    target, draft, drafts, num, u = to_device(cuda, *logit_inputs(64, 8, 128256, torch.bfloat16, seed=13))
    for sampling in [(1.0, 0, 1.0, 0.0), (0.8, 50, 0.9, 0.05), (1.0, 0, 0.9, 0.0)]:
        for rule in ("token", "block"):
            first = OPS.verify_logits(target, draft, drafts, num, u, *sampling, rule, [])
            for _ in range(2):
                again = OPS.verify_logits(target, draft, drafts, num, u, *sampling, rule, [])
                assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1]), (rule, sampling)
    logits = target[:, 0].contiguous()
    first = OPS.sample_logits(logits, u[:, 0].contiguous(), 0.8, 50, 0.9, 0.05)
    assert torch.equal(first, OPS.sample_logits(logits, u[:, 0].contiguous(), 0.8, 50, 0.9, 0.05))


def test_empty_batch(cuda):
    """B = 0 returns empty [0, gamma+1] and [0] tensors without launching anything."""
    p, q = torch.empty(0, 4, 10, device=cuda), torch.empty(0, 3, 10, device=cuda)
    x, n = torch.empty(0, 3, dtype=torch.int64, device=cuda), torch.empty(0, dtype=torch.int64, device=cuda)
    u = torch.empty(0, 4, dtype=torch.float64, device=cuda)
    tokens, accepted = OPS.verify_probs(p, q, x, n, u, "token", [])
    assert tokens.shape == (0, 4) and accepted.shape == (0,) and tokens.is_cuda


def test_token_does_not_read_after_first_rejection(cuda):
    """Token (and greedy / typical / top-beta) verification never reads a position after the
    first rejection: NaN logits there raise neither on the CPU nor on the GPU."""
    B, gamma, V = 4, 4, 500
    target, draft, drafts, num, u = logit_inputs(B, gamma, V, torch.float32, seed=3, ragged=False)
    # position 0 is rejected: its draft token is the target's least likely token and the
    # draft's almost certain one (p / q ~ 0; greedy: not the argmax), and the coin is 0.999
    drafts[:, 0] = torch.softmax(target.double(), -1)[:, 0].argmin(-1)
    draft[torch.arange(B), 0, drafts[:, 0]] = 40.0
    u[:, 0] = 0.999
    target[:, 2:] = math.nan
    draft[:, 2:] = math.nan
    for rule, params in RULES:
        if rule == "block":
            continue  # block verification reads every position by design
        cpu, gpu = _run_both_logits(rule, params, (1.0, 0, 1.0, 0.0), target, draft, drafts, num, u, cuda)
        assert bool((gpu[1] == 0).all())
        assert_agree("logits", rule, params, cpu, gpu, target, draft, drafts, num, u, (1.0, 0, 1.0, 0.0))


# ------------------------------------------------------------------ losslessness on the GPU

LOSSLESS_N = 200_000
LOSSLESS_CONFIGS = [(3, 2, 0), (4, 3, 0), (5, 4, 6)]


def _cuda_verify(target_probs, draft_probs, draft_tokens, **kwargs):
    return specdecode.verify(target_probs, draft_probs, draft_tokens, **kwargs)


def _broken_skip_residual(target_probs, draft_probs, draft_tokens, *, num_draft_tokens=None, generator=None, **kwargs):
    """The CUDA op, then the classic bug: after a rejection emit y ~ p_{tau+1} instead of the
    residual. The harness must reject it."""
    out = specdecode.verify(target_probs, draft_probs, draft_tokens, num_draft_tokens=num_draft_tokens,
                            generator=generator, **kwargs)
    B, gamma = draft_tokens.shape
    n = num_draft_tokens if num_draft_tokens is not None else torch.full((B,), gamma, device=draft_tokens.device)
    tau = out.accepted_len
    rows = torch.arange(B, device=draft_tokens.device)
    coin = torch.rand(B, dtype=torch.float64, device=draft_tokens.device, generator=generator)
    y = su.inverse_cdf(target_probs[rows, tau].double(), coin)
    tokens = out.tokens.clone()
    rejected = tau < n
    tokens[rows[rejected], tau[rejected]] = y[rejected]
    return VerifyOutput(tokens, tau)


@pytest.mark.parametrize("rule", ["token", "block"])
@pytest.mark.parametrize("cfg", LOSSLESS_CONFIGS, ids=lambda c: "V{}-g{}-s{}".format(*c))
def test_lossless_joint_on_gpu(cuda, rule, cfg):
    """The exact distribution test on the GPU: the completed gamma+1 tokens follow the target's exact joint, for
    full and ragged rows, and the mean accepted length matches its exact value."""
    V, gamma, seed = cfg
    tables = su.make_tables(V, gamma, seed)
    run = su.run_lossless_experiment(tables, rule, LOSSLESS_N, seed, device=cuda, verify_fn=_cuda_verify)
    assert run.fit.impossible == 0, f"{rule} {cfg}: emitted a sequence of target probability 0 ({run.fit})"
    assert run.fit.pvalue > 1e-4, f"{rule} {cfg}: joint differs from the target's ({run.fit})"
    p_fn, q_fn = su.table_row_fns(tables)
    exact = float(su.exact_expected_accepted(p_fn, q_fn, V, gamma, rule))
    tau = run.accepted_len.double()
    tolerance = 6.0 * float(tau.std()) / math.sqrt(LOSSLESS_N) + 1e-9
    assert abs(float(tau.mean()) - exact) < tolerance, f"E[tau] {float(tau.mean()):.5f} vs exact {exact:.5f}"
    ragged = su.run_lossless_experiment(tables, rule, LOSSLESS_N, seed + 1, device=cuda, ragged=True,
                                        verify_fn=_cuda_verify)
    assert ragged.fit.impossible == 0 and ragged.fit.pvalue > 1e-4, f"{rule} {cfg} ragged: {ragged.fit}"


@pytest.mark.parametrize("rule", ["token", "block"])
def test_lossless_test_rejects_broken_variant_on_gpu(cuda, rule):
    """The same harness, same configuration, rejects the skip-the-residual bug: the test can fail."""
    V, gamma, seed = 4, 3, 0
    tables = su.make_tables(V, gamma, seed)
    good = su.run_lossless_experiment(tables, rule, LOSSLESS_N, seed, device=cuda, verify_fn=_cuda_verify)
    bad = su.run_lossless_experiment(tables, rule, LOSSLESS_N, seed, device=cuda, verify_fn=_broken_skip_residual)
    assert good.fit.pvalue > 1e-4, good.fit
    assert bad.fit.pvalue < 1e-8, f"the broken variant passed the lossless test ({bad.fit})"


def test_block_beats_token_on_gpu(cuda):
    """Worked example of the block-verification paper: E[tau] = 10/9 (token), 11/9 (block)."""
    tables = su.context_free_tables([1 / 3, 2 / 3], [2 / 3, 1 / 3], 2)
    for rule, exact in [("token", 10 / 9), ("block", 11 / 9)]:
        run = su.run_lossless_experiment(tables, rule, LOSSLESS_N, 3, device=cuda, verify_fn=_cuda_verify)
        tau = run.accepted_len.double()
        assert abs(float(tau.mean()) - exact) < 6.0 * float(tau.std()) / math.sqrt(LOSSLESS_N)
        assert run.fit.pvalue > 1e-4, run.fit


# ------------------------------------------------------------------- opcheck and bad input

RULE_PARAMS = {"token": [], "block": [], "greedy": [], "typical": [0.09, 0.3, 0.0], "top_beta": [3.0, 1.0]}


@pytest.mark.parametrize(
    "config",
    [("token", torch.float32, True, None), ("block", torch.bfloat16, True, None), ("greedy", torch.float16, False, None),
     ("typical", torch.float32, False, None), ("top_beta", torch.float64, False, None),
     ("token", torch.float32, True, (0.7, 10, 0.9, 0.05)), ("block", torch.bfloat16, True, (1.0, 0, 1.0, 0.0)),
     ("typical", torch.float16, False, (0.9, 0, 0.8, 0.0)), ("block", torch.float32, False, (0.0, 0, 1.0, 0.0))],
    ids=lambda c: f"{c[0]}-{c[1]}-{'logits' if c[3] else 'probs'}",
)
def test_opcheck_cuda(cuda, config):
    """torch.library.opcheck with CUDA tensors (schema, fake kernel, AOT dispatch)."""
    rule, dtype, with_draft, sampling = config
    target, draft, drafts, num, u = logit_inputs(3, 2, 40, dtype, seed=1)
    if sampling is None:
        target, draft = torch.softmax(target.float(), -1).to(dtype), torch.softmax(draft.float(), -1).to(dtype)
        args = (*to_device(cuda, target, draft if with_draft else None, drafts, num, u), rule, RULE_PARAMS[rule])
        torch.library.opcheck(OPS.verify_probs.default, args)
    else:
        args = (*to_device(cuda, target, draft if with_draft else None, drafts, num, u), *sampling, rule, RULE_PARAMS[rule])
        torch.library.opcheck(OPS.verify_logits.default, args)


@pytest.mark.parametrize("philox", [False, True])
def test_opcheck_cuda_sample(cuda, philox):
    logits = torch.randn(3, 17, device=cuda)
    if philox:
        seed, offset = torch.tensor([1], device=cuda), torch.tensor([2], device=cuda)
        torch.library.opcheck(OPS.sample_logits_philox.default, (logits, seed, offset, 0.8, 4, 0.9, 0.0))
    else:
        u = torch.rand(3, dtype=torch.float64, device=cuda)
        torch.library.opcheck(OPS.sample_logits.default, (logits, u, 0.8, 4, 0.9, 0.0))


def _run_error_cases_in_subprocess(which: str) -> dict:
    """op_error_cases.run_cases('cuda', which) in a fresh interpreter: a crash (the failure this
    guards against: formatting a message inside an nvcc translation unit killed the process)
    fails the test with the child's output instead of killing pytest."""
    script = Path(__file__).resolve().parent / "op_error_cases.py"
    child = subprocess.run([sys.executable, str(script), "cuda", which], capture_output=True, text=True, timeout=600)
    assert child.returncode == 0, (
        f"the CUDA error cases crashed the process (exit status {child.returncode}):\n"
        f"{child.stdout[-3000:]}\n{child.stderr[-3000:]}")
    return json.loads(child.stdout.strip().splitlines()[-1])


def test_every_error_of_every_op_matches_cpu(cuda):
    """Every bad call of every op (shapes, dtypes, rule parameters, sampling settings, Philox
    tensors, bad rows: NaN / +inf / all -inf logits, empty distributions, out-of-range tokens
    and counts) raises on the GPU exactly what the CPU op raises: same type, same message
    (row and argument named); the calls that must not raise do not."""
    cpu = op_error_cases.run_cases("cpu")
    gpu = _run_error_cases_in_subprocess("cases")
    assert gpu == cpu, {k: {"cpu": cpu[k], "cuda": gpu.get(k)} for k in cpu if gpu.get(k) != cpu[k]}


def test_mixed_device_errors(cuda):
    """An input on the CPU next to CUDA tensors raises a ValueError naming the device."""
    results = _run_error_cases_in_subprocess("device")
    for name, (kind, message) in results.items():
        assert kind == "ValueError" and "device" in message, (name, kind, message)


def test_public_api_value_checks_on_cuda(cuda):
    """The public API's value checks (NaN probabilities) apply to CUDA tensors too."""
    target, draft, drafts, num, u = to_device(cuda, *prob_inputs(2, 3, 20, torch.float32, seed=0))
    with pytest.raises(ValueError, match="draft_probs"):
        specdecode.verify(target, torch.full_like(draft, math.nan), drafts)


# ------------------------------------------------------------------------------ sampling


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("B", [1, 17])
@pytest.mark.parametrize("V", [111, 32000, 128256])
def test_cpu_cuda_agree_sample_logits(cuda, V, B, dtype):
    """sample_logits draws the CPU's token with the same coin (every filter, greedy)."""
    g = torch.Generator().manual_seed(V + B)
    logits = (torch.randn(B, V, generator=g) * 3).to(dtype)
    u = torch.rand(B, dtype=torch.float64, generator=g)
    for sampling in [(1.0, 0, 1.0, 0.0), (0.8, 50, 0.9, 0.05), (0.7, 0, 0.9, 0.0), (1.0, 0, 1.0, 0.2),
                     (0.0, 0, 1.0, 0.0)]:
        cpu = OPS.sample_logits(logits, u, *sampling)
        gpu = OPS.sample_logits(logits.to(cuda), u.to(cuda), *sampling)
        assert gpu.is_cuda
        assert_samples_agree(cpu, gpu, logits, u, sampling)


def test_sample_logits_philox_and_graph(cuda):
    """sample_logits_philox draws the Python Philox coin (b, 0); captured in a CUDA graph with
    offset.add_(1), every replay equals the CPU op at the next offset."""
    B, V = 16, 5000
    logits = torch.randn(B, V, generator=torch.Generator().manual_seed(3)) * 2
    x = logits.to(cuda)
    seed = torch.tensor([77], dtype=torch.int64, device=cuda)
    offset = torch.tensor([0], dtype=torch.int64, device=cuda)
    sampling = (0.9, 40, 0.95, 0.01)
    graph, tokens = capture_with_offset(lambda: OPS.sample_logits_philox(x, seed, offset, *sampling), offset)
    offset.fill_(10)
    for k in range(3):
        graph.replay()
        torch.cuda.synchronize()
        coins = philox_uniforms(77, 10 + k, B, 0)[:, 0]
        cpu = OPS.sample_logits(logits, coins, *sampling)
        assert_samples_agree(cpu, tokens.clone(), logits, coins, sampling)


def test_public_api_on_cuda(cuda):
    """specdecode.verify / verify_logits with CUDA tensors and a CUDA generator: outputs on the
    GPU, reproducible for a fixed seed."""
    target, draft, drafts, num, _ = to_device(cuda, *logit_inputs(8, 4, 500, torch.bfloat16, seed=2))
    runs = []
    for _ in range(2):
        gen = torch.Generator(device=cuda).manual_seed(7)
        runs.append(specdecode.verify_logits(target, draft, drafts, rule="block", num_draft_tokens=num,
                                             generator=gen, temperature=0.8, top_p=0.9))
    assert runs[0].tokens.is_cuda and torch.equal(runs[0].tokens, runs[1].tokens)
    su.check_output_structure(runs[0].tokens, runs[0].accepted_len, drafts, num, 500)
    p, q = torch.softmax(target.float(), -1), torch.softmax(draft.float(), -1)
    out = specdecode.verify(p, q, drafts, rule="token", generator=torch.Generator(device=cuda).manual_seed(1))
    assert out.tokens.is_cuda and out.accepted_len.is_cuda


@pytest.mark.parametrize("V", [111, 32000, 128256])
def test_cpu_cuda_agree_processed_probs(cuda, V):
    """processed_probs: the CPU's distribution (same support, float64 rounding) for every
    filter, dtype and temperature 0; opcheck with CUDA inputs."""
    g = torch.Generator().manual_seed(V)
    logits = torch.randn(17, V, generator=g) * 3
    logits[1, : V // 2] = -math.inf
    for dtype in DTYPES:
        x = logits.to(dtype)
        for sampling in [(1.0, 0, 1.0, 0.0), (0.8, 50, 0.9, 0.05), (0.7, 0, 0.9, 0.0), (1.0, 0, 1.0, 0.2),
                         (0.0, 0, 1.0, 0.0)]:
            cpu = OPS.processed_probs(x, *sampling)
            gpu = OPS.processed_probs(x.to(cuda), *sampling)
            assert gpu.is_cuda
            assert_processed_probs_agree(cpu, gpu, greedy=sampling[0] == 0.0)
    torch.library.opcheck(OPS.processed_probs.default, (logits[:3].to(cuda), 0.9, 3, 0.8, 0.0))
