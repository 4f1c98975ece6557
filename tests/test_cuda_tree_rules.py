"""verify_tree / verify_tree_philox on the GPU (beside tests/test_cuda.py, which holds the ``cuda``
fixture): CPU vs CUDA agreement (tests/cuda_agreement.py) for every tree rule on random ragged
trees, V in {111, 32000, 128256}, B in {1, 17, 64}, the three dtypes, every filter and
temperature 0; many rejections and wide trees; determinism; the exact tree test of the lossless
tree rules (tests/test_tree_lossless.py) on the GPU and the drafting mistakes it must reject; a
captured verify_tree_philox replayed with advancing offsets; opcheck with CUDA inputs. The rules
whose reference is a Python row function (traversal, gbv, spectr, spechub): gbv's agreement on
rows of K paths, and the chi-square law tests of tests/test_tree_python_rules.py through the
CUDA op. Skipped without a CUDA device.
"""

from __future__ import annotations

import math

import pytest
import torch
from cuda_agreement import (PATH_RULES, TREE_RULES, assert_tree_agree, paths_logit_inputs, to_device,
                            tree_logit_inputs, tree_needs_draft)
from philox_ref import philox_uniforms
from test_cuda import BATCHES, DTYPES, OPS, VOCABS, cuda  # noqa: F401 (the fixture)

from specdecode.bench.harness import capture_with_offset

pytestmark = pytest.mark.cuda


TREE_SAMPLINGS = [(1.0, 0, 1.0, 0.0), (0.8, 50, 0.9, 0.05), (0.0, 0, 1.0, 0.0)]


def _run_both_tree(rule, params, sampling, target, draft, tokens, parents, num_nodes, u, device):
    d = draft if tree_needs_draft(rule) else None
    cpu = OPS.verify_tree(target, d, tokens, parents, num_nodes, u, *sampling, rule, params)
    gpu = OPS.verify_tree(*to_device(device, target, d, tokens, parents, num_nodes, u), *sampling, rule, params)
    assert all(t.is_cuda for t in gpu)
    return cpu, gpu


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("B", BATCHES)
@pytest.mark.parametrize("V", VOCABS[:3])
def test_cpu_cuda_agree_tree(cuda, V, B, dtype):
    """verify_tree: every tree rule on random ragged trees gives the CPU's tokens, accepted
    lengths and accepted nodes with the same uniforms (plain, every filter, temperature 0)."""
    inputs = tree_logit_inputs(B, 9, V, dtype, seed=3 * V + B)
    for sampling in TREE_SAMPLINGS:
        for rule, params in TREE_RULES:
            cpu, gpu = _run_both_tree(rule, params, sampling, *inputs, cuda)
            assert_tree_agree(rule, params, cpu, gpu, *inputs, sampling)


def test_cpu_cuda_agree_tree_many_rejections_and_wide_trees(cuda):
    """Wide nodes drafted from an unrelated draft (several rejections per node: the R and D
    updates run repeatedly), and one tree of 200 nodes per row (long children lists)."""
    inputs = tree_logit_inputs(64, 16, 9, torch.float32, seed=5, max_children=6, related=False)
    for rule in ("specinfer", "rrs", "deterministic", "spectr", "spechub", "traversal", "traversal_iid"):
        cpu, gpu = _run_both_tree(rule, [], (1.0, 0, 1.0, 0.0), *inputs, cuda)
        assert_tree_agree(rule, [], cpu, gpu, *inputs, (1.0, 0, 1.0, 0.0))
    inputs = tree_logit_inputs(3, 200, 1000, torch.bfloat16, seed=6, max_children=12)
    for rule, params in TREE_RULES:
        cpu, gpu = _run_both_tree(rule, params, (0.9, 0, 0.95, 0.0), *inputs, cuda)
        assert_tree_agree(rule, params, cpu, gpu, *inputs, (0.9, 0, 0.95, 0.0))


def test_tree_results_are_deterministic(cuda):
    inputs = to_device(cuda, *tree_logit_inputs(17, 9, 32000, torch.bfloat16, seed=7))
    first = OPS.verify_tree(*inputs, 0.8, 50, 0.9, 0.0, "rrs", [])
    second = OPS.verify_tree(*inputs, 0.8, 50, 0.9, 0.0, "rrs", [])
    assert all(torch.equal(a, b) for a, b in zip(first, second))


@pytest.mark.parametrize("rule,families", [("specinfer", None), ("deterministic", None), ("rrs", "peaked"),
                                           ("specinfer", "peaked")], ids=["specinfer", "deterministic", "rrs",
                                                                          "specinfer-peaked"])
def test_tree_lossless_chi_square_on_gpu(cuda, rule, families):
    """The exact tree test of tests/test_tree_lossless.py (the completed tokens follow the
    target's exact joint; chi-square over 10^5 trees drafted by the rule's scheme) with the
    CUDA op."""
    import test_tree_lossless as tl

    tables, shape = tl._tables(tl.MIXED, tl.PEAKED if families else None)
    fit = tl._op_fit(tables, shape, rule, tl.LOSSLESS[rule], seed=3, device=cuda)
    assert fit.impossible == 0 and fit.pvalue > tl.PASS, f"{rule}: {fit}"


