"""The CUDA implementation of the verify / sample ops, run WITHOUT a GPU: the kernels of
csrc/kernels/cuda compiled as host C++ against the CUDA emulator (tests/cuda_emu: every CUDA
thread a coroutine, real __syncthreads and warp-shuffle semantics), behind the same op bodies
(csrc/ops/verify_device.h: checks, messages, scratch, statuses) as the real CUDA ops.

Checked against the CPU ops with the agreement rules of tests/cuda_agreement.py:
  * every rule of verify_probs / verify_logits, ragged rows, odd and multi-chunk vocabularies
    (aligned and unaligned rows), all four dtypes;
  * top-k / top-p / min-p through every path of the filter kernels: thresholds from the chunk
    lists, the exact radix fallback (top-k beyond the lists, a top-p walk past them, flat rows
    whose lists overflow), the masked-sum normaliser, exact ties;
  * sample_logits, the Philox ops (and their capture mode: no raise, bad rows as -1), large
    gamma, an empty batch, zero-mass residuals;
  * verify_tree / verify_tree_philox: every tree rule on random ragged trees (V = 7, 111,
    32000; B = 1, 3, 17), temperature / top-k / top-p / min-p / temperature 0, every dtype,
    wide nodes with many rejections, unread NaN rows, capture mode;
  * processed_probs: the same distribution as the CPU op for every sampling setting and dtype;
  * every error a direct op call can raise (tests/op_error_cases.py): same type, same message.

What the emulator cannot show: timing, real concurrency between blocks (the kernels never
communicate within a launch), and the GPU's fast exp2 (emulated with exp2f; it only enters
sums whose rounding no decision depends on). tests/test_cuda.py runs the same checks on a GPU.

The module compiles the emulation once per source change (~2 minutes on 2 cores; cached in
build/cuda_emu) and is skipped when the CUDA headers or a C++ compiler are missing.
"""

from __future__ import annotations

import math

import pytest
import torch

import op_error_cases
from cuda_agreement import (PATH_RULES, RULES, TREE_RULES, assert_agree, assert_processed_probs_agree,
                            assert_samples_agree, assert_tree_agree, logit_inputs, paths_logit_inputs, prob_inputs,
                            tree_logit_inputs, tree_needs_draft)

OPS = torch.ops.specdecode


@pytest.fixture(scope="module")
def emu():
    from cuda_emu import build

    module = build.load()
    if module is None:
        pytest.skip(f"CUDA emulation unavailable: {build.SKIP_REASON}")
    return build.EmulatedOps(module)


def _needs_draft(rule: str) -> bool:
    return rule in ("token", "block")


def _agree_logits(emu, rule, params, sampling, target, draft, drafts, num, u):
    d = draft if _needs_draft(rule) else None
    cpu = OPS.verify_logits(target, d, drafts, num, u, *sampling, rule, params)
    dev = emu.verify_logits(target, d, drafts, num, u, *sampling, rule, params)
    assert_agree("logits", rule, params, cpu, dev, target, draft, drafts, num, u, sampling)


def _agree_probs(emu, rule, params, target, draft, drafts, num, u):
    d = draft if _needs_draft(rule) else None
    cpu = OPS.verify_probs(target, d, drafts, num, u, rule, params)
    dev = emu.verify_probs(target, d, drafts, num, u, rule, params)
    assert_agree("probs", rule, params, cpu, dev, target, draft, drafts, num, u)


SAMPLINGS = [
    (1.0, 0, 1.0, 0.0),     # plain
    (0.8, 50, 0.9, 0.05),   # every filter
    (0.6, 0, 0.5, 0.0),     # top-p alone
    (1.0, 0, 1.0, 0.3),     # min-p alone
    (1.3, 7, 1.0, 0.0),     # top-k alone
    (0.0, 0, 1.0, 0.0),     # greedy
]


