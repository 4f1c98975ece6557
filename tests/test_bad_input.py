"""Bad input (docs/verification.md §7). Through the public API every mistake raises ValueError or TypeError
whose message names the offending argument; called directly, ``torch.ops.specdecode.*`` raise
ValueError / TypeError too and never crash the process (some direct calls run in a subprocess
to prove there is no segfault). The only RuntimeError of a direct call is torch's own parsing
of Python arguments against the op schema (a str where a float is expected, an int beyond
int64), before any specdecode code runs. tests/test_robustness.py fuzzes all of this.
"""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap

import pytest
import torch

import specdecode
from specdecode.sampling import SamplingParams, sample_logits

B, GAMMA, V = 2, 3, 5


def _valid(dtype=torch.float32):
    """A valid call: target [2, 4, 5], draft [2, 3, 5], drafts with q > 0."""
    gen = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(B, GAMMA + 1, V, generator=gen, dtype=torch.float64), -1).to(dtype)
    q = torch.softmax(torch.randn(B, GAMMA, V, generator=gen, dtype=torch.float64), -1).to(dtype)
    x = torch.tensor([[0, 1, 2], [3, 4, 0]])
    return {"target_probs": p, "draft_probs": q, "draft_tokens": x}


def _call(args: dict, **kwargs):
    args = dict(args)
    return specdecode.verify(args.pop("target_probs"), args.pop("draft_probs"), args.pop("draft_tokens"), **args, **kwargs)


def _set(tensor, index, value):
    tensor = tensor.clone()
    tensor[index] = value
    return tensor


def _row(values, dtype=torch.float32):
    return torch.tensor(values, dtype=dtype)


