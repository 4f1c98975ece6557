"""``verify_tree`` (compiled op) against its definition.

- A chain passed as a tree gives exactly the chain op's result, given the same coins (the
  tree layout is the chain's rolled by one): greedy == greedy, specinfer and rrs == token,
  deterministic == token with a one-hot q, typical == typical; ragged rows, V = 7 / 111 / 32000,
  B = 1 / 3 / 17, temperature / top-k / top-p / min-p, temperature 0.
- The op equals the pure-Python reference (``specdecode.trees.reference``) on random trees;
  the kernel computes probabilities in float32, so a row may differ only where the reference's
  decision sits within 1e-5 (relative) of its boundary.
- Output structure (the path follows parent links, tokens are the path's), greedy and typical
  checked against their definitions, the Philox variant equals explicit coins, duplicates and
  bad input raise ValueError / TypeError naming the argument (wrapper and direct op calls).
"""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap

import pytest
import torch

import specdecode
from philox_ref import philox_uniforms
from specdecode import reference
from specdecode.sampling import SamplingParams
from specdecode.trees import TokenTree, list_tree_rules, verify_tree
from specdecode.trees.reference import verify_tree_logits_reference
from test_reference_equality import _filter_margin

OPS = torch.ops.specdecode
SAMPLING = [(1.0, 0, 1.0, 0.0), (0.7, 10, 0.9, 0.05), (1.3, 0, 0.95, 0.0), (0.0, 0, 1.0, 0.0)]
TYPICAL = {"epsilon": 0.3, "delta": 0.6}


def _chain_case(B, k, V, sampling, seed):
    """Peaked correlated logits; drafts sampled from the processed q, or the target's argmax."""
    gen = torch.Generator().manual_seed(seed)
    target = 3.0 * torch.randn(B, k + 1, V, generator=gen)
    draft = target[:, :k] + torch.randn(B, k, V, generator=gen)
    q = reference.process_logits(draft, *sampling) if sampling[0] > 0 else torch.softmax(draft.double(), -1)
    x = torch.multinomial(q.flatten(0, 1), 1, generator=gen).view(B, k)
    x = torch.where(torch.rand(B, k, generator=gen) < 0.3, target[:, :k].argmax(-1), x)
    n = torch.randint(0, k + 1, (B,), generator=gen)
    n[0] = k
    u = torch.rand(B, k + 1, generator=gen, dtype=torch.float64)
    return target, draft, x, n, u


# (tree rule, chain rule, tree options, chain options)
CHAIN_PAIRS = [
    ("greedy", "greedy", {}, {}),
    ("specinfer", "token", {}, {}),
    ("rrs", "token", {}, {}),
    ("deterministic", "token", {}, {}),
    ("typical", "typical", TYPICAL, TYPICAL),
    ("typical", "typical", {**TYPICAL, "sample_correction": True}, {**TYPICAL, "sample_correction": True}),
]


@pytest.mark.parametrize("B,V", [(1, 7), (3, 111), (17, 111), (3, 32000), (17, 7)], ids=lambda v: str(v))
@pytest.mark.parametrize("sampling", SAMPLING, ids=lambda s: "T{}-k{}-p{}-m{}".format(*s))
@pytest.mark.parametrize("pair", CHAIN_PAIRS, ids=lambda c: f"{c[0]}-vs-{c[1]}" + ("-sc" if c[2].get("sample_correction") else ""))
def test_chain_as_tree_equals_chain_op(pair, sampling, B, V):
    """TokenTree.chain through verify_tree == verify_logits on the chain, tokens and lengths
    identical, with the chain coins rolled right by one."""
    tree_rule, chain_rule, tree_options, chain_options = pair
    k = 4
    target, draft, x, n, u = _chain_case(B, k, V, sampling, seed=B * 7 + V)
    T, top_k, top_p, min_p = sampling
    if tree_rule == "deterministic":  # the chain counterpart: token verification with q one-hot on x
        chain_draft = torch.full_like(draft, -math.inf).scatter_(2, x[..., None], 0.0)
    else:
        chain_draft = draft
    chain = specdecode.verify_logits(target, chain_draft if chain_rule == "token" else None, x, rule=chain_rule,
                                     num_draft_tokens=n, uniforms=u, temperature=T, top_k=top_k, top_p=top_p,
                                     min_p=min_p, **chain_options)
    tree = TokenTree.chain(torch.zeros(B, dtype=torch.int64), x, n)
    tree_draft = torch.cat([draft, torch.zeros(B, 1, V)], 1)  # the leaf's q is never read
    out = verify_tree(target, tree_draft, tree, rule=tree_rule, uniforms=torch.roll(u, 1, dims=1),
                      sampling=SamplingParams(*sampling), **tree_options)
    width = int(n.max()) + 1
    assert out.tokens.shape == (B, width)
    assert torch.equal(out.accepted_len, chain.accepted_len)
    assert torch.equal(out.tokens, chain.tokens[:, :width])
    assert bool((chain.tokens[:, width:] == -1).all())
    path = torch.arange(width)[None, :].expand(B, width)
    assert torch.equal(out.accepted_nodes, torch.where(path <= out.accepted_len[:, None], path, -1))


