"""The tree rules moved from Python to the compiled op (``spectr``, ``spechub``, ``traversal``,
``traversal_iid``, ``gbv``) give exactly
the outputs of their Python row functions (``specdecode.trees.python_rules``: ``ROW_RULES`` run
by ``verify_tree_python``, the reference) on the compiled ops' processed distributions with the same coins: every row equal,
no tolerance, on random ragged trees (K paths of one length for ``gbv``; V = 7 / 111 / 32000, B = 1 / 3 / 17,
temperature / top-k / top-p / min-p, float32 / float64 / bfloat16 logits, nodes with many
rejected children, hub pairs drawn as the builders draw them). Also: temperature 0 is the
greedy walk, and the Philox variant equals explicit coins.

The kernels repeat the reference's float64 arithmetic step for step; Python's ``sum`` over
floats is sequential up to Python 3.11 (3.12 compensates its rounding), so on 3.12 a row may
differ where a decision sits at its boundary to the last bit.
"""

from __future__ import annotations

import sys

import pytest
import torch
from cuda_agreement import paths_logit_inputs
from test_tree_verify import SAMPLING, _tree_case

from specdecode.sampling import SamplingParams, processed_probs
from specdecode.trees import TokenTree, draw_hub_children, verify_tree
from specdecode.trees.python_rules import verify_tree_python

COMPILED = ["spectr", "spechub", "traversal", "traversal_iid"]
EXACT_SUMS = sys.version_info < (3, 12)


def _assert_equal_to_reference(target, draft, tree, u, rule, sampling: SamplingParams):
    """The op's result against verify_tree_python (the row function on every row, on the
    processed distributions of specdecode.sampling.processed_probs)."""
    out = verify_tree(target, draft, tree, rule=rule, sampling=sampling, uniforms=u)
    ref = verify_tree_python(target, draft, tree, rule=rule, sampling=sampling, uniforms=u)
    same = (out.tokens == ref.tokens).all(1) & (out.accepted_nodes == ref.accepted_nodes).all(1) & (
        out.accepted_len == ref.accepted_len)
    differ = [(b, out.accepted_nodes[b].tolist(), out.tokens[b].tolist(), ref.accepted_nodes[b].tolist(),
               ref.tokens[b].tolist()) for b in torch.nonzero(~same).flatten().tolist()]
    if EXACT_SUMS:
        assert not differ, f"{rule}: rows differ (row, op nodes, op tokens, reference nodes, reference tokens): {differ[:3]}"
    else:
        assert len(differ) <= 1, differ
    return out


@pytest.mark.parametrize("B,N,V", [(1, 9, 7), (3, 13, 111), (17, 11, 111), (3, 7, 32000), (17, 6, 7)],
                         ids=lambda v: str(v))
@pytest.mark.parametrize("sampling", [s for s in SAMPLING if s[0] > 0], ids=lambda s: "T{}-k{}-p{}-m{}".format(*s))
@pytest.mark.parametrize("rule", COMPILED)
def test_op_equals_row_function(rule, sampling, B, N, V):
    target, draft, tree, u = _tree_case(B, N, V, sampling, seed=B * 3 + N + V)
    _assert_equal_to_reference(target, draft, tree, u, rule, SamplingParams(*sampling))


@pytest.mark.parametrize("rule", COMPILED)
def test_op_equals_row_function_many_rejections_and_dtypes(rule):
    """Up to 6 children per node from an unrelated draft: most children are rejected, SpecHub's
    later children run recursive rejection sampling, traversal returns to nodes after rejected
    subtrees; float32, float64 and bfloat16 logits."""
    target, draft, tree, u = _tree_case(60, 16, 9, (1.0, 0, 1.0, 0.0), seed=7, max_children=6, related=False)
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        out = _assert_equal_to_reference(target.to(dtype), draft.to(dtype), tree, u, rule, SamplingParams())
        assert int((out.accepted_len == 0).sum()) >= 5  # rejections do happen


def test_spechub_on_hub_pairs_equals_row_function():
    """Hub pairs (and later children) drawn by draw_hub_children at every node."""
    gen = torch.Generator().manual_seed(11)
    B, V = 40, 13
    parents = torch.tensor([[-1, 0, 0, 0, 1, 1, 2, 4]]).expand(B, -1).contiguous()
    N = parents.shape[1]
    target = 2.0 * torch.randn(B, N, V, generator=gen)
    draft = target + torch.randn(B, N, V, generator=gen)
    sampling = SamplingParams(temperature=0.9)
    q = processed_probs(draft.reshape(B * N, V), sampling).view(B, N, V)
    tokens = torch.zeros(B, N, dtype=torch.int64)
    for v, kids in ((0, [1, 2, 3]), (1, [4, 5]), (2, [6]), (4, [7])):
        drawn = draw_hub_children(q[:, v], len(kids), torch.rand(B, len(kids), generator=gen, dtype=torch.float64))
        tokens[:, kids] = drawn
    tree = TokenTree(tokens, parents, torch.full((B,), N, dtype=torch.int64))
    u = torch.rand(B, N, generator=gen, dtype=torch.float64)
    out = _assert_equal_to_reference(target, draft, tree, u, "spechub", sampling)
    assert int((out.accepted_len >= 2).sum()) >= 3


def _paths_case(B: int, V: int, sampling: tuple, seed: int, max_paths: int = 4, max_length: int = 3):
    """cuda_agreement.paths_logit_inputs as (target, draft, tree, uniforms)."""
    target, draft, tokens, parents, num_nodes, u = paths_logit_inputs(B, V, torch.float32, seed, max_paths=max_paths,
                                                                      max_length=max_length, sampling=sampling)
    return target, draft, TokenTree(tokens, parents, num_nodes), u


@pytest.mark.parametrize("B,V", [(1, 7), (3, 111), (17, 111), (3, 32000), (17, 7)], ids=lambda v: str(v))
@pytest.mark.parametrize("sampling", [s for s in SAMPLING if s[0] > 0], ids=lambda s: "T{}-k{}-p{}-m{}".format(*s))
def test_gbv_equals_row_function(sampling, B, V):
    target, draft, tree, u = _paths_case(B, V, sampling, seed=B * 5 + V)
    _assert_equal_to_reference(target, draft, tree, u, "gbv", SamplingParams(*sampling))


def test_gbv_equals_row_function_many_paths_and_dtypes():
    """Up to 6 paths of up to 4 tokens from a small vocabulary (paths share prefixes often, the
    picked path's law is skewed), float32, float64 and bfloat16 logits."""
    target, draft, tree, u = _paths_case(60, 5, (1.0, 0, 1.0, 0.0), seed=9, max_paths=6, max_length=4)
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        out = _assert_equal_to_reference(target.to(dtype), draft.to(dtype), tree, u, "gbv", SamplingParams())
        assert int((out.accepted_len >= 2).sum()) >= 5


@pytest.mark.parametrize("rule", COMPILED + ["gbv"])
def test_temperature_zero_is_the_greedy_walk(rule):
    target, draft, tree, _ = _tree_case(5, 9, 50, (0.8, 0, 1.0, 0.0), seed=3)
    greedy = verify_tree(target, None, tree, rule="greedy")
    cold = verify_tree(target, draft, tree, rule=rule, temperature=0.0)
    assert torch.equal(cold.tokens, greedy.tokens) and torch.equal(cold.accepted_nodes, greedy.accepted_nodes)
