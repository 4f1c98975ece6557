"""Tree rules can be extended (issue 36, item 4): a rule written in plain PyTorch is registered
with ``register_tree_rule``, used by ``verify_tree`` and ``generate``, its options reach it, its
output is checked like a chain rule's (errors name the rule and the field), its lossless claim is
tied to a children scheme, and ``specdecode.testing.exact_tree_test`` tells a lossless rule from a
broken variant of it."""

from __future__ import annotations

import pytest
import torch
from test_generate_models import left_padded, make_pair

import specdecode
from specdecode.testing import exact_tree_test
from specdecode.trees import (TokenTree, get_tree_rule, list_tree_rules, register_tree_rule, unregister_tree_rule,
                              verify_tree)
from specdecode.trees.reference import NODE_RULES, node_rule_as_tree_rule

top_k_node = NODE_RULES["deterministic"]  # wrapped and registered as a user rule below


@pytest.fixture
def tree_rules():
    names: list[str] = []

    def register(name, fn, **kwargs):
        info = register_tree_rule(name, fn, **kwargs)
        names.append(name)
        return info

    yield register
    for name in names:
        if name in {r.name for r in list_tree_rules()}:
            unregister_tree_rule(name)


def top_k_node_broken(p, q, children, chooser, **_):
    """The deterministic-children rule, forgetting to remove a rejected child from R: biased."""
    for j, (node, x) in enumerate(children):
        if chooser.accept(node, p[x]):
            return ("accept", j)
    return ("emit", chooser.sample(p))


def _tree(B=2):
    tokens = torch.tensor([[0, 3, 1, 2, 4]] * B)
    parents = torch.tensor([[-1, 0, 0, 1, 1]] * B)
    return TokenTree(tokens, parents, torch.full((B,), 5))


def test_register_list_verify_and_unregister(tree_rules):
    info = tree_rules("my_top_k", node_rule_as_tree_rule(top_k_node), lossless=True, children="deterministic",
                      needs_draft_logits=False, description="top-k children, by hand")
    assert not info.builtin and info.children == ("deterministic",) and info.lossless
    assert list_tree_rules()[-1].name == "my_top_k" and "[user]" in str(list_tree_rules()[-1])
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 6, generator=gen)
    coins = torch.rand(2, 5, generator=gen, dtype=torch.float64)
    mine = verify_tree(logits, None, _tree(), rule="my_top_k", uniforms=coins)
    builtin = verify_tree(logits, None, _tree(), rule="deterministic", uniforms=coins)
    assert torch.equal(mine.tokens, builtin.tokens) and torch.equal(mine.accepted_nodes, builtin.accepted_nodes)
    unregister_tree_rule("my_top_k")
    with pytest.raises(ValueError, match="unknown tree rule 'my_top_k'"):
        verify_tree(logits, None, _tree(), rule="my_top_k")


def test_chain_rule_name_is_refused_with_a_pointer(user_rules):
    user_rules("chain_only", lambda tp, dp, dt, *, num_draft_tokens, uniforms: None)
    with pytest.raises(ValueError, match="register_tree_rule"):
        verify_tree(torch.randn(2, 5, 6), None, _tree(), rule="chain_only")


def test_registration_checks(tree_rules):
    with pytest.raises(ValueError, match="built-in tree rule"):
        register_tree_rule("rrs", node_rule_as_tree_rule(top_k_node))
    with pytest.raises(ValueError, match="children"):
        register_tree_rule("x", node_rule_as_tree_rule(top_k_node), lossless=True)
    with pytest.raises(ValueError, match="children"):
        register_tree_rule("x", node_rule_as_tree_rule(top_k_node), children="sideways")
    with pytest.raises(TypeError, match="fn: a rule is called as"):
        register_tree_rule("x", lambda a: None)


def test_options_reach_a_user_tree_rule(tree_rules):
    seen = []

    def node(p, q, children, chooser, *, bonus=0.0):
        seen.append(bonus)
        return top_k_node(p, q, children, chooser)

    def rule(target_probs, draft_probs, tree, *, uniforms, bonus=0.0):
        return node_rule_as_tree_rule(node)(target_probs, draft_probs, tree, uniforms=uniforms, bonus=bonus)

    info = tree_rules("with_bonus", rule, needs_draft_logits=False)
    assert info.options == {"bonus": 0.0}
    verify_tree(torch.randn(2, 5, 6), None, _tree(), rule="with_bonus", bonus=0.25)
    assert seen and set(seen) == {0.25}


