"""The CUDA implementations of ``verify_probs`` / ``verify_logits`` (csrc/ops/verify_cuda.cu over
the kernels in csrc/kernels/cuda/).

Every test that needs a GPU takes the ``cuda`` fixture, which skips when
``torch.cuda.is_available()`` is false (checked when the test runs, never at import) and fails
when a GPU is there but specdecode was built without its CUDA kernels. The Philox
known-answer test needs no GPU.

What is checked:
  * CPU vs CUDA agreement on tokens and accepted lengths with the SAME uniforms, for
    V in {111, 32000, 128256, 151936}, B in {1, 17, 64}, every rule, both ops, float32 /
    float16 / bfloat16, plus top-k / top-p / min-p with tied logits, ragged rows, float64,
    non-contiguous inputs, large gamma, an empty batch;
  * the exact joint-distribution test of spec §8 for token and block verification run on the
    GPU, and a deliberately broken variant (y ~ p instead of the residual after a rejection)
    that the same test must reject; E[tau] against its exact value;
  * torch.library.opcheck with CUDA inputs; bad input raising the CPU's ValueError;
  * the graph-safe Philox variant (when its schema is registered): coins equal to the Python
    Philox below, and a CUDA-graph capture replayed with advancing offsets.

Expected differences between CPU and CUDA (and how they are bounded here):
  * verify_probs reads the same float64 values on both sides; only summation order differs
    (the CPU sums sequentially, the GPU in parallel, both in float64), so a decision can only
    differ when a coin lies within ~1e-13 of its threshold. Allowed margin: 1e-9.
  * verify_logits computes every unnormalised weight e = exp((l - max) / T) bit-identically,
    but the CPU sums the normaliser in float32 chunks of 2048 (float64 across chunks) while
    the GPU sums in float64: 1/sum differs by up to ~1e-6 relative. An acceptance decision
    can then differ when |u - p/q| is within ~1e-6, and a residual draw when u lies within
    ~1e-6 / (residual mass) of a boundary of the residual's CDF. Allowed margin: 1e-5 (scaled
    by 1 / residual mass for draws).
  A mismatching row is accepted only if the reference math (float64, specdecode.reference)
  puts the coin of the first disagreeing decision within that margin of its threshold, or,
  when only the emitted token differs, puts the GPU's token's CDF interval within that margin
  of the coin. Greedy decisions and argmax corrections must agree exactly.
"""

from __future__ import annotations

import math

import pytest
import torch

import specdecode
import stat_utils as su
from specdecode import reference
from specdecode.reference import VerifyOutput
from cuda_agreement import RULES, assert_agree, assert_samples_agree, logit_inputs, prob_inputs, to_device

OPS = torch.ops.specdecode
pytestmark = pytest.mark.cuda

