"""Losslessness of the tree rules (token-trees spec §5), proved exactly, plus the same harness
rejecting deliberately broken rules and drafting schemes.

**Exact tests (deterministic, cannot be lucky).** For synthetic context-dependent target/draft
tables over V = 3..4 with Fraction rows (zeros, one-hots, p == q, near-uniform, peaked), small
tree shapes (depth 2-3, branching 2-3) and the drafting scheme each rule assumes (i.i.d.,
without replacement, top-k deterministic), ``tree_stat_utils.tree_law`` enumerates every draft
draw and integrates every coin of the rule's reference node function exactly. Completing each
output to depth + 1 tokens from the target's conditionals must give EXACTLY the target's joint
(total variation 0 as a Fraction). The node functions are the ones in
``specdecode.trees.reference``, which ``test_tree_verify.py`` shows the compiled op follows.
Each lossless rule has a broken variant (a wrong rule or a wrong drafting scheme) that the same
check rejects on the same tables.

**Expected accepted length**, exactly: the chain shape equals the chain token rule's exact
value; adding a sibling never lowers it for rrs, deterministic (and specinfer).

**Through the compiled op.** One chi-square test per lossless rule at a fixed seed with 10^5
trees drafted by the rule's scheme (the op's float32 arithmetic included), greedy at
temperature 0 reproducing the target's greedy path exactly, and the broken drafting schemes
rejected by the same chi-square test. ``typical`` is lossy: its law differs from the target's.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch

import specdecode
import stat_utils as su
import tree_stat_utils as tu
from specdecode.trees import reference as ref

# (V, branching per depth, seed): depth 2-3, branching 2-3, V 3-4.
SHAPES = [(3, [2, 2], 0), (4, [3, 2], 1), (4, [2, 2, 2], 2), (3, [3, 3], 3), (4, [3, 1, 2], 4), (3, [2, 3], 5)]
# Configurations on which every broken variant must fail (the lossless rules pass them too).
BROKEN_SHAPES = [(4, [3, 2], 1), (4, [2, 2, 2], 2)]
# Table families that stress one corner each: (target kinds, draft relations).
FAMILIES = {
    "p_equals_q": (tu.ROW_KINDS, ("equal",)),
    "one_hot_targets": (("one_hot",), tu.DRAFT_RELATIONS),
    "one_hot_drafts": (tu.ROW_KINDS, ("one_hot",)),
    "sparse": (("sparse", "one_hot"), ("sparse", "one_hot")),
    "peaked_drafts": (("near_uniform", "random"), ("peaked",)),
}
LOSSLESS = {"specinfer": "iid", "rrs": "without_replacement", "deterministic": "top_k"}


def _cfg_id(cfg):
    V, branching, seed = cfg
    return f"V{V}-b{''.join(map(str, branching))}-s{seed}"


def _tv(tables, shape, node_rule, scheme, **options) -> Fraction:
    return tu.law_difference(tu.tree_law(tables, shape, node_rule, scheme, options), tables, shape)


# ----------------------------------------------------------------------- the exact law


@pytest.mark.parametrize("rule", sorted(LOSSLESS))
@pytest.mark.parametrize("cfg", SHAPES, ids=_cfg_id)
def test_exact_law_equals_target(rule, cfg):
    """Each lossless rule, with children drafted by its scheme, outputs exactly the target's
    joint (as Fractions: total variation exactly 0)."""
    V, branching, seed = cfg
    tables = tu.ExactTables(V, seed)
    shape = tu.branching_shape(branching)
    assert _tv(tables, shape, ref.NODE_RULES[rule], LOSSLESS[rule]) == 0


@pytest.mark.parametrize("rule", sorted(LOSSLESS))
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_exact_law_table_families(rule, family):
    """Lossless also when p == q everywhere, on one-hot targets (temperature 0), one-hot drafts
    (a greedy drafter), sparse rows with disjoint supports, and peaked drafts over near-uniform
    targets; also on an irregular shape whose nodes have 3, 1 and 0 children."""
    target_kinds, relations = FAMILIES[family]
    tables = tu.ExactTables(4, 10 + sorted(FAMILIES).index(family), target_kinds=target_kinds,
                            draft_relations=relations)
    irregular = ((((), ()), (), ()), ((),), ())
    for shape in (tu.branching_shape([3, 2]), irregular):
        assert _tv(tables, shape, ref.NODE_RULES[rule], LOSSLESS[rule]) == 0, f"{rule} {family} {shape}"


@pytest.mark.parametrize("cfg", SHAPES, ids=_cfg_id)
def test_exact_greedy_at_temperature_zero(cfg):
    """Greedy over one-hot (temperature-0) targets returns the target's greedy path whatever
    the children are (drafted i.i.d. from q here, duplicates included)."""
    V, branching, seed = cfg
    tables = tu.ExactTables(V, seed).greedy()
    assert _tv(tables, tu.branching_shape(branching), ref.greedy_node, "iid") == 0


# ----------------------------------------------------------------------- broken variants


def rrs_stale_proposal(p, q, children, chooser, **_):
    """BROKEN rrs: keeps the un-updated D = q after a rejection (children without replacement)."""
    R = list(p)
    for j, (node, x) in enumerate(children):
        if chooser.accept(node, ref.ratio(R[x], q[x])):
            return ("accept", j)
        R = ref.normalized_or([max(r - d, 0) for r, d in zip(R, q)], p)
    return ("emit", chooser.sample(R))


def deterministic_no_zeroing(p, q, children, chooser, **_):
    """BROKEN deterministic: forgets to zero a rejected sibling (R stays p)."""
    for j, (node, x) in enumerate(children):
        if chooser.accept(node, p[x]):
            return ("accept", j)
    return ("emit", chooser.sample(p))


def specinfer_no_residual(p, q, children, chooser, **_):
    """BROKEN specinfer: never updates R (every child tested against p, y ~ p)."""
    for j, (node, x) in enumerate(children):
        if chooser.accept(node, ref.ratio(p[x], q[x])):
            return ("accept", j)
    return ("emit", chooser.sample(p))


def greedy_relative_argmax(p, q, children, chooser, **_):
    """BROKEN greedy: accepts the child the target likes best among the children, even when
    it is not the target's argmax."""
    if children:
        best = max(range(len(children)), key=lambda j: (p[children[j][1]], -j))
        return ("accept", best)
    return ("emit", ref.argmax_lowest(p))


