"""``torch.library.opcheck`` on the token-tree ops (schemas, fake kernels, dynamic shapes),
FakeTensor shapes, and ``verify_tree`` / ``tree_attention_mask`` inside ``torch.compile``."""

from __future__ import annotations

import pytest
import torch

import specdecode  # noqa: F401  (registers the ops and their fake kernels)
import tree_stat_utils as tu

OPS = torch.ops.specdecode


def _mask_args(B, N, W, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    tree = tu.random_trees(B, N, gen, ragged=True)
    prefix = (torch.rand(B, W, generator=gen) < 0.7).to(dtype)
    return (tree.parents, tree.num_nodes, prefix, torch.randint(0, 9, (B,), generator=gen))


@pytest.mark.parametrize("B,N,W,dtype", [(3, 7, 5, torch.bool), (1, 40, 0, torch.int64), (5, 33, 3, torch.uint8),
                                         (2, 1, 2, torch.int32)], ids=str)
def test_opcheck_tree_attention_mask(B, N, W, dtype):
    torch.library.opcheck(OPS.tree_attention_mask.default, _mask_args(B, N, W, dtype, seed=B + N + W))


def _verify_args(rule, B, N, V, dtype, with_draft, sampling, params, seed=0):
    gen = torch.Generator().manual_seed(seed)
    tree = tu.random_trees(B, N, gen, ragged=True, vocab=V)
    # distinct siblings: token = node index modulo V (V > N here)
    tokens = torch.where(torch.arange(N)[None, :] < tree.num_nodes[:, None], torch.arange(N)[None, :] % V, tree.tokens)
    t = torch.randn(B, N, V, generator=gen).to(dtype)
    d = torch.randn(B, N, V, generator=gen).to(dtype)
    u = torch.rand(B, N, dtype=torch.float64, generator=gen)
    return (t, d if with_draft else None, tokens, tree.parents, tree.num_nodes, u, *sampling, rule, params)


VERIFY_CONFIGS = [
    ("specinfer", 3, 7, 11, torch.float32, True, (1.0, 0, 1.0, 0.0), []),
    ("rrs", 4, 9, 20, torch.bfloat16, True, (0.8, 5, 0.9, 0.0), []),
    ("deterministic", 2, 5, 13, torch.float16, False, (1.0, 0, 1.0, 0.05), []),
    ("greedy", 3, 6, 10, torch.float32, False, (1.0, 0, 1.0, 0.0), []),
    ("typical", 2, 8, 17, torch.float64, True, (0.9, 0, 1.0, 0.0), [0.09, 0.3, 1.0]),
    ("rrs", 2, 4, 9, torch.float32, False, (0.0, 0, 1.0, 0.0), []),  # temperature 0: greedy, no draft needed
    ("spectr", 3, 7, 11, torch.float32, True, (1.0, 0, 1.0, 0.0), []),
    ("spechub", 4, 9, 20, torch.bfloat16, True, (0.8, 5, 0.9, 0.0), []),
    ("traversal", 2, 8, 13, torch.float16, True, (1.0, 0, 1.0, 0.05), []),
    ("traversal_iid", 3, 6, 11, torch.float32, True, (0.9, 0, 1.0, 0.0), []),
]


@pytest.mark.parametrize("config", VERIFY_CONFIGS, ids=lambda c: f"{c[0]}-B{c[1]}-N{c[2]}-V{c[3]}-{c[4]}-T{c[6][0]}")
def test_opcheck_verify_tree(config):
    torch.library.opcheck(OPS.verify_tree.default, _verify_args(*config))


def test_opcheck_verify_tree_philox():
    args = list(_verify_args("rrs", 3, 6, 12, torch.float32, True, (1.0, 0, 1.0, 0.0), []))
    philox_args = args[:5] + [torch.tensor([7]), torch.tensor([3])] + args[6:]
    torch.library.opcheck(OPS.verify_tree_philox.default, tuple(philox_args))


def test_fake_kernel_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        parents, n = torch.empty(4, 37, dtype=torch.int64), torch.empty(4, dtype=torch.int64)
        out = OPS.tree_attention_mask(parents, n, torch.empty(4, 10, dtype=torch.bool), torch.empty(4, dtype=torch.int64))
        assert [tuple(o.shape) for o in out] == [(4, 37), (4, 1, 37, 47), (4, 37, 37), (4, 37, 2), (4, 37), (4, 37), (4, 37)]
        assert [o.dtype for o in out] == [torch.int64, torch.bool, torch.bool, torch.int32] + [torch.int64] * 3
        logits = torch.empty(4, 37, 50)
        tokens, accepted, nodes = OPS.verify_tree(logits, None, parents, parents, n, torch.empty(4, 37, dtype=torch.float64),
                                                  1.0, 0, 1.0, 0.0, "greedy", [])
        assert tokens.shape == (4, 37) and accepted.shape == (4,) and nodes.shape == (4, 37)


def test_torch_compile_fullgraph():
    args = _verify_args("specinfer", 5, 7, 11, torch.float32, True, (1.0, 0, 1.0, 0.0), [])
    mask_args = _mask_args(5, 7, 4, torch.bool, seed=1)

    def f(*a):
        return OPS.verify_tree(*a), OPS.tree_attention_mask(*mask_args)

    eager = f(*args)
    compiled = torch.compile(f, fullgraph=True, backend="eager")(*args)
    for e, c in zip(list(eager[0]) + list(eager[1]), list(compiled[0]) + list(compiled[1])):
        assert torch.equal(e, c)