# ------------------------------------------------------------------ op vs the reference


def _tree_case(B, N, V, sampling, seed, max_children=3, related=True):
    """Random trees (at most ``max_children`` children per node, ragged rows) whose children
    are distinct tokens drawn without replacement from the processed q at their parent (a few
    replaced by the target's argmax), peaked logits (draft correlated with the target unless
    ``related`` is False), coins with a few exact zeros."""
    gen = torch.Generator().manual_seed(seed)
    target = 3.0 * torch.randn(B, N, V, generator=gen)
    noise = torch.randn(B, N, V, generator=gen)
    draft = target + noise if related else 2.0 * noise
    T = sampling[0]
    q = reference.process_logits(draft, *sampling) if T > 0 else torch.softmax(draft.double(), -1)
    parents = torch.full((B, N), -1, dtype=torch.int64)
    tokens = torch.zeros(B, N, dtype=torch.int64)
    num_nodes = torch.randint(1, N + 1, (B,), generator=gen)
    num_nodes[0] = N
    for b in range(B):
        counts = [0] * N
        for i in range(1, N):
            open_nodes = [v for v in range(i) if counts[v] < min(max_children, V)]
            parent = open_nodes[int(torch.randint(len(open_nodes), (1,), generator=gen))]
            parents[b, i] = parent
            counts[parent] += 1
        for v in range(N):
            kids = [i for i in range(1, N) if int(parents[b, i]) == v]
            if kids:
                weights = q[b, v] + 1e-3  # every token possible, so k distinct ones exist
                drawn = torch.multinomial(weights, len(kids), replacement=False, generator=gen)
                if related and torch.rand(1, generator=gen) < 0.4:
                    best = int(target[b, v].argmax())
                    if best not in drawn.tolist():
                        drawn[0] = best
                tokens[b, kids] = drawn
    u = torch.rand(B, N, generator=gen, dtype=torch.float64)
    u[torch.rand(B, N, generator=gen) < 0.03] = 0.0
    return target, draft, TokenTree(tokens, parents, num_nodes), u