BROKEN = {
    "rrs_stale_proposal": (rrs_stale_proposal, "without_replacement"),
    "rrs_fed_iid_children": (ref.rrs_node, "iid"),
    "deterministic_no_zeroing": (deterministic_no_zeroing, "top_k"),
    "specinfer_fed_without_replacement": (ref.specinfer_node, "without_replacement"),
    "specinfer_pruned_by_own_probability": (ref.specinfer_node, "pruned_iid"),
    "specinfer_no_residual": (specinfer_no_residual, "iid"),
}


@pytest.mark.parametrize("name", sorted(BROKEN))
@pytest.mark.parametrize("cfg", BROKEN_SHAPES, ids=_cfg_id)
def test_broken_variants_fail_the_exact_test(name, cfg):
    """The same exact check rejects wrong rules and wrong drafting schemes: reusing the
    un-updated q after a rejection without replacement, rrs or specinfer fed the other scheme's
    children, pruning sampled children by their own probability (spec §4), forgetting to zero
    a rejected deterministic sibling, skipping the residual."""
    V, branching, seed = cfg
    node_rule, scheme = BROKEN[name]
    tables = tu.ExactTables(V, seed)
    assert _tv(tables, tu.branching_shape(branching), node_rule, scheme) > Fraction(1, 1000)


@pytest.mark.parametrize("cfg", BROKEN_SHAPES, ids=_cfg_id)
def test_broken_greedy_fails(cfg):
    V, branching, seed = cfg
    tables = tu.ExactTables(V, seed).greedy()
    assert _tv(tables, tu.branching_shape(branching), greedy_relative_argmax, "iid") > Fraction(1, 1000)


