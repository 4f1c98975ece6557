"""A user rule's output is checked on every call, through ``verify`` and through ``generate``:
a wrong container, dtype, shape, accepted length, accepted token or emitted token raises an
error naming the rule and the field, and never reaches the output (issue 36, items 1 and 2).
The registry documents what it holds: greedy is lossless at temperature 0 only (and sampling
with it warns), and a user rule's options are listed (item 3, item 5)."""

from __future__ import annotations

import warnings

import pytest
import torch
from test_generate_models import left_padded, make_pair

import specdecode
from specdecode import generate


def _inputs(B=3, gamma=4, V=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(B, gamma + 1, V, generator=gen), -1)
    q = torch.softmax(torch.randn(B, gamma, V, generator=gen), -1)
    x = torch.multinomial(q.flatten(0, 1), 1, generator=gen).view(B, gamma)
    return p, q, x


def _accept_two(target_probs, draft_probs, draft_tokens, *, num_draft_tokens, uniforms):
    """A well-formed lossy rule: accept min(2, n) drafts, emit the target's argmax."""
    B, gamma = draft_tokens.shape
    tau = num_draft_tokens.clamp(max=2)
    tokens = torch.full((B, gamma + 1), -1, dtype=torch.int64, device=draft_tokens.device)
    for b in range(B):
        t = int(tau[b])
        tokens[b, :t] = draft_tokens[b, :t]
        tokens[b, t] = target_probs[b, t].argmax()
    return tokens, tau


def _broken(kind: str):
    """``_accept_two`` with one defect of the kind named."""

    def rule(target_probs, draft_probs, draft_tokens, *, num_draft_tokens, uniforms):
        tokens, tau = _accept_two(target_probs, draft_probs, draft_tokens, num_draft_tokens=num_draft_tokens,
                                  uniforms=uniforms)
        V = target_probs.shape[2]
        if kind == "int32":
            return tokens.int(), tau
        if kind == "float":
            return tokens.float(), tau
        if kind == "accepted_too_long":
            return tokens, tau + 5
        if kind == "negative_accepted":
            return tokens, tau - 3
        if kind == "emit_minus_one":
            return tokens.scatter(1, tau[:, None], -1), tau
        if kind == "emit_V":
            return tokens.scatter(1, tau[:, None], V), tau
        if kind == "three_tuple":
            return tokens, tau, tau
        if kind == "not_a_tuple":
            return tokens
        if kind == "wrong_shape":
            return tokens[:, :-1], tau
        if kind == "undrafted":  # a token the target never scored in an accepted slot
            bad = tokens.clone()
            bad[:, 0] = (draft_tokens[:, 0] + 1) % V
            return bad, tau
        if kind == "no_padding":
            return tokens.clamp_min(0), tau
        raise AssertionError(kind)

    return rule


CASES = {
    "int32": (TypeError, "tokens of dtype torch.int32"),
    "float": (TypeError, "tokens of dtype torch.float32"),
    "accepted_too_long": (ValueError, r"accepted_len\[0\] = 7, outside \[0, num_draft_tokens\[0\]\]"),
    "negative_accepted": (ValueError, r"accepted_len\[0\] = -1"),
    "emit_minus_one": (ValueError, r"the emitted token, outside \[0, V\)"),
    "emit_V": (ValueError, r"the emitted token, outside \[0, V\)"),
    "three_tuple": (TypeError, r"tuple of 3 items; expected 2: \(tokens, accepted_len\)"),
    "not_a_tuple": (TypeError, "returned Tensor; expected a 2-tuple"),
    "wrong_shape": (ValueError, r"tokens of shape \(3, 4\); expected \[B, gamma\+1\]"),
    "undrafted": (ValueError, r"at an accepted position, but the draft there is"),
    "no_padding": (ValueError, "expected -1 padding"),
}


@pytest.mark.parametrize("kind", sorted(CASES))
def test_verify_checks_every_field(user_rules, kind):
    """verify() and verify_logits() refuse each malformed output with the rule's name and the
    field; the well-formed rule passes."""
    p, q, x = _inputs()
    user_rules("accept_two", _accept_two, needs_draft_probs=False)
    assert specdecode.verify(p, None, x, rule="accept_two").accepted_len.tolist() == [2, 2, 2]
    user_rules(f"broken_{kind}", _broken(kind), needs_draft_probs=False)
    error, message = CASES[kind]
    for call in (lambda: specdecode.verify(p, None, x, rule=f"broken_{kind}"),
                 lambda: specdecode.verify_logits(p.log(), None, x, rule=f"broken_{kind}")):
        with pytest.raises(error, match=f"rule 'broken_{kind}'") as info:
            call()
        assert info.match(message)