# (id, function args -> args, keyword options, exception, match)
PROB_CASES = [
    ("nan_target", lambda a: {**a, "target_probs": _set(a["target_probs"], (0, 1, 2), math.nan)}, {}, ValueError, "target_probs"),
    ("inf_target", lambda a: {**a, "target_probs": _set(a["target_probs"], (1, 3, 0), math.inf)}, {}, ValueError, "target_probs"),
    ("nan_draft", lambda a: {**a, "draft_probs": _set(a["draft_probs"], (1, 0, 4), math.nan)}, {}, ValueError, "draft_probs"),
    ("neg_inf_draft", lambda a: {**a, "draft_probs": _set(a["draft_probs"], (0, 2, 1), -math.inf)}, {}, ValueError, "draft_probs"),
    ("negative_target", lambda a: {**a, "target_probs": _set(a["target_probs"], (0, 0), _row([-0.1, 0.6, 0.5, 0.0, 0.0]))},
     {}, ValueError, "target_probs"),
    ("negative_draft", lambda a: {**a, "draft_probs": _set(a["draft_probs"], (1, 1), _row([0.3, 0.3, 0.3, 0.2, -0.1]))},
     {}, ValueError, "draft_probs"),
    ("target_sum_half", lambda a: {**a, "target_probs": _set(a["target_probs"], (1, 2), _row([0.1] * 5))}, {}, ValueError, "target_probs"),
    ("draft_sum_1.2", lambda a: {**a, "draft_probs": _set(a["draft_probs"], (0, 1), _row([0.3, 0.3, 0.2, 0.2, 0.2]))},
     {}, ValueError, "draft_probs"),
    ("target_2d", lambda a: {**a, "target_probs": a["target_probs"][0]}, {}, ValueError, "target_probs"),
    ("target_4d", lambda a: {**a, "target_probs": a["target_probs"][None]}, {}, ValueError, "target_probs"),
    ("draft_2d", lambda a: {**a, "draft_probs": a["draft_probs"][0]}, {}, ValueError, "draft_probs"),
    ("tokens_1d", lambda a: {**a, "draft_tokens": a["draft_tokens"][0]}, {}, ValueError, "draft_tokens"),
    ("tokens_3d", lambda a: {**a, "draft_tokens": a["draft_tokens"][None]}, {}, ValueError, "draft_tokens"),
    ("target_gamma_rows", lambda a: {**a, "target_probs": a["target_probs"][:, :GAMMA]}, {}, ValueError, "target_probs"),
    ("target_batch", lambda a: {**a, "target_probs": a["target_probs"][:1]}, {}, ValueError, "target_probs"),
    ("draft_gamma_rows", lambda a: {**a, "draft_probs": a["draft_probs"][:, :2]}, {}, ValueError, "draft_probs"),
    ("draft_batch", lambda a: {**a, "draft_probs": a["draft_probs"][:1]}, {}, ValueError, "draft_probs"),
    ("vocab_mismatch", lambda a: {**a, "draft_probs": torch.full((B, GAMMA, V + 1), 1.0 / (V + 1))}, {}, ValueError, "draft_probs"),
    ("token_too_large", lambda a: {**a, "draft_tokens": _set(a["draft_tokens"], (1, 1), V)}, {}, ValueError, "draft_tokens"),
    ("token_negative", lambda a: {**a, "draft_tokens": _set(a["draft_tokens"], (0, 0), -1)}, {}, ValueError, "draft_tokens"),
    ("token_huge", lambda a: {**a, "draft_tokens": _set(a["draft_tokens"], (0, 2), 2**40)}, {}, ValueError, "draft_tokens"),
    ("drafted_q_zero", lambda a: {**a, "draft_probs": _set(a["draft_probs"], (1, 0), _row([0.25, 0.25, 0.25, 0.0, 0.25]))},
     {}, ValueError, "draft_probs"),
    ("gamma_zero", lambda a: {"target_probs": a["target_probs"][:, :1], "draft_probs": a["draft_probs"][:, :0],
                              "draft_tokens": a["draft_tokens"][:, :0]}, {}, ValueError, "draft_tokens"),
    ("vocab_zero", lambda a: {"target_probs": torch.empty(B, GAMMA + 1, 0), "draft_probs": torch.empty(B, GAMMA, 0),
                              "draft_tokens": a["draft_tokens"]}, {}, ValueError, "target_probs"),
    ("int_target", lambda a: {**a, "target_probs": torch.ones(B, GAMMA + 1, V, dtype=torch.int64)}, {}, TypeError, "target_probs"),
    ("int_draft", lambda a: {**a, "draft_probs": torch.ones(B, GAMMA, V, dtype=torch.int32)}, {}, TypeError, "draft_probs"),
    ("bool_target", lambda a: {**a, "target_probs": a["target_probs"] > 0.1}, {}, TypeError, "target_probs"),
    ("dtype_mismatch", lambda a: {**a, "draft_probs": a["draft_probs"].double()}, {}, TypeError, "draft_probs"),
    ("int32_tokens", lambda a: {**a, "draft_tokens": a["draft_tokens"].int()}, {}, TypeError, "draft_tokens"),
    ("float_tokens", lambda a: {**a, "draft_tokens": a["draft_tokens"].float()}, {}, TypeError, "draft_tokens"),
    ("list_target", lambda a: {**a, "target_probs": a["target_probs"].tolist()}, {}, TypeError, "target_probs"),
    ("list_tokens", lambda a: {**a, "draft_tokens": [[0, 1, 2], [3, 4, 0]]}, {}, TypeError, "draft_tokens"),
    ("uniform_one", lambda a: a, {"uniforms": torch.full((B, GAMMA + 1), 1.0, dtype=torch.float64)}, ValueError, "uniforms"),
    ("uniform_above", lambda a: a, {"uniforms": torch.full((B, GAMMA + 1), 1.5, dtype=torch.float64)}, ValueError, "uniforms"),
    ("uniform_negative", lambda a: a, {"uniforms": _set(torch.zeros(B, GAMMA + 1, dtype=torch.float64), (1, 2), -0.1)},
     ValueError, "uniforms"),
    ("uniform_nan", lambda a: a, {"uniforms": _set(torch.zeros(B, GAMMA + 1, dtype=torch.float64), (0, 0), math.nan)},
     ValueError, "uniforms"),
    ("uniform_shape", lambda a: a, {"uniforms": torch.zeros(B, GAMMA, dtype=torch.float64)}, ValueError, "uniforms"),
    ("uniform_1d", lambda a: a, {"uniforms": torch.zeros(B * (GAMMA + 1), dtype=torch.float64)}, ValueError, "uniforms"),
    ("uniform_int", lambda a: a, {"uniforms": torch.zeros(B, GAMMA + 1, dtype=torch.int64)}, TypeError, "uniforms"),
    ("uniform_half", lambda a: a, {"uniforms": torch.zeros(B, GAMMA + 1, dtype=torch.float16)}, TypeError, "uniforms"),
    ("uniform_and_generator", lambda a: a, {"uniforms": torch.zeros(B, GAMMA + 1, dtype=torch.float64),
                                            "generator": torch.Generator()}, ValueError, "uniforms"),
    ("meta_draft", lambda a: {**a, "draft_probs": a["draft_probs"].to("meta")}, {}, ValueError, "draft_probs"),
    ("meta_tokens", lambda a: {**a, "draft_tokens": a["draft_tokens"].to("meta")}, {}, ValueError, "draft_tokens"),
    ("meta_num_draft", lambda a: a, {"num_draft_tokens": torch.full((B,), GAMMA, device="meta")}, ValueError, "num_draft_tokens"),
    ("meta_uniforms", lambda a: a, {"uniforms": torch.zeros(B, GAMMA + 1, dtype=torch.float64, device="meta")}, ValueError, "uniforms"),
    ("num_draft_negative", lambda a: a, {"num_draft_tokens": torch.tensor([GAMMA, -1])}, ValueError, "num_draft_tokens"),
    ("num_draft_above_gamma", lambda a: a, {"num_draft_tokens": torch.tensor([GAMMA + 1, 0])}, ValueError, "num_draft_tokens"),
    ("num_draft_shape", lambda a: a, {"num_draft_tokens": torch.tensor([1, 1, 1])}, ValueError, "num_draft_tokens"),
    ("num_draft_2d", lambda a: a, {"num_draft_tokens": torch.tensor([[1, 1]])}, ValueError, "num_draft_tokens"),
    ("num_draft_int32", lambda a: a, {"num_draft_tokens": torch.tensor([1, 1], dtype=torch.int32)}, TypeError, "num_draft_tokens"),
    ("num_draft_list", lambda a: a, {"num_draft_tokens": [1, 1]}, TypeError, "num_draft_tokens"),
    ("unknown_rule", lambda a: a, {"rule": "speculative_magic"}, ValueError, "rule"),
    ("rule_not_str", lambda a: a, {"rule": 3}, TypeError, "rule"),
    ("unknown_option", lambda a: a, {"rule": "token", "bogus_option": 1}, TypeError, "bogus_option"),
    ("option_of_other_rule", lambda a: a, {"rule": "block", "epsilon": 0.1}, TypeError, "epsilon"),
    ("top_beta_beta_zero", lambda a: a, {"rule": "top_beta", "beta": 0}, ValueError, "beta"),
    ("top_beta_beta_float", lambda a: a, {"rule": "top_beta", "beta": 1.5}, ValueError, "beta"),
    ("top_beta_negative_tolerance", lambda a: a, {"rule": "top_beta", "tolerance": -1.0}, ValueError, "tolerance"),
    ("typical_negative_epsilon", lambda a: a, {"rule": "typical", "epsilon": -0.1}, ValueError, "epsilon"),
    ("draft_missing", lambda a: {**a, "draft_probs": None}, {"rule": "token"}, ValueError, "draft_probs"),
    ("draft_missing_block", lambda a: {**a, "draft_probs": None}, {"rule": "block"}, ValueError, "draft_probs"),
]


