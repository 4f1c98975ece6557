"""The graph-safe Philox ops on the GPU (beside tests/test_cuda.py, which holds the ``cuda``
fixture): the Python Philox reproduces the Random123 known answers (no GPU needed); the coins of
verify_*_philox and sample_logits_philox equal the CPU ops' with the Python Philox's uniforms;
CUDA-graph captures (verify and sample, with filters and a bad row) replayed with advancing
offsets.
"""

from __future__ import annotations

import math

import pytest
import torch
from cuda_agreement import RULES, assert_agree, logit_inputs, prob_inputs, to_device
from philox_ref import _MASK32, philox4x32_10, philox_uniforms  # Python reference of kernels/philox.h
from test_cuda import OPS, cuda  # noqa: F401 (the fixture)

from specdecode.bench.harness import capture_with_offset

pytestmark = pytest.mark.cuda


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


@pytest.mark.parametrize("rule", ["token", "block"])
def test_philox_logits_graph_with_filters_and_bad_row(cuda, rule):
    """verify_logits_philox with top-k / top-p / min-p captured in a CUDA graph (every filter
    kernel runs under capture) replays equal to the CPU op; a NaN row in the captured inputs
    comes back as accepted_len = -1 and tokens -1 (no status copy during capture), the other
    rows are unaffected."""
    B, gamma, V = 8, 4, 32000
    target, draft, drafts, num, _ = logit_inputs(B, gamma, V, torch.bfloat16, seed=21)
    t, d, x, n = to_device(cuda, target, draft, drafts, num)
    seed = torch.tensor([9], dtype=torch.int64, device=cuda)
    offset = torch.tensor([0], dtype=torch.int64, device=cuda)
    sampling = (0.8, 50, 0.9, 0.05)
    graph, (tokens, accepted) = capture_with_offset(
        lambda: OPS.verify_logits_philox(t, d, x, n, seed, offset, *sampling, rule, []), offset)
    for k in range(2):
        graph.replay()
        torch.cuda.synchronize()
        coins = philox_uniforms(9, k, B, gamma)
        cpu = OPS.verify_logits(target, draft, drafts, num, coins, *sampling, rule, [])
        assert_agree("logits", rule, [], cpu, (tokens.clone(), accepted.clone()), target, draft, drafts, num, coins,
                     sampling)
    t[3, 0, 7] = math.nan  # the graph reads the same memory
    graph.replay()
    torch.cuda.synchronize()
    assert int(accepted[3]) == -1 and bool((tokens[3] == -1).all())
    assert bool((accepted[torch.arange(B, device=cuda) != 3] >= 0).all())