def test_emulated_errors_match_cpu(emu):
    """Every bad call of every op: the same exception type and message as the CPU op."""
    cpu = op_error_cases.run_cases("cpu")
    dev = op_error_cases.run_cases("cpu", emu)
    assert dev == cpu, {k: (cpu[k], dev[k]) for k in cpu if cpu[k] != dev[k]}


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=lambda s: "T{}-k{}-p{}-m{}".format(*s))
def test_emulated_agree_logits_small_vocab(emu, sampling):
    target, draft, drafts, num, u = logit_inputs(5, 3, 111, torch.float32, seed=1)
    for rule, params in RULES:
        _agree_logits(emu, rule, params, sampling, target, draft, drafts, num, u)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_emulated_agree_logits_multichunk_unaligned(emu, dtype):
    """V = 20001: three stats chunks, ten sampling chunks, rows not 16-byte aligned."""
    target, draft, drafts, num, u = logit_inputs(2, 2, 20001, dtype, seed=2)
    for sampling in [(1.0, 0, 1.0, 0.0), (0.8, 50, 0.9, 0.05)]:
        for rule, params in RULES if dtype == torch.bfloat16 else RULES[:2]:
            _agree_logits(emu, rule, params, sampling, target, draft, drafts, num, u)


def test_emulated_agree_logits_multichunk_aligned(emu):
    """V = 16384 float32: two full chunks, vectorised loads; the max in the second chunk."""
    target, draft, drafts, num, u = logit_inputs(2, 2, 16384, torch.float32, seed=3)
    target[:, :, 12000] += 30.0  # argmax and most of the mass in chunk 1
    for rule, params in RULES[:3]:
        _agree_logits(emu, rule, params, (0.9, 0, 1.0, 0.0), target, draft, drafts, num, u)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16], ids=str)
def test_emulated_agree_probs(emu, dtype):
    target, draft, drafts, num, u = prob_inputs(5, 3, 111, dtype, seed=4)
    for rule, params in RULES:
        _agree_probs(emu, rule, params, target, draft, drafts, num, u)


def test_emulated_agree_probs_multichunk(emu):
    target, draft, drafts, num, u = prob_inputs(2, 2, 9000, torch.float32, seed=5)
    for rule, params in RULES:
        _agree_probs(emu, rule, params, target, draft, drafts, num, u)