def _check_against_reference(target, draft, tree, u, rule, sampling, **options) -> int:
    params = SamplingParams(*sampling)
    out = verify_tree(target, draft, tree, rule=rule, sampling=params, uniforms=u, **options)
    margins: list[float] = []
    ref = verify_tree_logits_reference(target, draft, tree, rule=rule, uniforms=u, sampling=params, margins=margins,
                                       **options)
    assert out.tokens.shape == ref.tokens.shape
    bad = ~((out.tokens == ref.tokens).all(1) & (out.accepted_len == ref.accepted_len)
            & (out.accepted_nodes == ref.accepted_nodes).all(1))
    for b in torch.nonzero(bad).flatten().tolist():
        n = int(tree.num_nodes[b])
        margin = margins[b]
        for row in list(target[b, :n]) + (list(draft[b, :n]) if draft is not None else []):
            margin = min(margin, _filter_margin(row, *sampling[:1], sampling[2], sampling[3], sampling[1]))
        assert margin < 1e-5, (f"row {b}: op {out.tokens[b].tolist()} nodes {out.accepted_nodes[b].tolist()} vs "
                               f"reference {ref.tokens[b].tolist()} nodes {ref.accepted_nodes[b].tolist()}, margin {margin:.3g}")
    assert int(bad.sum()) <= max(1, bad.numel() // 100), "more than 1% of rows differ"
    return int(bad.sum())


RULE_OPTIONS = [("greedy", {}), ("specinfer", {}), ("rrs", {}), ("deterministic", {}), ("typical", TYPICAL),
                ("typical", {"epsilon": 0.05, "delta": 0.1, "sample_correction": True})]


@pytest.mark.parametrize("B,N,V", [(1, 9, 7), (3, 13, 111), (17, 11, 111), (3, 7, 32000)], ids=lambda v: str(v))
@pytest.mark.parametrize("sampling", SAMPLING, ids=lambda s: "T{}-k{}-p{}-m{}".format(*s))
@pytest.mark.parametrize("rule,options", RULE_OPTIONS, ids=lambda v: v if isinstance(v, str) else "-".join(map(str, v.values())))
def test_op_equals_reference(rule, options, sampling, B, N, V):
    """verify_tree == the reference on random ragged trees (mismatches only at boundaries)."""
    target, draft, tree, u = _tree_case(B, N, V, sampling, seed=B + N + V)
    _check_against_reference(target, draft, tree, u, rule, sampling, **options)


def test_op_equals_reference_many_rejections():
    """Wide nodes (up to 6 children) drafted from a draft unrelated to the target, so children
    are often rejected and the residual updates (R, and D for rrs) run several times per node;
    float32, float64 and bfloat16 logits. The case is sharp enough to tell the rules apart:
    rrs and specinfer (which differ only from a node's second rejected child on) disagree on
    some rows, so an rrs kernel that skipped its D update would fail here."""
    target, draft, tree, u = _tree_case(80, 16, 9, (1.0, 0, 1.0, 0.0), seed=5, max_children=6, related=False)
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        total = 0
        for rule in ("specinfer", "rrs", "deterministic"):
            total += _check_against_reference(target.to(dtype), draft.to(dtype), tree, u, rule, (1.0, 0, 1.0, 0.0))
        assert total <= 2
    rrs = verify_tree(target, draft, tree, rule="rrs", uniforms=u)
    specinfer = verify_tree(target, draft, tree, rule="specinfer", uniforms=u)
    assert int((rrs.tokens != specinfer.tokens).any(1).sum()) >= 3


def test_output_structure_and_greedy_definition():
    """Paths follow parent links from the root, output tokens are the path's tokens then one
    emitted token, -1 after; greedy accepts exactly the children equal to argmax p and emits
    the argmax of the last node, whose children all differ from it."""
    target, draft, tree, u = _tree_case(40, 12, 11, (1.0, 0, 1.0, 0.0), seed=9)
    for rule in ("greedy", "specinfer", "rrs", "deterministic"):
        out = verify_tree(target, draft, tree, rule=rule, uniforms=u)
        for b in range(40):
            tau = int(out.accepted_len[b])
            nodes = out.accepted_nodes[b].tolist()
            assert nodes[0] == 0 and all(v == -1 for v in nodes[tau + 1:])
            for k in range(tau):
                assert int(tree.parents[b, nodes[k + 1]]) == nodes[k]
                assert int(out.tokens[b, k]) == int(tree.tokens[b, nodes[k + 1]])
            assert 0 <= int(out.tokens[b, tau]) < 11 and all(t == -1 for t in out.tokens[b, tau + 1:].tolist())
            if rule == "greedy":
                for k in range(tau):
                    assert int(out.tokens[b, k]) == int(target[b, nodes[k]].argmax())
                last = nodes[tau]
                best = int(target[b, last].argmax())
                assert int(out.tokens[b, tau]) == best
                kids = [i for i in range(int(tree.num_nodes[b])) if int(tree.parents[b, i]) == last and i > 0]
                assert all(int(tree.tokens[b, c]) != best for c in kids)


def test_typical_against_its_definition():
    """typical accepts the first child (index order) with p(x) > min(eps, delta exp(-H(p)))
    and emits argmax p: checked node by node from the op's own output."""
    target, draft, tree, u = _tree_case(30, 10, 13, (1.0, 0, 1.0, 0.0), seed=11)
    out = verify_tree(target, None, tree, rule="typical", uniforms=u, **TYPICAL)
    p = torch.softmax(target.double(), -1)
    for b in range(30):
        nodes = out.accepted_nodes[b].tolist()
        tau = int(out.accepted_len[b])
        for k in range(tau + 1):
            v = nodes[k]
            h = float(-(p[b, v] * p[b, v].log()).sum())
            threshold = min(TYPICAL["epsilon"], TYPICAL["delta"] * math.exp(-h))
            kids = [i for i in range(1, int(tree.num_nodes[b])) if int(tree.parents[b, i]) == v]
            passing = [c for c in kids if float(p[b, v, tree.tokens[b, c]]) > threshold]
            if k < tau:
                assert passing and passing[0] == nodes[k + 1]
            else:
                assert not passing and int(out.tokens[b, tau]) == int(p[b, v].argmax())


def test_philox_variant_equals_explicit_coins():
    """verify_tree with philox_seed/offset == the same call with uniforms[b, c] =
    philox_uniform(seed, offset, b, c); the direct op too."""
    target, draft, tree, _ = _tree_case(5, 8, 20, (1.0, 0, 1.0, 0.0), seed=13)
    seed, offset = 1234, 77
    coins = philox_uniforms(seed, offset, 5, 7)  # [B, N] with N = 8
    for rule in ("specinfer", "rrs", "deterministic", "spectr", "spechub", "traversal", "traversal_iid"):
        philox = verify_tree(target, draft, tree, rule=rule, philox_seed=torch.tensor([seed]),
                             philox_offset=torch.tensor([offset]))
        explicit = verify_tree(target, draft, tree, rule=rule, uniforms=coins)
        assert all(torch.equal(a, b) for a, b in zip(philox, explicit))


def test_seeded_generator_and_float32_uniforms():
    target, draft, tree, u = _tree_case(20, 9, 30, (1.0, 0, 1.0, 0.0), seed=15)
    a = verify_tree(target, draft, tree, rule="rrs", generator=torch.Generator().manual_seed(3))
    b = verify_tree(target, draft, tree, rule="rrs", generator=torch.Generator().manual_seed(3))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    c = verify_tree(target, draft, tree, rule="rrs", uniforms=u.float())
    d = verify_tree(target, draft, tree, rule="rrs", uniforms=u.float().double())
    assert all(torch.equal(x, y) for x, y in zip(c, d))


def test_root_only_tree_emits_from_p():
    """num_nodes = 1: nothing to accept; a lossless rule emits y ~ p_root by inverse CDF."""
    target = torch.tensor([[[0.0, math.log(3.0), -math.inf]]])
    tree = TokenTree(torch.tensor([[7]]), torch.tensor([[-1]]), torch.tensor([1]))
    for u0, y in ((0.1, 0), (0.3, 1), (0.99, 1)):
        out = verify_tree(target, None, tree, rule="deterministic", uniforms=torch.tensor([[u0]], dtype=torch.float64))
        assert out.tokens.tolist() == [[y]] and out.accepted_len.tolist() == [0] and out.accepted_nodes.tolist() == [[0]]


def test_rule_table():
    rules = {r.name: r for r in list_tree_rules()}
    compiled = {"greedy", "specinfer", "rrs", "deterministic", "typical", "spectr", "spechub", "traversal",
                "traversal_iid", "gbv"}
    python_only: set[str] = set()
    assert set(rules) == compiled | python_only
    assert {n for n, r in rules.items() if r.compiled} == compiled
    assert [n for n, r in rules.items() if r.needs_draft_logits and r.compiled] == [
        "specinfer", "rrs", "traversal", "traversal_iid", "gbv", "spectr", "spechub"]
    assert all(rules[n].needs_draft_logits for n in python_only)
    # greedy: lossless at temperature 0 only, so not marked lossless (issue 36, item 5)
    assert {n for n, r in rules.items() if not r.lossless} == {"typical", "greedy"}
    assert "temperature 0" in rules["greedy"].drafting
    assert "replacement" in rules["rrs"].drafting and "i.i.d." in rules["specinfer"].drafting


# ----------------------------------------------------------------------------- bad input


def test_duplicate_siblings():
    """Repeated sibling tokens are bad input for rrs and deterministic (their schemes make
    siblings distinct), fine for specinfer (i.i.d.), greedy and typical; a repeat across
    different parents is fine for every rule."""
    V = 6
    target = torch.randn(1, 5, V, generator=torch.Generator().manual_seed(0))
    parents = torch.tensor([[-1, 0, 0, 1, 2]])
    dup = TokenTree(torch.tensor([[0, 3, 3, 1, 2]]), parents, torch.tensor([5]))
    cousins = TokenTree(torch.tensor([[0, 3, 4, 1, 1]]), parents, torch.tensor([5]))
    for rule in ("rrs", "deterministic"):
        with pytest.raises(ValueError, match="tree_tokens"):
            verify_tree(target, target, dup, rule=rule)
        verify_tree(target, target, cousins, rule=rule)
    for rule in ("specinfer", "greedy", "typical"):
        verify_tree(target, target, dup, rule=rule)
    # duplicates only in a padding slot are ignored
    verify_tree(target, target, TokenTree(torch.tensor([[0, 3, 3, 1, 2]]), parents, torch.tensor([2])), rule="rrs")


def _valid():
    gen = torch.Generator().manual_seed(1)
    tree = TokenTree(torch.tensor([[0, 1, 2, 3], [4, 0, 1, 2]]), torch.tensor([[-1, 0, 0, 1], [-1, 0, 1, 1]]),
                     torch.tensor([4, 3]))
    return {"target_logits": torch.randn(2, 4, 5, generator=gen), "draft_logits": torch.randn(2, 4, 5, generator=gen),
            "tree": tree}


def _tree_with(**fields):
    base = _valid()["tree"]
    values = {"tokens": base.tokens, "parents": base.parents, "num_nodes": base.num_nodes, **fields}
    return TokenTree(values["tokens"], values["parents"], values["num_nodes"])


def _set(tensor, index, value):
    tensor = tensor.clone()
    tensor[index] = value
    return tensor


VERIFY_CASES = [
    ("token_out_of_range", lambda a: {**a, "tree": _tree_with(tokens=_set(a["tree"].tokens, (0, 2), 5))}, {}, ValueError, "tree_tokens"),
    ("token_negative", lambda a: {**a, "tree": _tree_with(tokens=_set(a["tree"].tokens, (1, 1), -1))}, {}, ValueError, "tree_tokens"),
    ("bad_parent", lambda a: {**a, "tree": _tree_with(parents=_set(a["tree"].parents, (0, 2), 2))}, {}, ValueError, "parents"),
    ("bad_root", lambda a: {**a, "tree": _tree_with(parents=_set(a["tree"].parents, (1, 0), 0))}, {}, ValueError, "parents"),
    ("num_nodes_zero", lambda a: {**a, "tree": _tree_with(num_nodes=torch.tensor([0, 3]))}, {}, ValueError, "num_nodes"),
    ("num_nodes_above", lambda a: {**a, "tree": _tree_with(num_nodes=torch.tensor([4, 5]))}, {}, ValueError, "num_nodes"),
    ("nan_target", lambda a: {**a, "target_logits": _set(a["target_logits"], (0, 0, 1), math.nan)}, {}, ValueError, "target_logits"),
    ("inf_draft", lambda a: {**a, "draft_logits": _set(a["draft_logits"], (1, 0, 2), math.inf)}, {}, ValueError, "draft_logits"),
    ("all_masked_target", lambda a: {**a, "target_logits": _set(a["target_logits"], (0, 0), -math.inf)}, {}, ValueError, "target_logits"),
    ("draft_missing", lambda a: {**a, "draft_logits": None}, {}, ValueError, "draft_logits"),
    ("draft_missing_rrs", lambda a: {**a, "draft_logits": None}, {"rule": "rrs"}, ValueError, "draft_logits"),
    ("draft_vocab", lambda a: {**a, "draft_logits": torch.zeros(2, 4, 6)}, {}, ValueError, "draft_logits"),
    ("draft_dtype", lambda a: {**a, "draft_logits": a["draft_logits"].double()}, {}, TypeError, "draft_logits"),
    ("draft_nodes", lambda a: {**a, "draft_logits": a["draft_logits"][:, :3]}, {}, ValueError, "draft_logits"),
    ("target_nodes", lambda a: {**a, "target_logits": a["target_logits"][:, :3]}, {}, ValueError, "target_logits"),
    ("target_2d", lambda a: {**a, "target_logits": a["target_logits"][0]}, {}, ValueError, "target_logits"),
    ("target_int", lambda a: {**a, "target_logits": torch.zeros(2, 4, 5, dtype=torch.int64)}, {}, TypeError, "target_logits"),
    ("target_meta", lambda a: {**a, "target_logits": a["target_logits"].to("meta")}, {}, ValueError, "target_logits"),
    ("tree_not_tree", lambda a: {**a, "tree": a["tree"].parents}, {}, TypeError, "tree"),
    ("uniform_one", lambda a: a, {"uniforms": torch.ones(2, 4, dtype=torch.float64)}, ValueError, "uniforms"),
    ("uniform_shape", lambda a: a, {"uniforms": torch.zeros(2, 5, dtype=torch.float64)}, ValueError, "uniforms"),
    ("uniform_int", lambda a: a, {"uniforms": torch.zeros(2, 4, dtype=torch.int64)}, TypeError, "uniforms"),
    ("uniform_and_generator", lambda a: a, {"uniforms": torch.zeros(2, 4, dtype=torch.float64),
                                            "generator": torch.Generator()}, ValueError, "uniforms"),
    ("philox_half", lambda a: a, {"philox_seed": torch.tensor([1])}, ValueError, "philox_offset"),
    ("philox_with_uniforms", lambda a: a, {"philox_seed": torch.tensor([1]), "philox_offset": torch.tensor([0]),
                                           "uniforms": torch.zeros(2, 4, dtype=torch.float64)}, ValueError, "philox"),
    ("philox_float", lambda a: a, {"philox_seed": torch.tensor([1.0]), "philox_offset": torch.tensor([0])}, TypeError, "philox_seed"),
    ("unknown_rule", lambda a: a, {"rule": "token"}, ValueError, "rule"),
    ("rule_not_str", lambda a: a, {"rule": 1}, TypeError, "rule"),
    ("unknown_option", lambda a: a, {"rule": "rrs", "epsilon": 0.1}, TypeError, "epsilon"),
    ("typical_negative_delta", lambda a: a, {"rule": "typical", "delta": -1.0}, ValueError, "delta"),
    ("temperature_negative", lambda a: a, {"temperature": -1.0}, ValueError, "temperature"),
    ("top_p_zero", lambda a: a, {"top_p": 0.0}, ValueError, "top_p"),
    ("sampling_and_keywords", lambda a: a, {"sampling": SamplingParams(), "temperature": 0.5}, ValueError, "sampling"),
]


@pytest.mark.parametrize("make,options,exc,match", [c[1:] for c in VERIFY_CASES], ids=[c[0] for c in VERIFY_CASES])
def test_verify_tree_bad_input(make, options, exc, match):
    args = make(_valid())
    kwargs = {"rule": "specinfer", **options}
    with pytest.raises(exc, match=match):
        verify_tree(args["target_logits"], args["draft_logits"], args["tree"], **kwargs)


def _op_args():
    a = _valid()
    t = a["tree"]
    u = torch.rand(2, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    return [a["target_logits"], a["draft_logits"], t.tokens, t.parents, t.num_nodes, u, 1.0, 0, 1.0, 0.0, "rrs", []]


OP_CASES = [
    ("parents_after_child", 3, torch.tensor([[-1, 0, 3, 1], [-1, 0, 1, 1]]), ValueError, "parents"),
    ("num_nodes_negative", 4, torch.tensor([-1, 3]), ValueError, "num_nodes"),
    ("num_nodes_shape", 4, torch.tensor([4]), ValueError, "num_nodes"),
    ("tokens_huge", 2, torch.tensor([[0, 2**40, 2, 3], [4, 0, 1, 2]]), ValueError, "tree_tokens"),
    ("tokens_shape", 2, torch.zeros(2, 3, dtype=torch.int64), ValueError, "tree_tokens"),
    ("tokens_int32", 2, torch.zeros(2, 4, dtype=torch.int32), TypeError, "tree_tokens"),
    ("uniforms_float32", 5, torch.zeros(2, 4), TypeError, "uniforms"),
    ("uniforms_shape", 5, torch.zeros(2, 3, dtype=torch.float64), ValueError, "uniforms"),
    ("target_shape", 0, torch.zeros(2, 3, 5), ValueError, "target_logits"),
    ("draft_none", 1, None, ValueError, "draft_logits"),
    ("temperature_nan", 6, math.nan, ValueError, "temperature"),
    ("top_k_negative", 7, -2, ValueError, "top_k"),
    ("rule_unknown", 10, "block", ValueError, "rule"),
    ("rule_params", 11, [1.0], ValueError, "rule_params"),
    ("too_many_nodes", 3, torch.full((2, 4097), -1), ValueError, "parents"),
]


@pytest.mark.parametrize("index,value,exc,match", [c[1:] for c in OP_CASES], ids=[c[0] for c in OP_CASES])
def test_direct_op_bad_input(index, value, exc, match):
    args = _op_args()
    args[index] = value
    with pytest.raises(exc, match=match):
        OPS.verify_tree(*args)


def test_direct_op_calls_never_crash():
    """Garbage straight into torch.ops.specdecode.verify_tree / verify_tree_philox raises in a
    child process instead of killing it; the empty batch returns empty outputs."""
    code = textwrap.dedent("""
        import math, torch, specdecode
        op, philox = torch.ops.specdecode.verify_tree, torch.ops.specdecode.verify_tree_philox
        t = torch.randn(2, 3, 4)
        ok_tokens, ok_parents, ok_n = torch.tensor([[0, 1, 2]] * 2), torch.tensor([[-1, 0, 0]] * 2), torch.tensor([3, 3])
        u = torch.rand(2, 3, dtype=torch.float64)
        cases = [
            lambda: op(t, t, ok_tokens, torch.tensor([[-1, 2**40, -2**40]] * 2), ok_n, u, 1.0, 0, 1.0, 0.0, "rrs", []),
            lambda: op(t, t, torch.tensor([[0, -2**62, 2**62]] * 2), ok_parents, ok_n, u, 1.0, 0, 1.0, 0.0, "specinfer", []),
            lambda: op(t, t, ok_tokens, ok_parents, torch.tensor([2**40, -2**40]), u, 1.0, 0, 1.0, 0.0, "greedy", []),
            lambda: op(t.fill_(math.nan), None, ok_tokens, ok_parents, ok_n, u, 0.0, 0, 1.0, 0.0, "greedy", []),
            lambda: philox(t, t, ok_tokens, ok_parents, ok_n, torch.tensor([1, 2]), torch.tensor([0]), 1.0, 0, 1.0, 0.0, "rrs", []),
            lambda: op(torch.randn(2, 3, 0), None, ok_tokens, ok_parents, ok_n, u, 1.0, 0, 1.0, 0.0, "greedy", []),
        ]
        raised = 0
        for case in cases:
            try:
                case()
            except (ValueError, TypeError, RuntimeError):
                raised += 1
        e = op(torch.randn(0, 3, 4), None, torch.zeros(0, 3, dtype=torch.int64), torch.zeros(0, 3, dtype=torch.int64),
               torch.zeros(0, dtype=torch.int64), torch.zeros(0, 3, dtype=torch.float64), 1.0, 0, 1.0, 0.0, "greedy", [])
        print("raised", raised, [tuple(x.shape) for x in e])
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "raised 6 [(0, 3), (0,), (0, 3)]" in result.stdout, result.stdout


def test_inputs_are_not_modified():
    a = _valid()
    before = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in a.items()}
    tree_before = [t.clone() for t in (a["tree"].tokens, a["tree"].parents, a["tree"].num_nodes)]
    u = torch.rand(2, 4, dtype=torch.float64)
    u_before = u.clone()
    verify_tree(a["target_logits"], a["draft_logits"], a["tree"], rule="rrs", uniforms=u, top_k=3, top_p=0.8)
    assert torch.equal(a["target_logits"], before["target_logits"]) and torch.equal(a["draft_logits"], before["draft_logits"])
    assert all(torch.equal(x, y) for x, y in zip((a["tree"].tokens, a["tree"].parents, a["tree"].num_nodes), tree_before))
    assert torch.equal(u, u_before)