@pytest.mark.parametrize("make,options,exc,match", [c[1:] for c in PROB_CASES], ids=[c[0] for c in PROB_CASES])
def test_verify_rejects_bad_input(make, options, exc, match):
    """specdecode.verify raises ValueError / TypeError naming the argument (docs/verification.md §7)."""
    with pytest.raises(exc, match=match):
        _call(make(_valid()), **options)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64], ids=str)
def test_sum_tolerance_per_dtype(dtype):
    """In every dtype, rows that sum to 1 up to the dtype's rounding are accepted and a row
    summing to 0.9 is rejected."""
    args = _valid(dtype)
    assert _call(args).tokens.shape == (B, GAMMA + 1)
    bad = _set(args["target_probs"], (0, 0), torch.full((V,), 0.9 / V, dtype=dtype))
    with pytest.raises(ValueError, match="target_probs"):
        _call({**args, "target_probs": bad})


def test_validate_false_skips_value_checks_only():
    """validate=False skips the value checks (the caller vouches for the probabilities) but
    never the shape / dtype / range checks."""
    args = _valid()
    unnormalised = args["target_probs"] * 1.5
    _call({**args, "target_probs": unnormalised}, validate=False)
    with pytest.raises(ValueError, match="draft_tokens"):
        _call({**args, "draft_tokens": _set(args["draft_tokens"], (0, 0), V)}, validate=False)
    with pytest.raises(TypeError, match="draft_tokens"):
        _call({**args, "draft_tokens": args["draft_tokens"].int()}, validate=False)


