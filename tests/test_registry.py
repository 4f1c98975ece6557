"""The rule registry: a rule written in plain PyTorch is registered by name, used by verify and
verify_logits, listed with its lossless claim, protected against duplicates and built-in
names, and removed again.
"""

from __future__ import annotations

import pytest
import torch

import specdecode
from specdecode import reference

BUILTINS = ["token", "block", "greedy", "typical", "top_beta"]


def _inputs(B=4, gamma=3, V=6, seed=0):
    gen = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(B, gamma + 1, V, generator=gen), -1)
    q = torch.softmax(torch.randn(B, gamma, V, generator=gen), -1)
    x = torch.multinomial(q.flatten(0, 1), 1, generator=gen).view(B, gamma)
    return p, q, x


def _recording_rule(calls: list):
    """A rule that emits the target's argmax at position 0 and records what it received."""

    def rule(target_probs, draft_probs, draft_tokens, *, num_draft_tokens, uniforms, **options):
        calls.append({"target_probs": target_probs, "draft_probs": draft_probs, "draft_tokens": draft_tokens,
                      "num_draft_tokens": num_draft_tokens, "uniforms": uniforms, "options": options})
        B, gamma = draft_tokens.shape
        tokens = torch.full((B, gamma + 1), -1, dtype=torch.int64)
        tokens[:, 0] = target_probs[:, 0].argmax(-1)
        return specdecode.VerifyOutput(tokens, torch.zeros(B, dtype=torch.int64))

    return rule


def test_builtin_rules_listed_first_with_flags():
    """list_rules starts with the five built-ins, in order, with their lossless flags."""
    rules = specdecode.list_rules()
    assert [r.name for r in rules[:5]] == BUILTINS
    assert [r.lossless for r in rules[:5]] == [True, True, False, False, False]  # greedy: at T = 0 only
    assert all(r.builtin for r in rules[:5])
    assert [r.needs_draft_probs for r in rules[:5]] == [True, True, False, False, False]


def test_register_use_and_unregister(user_rules):
    """A registered rule is listed (user, with its lossless claim), is called by verify with
    num_draft_tokens and uniforms filled in and options passed through, and disappears on
    unregister."""
    calls = []
    info = user_rules("first_token_argmax", _recording_rule(calls), lossless=False, needs_draft_probs=False,
                      description="always emits argmax p_1")
    assert not info.builtin and not info.lossless and info.name == "first_token_argmax"
    listed = {r.name: r for r in specdecode.list_rules()}
    assert listed["first_token_argmax"].lossless is False and listed["first_token_argmax"].builtin is False
    assert specdecode.list_rules()[-1].name == "first_token_argmax"
    assert "user" in str(listed["first_token_argmax"]) and "lossy" in str(listed["first_token_argmax"])

    p, q, x = _inputs()
    out = specdecode.verify(p, None, x, rule="first_token_argmax", my_option=7,
                            generator=torch.Generator().manual_seed(3))
    assert out.tokens[:, 0].tolist() == p[:, 0].argmax(-1).tolist()
    assert out.accepted_len.tolist() == [0] * 4
    call = calls[-1]
    assert call["options"] == {"my_option": 7}
    assert call["num_draft_tokens"].tolist() == [3] * 4 and call["num_draft_tokens"].dtype == torch.int64
    u = call["uniforms"]
    assert u.shape == (4, 4) and u.dtype == torch.float64 and bool(((u >= 0) & (u < 1)).all())

    specdecode.unregister_rule("first_token_argmax")
    assert "first_token_argmax" not in {r.name for r in specdecode.list_rules()}
    with pytest.raises(ValueError, match="rule"):
        specdecode.verify(p, None, x, rule="first_token_argmax")


def test_user_rule_gets_same_uniforms_for_same_seed(user_rules):
    """The uniforms a user rule receives come from the generator: same seed, same uniforms;
    explicit uniforms are passed through unchanged; num_draft_tokens too."""
    calls = []
    user_rules("recorder", _recording_rule(calls), needs_draft_probs=False)
    p, q, x = _inputs()
    specdecode.verify(p, None, x, rule="recorder", generator=torch.Generator().manual_seed(5))
    specdecode.verify(p, None, x, rule="recorder", generator=torch.Generator().manual_seed(5))
    assert torch.equal(calls[0]["uniforms"], calls[1]["uniforms"])
    u = torch.rand(4, 4, dtype=torch.float64)
    n = torch.tensor([0, 1, 2, 3])
    specdecode.verify(p, None, x, rule="recorder", uniforms=u, num_draft_tokens=n)
    assert torch.equal(calls[-1]["uniforms"], u) and torch.equal(calls[-1]["num_draft_tokens"], n)