def _returning(kind):
    good = node_rule_as_tree_rule(top_k_node)

    def rule(target_probs, draft_probs, tree, *, uniforms):
        tokens, accepted, nodes = good(target_probs, draft_probs, tree, uniforms=uniforms)
        if kind == "int32":
            return tokens.int(), accepted, nodes
        if kind == "pair":
            return tokens, accepted
        if kind == "too_long":
            return tokens, accepted + 3, nodes
        if kind == "not_a_path":  # node 2 is not a child of node 1
            nodes = torch.tensor([[0, 1, 2]] * tokens.shape[0])
            return torch.tensor([[3, 1, 0]] * tokens.shape[0]), torch.full_like(accepted, 2), nodes
        if kind == "undrafted":  # accepted node 1 holds token 3; claim 5
            nodes = torch.tensor([[0, 1, -1]] * tokens.shape[0])
            return torch.tensor([[5, 0, -1]] * tokens.shape[0]), torch.ones_like(accepted), nodes
        if kind == "emit_V":
            return tokens.scatter(1, accepted[:, None], target_probs.shape[2]), accepted, nodes
        raise AssertionError(kind)

    return rule


TREE_CASES = {
    "int32": (TypeError, "tokens of dtype torch.int32"),
    "pair": (TypeError, r"tuple of 2 items; expected 3"),
    "too_long": (ValueError, r"accepted_len\[0\] = \d, outside \[0, max_depth\] = \[0, 2\]"),
    "not_a_path": (ValueError, r"accepted_nodes\[0, 2\] = 2, which is not a child of node 1"),
    "undrafted": (ValueError, r"tokens\[0, 0\] = 5, but accepted node 1 holds 3"),
    "emit_V": (ValueError, r"the emitted token, outside \[0, V\) = \[0, 6\)"),
}


@pytest.mark.parametrize("kind", sorted(TREE_CASES))
def test_tree_rule_output_is_checked(tree_rules, kind):
    tree_rules(f"bad_{kind}", _returning(kind), needs_draft_logits=False)
    error, message = TREE_CASES[kind]
    with pytest.raises(error, match=f"tree rule 'bad_{kind}'") as info:
        verify_tree(torch.randn(2, 5, 6), None, _tree(), rule=f"bad_{kind}")
    assert info.match(message)


def test_generate_with_a_user_tree_rule(tree_rules):
    """generate drafts trees and verifies them with the user rule; a lossless claim for another
    children scheme is refused as for built-in rules; a malformed output names the rule."""
    target, draft = make_pair("llama")
    ids, mask = left_padded([5], seed=1)
    tree_rules("my_top_k", node_rule_as_tree_rule(top_k_node), lossless=True, children="deterministic",
               needs_draft_logits=False)
    kwargs = dict(tree=[[0], [1], [0, 0]], max_new_tokens=12, pad_token_id=0)
    mine = specdecode.generate(target, draft, ids, mask, rule="my_top_k", **kwargs)
    assert mine.stats.tree_rule == "my_top_k"
    builtin = specdecode.generate(target, draft, ids, mask, rule="deterministic", **kwargs)
    assert torch.equal(mine.sequences, builtin.sequences)  # greedy: both the greedy walk's output
    sampled = dict(kwargs, tree="static", tree_children="without_replacement", do_sample=True)
    with pytest.raises(ValueError, match="lossless only for children drafted deterministic"):
        specdecode.generate(target, draft, ids, mask, rule="my_top_k", **sampled)
    tree_rules("bad_emit_V", _returning("emit_V"), needs_draft_logits=False)
    with pytest.raises(ValueError, match="tree rule 'bad_emit_V' returned tokens"):
        specdecode.generate(target, draft, ids, mask, rule="bad_emit_V", **kwargs)


def test_exact_tree_test_passes_the_rule_and_rejects_its_broken_variant(tree_rules):
    tree_rules("my_top_k", node_rule_as_tree_rule(top_k_node), lossless=True, children="deterministic",
               needs_draft_logits=False)
    tree_rules("my_top_k_broken", node_rule_as_tree_rule(top_k_node_broken), needs_draft_logits=False)
    kwargs = dict(children="deterministic", num_samples=6000, seed=1)
    assert exact_tree_test("my_top_k", **kwargs).passed
    assert not exact_tree_test("my_top_k_broken", **kwargs).passed


@pytest.mark.parametrize("rule,children", [("specinfer", "iid"), ("rrs", "without_replacement"),
                                           ("deterministic", "deterministic"), ("traversal", "without_replacement")])
def test_exact_tree_test_passes_built_in_lossless_rules(rule, children):
    for seed in (1, 2):
        result = exact_tree_test(rule, children=children, num_samples=30_000, seed=seed)
        assert result.passed, f"{rule} {children} seed {seed}: {result}"


def test_exact_tree_test_rejects_a_rule_on_the_wrong_scheme():
    """specinfer is exact for i.i.d. children, not for children drawn without replacement."""
    result = exact_tree_test("specinfer", children="without_replacement", num_samples=30_000, seed=1)
    assert not result.passed, str(result)


def test_node_rules_listed_in_the_reference_are_usable():
    assert "deterministic" in NODE_RULES and get_tree_rule("deterministic").builtin