def test_unused_slots_are_not_checked():
    """Draft tokens beyond a row's num_draft_tokens are never read: out-of-range ids and q = 0
    there are fine."""
    args = _valid()
    tokens = _set(args["draft_tokens"], (0, 2), 999)
    draft = _set(args["draft_probs"], (1, 1), _row([0.5, 0.5, 0.0, 0.0, 0.0]))
    out = _call({**args, "draft_tokens": _set(tokens, (1, 1), 4), "draft_probs": draft},
                num_draft_tokens=torch.tensor([2, 1]))
    assert bool((out.accepted_len <= torch.tensor([2, 1])).all())


def test_empty_batch():
    """B = 0 either works (empty outputs of the right shapes) or is refused with a ValueError
    naming the argument, never an internal error from a reduction over nothing."""
    args = {k: v[:0] for k, v in _valid().items()}
    try:
        out = _call(args, rule="block")
    except ValueError as exc:
        assert "target_probs" in str(exc) or "draft_tokens" in str(exc), str(exc)
    else:
        assert out.tokens.shape == (0, GAMMA + 1) and out.accepted_len.shape == (0,)


# --------------------------------------------------------------------------- verify_logits


def _valid_logits():
    gen = torch.Generator().manual_seed(1)
    return {"target_logits": torch.randn(B, GAMMA + 1, V, generator=gen),
            "draft_logits": torch.randn(B, GAMMA, V, generator=gen),
            "draft_tokens": torch.tensor([[0, 1, 2], [3, 4, 0]])}


def _call_logits(args, **kwargs):
    args = dict(args)
    return specdecode.verify_logits(args.pop("target_logits"), args.pop("draft_logits"), args.pop("draft_tokens"),
                                    **args, **kwargs)


LOGIT_CASES = [
    ("nan_target", lambda a: {**a, "target_logits": _set(a["target_logits"], (0, 0, 1), math.nan)}, {}, ValueError, "target_logits"),
    ("inf_target", lambda a: {**a, "target_logits": _set(a["target_logits"], (1, 0, 3), math.inf)}, {}, ValueError, "target_logits"),
    ("nan_draft", lambda a: {**a, "draft_logits": _set(a["draft_logits"], (1, 0, 0), math.nan)}, {}, ValueError, "draft_logits"),
    ("inf_draft", lambda a: {**a, "draft_logits": _set(a["draft_logits"], (0, 0, 2), math.inf)}, {}, ValueError, "draft_logits"),
    ("nan_target_greedy", lambda a: {**a, "target_logits": _set(a["target_logits"], (0, 0, 4), math.nan)},
     {"temperature": 0.0}, ValueError, "target_logits"),
    ("int_logits", lambda a: {**a, "target_logits": torch.zeros(B, GAMMA + 1, V, dtype=torch.int64)}, {}, TypeError, "target_logits"),
    ("vocab_mismatch", lambda a: {**a, "draft_logits": torch.zeros(B, GAMMA, V + 2)}, {}, ValueError, "draft_logits"),
    ("dtype_mismatch", lambda a: {**a, "draft_logits": a["draft_logits"].half()}, {}, TypeError, "draft_logits"),
    ("target_2d", lambda a: {**a, "target_logits": a["target_logits"][0]}, {}, ValueError, "target_logits"),
    ("token_out_of_range", lambda a: {**a, "draft_tokens": _set(a["draft_tokens"], (0, 1), V)}, {}, ValueError, "draft_tokens"),
    ("token_negative", lambda a: {**a, "draft_tokens": _set(a["draft_tokens"], (1, 0), -3)}, {}, ValueError, "draft_tokens"),
    ("num_draft_out_of_range", lambda a: a, {"num_draft_tokens": torch.tensor([GAMMA + 1, 0])}, ValueError, "num_draft_tokens"),
    ("num_draft_negative", lambda a: a, {"num_draft_tokens": torch.tensor([0, -1])}, ValueError, "num_draft_tokens"),
    ("draft_missing", lambda a: {**a, "draft_logits": None}, {"rule": "block"}, ValueError, "draft_logits"),
    ("meta_draft", lambda a: {**a, "draft_logits": a["draft_logits"].to("meta")}, {}, ValueError, "draft_logits"),
    ("uniform_one", lambda a: a, {"uniforms": torch.full((B, GAMMA + 1), 1.0, dtype=torch.float64)}, ValueError, "uniforms"),
    ("temperature_negative", lambda a: a, {"temperature": -1.0}, ValueError, "temperature"),
    ("temperature_inf", lambda a: a, {"temperature": math.inf}, ValueError, "temperature"),
    ("temperature_nan", lambda a: a, {"temperature": math.nan}, ValueError, "temperature"),
    ("temperature_str", lambda a: a, {"temperature": "hot"}, TypeError, "temperature"),
    ("temperature_bool", lambda a: a, {"temperature": True}, TypeError, "temperature"),
    ("temperature_tensor", lambda a: a, {"temperature": torch.tensor([1.0, 2.0])}, TypeError, "temperature"),
    ("top_k_negative", lambda a: a, {"top_k": -1}, ValueError, "top_k"),
    ("top_k_float", lambda a: a, {"top_k": 2.5}, TypeError, "top_k"),
    ("top_p_zero", lambda a: a, {"top_p": 0.0}, ValueError, "top_p"),
    ("top_p_above_one", lambda a: a, {"top_p": 1.5}, ValueError, "top_p"),
    ("top_p_nan", lambda a: a, {"top_p": math.nan}, ValueError, "top_p"),
    ("min_p_negative", lambda a: a, {"min_p": -0.1}, ValueError, "min_p"),
    ("min_p_above_one", lambda a: a, {"min_p": 1.1}, ValueError, "min_p"),
    ("min_p_nan", lambda a: a, {"min_p": math.nan}, ValueError, "min_p"),
    ("unknown_rule", lambda a: a, {"rule": "nope"}, ValueError, "rule"),
    ("unknown_option", lambda a: a, {"rule": "typical", "epsilom": 0.1}, TypeError, "epsilom"),
]