def test_emulated_filter_paths(emu):
    """Every path of the filter kernels against the CPU's thresholds: exact ties (quantised
    logits), top-k beyond what the chunk lists hold (radix fallback), a top-p walk deeper than
    the lists (fallback), flat rows whose lists overflow (fallback; min-p normaliser by the
    masked sum), top-k >= V (off)."""
    V = 20001
    target, draft, drafts, num, u = logit_inputs(2, 2, V, torch.float32, seed=6, quantize=True)
    flat_t, flat_d = torch.zeros_like(target), torch.zeros_like(draft)
    flat_t[1, :, : V // 2] = 1.0  # row 1: two plateaus
    for sampling in [(1.0, 1000, 1.0, 0.0), (1.5, 0, 0.99, 0.0), (0.7, 40, 0.95, 0.02), (1.0, 0, 1.0, 0.5),
                     (1.0, V, 1.0, 0.0), (1.0, 1, 1.0, 0.0)]:
        for rule, params in [("token", []), ("block", [])]:
            _agree_logits(emu, rule, params, sampling, target, draft, drafts, num, u)
    for sampling in [(1.0, 0, 0.9, 0.0), (1.0, 0, 1.0, 0.5), (1.0, 3000, 0.5, 0.0)]:
        for rule, params in [("token", []), ("typical", [0.09, 0.3, 1.0])]:
            _agree_logits(emu, rule, params, sampling, flat_t, flat_d, drafts, num, u)
    # Lists that overflow even strictly above t0 (one warp's slice of chunk 0 is deep, the rest
    # holds > 512 tied entries above it): top-p and min-p go through the exact fallback.
    spread_t = torch.full_like(target, -10.0)
    spread_d = spread_t[:, : draft.shape[1]].clone()
    chunk0 = torch.arange(8192)
    outside_warp7 = chunk0[(chunk0 // 4) % 256 < 224]  # float32 slots of threads 0..223
    spread_t[:, :, outside_warp7] = 5.0
    spread_t[:, :, 900:910] = 6.0
    spread_d[:, :, outside_warp7] = 4.0
    for sampling in [(1.0, 0, 0.3, 0.0), (1.0, 0, 1.0, 0.9), (1.0, 20, 0.5, 0.0)]:
        _agree_logits(emu, "token", [], sampling, spread_t, spread_d, drafts, num, u)
    # Mostly masked rows: top-k larger than the number of finite logits keeps all of them (the
    # k-th largest is -inf); min-p with a tiny and with the largest min_p.
    masked_t, masked_d = target.clone(), draft.clone()
    masked_t[:, :, 40:] = -math.inf
    masked_d[:, :, 60:] = -math.inf
    x = drafts % 40
    for sampling in [(1.0, 100, 1.0, 0.0), (1.0, 100, 0.8, 0.0), (1.0, 0, 1.0, 1e-30), (1.0, 0, 1.0, 1.0)]:
        for rule, params in [("token", []), ("block", [])]:
            _agree_logits(emu, rule, params, sampling, masked_t, masked_d, x, num, u)


def test_emulated_top_p_boundary_needs_the_exact_mass(emu):
    """Top-p alone where top_p * (kept mass) lies within 1e-6 (relative) of a group boundary: the
    approximate mass from the first pass cannot decide the group, so the exact mass pass and the
    second merge run; the threshold must still be the CPU's, on both sides of the boundary."""
    B, gamma, V = 2, 2, 20001
    g = torch.Generator().manual_seed(15)
    target = torch.full((B, gamma + 1, V), -30.0)
    target[:, :, 0:2048:8] = 2.0   # 256 entries, one per thread of chunk 0: every thread max is 2
    target[:, :, 8193:8193 + 40] = -1.0  # a second group, 3 nats lower, in chunk 1
    target += 1e-3 * torch.rand(B, gamma + 1, V, generator=g).round()  # keep exact ties: adds 0 or 1e-3
    target = target.round(decimals=3)
    draft = target[:, :gamma].clone()
    draft[:, :, 0:2048:8] = 1.0
    drafts = torch.zeros(B, gamma, dtype=torch.int64)
    num = torch.tensor([gamma, 1])
    u = torch.rand(B, gamma + 1, dtype=torch.float64, generator=g)
    for b in range(B):
        for i in range(gamma + 1):
            row = target[b, i].double()
            e = torch.exp(row - row.max())
            top = float(e[row >= 2.0].sum())  # the mass of the top groups
            for side in (1.0 + 1e-6, 1.0 - 1e-6):
                top_p = top / float(e.sum()) * side
                _agree_logits(emu, "token", [], (1.0, 0, top_p, 0.0), target, draft, drafts, num, u)


def test_emulated_min_p_threshold_search(emu):
    """The device search for min-p's logit threshold equals plain bisection with the CPU's exp,
    over scales, temperatures and min_p values (including 1 and a tiny one)."""
    g = torch.Generator().manual_seed(14)
    cases = [(0.0, 1.0, 0.05), (13.5, 0.8, 1.0), (-7.25, 3.0, 1e-30), (1e4, 0.01, 0.5), (-1e4, 100.0, 0.3),
             (30.0, 1.0, 1e-38), (2.5, 1.0 / 0.7, 0.02)]
    for _ in range(200):
        cases.append((float(torch.randn(1, generator=g)) * 10.0 ** float(torch.randint(-2, 4, (1,), generator=g)),
                      float(torch.rand(1, generator=g)) * 4 + 0.05, float(torch.rand(1, generator=g)) ** 4))
    for max_logit, inv_temp, min_e in cases:
        m, it, e = (float(torch.tensor(v, dtype=torch.float32)) for v in (max_logit, inv_temp, min_e))
        if e <= 0.0:
            continue
        assert emu.module.min_p_threshold(m, it, e) == emu.module.min_p_threshold_oracle(m, it, e), (m, it, e)


def test_emulated_does_not_read_after_first_rejection(emu):
    """NaN after the first rejection raises on neither side; the results agree."""
    B, gamma, V = 4, 4, 500
    target, draft, drafts, num, u = logit_inputs(B, gamma, V, torch.float32, seed=7, ragged=False)
    # position 0 is rejected: its draft token is the target's least likely token and the
    # draft's almost certain one (p / q ~ 0), and the coin is 0.999
    drafts[:, 0] = torch.softmax(target.double(), -1)[:, 0].argmin(-1)
    draft[torch.arange(B), 0, drafts[:, 0]] = 40.0
    u[:, 0] = 0.999
    target[:, 2:] = math.nan
    draft[:, 2:] = math.nan
    for rule, params in RULES:
        if rule == "block":
            continue  # block verification reads every position by design
        d = draft if _needs_draft(rule) else None
        dev = emu.verify_logits(target, d, drafts, num, u, 1.0, 0, 1.0, 0.0, rule, params)
        assert bool((dev[1] == 0).all())
        _agree_logits(emu, rule, params, (1.0, 0, 1.0, 0.0), target, draft, drafts, num, u)


def test_emulated_masked_zero_mass_and_coins_at_the_edges(emu):
    """-inf logits masking part of a row, p == q (zero residual: falls back to p), one-hot rows
    with coins exactly 0 and just below 1, float64."""
    B, gamma, V = 4, 3, 300
    target, draft, drafts, num, u = logit_inputs(B, gamma, V, torch.float64, seed=8)
    target[0, :, : V // 2] = -math.inf
    draft[1, :, V // 3:] = -math.inf
    for rule, params in RULES[:3]:
        _agree_logits(emu, rule, params, (0.9, 0, 0.9, 0.0), target, draft, drafts, num, u)
    p = torch.softmax(torch.randn(B, gamma + 1, V, dtype=torch.float64), -1)
    one_hot = torch.zeros(B, gamma + 1, V, dtype=torch.float64)
    one_hot[..., 7] = 1.0
    for coin in (0.0, 1.0 - 2.0**-53, 1.0):  # 1.0: u * total at the very top (the last positive entry)
        uu = torch.full((B, gamma + 1), coin, dtype=torch.float64)
        for tgt, dft in [(p, p[:, :gamma].clone()),
                         (one_hot, torch.softmax(torch.randn(B, gamma, V, dtype=torch.float64), -1))]:
            for rule, params in RULES:
                _agree_probs(emu, rule, params, tgt, dft, drafts, num, uu)


def test_emulated_large_gamma(emu):
    """gamma = 120: many positions per row (no shared-memory limit on gamma any more)."""
    gamma, V = 120, 64
    g = torch.Generator().manual_seed(10)
    t = torch.randn(2, gamma + 1, V, generator=g) * 0.1
    d = t[:, :gamma] + 0.05 * torch.randn(2, gamma, V, generator=g)
    x = torch.multinomial(torch.softmax(d, -1).reshape(-1, V), 1, generator=g).view(2, gamma)
    n = torch.tensor([gamma, gamma // 2])
    u = torch.rand(2, gamma + 1, dtype=torch.float64, generator=g) * 0.2  # accept most drafts
    for rule, params in RULES[:3]:
        _agree_logits(emu, rule, params, (1.0, 0, 1.0, 0.0), t, d, x, n, u)
        _agree_probs(emu, rule, params, torch.softmax(t, -1), torch.softmax(d, -1), x, n, u)


def test_emulated_empty_batch(emu):
    p, q = torch.empty(0, 4, 10), torch.empty(0, 3, 10)
    x, n, u = torch.empty(0, 3, dtype=torch.int64), torch.empty(0, dtype=torch.int64), torch.empty(0, 4, dtype=torch.float64)
    tokens, accepted = emu.verify_probs(p, q, x, n, u, "token", [])
    assert tokens.shape == (0, 4) and accepted.shape == (0,)
    assert emu.sample_logits(torch.empty(0, 5), torch.empty(0, dtype=torch.float64), 1.0, 0, 1.0, 0.0).shape == (0,)


@pytest.mark.parametrize("V", [111, 20001, 70001])
def test_emulated_sample_logits(emu, V):
    """sample_logits; V = 70001 has 35 sampling chunks (more than one warp's worth)."""
    g = torch.Generator().manual_seed(V)
    logits = torch.randn(3, V, generator=g) * 3
    u = torch.rand(3, dtype=torch.float64, generator=g)
    for dtype in (torch.float32, torch.bfloat16):
        x = logits.to(dtype)
        for sampling in SAMPLINGS:
            cpu = OPS.sample_logits(x, u, *sampling)
            dev = emu.sample_logits(x, u, *sampling)
            assert_samples_agree(cpu, dev, x, u, sampling)
    seed, offset = torch.tensor([123]), torch.tensor([4])
    for sampling in [(1.0, 0, 1.0, 0.0), (0.7, 20, 0.9, 0.0)]:
        cpu = OPS.sample_logits_philox(logits, seed, offset, *sampling)
        dev = emu.sample_logits_philox(logits, seed, offset, *sampling)
        from philox_ref import philox_uniforms

        assert_samples_agree(cpu, dev, logits, philox_uniforms(123, 4, 3, 0)[:, 0], sampling)


def test_emulated_philox_and_capture_mode(emu):
    """The Philox ops draw the CPU's coins; in capture mode a bad row comes back as -1 instead
    of raising, and the good rows are unchanged."""
    from philox_ref import philox_uniforms

    target, draft, drafts, num, _ = logit_inputs(6, 3, 300, torch.float32, seed=12)
    seed, offset = torch.tensor([-5]), torch.tensor([2**33 + 1])
    coins = philox_uniforms(-5, 2**33 + 1, 6, 3)
    for rule, params in RULES[:2]:
        cpu = OPS.verify_logits(target, draft, drafts, num, coins, 0.9, 0, 1.0, 0.0, rule, params)
        dev = emu.verify_logits_philox(target, draft, drafts, num, seed, offset, 0.9, 0, 1.0, 0.0, rule, params)
        assert_agree("logits", rule, params, cpu, dev, target, draft, drafts, num, coins, (0.9, 0, 1.0, 0.0))
        probs, dprobs = torch.softmax(target, -1), torch.softmax(draft, -1)
        cpu = OPS.verify_probs(probs, dprobs, drafts, num, coins, rule, params)
        dev = emu.verify_probs_philox(probs, dprobs, drafts, num, seed, offset, rule, params)
        assert_agree("probs", rule, params, cpu, dev, probs, dprobs, drafts, num, coins)
    bad = target.clone()
    bad[2, 0, 5] = math.nan
    with pytest.raises(ValueError, match="row 2"):
        emu.verify_logits_philox(bad, draft, drafts, num, seed, offset, 1.0, 0, 1.0, 0.0, "token", [])
    emu.capturing = True
    try:
        tokens, accepted = emu.verify_logits_philox(bad, draft, drafts, num, seed, offset, 1.0, 0, 1.0, 0.0, "token", [])
        sampled = emu.sample_logits_philox(bad[:, 0], seed, offset, 1.0, 0, 1.0, 0.0)
    finally:
        emu.capturing = False
    assert int(accepted[2]) == -1 and bool((tokens[2] == -1).all()) and int(sampled[2]) == -1
    good = emu.verify_logits_philox(target, draft, drafts, num, seed, offset, 1.0, 0, 1.0, 0.0, "token", [])
    keep = torch.arange(6) != 2
    assert torch.equal(tokens[keep], good[0][keep]) and torch.equal(accepted[keep], good[1][keep])


# ------------------------------------------------------------------------------ token trees


def _agree_tree(emu, rule, params, sampling, target, draft, tokens, parents, num_nodes, u):
    d = draft if tree_needs_draft(rule) else None
    cpu = OPS.verify_tree(target, d, tokens, parents, num_nodes, u, *sampling, rule, params)
    dev = emu.verify_tree(target, d, tokens, parents, num_nodes, u, *sampling, rule, params)
    assert_tree_agree(rule, params, cpu, dev, target, draft, tokens, parents, num_nodes, u, sampling)
    return dev


TREE_SAMPLINGS = [
    (1.0, 0, 1.0, 0.0),     # plain
    (0.7, 10, 0.9, 0.05),   # every filter
    (1.3, 0, 0.95, 0.0),    # top-p alone
    (0.0, 0, 1.0, 0.0),     # greedy walk
]


@pytest.mark.parametrize("B,N,V", [(1, 9, 7), (3, 13, 111), (17, 11, 111), (3, 7, 32000)], ids=lambda v: str(v))
@pytest.mark.parametrize("sampling", TREE_SAMPLINGS, ids=lambda s: "T{}-k{}-p{}-m{}".format(*s))
def test_emulated_tree_agrees(emu, sampling, B, N, V):
    """verify_tree: every rule on random ragged trees, the device result equals the CPU's."""
    inputs = tree_logit_inputs(B, N, V, torch.float32, seed=B * 100 + N + V, sampling=sampling)
    for rule, params in TREE_RULES:
        _agree_tree(emu, rule, params, sampling, *inputs)


@pytest.mark.parametrize("B,V,dtype", [(1, 7, torch.float32), (17, 111, torch.float32), (3, 32000, torch.bfloat16),
                                       (40, 5, torch.float64)], ids=str)
@pytest.mark.parametrize("sampling", TREE_SAMPLINGS, ids=lambda s: "T{}-k{}-p{}-m{}".format(*s))
def test_emulated_gbv_agrees(emu, sampling, B, V, dtype):
    """verify_tree with gbv on rows of K paths (ragged K and L), the device result equals the CPU's."""
    inputs = paths_logit_inputs(B, V, dtype, seed=B + V, max_paths=5 if V < 10 else 4, sampling=sampling)
    for rule, params in PATH_RULES:
        _agree_tree(emu, rule, params, sampling, *inputs)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64], ids=str)
def test_emulated_tree_agrees_dtypes(emu, dtype):
    inputs = tree_logit_inputs(5, 10, 111, dtype, seed=21, sampling=(0.8, 0, 1.0, 0.1))
    for rule, params in TREE_RULES:
        _agree_tree(emu, rule, params, (0.8, 0, 1.0, 0.1), *inputs)


def test_emulated_tree_many_rejections(emu):
    """Wide nodes (up to 6 children) drafted from an unrelated draft: children are often
    rejected, so the residual updates (R, and D for rrs) run several times per node. Sharp
    enough to tell rrs from specinfer (they differ from a node's second rejected child on): an
    rrs kernel that skipped its D update would disagree with the CPU here."""
    target, draft, tokens, parents, num_nodes, u = tree_logit_inputs(40, 16, 9, torch.float32, seed=5, max_children=6,
                                                                     related=False)
    plain = (1.0, 0, 1.0, 0.0)
    for rule in ("specinfer", "rrs", "deterministic"):
        _agree_tree(emu, rule, [], plain, target, draft, tokens, parents, num_nodes, u)
    rrs = emu.verify_tree(target, draft, tokens, parents, num_nodes, u, *plain, "rrs", [])
    specinfer = emu.verify_tree(target, draft, tokens, parents, num_nodes, u, *plain, "specinfer", [])
    assert int((rrs[0] != specinfer[0]).any(1).sum()) >= 3
    # multi-chunk rows (V = 20001, bfloat16, filters through the merge and fallback kernels)
    inputs = tree_logit_inputs(2, 6, 20001, torch.bfloat16, seed=6, max_children=4, related=False,
                               sampling=(0.9, 1000, 0.9, 0.0))
    for rule, params in TREE_RULES:
        _agree_tree(emu, rule, params, (0.9, 1000, 0.9, 0.0), *inputs)


def test_emulated_tree_reads_only_the_walked_nodes(emu):
    """NaN logits at nodes the walk never reaches (a rejected subtree, padding slots) raise on
    neither side and the results agree; a NaN at a node it reaches raises the CPU's error."""
    target, draft, tokens, parents, num_nodes, u = tree_logit_inputs(6, 8, 50, torch.float32, seed=9,
                                                                     max_children=2)
    num_nodes[:] = 7
    parents[:, :7] = torch.tensor([-1, 0, 0, 1, 2, 3, 4])
    tokens[:, :7] = torch.tensor([0, 11, 12, 13, 14, 15, 16])
    u[:, 1] = 0.9999999  # node 1 (the first child) rejected unless p(x) / q(x) is ~1 or more
    draft[torch.arange(6), 0, tokens[:, 1]] += 40.0  # q(x_1) ~ 1, p(x_1) small: rejected
    u[:, 2] = 0.0  # node 2 accepted (p > 0)
    target[:, 7] = math.nan  # padding
    draft[:, 7] = math.nan
    target[:, 3] = math.nan  # node 3: child of the rejected node 1
    draft[:, 5] = math.nan
    for rule, params in TREE_RULES:
        if rule in ("greedy", "typical"):
            continue  # their walks follow the target's argmax / threshold, not the coins
        if rule.startswith("traversal"):  # decided from the leaves up: the walk enters node 1's subtree
            errors = []
            for ops in (OPS, emu):
                with pytest.raises(ValueError) as info:
                    ops.verify_tree(target, draft, tokens, parents, num_nodes, u, 1.0, 0, 1.0, 0.0, rule, [])
                errors.append(str(info.value))
            assert errors[0] == errors[1] and "target_logits" in errors[0], errors
            continue
        dev = _agree_tree(emu, rule, params, (1.0, 0, 1.0, 0.0), target, draft, tokens, parents, num_nodes, u)
        if rule != "spechub":  # spechub: q(x_1) rounds to 1 on some rows, and then reads only child 1
            assert bool((dev[2][:, 1] == 2).all()), (rule, dev[2])
    bad = target.clone()
    bad[2, 2, 3] = math.nan  # node 2: accepted, so the walk reads its distribution
    cpu_error = dev_error = None
    try:
        OPS.verify_tree(bad, draft, tokens, parents, num_nodes, u, 1.0, 0, 1.0, 0.0, "specinfer", [])
    except ValueError as exc:
        cpu_error = str(exc)
    try:
        emu.verify_tree(bad, draft, tokens, parents, num_nodes, u, 1.0, 0, 1.0, 0.0, "specinfer", [])
    except ValueError as exc:
        dev_error = str(exc)
    assert cpu_error is not None and cpu_error == dev_error and "row 2" in dev_error


def test_emulated_tree_philox_and_capture_mode(emu):
    """verify_tree_philox draws the CPU's coins; in capture mode a bad row comes back as -1
    instead of raising, the good rows unchanged."""
    target, draft, tokens, parents, num_nodes, _ = tree_logit_inputs(5, 9, 111, torch.float32, seed=12)
    seed, offset = torch.tensor([-5]), torch.tensor([2**33 + 1])
    for rule, params in TREE_RULES:
        d = draft if tree_needs_draft(rule) else None
        cpu = OPS.verify_tree_philox(target, d, tokens, parents, num_nodes, seed, offset, 0.9, 0, 1.0, 0.0, rule,
                                     params)
        dev = emu.verify_tree_philox(target, d, tokens, parents, num_nodes, seed, offset, 0.9, 0, 1.0, 0.0, rule,
                                     params)
        from philox_ref import philox_uniforms

        coins = philox_uniforms(-5, 2**33 + 1, 5, 8)  # [B, N]: columns 0..N-1
        assert_tree_agree(rule, params, cpu, dev, target, draft, tokens, parents, num_nodes, coins,
                          (0.9, 0, 1.0, 0.0))
    bad = target.clone()
    bad[2, 0, 5] = math.nan
    with pytest.raises(ValueError, match="row 2"):
        emu.verify_tree_philox(bad, draft, tokens, parents, num_nodes, seed, offset, 1.0, 0, 1.0, 0.0, "rrs", [])
    emu.capturing = True
    try:
        out = emu.verify_tree_philox(bad, draft, tokens, parents, num_nodes, seed, offset, 1.0, 0, 1.0, 0.0, "rrs", [])
    finally:
        emu.capturing = False
    assert int(out[1][2]) == -1 and bool((out[0][2] == -1).all()) and bool((out[2][2] == -1).all())
    good = emu.verify_tree_philox(target, draft, tokens, parents, num_nodes, seed, offset, 1.0, 0, 1.0, 0.0, "rrs", [])
    keep = torch.arange(5) != 2
    for o, g in zip(out, good):
        assert torch.equal(o[keep], g[keep])


def test_emulated_tree_root_only_and_coins_at_the_edges(emu):
    """Root-only trees (y ~ p at once), chains of one child, and coins exactly 0 and just
    below 1 (u * mass at the very top of the inverse CDF: the last positive token)."""
    target, draft, tokens, parents, num_nodes, _ = tree_logit_inputs(4, 5, 60, torch.float64, seed=13)
    target[1, :, 30:] = -math.inf
    num_nodes[0] = 1
    for coin in (0.0, 1.0 - 2.0**-53):
        u = torch.full((4, 5), coin, dtype=torch.float64)
        for rule, params in TREE_RULES:
            _agree_tree(emu, rule, params, (0.9, 0, 0.9, 0.0), target, draft, tokens, parents, num_nodes, u)


@pytest.mark.parametrize("B,N,V,max_children", [(4, 1, 50, 3), (3, 5, 1, 1), (5, 2, 2, 2), (20, 4, 3, 3),
                                                (2, 300, 40, 20)],
                         ids=["root-only-slots", "V1", "V2", "V3-every-token-a-child", "300-nodes"])
def test_emulated_tree_edge_sizes(emu, B, N, V, max_children):
    """One node slot (N = 1: every row a root), V = 1, 2 and 3 (with three children per node,
    rejecting them all empties R and D: the fallback to p), one-hot p (top-k 1), and 300-node
    trees with up to 20 children per node."""
    inputs = tree_logit_inputs(B, N, V, torch.float32, seed=B + N + V, max_children=max_children, related=V > 3)
    samplings = [(0.7, 3, 0.9, 0.05), (1.0, 0, 1.0, 0.0), (1.0, 1, 1.0, 0.0), (0.0, 0, 1.0, 0.0)]
    for sampling in samplings[:1] if N > 100 else samplings:  # the large trees: one (filtered) setting
        for rule, params in TREE_RULES:
            _agree_tree(emu, rule, params, sampling, *inputs)


# ------------------------------------------------------------------------------ processed_probs


@pytest.mark.parametrize("V", [7, 111, 32000])
def test_emulated_processed_probs(emu, V):
    """processed_probs: the CPU's distribution for every sampling setting and dtype."""
    g = torch.Generator().manual_seed(V + 1)
    logits = torch.randn(3, V, generator=g) * 3
    logits[1, : V // 2] = -math.inf
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        x = logits.to(dtype)
        for sampling in SAMPLINGS:
            cpu = OPS.processed_probs(x, *sampling)
            dev = emu.processed_probs(x, *sampling)
            assert_processed_probs_agree(cpu, dev, greedy=sampling[0] == 0.0)