@pytest.fixture
def cuda() -> torch.device:
    """The CUDA device; skips without one (queried at test time, not at import)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    for op in ("verify_probs", "verify_logits"):
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
    """Non-contiguous inputs are made contiguous; gamma = 1000 with logits needs more than
    48 KiB of shared memory per row (the kernel opts in) and still matches the CPU; a gamma
    beyond the GPU's shared memory raises ValueError naming gamma."""
    target, draft, drafts, num, u = logit_inputs(5, 3, 1000, torch.float32, seed=9)
    t_nc = target.transpose(0, 1).contiguous().transpose(0, 1)
    d_nc = draft.transpose(0, 1).contiguous().transpose(0, 1)
    assert not t_nc.is_contiguous()
    for rule, params in RULES:
        cpu, gpu = _run_both_logits(rule, params, (1.0, 0, 1.0, 0.0), t_nc, d_nc, drafts, num, u, cuda)
        assert_agree("logits", rule, params, cpu, gpu, target, draft, drafts, num, u, (1.0, 0, 1.0, 0.0))
    gamma = 1000
    g = torch.Generator().manual_seed(10)
    t = torch.randn(2, gamma + 1, 64, generator=g) * 0.1
    d = t[:, :gamma] + 0.05 * torch.randn(2, gamma, 64, generator=g)
    x = torch.multinomial(torch.softmax(d, -1).reshape(-1, 64), 1, generator=g).view(2, gamma)
    n = torch.tensor([gamma, gamma // 2])
    uu = torch.rand(2, gamma + 1, dtype=torch.float64, generator=g) * 0.2  # accept most drafts
    for rule, params in RULES:
        cpu, gpu = _run_both_logits(rule, params, (1.0, 0, 1.0, 0.0), t, d, x, n, uu, cuda)
        assert_agree("logits", rule, params, cpu, gpu, t, d, x, n, uu, (1.0, 0, 1.0, 0.0))
        cpu, gpu = _run_both_probs(rule, params, torch.softmax(t, -1), torch.softmax(d, -1), x, n, uu, cuda)
        assert_agree("probs", rule, params, cpu, gpu, torch.softmax(t, -1), torch.softmax(d, -1), x, n, uu)
    big = 8000
    with pytest.raises(ValueError, match="gamma"):
        OPS.verify_logits(*to_device(cuda, torch.zeros(1, big + 1, 8), torch.zeros(1, big, 8),
                               torch.zeros(1, big, dtype=torch.int64), torch.tensor([big]),
                               torch.zeros(1, big + 1, dtype=torch.float64)), 1.0, 0, 1.0, 0.0, "block", [])


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
    p = torch.softmax(target.double(), -1)
    drafts[:, 0] = p[:, 0].argmin(-1)  # the least likely token: rejected (and not the argmax)
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
    """Spec §8 on the GPU: the completed gamma+1 tokens follow the target's exact joint, for
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


def _bad_cases():
    def set_(t, idx, value):
        t = t.clone()
        t[idx] = value
        return t

    target, draft, drafts, num, u = logit_inputs(3, 3, 30, torch.float32, seed=4, ragged=False)
    yield "nan_target", (set_(target, (1, 0, 3), math.nan), draft, drafts, num, u)
    yield "inf_draft", (target, set_(draft, (2, 0, 5), math.inf), drafts, num, u)
    yield "all_masked", (set_(target, (0, 0), -math.inf), draft, drafts, num, u)
    yield "token_out_of_range", (target, draft, set_(drafts, (1, 1), 30), num, u)
    yield "num_out_of_range", (target, draft, drafts, set_(num, 2, 4), u)
    yield "num_negative", (target, draft, drafts, set_(num, 0, -1), u)


@pytest.mark.parametrize("rule", ["token", "block", "greedy", "typical"])
def test_bad_input_raises_like_cpu(cuda, rule):
    """Bad values raise ValueError on the GPU with exactly the CPU's message (same row, same
    argument named); where the CPU does not raise (the rule never reads the bad value), the
    GPU does not either and returns the CPU's result."""
    for name, (target, draft, drafts, num, u) in _bad_cases():
        needs = rule in ("token", "block")
        args = (target, draft if needs else None, drafts, num, u)
        try:
            cpu = OPS.verify_logits(*args, 1.0, 0, 1.0, 0.0, rule, RULE_PARAMS[rule])
            cpu_error = None
        except ValueError as exc:
            cpu_error = str(exc).splitlines()[0]
        if cpu_error is None:
            gpu = OPS.verify_logits(*to_device(cuda, *args), 1.0, 0, 1.0, 0.0, rule, RULE_PARAMS[rule])
            assert_agree("logits", rule, RULE_PARAMS[rule], cpu, gpu, target, draft, drafts, num, u,
                         (1.0, 0, 1.0, 0.0))
            continue
        with pytest.raises(ValueError) as gpu_err:
            OPS.verify_logits(*to_device(cuda, *args), 1.0, 0, 1.0, 0.0, rule, RULE_PARAMS[rule])
        assert str(gpu_err.value).splitlines()[0] == cpu_error, name


def test_bad_shapes_and_devices_raise(cuda):
    """Shape, dtype and device mistakes raise (ValueError / TypeError naming the argument)."""
    target, draft, drafts, num, u = to_device(cuda, *prob_inputs(2, 3, 20, torch.float32, seed=0))
    with pytest.raises(ValueError, match="draft_probs"):
        OPS.verify_probs(target, draft[:, :2], drafts, num, u, "token", [])
    with pytest.raises(ValueError, match="uniforms"):
        OPS.verify_probs(target, draft, drafts, num, u[:, :2], "token", [])
    with pytest.raises(TypeError, match="uniforms"):
        OPS.verify_probs(target, draft, drafts, num, u.float(), "token", [])
    with pytest.raises(TypeError, match="target_probs"):
        OPS.verify_probs(target.int(), draft, drafts, num, u, "greedy", [])
    with pytest.raises(ValueError):
        OPS.verify_probs(target, draft, drafts.cpu(), num, u, "token", [])
    with pytest.raises(ValueError, match="rule"):
        OPS.verify_probs(target, draft, drafts, num, u, "nope", [])
    with pytest.raises(ValueError, match="draft"):
        OPS.verify_probs(target, None, drafts, num, u, "block", [])
    with pytest.raises(ValueError, match="draft_probs"):  # the public API's value checks on CUDA tensors
        specdecode.verify(target, torch.full_like(draft, math.nan), drafts)


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


# --------------------------------------------------------------------- Philox (graph-safe)

from stat_utils import _MASK32, philox4x32_10, philox_uniforms  # noqa: E402  (Python reference of philox.h)


def test_philox_known_answers():
    """The Python Philox reproduces the Random123 known-answer vectors (no GPU needed)."""
    assert philox4x32_10((0, 0, 0, 0), (0, 0)) == (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)
    assert philox4x32_10((_MASK32,) * 4, (_MASK32, _MASK32)) == (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)
    assert philox4x32_10((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0)) == (
        0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)
    u = philox_uniforms(1234, 5, 8, 3)
    assert bool(((u >= 0) & (u < 1)).all()) and u.unique().numel() == u.numel()


def _philox_op(name):
    if not hasattr(OPS, name):
        pytest.skip(f"torch.ops.specdecode.{name} is not registered in this build")
    return getattr(OPS, name)


def test_philox_probs_matches_cpu_with_python_coins(cuda):
    """verify_probs_philox on the GPU equals verify_probs on the CPU fed the Python Philox coins."""
    op = _philox_op("verify_probs_philox")
    target, draft, drafts, num, _ = prob_inputs(8, 4, 300, torch.float32, seed=6)
    seed = torch.tensor([0x1234_5678_9ABC], dtype=torch.int64, device=cuda)
    for offset_value in (0, 1, 2**33 + 5):
        offset = torch.tensor([offset_value], dtype=torch.int64, device=cuda)
        coins = philox_uniforms(0x1234_5678_9ABC, offset_value, 8, 4)
        for rule, params in RULES:
            needs = rule in ("token", "block")
            gpu = op(*to_device(cuda, target, draft if needs else None, drafts, num), seed, offset, rule, params)
            cpu = OPS.verify_probs(target, draft if needs else None, drafts, num, coins, rule, params)
            assert_agree("probs", rule, params, cpu, gpu, target, draft, drafts, num, coins)


def test_philox_logits_matches_cpu_with_python_coins(cuda):
    op = _philox_op("verify_logits_philox")
    target, draft, drafts, num, _ = logit_inputs(8, 4, 300, torch.bfloat16, seed=8)
    seed = torch.tensor([-5], dtype=torch.int64, device=cuda)  # seeds are read as uint64
    offset = torch.tensor([3], dtype=torch.int64, device=cuda)
    coins = philox_uniforms(-5, 3, 8, 4)
    sampling = (0.8, 20, 0.9, 0.0)
    for rule, params in RULES:
        needs = rule in ("token", "block")
        gpu = op(*to_device(cuda, target, draft if needs else None, drafts, num), seed, offset, *sampling, rule, params)
        cpu = OPS.verify_logits(target, draft if needs else None, drafts, num, coins, *sampling, rule, params)
        assert_agree("logits", rule, params, cpu, gpu, target, draft, drafts, num, coins, sampling)


def test_philox_cuda_graph_replay(cuda):
    """Capture one Philox verify call plus offset.add_(1) in a CUDA graph; every replay uses the
    next offset (read from device memory) and equals the CPU op fed that offset's coins."""
    op = _philox_op("verify_probs_philox")
    B, gamma, V = 16, 4, 1000
    target, draft, drafts, num, _ = prob_inputs(B, gamma, V, torch.float32, seed=11)
    t, d, x, n = to_device(cuda, target, draft, drafts, num)
    seed = torch.tensor([42], dtype=torch.int64, device=cuda)
    offset = torch.tensor([0], dtype=torch.int64, device=cuda)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture (lazy initialisation, allocator)
        for _ in range(2):
            op(t, d, x, n, seed, offset, "block", [])
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tokens, accepted = op(t, d, x, n, seed, offset, "block", [])
        offset.add_(1)
    offset.fill_(100)
    seen = []
    for k in range(3):
        graph.replay()
        torch.cuda.synchronize()
        coins = philox_uniforms(42, 100 + k, B, gamma)
        cpu = OPS.verify_probs(target, draft, drafts, num, coins, "block", [])
        assert_agree("probs", "block", [], cpu, (tokens.clone(), accepted.clone()), target, draft, drafts, num, coins)
        seen.append(tokens.cpu().clone())
    assert int(offset.item()) == 103
    assert not all(torch.equal(seen[0], s) for s in seen[1:]), "replays with new offsets gave identical draws"