def test_typical_shifts_the_distribution():
    """typical is lossy: its exact law differs from the target's (Medusa's trade-off)."""
    tables = tu.ExactTables(4, 1)
    shape = tu.branching_shape([3, 2])
    assert _tv(tables, shape, ref.typical_node, "top_k", epsilon=0.09, delta=0.3) > Fraction(1, 100)
    assert _tv(tables, shape, ref.typical_node, "iid", epsilon=0.3, delta=0.6, sample_correction=True) > Fraction(1, 100)


# -------------------------------------------------------------- expected accepted length


def _expected(tables, shape, rule, scheme=None) -> Fraction:
    return tu.expected_accepted(tu.tree_law(tables, shape, ref.NODE_RULES[rule], scheme or LOSSLESS[rule]))


@pytest.mark.parametrize("cfg", [(3, 3, 0), (4, 2, 1), (4, 3, 2)], ids=lambda c: "V{}-d{}-s{}".format(*c))
def test_chain_shaped_tree_equals_the_chain(cfg):
    """A tree whose every node has one child is the chain: specinfer and rrs give the token
    rule's exact E[tau]; deterministic gives the token rule's with a greedy (one-hot argmax q)
    drafter; the output laws of specinfer and rrs coincide."""
    V, depth, seed = cfg
    tables = tu.ExactTables(V, seed)
    shape = tu.chain_shape(depth)
    p_fn, q_fn = tables.p, tables.q
    token = su.exact_expected_accepted(p_fn, q_fn, V, depth, "token")
    assert isinstance(token, Fraction)
    assert _expected(tables, shape, "specinfer") == token
    assert _expected(tables, shape, "rrs") == token
    assert tu.tree_law(tables, shape, ref.specinfer_node, "iid") == tu.tree_law(tables, shape, ref.rrs_node, "without_replacement")

    def greedy_q(ctx):
        q = tables.q(ctx)
        best = min(range(V), key=lambda x: (-q[x], x))
        return [Fraction(int(x == best)) for x in range(V)]

    assert _expected(tables, shape, "deterministic") == su.exact_expected_accepted(p_fn, greedy_q, V, depth, "token")


# Each shape adds one child to the previous one (at the root first, then deeper).
GROWING = [
    ((),),
    (((),),),
    (((),), ()),
    (((),), (), ()),
    ((((),),), (), ()),
    ((((),), ()), (), ()),
    ((((),), ()), ((),), ()),
    ((((),), ()), ((),), ((),)),
]