@pytest.mark.parametrize("make,options,exc,match", [c[1:] for c in LOGIT_CASES], ids=[c[0] for c in LOGIT_CASES])
def test_verify_logits_rejects_bad_input(make, options, exc, match):
    """specdecode.verify_logits raises ValueError / TypeError naming the argument: NaN / +inf
    logits (in target_logits or draft_logits), bad sampling settings, bad shapes and ids."""
    with pytest.raises(exc, match=match):
        _call_logits(make(_valid_logits()), **options)


@pytest.mark.parametrize("rule", ["token", "block", "greedy", "typical", "top_beta"])
@pytest.mark.parametrize("bad", [math.nan, math.inf], ids=["nan", "inf"])
def test_non_finite_logit_message(rule, bad):
    """A NaN / +inf target logit in a row every rule reads (position 0) is reported as a
    NaN / +inf logit whatever the rule, not as an empty distribution (the argument name is
    checked by test_verify_logits_rejects_bad_input)."""
    args = _valid_logits()
    args["target_logits"] = _set(args["target_logits"], (1, 0, 2), bad)
    draft = args["draft_logits"] if rule in ("token", "block") else None
    with pytest.raises(ValueError, match=r"NaN|\+inf"):
        _call_logits({**args, "draft_logits": draft}, rule=rule)


def test_all_masked_logit_row():
    """A logit row that is -inf everywhere has no distribution: ValueError, not a crash or a
    garbage token. (-inf in some entries just masks those tokens.)"""
    args = _valid_logits()
    masked = _set(args["target_logits"], (0, 0, slice(1, None)), -math.inf)
    out = _call_logits({**args, "target_logits": masked}, rule="greedy")
    assert int(out.tokens[0, 0]) == 0
    with pytest.raises(ValueError):
        _call_logits({**args, "target_logits": _set(args["target_logits"], (1, 0), -math.inf)}, rule="greedy")


# ------------------------------------------------------------------------- direct op calls


