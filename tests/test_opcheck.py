"""``torch.library.opcheck`` on both ops: the schemas are right (no hidden mutation or
aliasing), the fake (meta) kernels agree with the real ones on shapes and dtypes, and the ops
survive AOT dispatch with dynamic shapes — so they work under torch.compile.
"""

from __future__ import annotations

import pytest
import torch

import specdecode  # noqa: F401  (registers the ops and their fake kernels)

OPS = torch.ops.specdecode
RULE_PARAMS = {"token": [], "block": [], "greedy": [], "typical": [0.09, 0.3, 0.0], "top_beta": [3.0, 1.0]}


def _probs_args(rule, B, gamma, V, dtype, with_draft, ragged, seed=0):
    gen = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(B, gamma + 1, V, generator=gen), -1).to(dtype)
    q = torch.softmax(torch.randn(B, gamma, V, generator=gen), -1).to(dtype)
    x = torch.multinomial(q.float().flatten(0, 1), 1, generator=gen).view(B, gamma)
    n = torch.randint(0, gamma + 1, (B,), generator=gen) if ragged else torch.full((B,), gamma)
    u = torch.rand(B, gamma + 1, dtype=torch.float64, generator=gen)
    return (p, q if with_draft else None, x, n, u, rule, RULE_PARAMS[rule])


PROBS_CONFIGS = [
    ("token", 4, 3, 11, torch.float32, True, False),
    ("block", 5, 2, 7, torch.float32, True, True),
    ("block", 3, 4, 33, torch.bfloat16, True, False),
    ("token", 2, 1, 5, torch.float16, True, True),
    ("greedy", 3, 3, 9, torch.float32, False, False),
    ("typical", 4, 2, 13, torch.float32, False, True),
    ("top_beta", 2, 3, 6, torch.float64, False, False),
    ("greedy", 1, 2, 4, torch.bfloat16, True, False),  # a draft given to a rule that ignores it
]


@pytest.mark.parametrize("config", PROBS_CONFIGS, ids=lambda c: f"{c[0]}-B{c[1]}-g{c[2]}-V{c[3]}-{c[4]}-draft{c[5]}-ragged{c[6]}")
def test_opcheck_verify_probs(config):
    """opcheck(verify_probs) for every rule, dtype, with and without draft_probs (None for
    greedy / typical / top_beta), ragged rows."""
    torch.library.opcheck(OPS.verify_probs.default, _probs_args(*config))


def _logits_args(rule, B, gamma, V, dtype, with_draft, sampling, seed=1):
    gen = torch.Generator().manual_seed(seed)
    t = torch.randn(B, gamma + 1, V, generator=gen).to(dtype)
    d = torch.randn(B, gamma, V, generator=gen).to(dtype)
    x = torch.randint(0, V, (B, gamma), generator=gen)
    n = torch.randint(0, gamma + 1, (B,), generator=gen)
    u = torch.rand(B, gamma + 1, dtype=torch.float64, generator=gen)
    temperature, top_k, top_p, min_p = sampling
    return (t, d if with_draft else None, x, n, u, temperature, top_k, top_p, min_p, rule, RULE_PARAMS[rule])


LOGITS_CONFIGS = [
    ("token", 4, 3, 50, torch.float32, True, (1.0, 0, 1.0, 0.0)),
    ("block", 3, 2, 40, torch.float32, True, (0.7, 10, 0.9, 0.05)),
    ("token", 2, 2, 30, torch.bfloat16, True, (1.2, 5, 1.0, 0.0)),
    ("greedy", 3, 3, 20, torch.float16, False, (1.0, 0, 1.0, 0.0)),
    ("typical", 2, 2, 25, torch.float32, False, (0.9, 0, 0.8, 0.0)),
    ("top_beta", 3, 2, 25, torch.float32, False, (1.0, 3, 1.0, 0.1)),
    ("block", 2, 3, 16, torch.float32, False, (0.0, 0, 1.0, 0.0)),  # temperature 0: greedy, no draft needed
]


@pytest.mark.parametrize("config", LOGITS_CONFIGS, ids=lambda c: f"{c[0]}-B{c[1]}-g{c[2]}-V{c[3]}-{c[4]}-T{c[6][0]}")
def test_opcheck_verify_logits(config):
    """opcheck(verify_logits) with temperature / top-k / top-p / min-p settings, with and
    without draft logits, including temperature 0."""
    torch.library.opcheck(OPS.verify_logits.default, _logits_args(*config))


def test_fake_kernel_shapes():
    """Under FakeTensorMode the ops produce [B, gamma+1] and [B] int64 outputs without running."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        p, q = torch.empty(5, 4, 100), torch.empty(5, 3, 100)
        x, n = torch.empty(5, 3, dtype=torch.int64), torch.empty(5, dtype=torch.int64)
        u = torch.empty(5, 4, dtype=torch.float64)
        tokens, accepted = OPS.verify_probs(p, q, x, n, u, "block", [])
        assert tokens.shape == (5, 4) and accepted.shape == (5,)
        assert tokens.dtype == accepted.dtype == torch.int64
        tokens, accepted = OPS.verify_logits(p, None, x, n, u, 0.0, 0, 1.0, 0.0, "greedy", [])
        assert tokens.shape == (5, 4) and accepted.shape == (5,)


def test_torch_compile_fullgraph():
    """verify called inside a torch.compile'd function (fullgraph, eager backend) gives the
    eager result."""
    p, q, x, n, u, rule, params = _probs_args("block", 6, 3, 10, torch.float32, True, True)

    def f(p, q, x, n, u):
        return OPS.verify_probs(p, q, x, n, u, "block", [])

    compiled = torch.compile(f, fullgraph=True, backend="eager")
    eager = f(p, q, x, n, u)
    got = compiled(p, q, x, n, u)
    assert torch.equal(got[0], eager[0]) and torch.equal(got[1], eager[1])