@pytest.mark.parametrize("rule", ["rrs", "deterministic", "specinfer"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_adding_siblings_never_lowers_expected_length(rule, seed):
    """E[tau] is non-decreasing along a sequence of trees that each add one node, and a
    sibling strictly helps somewhere."""
    tables = tu.ExactTables(4, 100 + seed)
    values = [_expected(tables, shape, rule) for shape in GROWING]
    assert all(a <= b for a, b in zip(values, values[1:])), [float(v) for v in values]
    assert values[-1] > values[1]


# ------------------------------------------------------------- through the compiled op

N_SAMPLES = 100_000
PASS = 1e-4
FAIL = 1e-8
MIXED = (4, [3, 2], 1)  # mixed tables
PEAKED = ("near_uniform", "random"), ("peaked",)  # full-support peaked drafts: without replacement works


def _op_fit(tables: su.PrefixTables, shape, rule: str, scheme: str, seed: int, dtype=torch.float32,
            device: str | torch.device = "cpu") -> su.FitResult:
    """The op on N_SAMPLES trees drafted by ``scheme``, run on ``device`` (tests/test_cuda.py
    runs the same fit on the GPU), completed with the target and fitted to its exact joint."""
    gen = torch.Generator().manual_seed(seed)
    tree, p, q = tu.draft_tree_batch(tables, shape, scheme, N_SAMPLES, gen)
    out = specdecode.verify_tree(p.log().to(dtype).to(device), q.log().to(dtype).to(device), tree.to(device),
                                 rule=rule, generator=torch.Generator(device=device).manual_seed(seed + 1))
    depth = tu.shape_depth(shape)
    assert out.tokens.shape == (N_SAMPLES, depth + 1) and out.tokens.device.type == torch.device(device).type
    seq = su.complete_with_target(tables, out.tokens.cpu(), gen)
    counts = torch.bincount(su.sequence_cells(seq, tables.V), minlength=tables.V ** (depth + 1))
    return su.goodness_of_fit(counts, su.exact_joint(tables.target, tables.V, depth + 1))


def _tables(cfg, families=None) -> tuple[su.PrefixTables, tuple]:
    V, branching, seed = cfg
    kwargs = {} if families is None else {"target_kinds": families[0], "draft_relations": families[1]}
    shape = tu.branching_shape(branching)
    return tu.ExactTables(V, seed, **kwargs).as_prefix_tables(tu.shape_depth(shape)), shape


@pytest.mark.parametrize("rule,families", [("specinfer", None), ("deterministic", None), ("rrs", PEAKED),
                                           ("specinfer", PEAKED)], ids=["specinfer", "deterministic", "rrs", "specinfer-peaked"])
def test_op_lossless_chi_square(rule, families):
    """verify_tree with children drafted by the rule's scheme reproduces the target's joint
    (chi-square, 10^5 trees, fixed seed)."""
    tables, shape = _tables(MIXED, families)
    fit = _op_fit(tables, shape, rule, LOSSLESS[rule], seed=3)
    assert fit.impossible == 0 and fit.pvalue > PASS, f"{rule}: {fit}"


@pytest.mark.parametrize("scheme,families", [("without_replacement", PEAKED), ("pruned_iid", None)],
                         ids=["without_replacement", "pruned_by_own_probability"])
def test_op_broken_drafting_fails_chi_square(scheme, families):
    """The same chi-square test rejects specinfer fed children drawn without replacement, and
    specinfer fed i.i.d. children pruned by their own probability."""
    tables, shape = _tables(MIXED, families)
    fit = _op_fit(tables, shape, "specinfer", scheme, seed=3)
    assert fit.pvalue < FAIL, f"specinfer with {scheme} children passed: {fit}"


@pytest.mark.parametrize("rule", ["greedy", "specinfer", "rrs", "deterministic", "typical"])
def test_op_temperature_zero_is_the_target_greedy_path(rule):
    """At temperature 0 every tree rule returns exactly the target's greedy continuation (as
    far as the tree reaches, then its argmax), whatever the children."""
    tables, shape = _tables((4, [3, 2], 6))
    gen = torch.Generator().manual_seed(0)
    tree, p, q = tu.draft_tree_batch(tables, shape, "top_k", 5000, gen)
    # make a third of the children the target's argmax so paths go deep
    best = p.argmax(-1)
    parents = tree.parents[0]
    use_best = torch.rand(5000, tree.max_nodes, generator=gen) < 0.5
    tokens = torch.where(use_best, best[:, parents.clamp_min(0)], tree.tokens)
    siblings_ok = []
    for i in range(1, tree.max_nodes):  # keep siblings distinct (rrs / deterministic need it)
        same = torch.zeros(5000, dtype=torch.bool)
        for j in range(1, i):
            if int(parents[j]) == int(parents[i]):
                same |= tokens[:, j] == tokens[:, i]
        siblings_ok.append(~same)
    keep = torch.stack(siblings_ok, 1).all(1)
    tree = specdecode.TokenTree(tokens[keep], tree.parents[keep], tree.num_nodes[keep])
    out = specdecode.verify_tree(p[keep].log(), q[keep].log(), tree, rule=rule, temperature=0.0)
    depth = tu.shape_depth(shape)
    greedy_tables = su.greedy_target(tables)
    path = su.complete_with_target(greedy_tables, out.tokens, gen)
    expected = torch.empty(0, dtype=torch.int64)
    seq = torch.empty(1, 0, dtype=torch.int64)
    for _ in range(depth + 1):
        nxt = greedy_tables.target[greedy_tables.index(seq)].argmax(-1)
        seq = torch.cat([seq, nxt[:, None]], 1)
    expected = seq[0]
    assert bool((path == expected).all()), "temperature 0 left the target's greedy path"
    assert float(out.accepted_len.double().mean()) > 0.5  # the trees did contain the path