def _op_args():
    a = _valid()
    n = torch.full((B,), GAMMA, dtype=torch.int64)
    u = torch.rand(B, GAMMA + 1, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    return [a["target_probs"], a["draft_probs"], a["draft_tokens"], n, u, "token", []]


def _replace(args, index, value):
    args = list(args)
    args[index] = value
    return args


DIRECT_PROB_CASES = [
    ("target_2d", lambda a: _replace(a, 0, a[0][0])),
    ("target_int", lambda a: _replace(a, 0, a[0].long())),
    ("draft_wrong_vocab", lambda a: _replace(a, 1, torch.full((B, GAMMA, V + 1), 1.0 / (V + 1)))),
    ("draft_wrong_dtype", lambda a: _replace(a, 1, a[1].double())),
    ("draft_none_for_token", lambda a: _replace(a, 1, None)),
    ("tokens_int32", lambda a: _replace(a, 2, a[2].int())),
    ("tokens_1d", lambda a: _replace(a, 2, a[2][0])),
    ("tokens_batch", lambda a: _replace(a, 2, a[2][:1])),
    ("token_out_of_range", lambda a: _replace(a, 2, _set(a[2], (0, 0), V))),
    ("token_huge", lambda a: _replace(a, 2, _set(a[2], (1, 2), 2**62))),
    ("token_negative", lambda a: _replace(a, 2, _set(a[2], (1, 0), -7))),
    ("gamma_zero", lambda a: [a[0][:, :1], a[1][:, :0], a[2][:, :0], torch.zeros(B, dtype=torch.int64),
                              a[4][:, :1], "token", []]),
    ("num_draft_out_of_range", lambda a: _replace(a, 3, torch.tensor([GAMMA + 1, 0]))),
    ("num_draft_negative", lambda a: _replace(a, 3, torch.tensor([0, -1]))),
    ("num_draft_huge", lambda a: _replace(a, 3, torch.tensor([2**40, 0]))),
    ("num_draft_shape", lambda a: _replace(a, 3, torch.tensor([1]))),
    ("num_draft_int32", lambda a: _replace(a, 3, a[3].int())),
    ("uniforms_float32", lambda a: _replace(a, 4, a[4].float())),
    ("uniforms_shape", lambda a: _replace(a, 4, a[4][:, :GAMMA])),
    ("meta_draft", lambda a: _replace(a, 1, a[1].to("meta"))),
    ("meta_tokens", lambda a: _replace(a, 2, a[2].to("meta"))),
    ("unknown_rule", lambda a: _replace(a, 5, "nope")),
    ("params_for_token", lambda a: _replace(a, 6, [1.0])),
    ("typical_params_missing", lambda a: _replace(_replace(a, 5, "typical"), 6, [0.1])),
    ("top_beta_fractional_beta", lambda a: _replace(_replace(a, 5, "top_beta"), 6, [1.5, 1.0])),
    ("all_zero_probs", lambda a: [torch.zeros_like(a[0]), torch.zeros_like(a[1])] + a[2:]),
]


@pytest.mark.parametrize("make", [c[1] for c in DIRECT_PROB_CASES], ids=[c[0] for c in DIRECT_PROB_CASES])
def test_direct_verify_probs_raises(make):
    """torch.ops.specdecode.verify_probs checks its inputs itself (TORCH_CHECK_VALUE / _TYPE)."""
    with pytest.raises((ValueError, TypeError)):
        torch.ops.specdecode.verify_probs(*make(_op_args()))


def _logit_op_args():
    a = _valid_logits()
    n = torch.full((B,), GAMMA, dtype=torch.int64)
    u = torch.rand(B, GAMMA + 1, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    return [a["target_logits"], a["draft_logits"], a["draft_tokens"], n, u, 1.0, 0, 1.0, 0.0, "token", []]


DIRECT_LOGIT_CASES = [
    ("nan_logit", lambda a: _replace(a, 0, _set(a[0], (0, 0, 0), math.nan))),
    ("inf_logit", lambda a: _replace(a, 1, _set(a[1], (1, 0, 0), math.inf))),
    ("all_masked", lambda a: _replace(a, 0, torch.full_like(a[0], -math.inf))),
    ("temperature_negative", lambda a: _replace(a, 5, -0.5)),
    ("temperature_nan", lambda a: _replace(a, 5, math.nan)),
    ("top_k_negative", lambda a: _replace(a, 6, -2)),
    ("top_p_zero", lambda a: _replace(a, 7, 0.0)),
    ("min_p_above_one", lambda a: _replace(a, 8, 2.0)),
    ("token_out_of_range", lambda a: _replace(a, 2, _set(a[2], (1, 1), V + 10))),
    ("num_draft_out_of_range", lambda a: _replace(a, 3, torch.tensor([GAMMA, GAMMA + 5]))),
    ("wrong_vocab", lambda a: _replace(a, 1, torch.zeros(B, GAMMA, V - 1))),
    ("target_1d", lambda a: _replace(a, 0, a[0].flatten())),
    ("uniforms_float32", lambda a: _replace(a, 4, a[4].float())),
    ("unknown_rule", lambda a: _replace(a, 9, "nope")),
]


@pytest.mark.parametrize("make", [c[1] for c in DIRECT_LOGIT_CASES], ids=[c[0] for c in DIRECT_LOGIT_CASES])
def test_direct_verify_logits_raises(make):
    """torch.ops.specdecode.verify_logits checks its inputs and sampling settings itself."""
    with pytest.raises((ValueError, TypeError)):
        torch.ops.specdecode.verify_logits(*make(_logit_op_args()))


def test_direct_calls_never_crash_the_process():
    """In a fresh interpreter, a battery of bad direct op calls each raise a Python exception
    (no segfault, no abort), including ones the wrapper would have caught: huge ids, empty
    vocabularies, mismatched batch sizes, NaN probabilities without validation."""
    script = textwrap.dedent(
        """
        import math, torch, specdecode
        ops = torch.ops.specdecode
        B, G, V = 3, 2, 4
        p = torch.softmax(torch.randn(B, G + 1, V), -1); q = torch.softmax(torch.randn(B, G, V), -1)
        x = torch.zeros(B, G, dtype=torch.int64); n = torch.full((B,), G); u = torch.rand(B, G + 1, dtype=torch.float64)
        cases = [
            lambda: ops.verify_probs(p, q, torch.full((B, G), 2**62), n, u, "block", []),
            lambda: ops.verify_probs(p, q, torch.full((B, G), -2**62), n, u, "token", []),
            lambda: ops.verify_probs(p, q, x, torch.full((B,), -2**62), u, "block", []),
            lambda: ops.verify_probs(p, q, x, torch.full((B,), 2**62), u, "typical", [0.1, 0.3, 0.0]),
            lambda: ops.verify_probs(p[:, :, :0], q[:, :, :0], x, n, u, "token", []),
            lambda: ops.verify_probs(p[:1], q, x, n, u, "token", []),
            lambda: ops.verify_probs(p, q[:1], x, n, u, "block", []),
            lambda: ops.verify_probs(p, q, x[:, :1], n, u, "token", []),
            lambda: ops.verify_probs(p, q, x, n[:1], u, "token", []),
            lambda: ops.verify_probs(p, q, x, n, u[:1], "token", []),
            lambda: ops.verify_probs(p, None, x, n, u, "block", []),
            lambda: ops.verify_probs(torch.full_like(p, math.nan), torch.full_like(q, math.nan), x, n, u, "token", []),
            None,  # the calls below may also succeed; they must only not crash
            lambda: ops.verify_probs(torch.zeros_like(p), q, x, n, u, "greedy", []),
            lambda: ops.verify_logits(torch.full_like(p, math.nan), q, x, n, u, 1.0, 0, 1.0, 0.0, "token", []),
            lambda: ops.verify_logits(torch.full_like(p, -math.inf), q, x, n, u, 0.7, 3, 0.5, 0.1, "block", []),
            lambda: ops.verify_logits(p, q, torch.full((B, G), 2**62), n, u, 1.0, 2, 0.9, 0.0, "block", []),
            lambda: ops.verify_logits(p, q, x, torch.full((B,), G + 1), u, 1.0, 0, 1.0, 0.0, "top_beta", [2.0, 1.0]),
            lambda: ops.verify_logits(p, q, x, n, u, 1.0, 2**40, 1.0, 0.0, "token", []),
            lambda: ops.verify_probs(-p, q, x, n, u, "block", []),
            lambda: ops.verify_probs(p, q, x, n, torch.full_like(u, 7.0), "token", []),
            lambda: ops.verify_probs(p.transpose(0, 2), q, x, n, u, "token", []),
        ]
        must_raise, raised = True, []
        for case in cases:
            if case is None:
                must_raise = False
                continue
            try:
                case()
                raised.append(not must_raise)
            except (ValueError, TypeError):
                raised.append(True)
        print("survived", sum(raised), len(raised))
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"the interpreter died (rc {result.returncode}):\n{result.stderr[-2000:]}"
    raised, total = result.stdout.split()[-2:]
    assert raised == total, result.stdout


# ------------------------------------------------- found by fuzzing (tests/test_robustness.py)


@pytest.mark.parametrize("op, args, position, name", [
    ("verify_logits", "logit", 0, "target_logits"),
    ("verify_logits", "logit", 2, "draft_tokens"),
    ("verify_logits", "logit", 3, "num_draft_tokens"),
    ("verify_logits", "logit", 4, "uniforms"),
    ("verify_probs", "prob", 0, "target_probs"),
    ("verify_logits_philox", "logit_philox", 0, "target_logits"),
    ("verify_logits_philox", "logit_philox", 4, "philox_seed"),
    ("verify_probs_philox", "prob_philox", 5, "philox_offset"),
    ("sample_logits", "sample", 0, "logits"),
    ("sample_logits", "sample", 1, "uniforms"),
    ("sample_logits_philox", "sample_philox", 1, "philox_seed"),
])
@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_direct_call_with_none_for_a_required_tensor(op, args, position, name, device):
    """None for a required Tensor reaches a kernel as an undefined tensor: it used to give
    misleading shape errors, a RuntimeError ("tensor does not have a device") in the Philox
    ops and an AttributeError in the fake (meta) kernels. Now: TypeError naming the argument."""
    seed, offset = torch.tensor([1]), torch.tensor([2])
    base = {
        "logit": _logit_op_args(),
        "prob": _op_args(),
        "logit_philox": _logit_op_args()[:4] + [seed, offset] + _logit_op_args()[5:],
        "prob_philox": _op_args()[:4] + [seed, offset] + _op_args()[5:],
        "sample": [torch.randn(2, 5), torch.rand(2, dtype=torch.float64), 1.0, 0, 1.0, 0.0],
        "sample_philox": [torch.randn(2, 5), seed, offset, 1.0, 0, 1.0, 0.0],
    }[args]
    if device == "meta":
        base = [t.to("meta") if isinstance(t, torch.Tensor) else t for t in base]
    with pytest.raises(TypeError, match=f"{name}: expected a Tensor, got None"):
        getattr(torch.ops.specdecode, op)(*_replace(base, position, None))


def test_top_k_beyond_int64_is_a_value_error():
    """top_k >= 2^63 cannot reach the op (int64): the Python API and SamplingParams say so
    instead of letting torch's schema parsing raise RuntimeError."""
    args = _valid_logits()
    with pytest.raises(ValueError, match="top_k"):
        _call_logits(args, top_k=2**63)
    with pytest.raises(ValueError, match="top_k"):
        SamplingParams(top_k=2**70)


def test_top_beta_beta_beyond_int64_is_a_value_error():
    """beta is checked for range before its float -> int64 conversion (undefined behaviour
    in C++ for values beyond int64)."""
    args = _op_args()
    for beta in (2.0**63, 1e300, math.inf):
        with pytest.raises(ValueError, match="beta"):
            torch.ops.specdecode.verify_probs(*_replace(_replace(args, 5, "top_beta"), 6, [beta, 0.0]))


@pytest.mark.parametrize("bad", ["gen", 5, torch.tensor(1)], ids=["str", "int", "tensor"])
def test_generator_of_the_wrong_type(bad):
    with pytest.raises(TypeError, match="generator"):
        _call_logits(_valid_logits(), generator=bad)
    with pytest.raises(TypeError, match="generator"):
        _call(_valid(), generator=bad)
    with pytest.raises(TypeError, match="generator"):
        sample_logits(torch.randn(2, 5), SamplingParams(), generator=bad)


def test_python_api_on_meta_tensors_gives_meta_outputs():
    """Meta tensors carry no values: the value checks (probabilities, ids, counts, coins) are
    skipped and the fake kernels give outputs of the right shapes (verify with validate=True
    used to raise RuntimeError from Tensor.item())."""
    a = {k: v.to("meta") for k, v in _valid().items()}
    out = _call(a, num_draft_tokens=torch.full((B,), 1).to("meta"))
    assert out.tokens.device.type == "meta" and tuple(out.tokens.shape) == (B, GAMMA + 1)
    out = _call(a, uniforms=torch.rand(B, GAMMA + 1, dtype=torch.float64).to("meta"))
    assert tuple(out.accepted_len.shape) == (B,)
    la = {k: v.to("meta") for k, v in _valid_logits().items()}
    out = _call_logits(la, rule="block", top_k=3)
    assert out.tokens.device.type == "meta" and tuple(out.tokens.shape) == (B, GAMMA + 1)
    tokens = sample_logits(torch.randn(3, V).to("meta"), SamplingParams(top_p=0.9))
    assert tokens.device.type == "meta" and tuple(tokens.shape) == (3,) and tokens.dtype == torch.int64


def test_sample_logits_uniforms_are_checked_like_verify():
    """sample_logits(uniforms=...) checks type, dtype and range as verify does (it used to take
    integer tensors and values outside [0, 1) silently)."""
    logits = torch.randn(2, V)
    with pytest.raises(TypeError, match="uniforms"):
        sample_logits(logits, SamplingParams(), uniforms=[0.1, 0.2])
    with pytest.raises(TypeError, match="uniforms"):
        sample_logits(logits, SamplingParams(), uniforms=torch.tensor([0, 0]))
    for bad in (1.0, -0.1, math.nan):
        with pytest.raises(ValueError, match="uniforms"):
            sample_logits(logits, SamplingParams(), uniforms=torch.tensor([0.5, bad], dtype=torch.float64))