def test_user_rule_in_verify_logits(user_rules):
    """verify_logits hands a user rule the PROCESSED probabilities (temperature, top-k, ...
    applied to target and draft alike), in the logits' dtype."""
    calls = []
    user_rules("recorder", _recording_rule(calls), needs_draft_probs=True)
    gen = torch.Generator().manual_seed(1)
    tl, dl = torch.randn(3, 3, 9, generator=gen), torch.randn(3, 2, 9, generator=gen)
    x = torch.randint(0, 9, (3, 2), generator=gen)
    out = specdecode.verify_logits(tl, dl, x, rule="recorder", temperature=0.8, top_k=4, top_p=0.9)
    call = calls[-1]
    torch.testing.assert_close(call["target_probs"].double(), reference.process_logits(tl, 0.8, 4, 0.9, 0.0),
                               rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(call["draft_probs"].double(), reference.process_logits(dl, 0.8, 4, 0.9, 0.0),
                               rtol=1e-6, atol=1e-7)
    assert call["target_probs"].dtype == tl.dtype
    assert out.tokens[:, 0].tolist() == tl[:, 0].argmax(-1).tolist()
    # temperature 0: the user rule is kept (not replaced by greedy) and sees one-hot targets
    specdecode.verify_logits(tl, dl, x, rule="recorder", temperature=0.0)
    one_hot = torch.nn.functional.one_hot(tl.argmax(-1), 9).to(tl.dtype)
    assert torch.equal(calls[-1]["target_probs"], one_hot)


def test_user_rule_needing_draft_probs(user_rules):
    """needs_draft_probs=True makes draft_probs mandatory, with an error naming it."""
    user_rules("needs_q", _recording_rule([]), needs_draft_probs=True)
    p, q, x = _inputs()
    specdecode.verify(p, q, x, rule="needs_q")
    with pytest.raises(ValueError, match="draft_probs"):
        specdecode.verify(p, None, x, rule="needs_q")


def test_user_rule_may_return_a_tuple(user_rules):
    """A rule may return a plain (tokens, accepted_len) pair instead of a VerifyOutput."""

    def pair_rule(target_probs, draft_probs, draft_tokens, *, num_draft_tokens, uniforms):
        out = _recording_rule([])(target_probs, draft_probs, draft_tokens, num_draft_tokens=num_draft_tokens,
                                  uniforms=uniforms)
        return out.tokens, out.accepted_len

    user_rules("pair", pair_rule, needs_draft_probs=False)
    p, q, x = _inputs()
    out = specdecode.verify(p, None, x, rule="pair")
    assert isinstance(out, specdecode.VerifyOutput) and out.tokens.shape == (4, 4)


def test_user_rule_with_wrong_output_shape(user_rules):
    """A rule returning outputs of the wrong shape is reported, naming the rule."""

    def bad_rule(target_probs, draft_probs, draft_tokens, *, num_draft_tokens, uniforms):
        B = draft_tokens.shape[0]
        return torch.zeros(B, 1, dtype=torch.int64), torch.zeros(B, dtype=torch.int64)

    user_rules("bad_shape", bad_rule, needs_draft_probs=False)
    p, q, x = _inputs()
    with pytest.raises(ValueError, match="bad_shape"):
        specdecode.verify(p, None, x, rule="bad_shape")


@pytest.mark.parametrize("name", BUILTINS)
def test_builtin_names_refused(name):
    """A built-in rule cannot be replaced, not even with overwrite=True."""
    with pytest.raises(ValueError, match="name"):
        specdecode.register_rule(name, _recording_rule([]))
    with pytest.raises(ValueError, match="name"):
        specdecode.register_rule(name, _recording_rule([]), overwrite=True)
    with pytest.raises(ValueError, match="name"):
        specdecode.unregister_rule(name)


def test_duplicates_refused_unless_overwrite(user_rules):
    """Registering a taken user name fails; overwrite=True replaces the rule in place."""
    user_rules("dup", _recording_rule([]), lossless=False)
    with pytest.raises(ValueError, match="name"):
        specdecode.register_rule("dup", _recording_rule([]))
    specdecode.register_rule("dup", _recording_rule([]), lossless=True, overwrite=True)
    matches = [r for r in specdecode.list_rules() if r.name == "dup"]
    assert len(matches) == 1 and matches[0].lossless is True


@pytest.mark.parametrize("name,fn,exc,match", [
    ("", lambda *a, **k: None, TypeError, "name"),
    (None, lambda *a, **k: None, TypeError, "name"),
    (3, lambda *a, **k: None, TypeError, "name"),
    ("not_callable", 42, TypeError, "fn"),
])
def test_register_rejects_bad_arguments(name, fn, exc, match):
    """register_rule checks its name and function."""
    with pytest.raises(exc, match=match):
        specdecode.register_rule(name, fn)
    assert "not_callable" not in {r.name for r in specdecode.list_rules()}


def test_unregister_unknown():
    """Unregistering a name that was never registered is a ValueError naming it."""
    with pytest.raises(ValueError, match="never_registered"):
        specdecode.unregister_rule("never_registered")
