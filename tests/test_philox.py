"""The graph-safe *_philox ops on the CPU: their coins are Philox4x32-10 of (seed, offset, row,
column) computed exactly as on the GPU, so they equal verify_* fed the Python Philox coins."""

from __future__ import annotations

import pytest
import torch

import specdecode
from philox_ref import philox_uniforms

OPS = torch.ops.specdecode
RULES = [("token", []), ("block", []), ("greedy", []), ("typical", [0.09, 0.3, 1.0]), ("top_beta", [3.0, 1.0])]


def _inputs(B: int, gamma: int, V: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(B, gamma + 1, V, generator=g) * 2
    draft = target[:, :gamma] + torch.randn(B, gamma, V, generator=g)
    tokens = torch.multinomial(torch.softmax(draft, -1).reshape(-1, V), 1, generator=g).reshape(B, gamma)
    num = torch.randint(0, gamma + 1, (B,), generator=g)
    return target, draft, tokens, num


def _seed_offset(seed: int, offset: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor([seed], dtype=torch.int64), torch.tensor([offset], dtype=torch.int64)


@pytest.mark.parametrize("rule,params", RULES)
@pytest.mark.parametrize("offset", [0, 7, 2**33 + 5])
def test_probs_philox_equals_explicit_coins(rule, params, offset):
    target, draft, tokens, num = _inputs(17, 4, 111, seed=offset % 97)
    p, q = torch.softmax(target, -1), torch.softmax(draft, -1)
    coins = philox_uniforms(12345, offset, 17, 4)
    needs = rule in ("token", "block")
    got = OPS.verify_probs_philox(p, q if needs else None, tokens, num, *_seed_offset(12345, offset), rule, params)
    want = OPS.verify_probs(p, q if needs else None, tokens, num, coins, rule, params)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("rule,params", RULES)
def test_logits_philox_equals_explicit_coins(rule, params):
    target, draft, tokens, num = _inputs(5, 3, 300, seed=3)
    coins = philox_uniforms(-5, 3, 5, 3)  # seeds are read as uint64
    sampling = (0.8, 20, 0.9, 0.0)
    needs = rule in ("token", "block")
    got = OPS.verify_logits_philox(target, draft if needs else None, tokens, num, *_seed_offset(-5, 3), *sampling,
                                   rule, params)
    want = OPS.verify_logits(target, draft if needs else None, tokens, num, coins, *sampling, rule, params)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_public_api_philox_keywords():
    """verify_logits(philox_seed=, philox_offset=): same offset, same draw; next offset, new draw."""
    target, draft, tokens, _ = _inputs(64, 4, 50, seed=1)
    seed, offset = _seed_offset(7, 0)
    a = specdecode.verify_logits(target, draft, tokens, rule="block", philox_seed=seed, philox_offset=offset)
    b = specdecode.verify_logits(target, draft, tokens, rule="block", philox_seed=seed, philox_offset=offset)
    c = specdecode.verify_logits(target, draft, tokens, rule="block", philox_seed=seed, philox_offset=offset + 1)
    assert torch.equal(a.tokens, b.tokens)
    assert not torch.equal(a.tokens, c.tokens)
    p, q = torch.softmax(target, -1), torch.softmax(draft, -1)
    d = specdecode.verify(p, q, tokens, rule="token", philox_seed=seed, philox_offset=offset)
    e = specdecode.verify(p, q, tokens, rule="token", uniforms=philox_uniforms(7, 0, 64, 4))
    assert torch.equal(d.tokens, e.tokens)


@pytest.mark.parametrize(
    "seed,offset,match",
    [
        (torch.tensor([1.0]), torch.tensor([0]), "philox_seed"),
        (torch.tensor([1, 2]), torch.tensor([0]), "philox_seed"),
        (torch.tensor([1]), torch.tensor([0], dtype=torch.int32), "philox_offset"),
    ],
)
def test_bad_philox_arguments(seed, offset, match):
    target, draft, tokens, num = _inputs(2, 2, 9, seed=0)
    with pytest.raises((TypeError, ValueError), match=match):
        OPS.verify_logits_philox(target, draft, tokens, num, seed, offset, 1.0, 0, 1.0, 0.0, "token", [])


def test_philox_and_uniforms_are_exclusive():
    target, draft, tokens, _ = _inputs(2, 2, 9, seed=0)
    seed, offset = _seed_offset(1, 0)
    with pytest.raises(ValueError, match="philox"):
        specdecode.verify_logits(target, draft, tokens, uniforms=torch.rand(2, 3, dtype=torch.float64),
                                 philox_seed=seed, philox_offset=offset)
    with pytest.raises(ValueError, match="philox_offset"):
        specdecode.verify_logits(target, draft, tokens, philox_seed=seed)


@pytest.mark.parametrize("op", ["verify_probs_philox", "verify_logits_philox"])
def test_opcheck_philox_ops(op):
    target, draft, tokens, num = _inputs(3, 2, 11, seed=2)
    seed, offset = _seed_offset(3, 1)
    if op == "verify_probs_philox":
        args = (torch.softmax(target, -1), torch.softmax(draft, -1), tokens, num, seed, offset, "block", [])
    else:
        args = (target, draft, tokens, num, seed, offset, 0.9, 5, 0.95, 0.01, "token", [])
    torch.library.opcheck(getattr(OPS, op).default, args)