@pytest.mark.parametrize("kind", ["int32", "accepted_too_long", "emit_V", "three_tuple", "undrafted"])
def test_generate_checks_every_field(user_rules, kind):
    """Through generate the same errors are raised, naming the rule, instead of an index error
    deep in the engine or a token the target never scored in the output."""
    target, draft = make_pair("llama")
    ids, mask = left_padded([5, 3], seed=14)
    user_rules(f"broken_{kind}", _broken(kind), needs_draft_probs=False)
    error, message = CASES[kind]
    message = message.replace(r"accepted_len\[0\] = 7", r"accepted_len\[0\] = \d+")
    with pytest.raises(error, match=f"rule 'broken_{kind}'") as info:
        generate(target, draft, ids, mask, rule=f"broken_{kind}", num_draft_tokens=3, max_new_tokens=8,
                 pad_token_id=0)
    assert info.match(message)


def test_num_draft_tokens_bounds_the_accepted_length(user_rules):
    """A row that verified fewer drafts may not accept more than it verified."""
    p, q, x = _inputs()
    user_rules("accept_all", lambda tp, dp, dt, *, num_draft_tokens, uniforms: (
        torch.cat([dt, tp[:, -1].argmax(-1, keepdim=True)], 1), torch.full_like(num_draft_tokens, dt.shape[1])),
        needs_draft_probs=False)
    assert specdecode.verify(p, None, x, rule="accept_all").accepted_len.tolist() == [4, 4, 4]
    with pytest.raises(ValueError, match=r"accepted_len\[1\] = 4, outside \[0, num_draft_tokens\[1\]\] = \[0, 2\]"):
        specdecode.verify(p, None, x, rule="accept_all", num_draft_tokens=torch.tensor([4, 2, 4]))


def test_rule_that_cannot_take_the_call_is_refused_at_registration():
    with pytest.raises(TypeError, match="fn: a rule is called as"):
        specdecode.register_rule("two_args", lambda a, b: None)
    assert "two_args" not in {r.name for r in specdecode.list_rules()}


def test_user_rule_options_are_listed(user_rules):
    def rule(target_probs, draft_probs, draft_tokens, *, num_draft_tokens, uniforms, power=0.5, floor):
        raise AssertionError("not called")

    info = user_rules("with_options", rule, description="a test rule")
    assert info.options == {"power": 0.5, "floor": "required"}
    listed = {r.name: r for r in specdecode.list_rules()}["with_options"]
    assert "options: power=0.5, floor" in str(listed) and "a test rule" in str(listed)


def test_greedy_is_lossless_at_temperature_zero_only():
    rules = {r.name: r for r in specdecode.list_rules()}
    assert [name for name, r in rules.items() if r.lossless] == ["token", "block"]
    assert rules["greedy"].lossless_when == "temperature 0 only" and "T=0 only" in str(rules["greedy"])
    assert rules["token"].lossless_when == "always" and rules["typical"].lossless_when == "never"


def test_sampling_with_greedy_warns():
    target, draft = make_pair("llama")
    ids, mask = left_padded([5], seed=1)
    with pytest.warns(UserWarning, match="'greedy' is lossless only at temperature 0"):
        generate(target, draft, ids, mask, rule="greedy", do_sample=True, temperature=1.0, max_new_tokens=4,
                 pad_token_id=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        generate(target, draft, ids, mask, rule="greedy", max_new_tokens=4, pad_token_id=0)


def test_docstring_examples():
    """The examples of the modules of the extension point run as shown."""
    import doctest

    import specdecode.rule_checks
    import specdecode.rules

    for module in (specdecode.rules, specdecode.rule_checks):
        result = doctest.testmod(module, extraglobs={"torch": torch, "specdecode": specdecode})
        assert result.attempted > 0 and result.failed == 0, f"{module.__name__}: {result}"