@pytest.mark.parametrize("scheme,families", [("without_replacement", "peaked"), ("pruned_iid", None)],
                         ids=["without_replacement", "pruned_by_own_probability"])
def test_tree_lossless_test_rejects_broken_drafting_on_gpu(cuda, scheme, families):
    """The same test rejects specinfer fed children drawn without replacement, or i.i.d.
    children pruned by their own probability: it can fail on the GPU too."""
    import test_tree_lossless as tl

    tables, shape = tl._tables(tl.MIXED, tl.PEAKED if families else None)
    fit = tl._op_fit(tables, shape, "specinfer", scheme, seed=3, device=cuda)
    assert fit.pvalue < tl.FAIL, f"specinfer with {scheme} children passed on the GPU: {fit}"


def test_tree_philox_and_graph(cuda):
    """verify_tree_philox draws the Python Philox coins (b, c); captured in a CUDA graph with
    offset.add_(1), every replay equals the CPU op at the next offset; a NaN row in the
    captured inputs comes back as -1 (no status copy during capture)."""
    B, N, V = 8, 9, 32000
    target, draft, tokens, parents, num_nodes, _ = tree_logit_inputs(B, N, V, torch.bfloat16, seed=8)
    t, d, x, par, n = to_device(cuda, target, draft, tokens, parents, num_nodes)
    seed = torch.tensor([5], dtype=torch.int64, device=cuda)
    offset = torch.tensor([0], dtype=torch.int64, device=cuda)
    sampling = (0.8, 50, 0.9, 0.05)
    graph, out = capture_with_offset(
        lambda: OPS.verify_tree_philox(t, d, x, par, n, seed, offset, *sampling, "rrs", []), offset)
    offset.fill_(10)
    for k in range(3):
        graph.replay()
        torch.cuda.synchronize()
        coins = philox_uniforms(5, 10 + k, B, N - 1)
        cpu = OPS.verify_tree(target, draft, tokens, parents, num_nodes, coins, *sampling, "rrs", [])
        assert_tree_agree("rrs", [], cpu, [o.clone() for o in out], target, draft, tokens, parents, num_nodes,
                          coins, sampling)
    t[3, 0, 7] = math.nan  # the root of row 3: every walk reads it
    graph.replay()
    torch.cuda.synchronize()
    assert int(out[1][3]) == -1 and bool((out[0][3] == -1).all()) and bool((out[2][3] == -1).all())
    assert bool((out[1][torch.arange(B, device=cuda) != 3] >= 0).all())


@pytest.mark.parametrize("config", [("rrs", torch.float32, (0.7, 10, 0.9, 0.05)), ("greedy", torch.bfloat16,
                                                                                    (0.0, 0, 1.0, 0.0)),
                                    ("typical", torch.float16, (1.0, 0, 1.0, 0.0))], ids=lambda c: c[0])
def test_opcheck_cuda_tree(cuda, config):
    rule, dtype, sampling = config
    target, draft, tokens, parents, num_nodes, u = to_device(cuda, *tree_logit_inputs(3, 6, 40, dtype, seed=1))
    params = [0.09, 0.3, 0.0] if rule == "typical" else []
    d = draft if tree_needs_draft(rule) else None
    torch.library.opcheck(OPS.verify_tree.default, (target, d, tokens, parents, num_nodes, u, *sampling, rule, params))
    seed, offset = torch.tensor([1], device=cuda), torch.tensor([2], device=cuda)
    torch.library.opcheck(OPS.verify_tree_philox.default,
                          (target, d, tokens, parents, num_nodes, seed, offset, *sampling, rule, params))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("V", VOCABS[:3])
def test_cpu_cuda_agree_gbv(cuda, V, dtype):  # noqa: F811
    """verify_tree with gbv on rows of K paths of one length (ragged K and L)."""
    inputs = paths_logit_inputs(17, V, dtype, seed=V)
    for sampling in TREE_SAMPLINGS:
        for rule, params in PATH_RULES:
            cpu, gpu = _run_both_tree(rule, params, sampling, *inputs, cuda)
            assert_tree_agree(rule, params, cpu, gpu, *inputs, sampling)


def test_row_function_rules_keep_the_target_law_on_gpu(cuda):  # noqa: F811
    """The chi-square tests of tests/test_tree_python_rules.py (traversal, gbv, spechub, spectr
    on trees drafted by their schemes) through the CUDA op."""
    import test_tree_python_rules as tpr

    for rule, scheme, shape in tpr.LAW_CASES:
        fit = tpr.law_fit(rule, scheme, shape, device=cuda)
        assert fit.pvalue > 1e-4, f"{rule}: {fit}"
