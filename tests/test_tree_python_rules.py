"""The tree rules written as Python row functions (traversal, GBV, SpecTr, SpecHub; all compiled
now, the row functions their reference) through ``specdecode.verify_tree`` and the engine: they
read the compiled ops' processed distributions and the op's coin layout, keep the target's law through
the public API (chi-square on drafted batches), fall back to the greedy walk at temperature 0,
refuse bad input with errors naming the argument, and generate through ``specdecode.generate``."""

from __future__ import annotations

import pytest
import torch
import tree_law_utils as tlu
import tree_stat_utils as tsu
from test_generate_models import PAD, make_pair
from test_generate_sampling import K, PROMPT, chi_square_p, exact_joint
from test_generate_sampling import pair as sampling_pair  # noqa: F401

import specdecode
from specdecode.sampling import processed_probs
from specdecode.trees.builders import StaticTree
from specdecode.trees.transport import draw_hub_children
from specdecode.trees import TokenTree, list_tree_rules
from specdecode.trees.python_rules import PYTHON_ONLY, ROW_RULES
from specdecode.trees.reference import CoinChooser
from specdecode.trees.transport import draw_hub_children

PYTHON_RULES = [r.name for r in list_tree_rules() if not r.compiled]


def test_python_rules_are_listed_and_lossless():
    assert set(PYTHON_RULES) == set(PYTHON_ONLY) and set(PYTHON_ONLY) <= set(ROW_RULES)
    assert all(r.lossless and r.needs_draft_logits for r in list_tree_rules() if not r.compiled)


def _batch(V: int, B: int, gen: torch.Generator):
    tree = TokenTree(torch.tensor([[0, 1, 2, 3, 4]] * B), torch.tensor([[-1, 0, 0, 1, 2]] * B),
                     torch.full((B,), 5, dtype=torch.int64))
    tokens = torch.randint(0, V, (B, 5), generator=gen)
    tokens[:, 2] = (tokens[:, 1] + 1 + torch.randint(0, V - 1, (B,), generator=gen)) % V  # distinct siblings
    tree = TokenTree(tokens, tree.parents, tree.num_nodes)
    return tree, torch.randn(B, 5, V, generator=gen), torch.randn(B, 5, V, generator=gen)


@pytest.mark.parametrize("rule", ["traversal", "traversal_iid", "spectr", "spechub"])
def test_verify_tree_runs_the_row_function_on_processed_probabilities(rule):
    gen = torch.Generator().manual_seed(1)
    V, B = 7, 3
    tree, target, draft = _batch(V, B, gen)
    u = torch.rand(B, 5, generator=gen, dtype=torch.float64)
    out = specdecode.verify_tree(target, draft, tree, rule=rule, temperature=0.7, top_k=5, uniforms=u)
    sampling = specdecode.SamplingParams(temperature=0.7, top_k=5)
    p = specdecode.sampling.processed_probs(target.reshape(-1, V), sampling).view(B, 5, V)
    q = specdecode.sampling.processed_probs(draft.reshape(-1, V), sampling).view(B, 5, V)
    for b in range(B):
        nodes, emitted = ROW_RULES[rule](p[b].tolist(), q[b].tolist(), tree.tokens[b].tolist(), tree.parents[b].tolist(),
                                         5, CoinChooser(u[b].tolist()))
        assert out.accepted_nodes[b, : len(nodes)].tolist() == nodes
        assert out.tokens[b, : len(emitted)].tolist() == emitted
        assert int(out.accepted_len[b]) == len(nodes) - 1


def test_python_rules_at_temperature_zero_are_the_greedy_walk():
    gen = torch.Generator().manual_seed(2)
    tree, target, draft = _batch(111, 3, gen)
    greedy = specdecode.verify_tree(target, None, tree, rule="greedy")
    for rule in ROW_RULES:
        out = specdecode.verify_tree(target, draft, tree, rule=rule, temperature=0.0)
        assert torch.equal(out.tokens, greedy.tokens) and torch.equal(out.accepted_nodes, greedy.accepted_nodes)


def _hub_batch(tables, n: int, gen: torch.Generator):
    """n trees of shape [2, 1]: hub-pair children at the root, one i.i.d. child below each."""
    V = tables.V
    tokens = torch.zeros(n, 5, dtype=torch.int64)
    p = torch.empty(n, 5, V, dtype=torch.float64)
    q = torch.empty_like(p)
    root = tables.index(torch.empty(n, 0, dtype=torch.int64))
    p[:, 0], q[:, 0] = tables.target[root], tables.draft[root]
    tokens[:, 1:3] = draw_hub_children(q[:, 0], 2, torch.rand(n, 2, generator=gen, dtype=torch.float64))
    for child, parent in ((3, 1), (4, 2)):
        rows = tables.index(tokens[:, [parent]])
        p[:, parent], q[:, parent] = tables.target[rows], tables.draft[rows]
        tokens[:, child] = tsu.su.sample_rows(q[:, parent], gen)
        rows = tables.index(tokens[:, [parent, child]])
        p[:, child], q[:, child] = tables.target[rows], tables.draft[rows]
    parents = torch.tensor([-1, 0, 0, 1, 2]).expand(n, 5).contiguous()
    return TokenTree(tokens, parents, torch.full((n,), 5, dtype=torch.int64)), p, q


#: (rule, children scheme, tree shape) of the chi-square tests (test_cuda_tree_rules.py runs them on
#: the GPU).
LAW_CASES = [
    ("traversal", "without_replacement", tsu.branching_shape([2, 1])),
    ("gbv", "iid", tlu.paths_shape(2, 2)),
    ("spechub", "hub", tsu.branching_shape([2, 1])),
    ("spectr", "iid", tsu.branching_shape([3, 1])),
]


def law_fit(rule, scheme, shape, device="cpu"):
    """Chi-square fit of 20000 trees drafted by ``scheme`` and verified by ``rule`` through the
    public API on ``device``, against the exact target joint."""
    exact = tsu.ExactTables(4, 11, target_kinds=("random", "peaked", "near_uniform", "sparse"),
                            draft_relations=("close", "near_uniform"))
    tables = exact.as_prefix_tables(tsu.shape_depth(shape))
    gen = torch.Generator().manual_seed(3)
    n = 20000
    if scheme == "hub":
        tree, p, q = _hub_batch(tables, n, gen)
    else:
        tree, p, q = tsu.draft_tree_batch(tables, shape, scheme, n, gen)
    out = specdecode.verify_tree(p.log().to(device), q.log().to(device), tree.to(device), rule=rule, temperature=1.0,
                                 generator=torch.Generator(device=device).manual_seed(4))
    depth = tsu.shape_depth(shape)
    seqs = tsu.su.complete_with_target(tables, out.tokens.cpu(), gen)[:, : depth + 1]
    cells = tsu.su.sequence_cells(seqs, 4)
    joint = tsu.su.exact_joint(tables.target, 4, depth + 1)
    return tsu.su.goodness_of_fit(torch.bincount(cells, minlength=joint.numel()).double(), joint)


@pytest.mark.parametrize("rule, scheme, shape", LAW_CASES, ids=[c[0] for c in LAW_CASES])
def test_python_rules_keep_the_target_law_through_verify_tree(rule, scheme, shape):
    """Chi-square of 20000 drafted trees through the public API against the exact target joint."""
    fit = law_fit(rule, scheme, shape)
    assert fit.pvalue > 1e-4, fit


def test_python_rules_refuse_bad_input():
    gen = torch.Generator().manual_seed(4)
    tree, target, draft = _batch(7, 1, gen)
    with pytest.raises(ValueError, match="draft_logits"):
        specdecode.verify_tree(target, None, tree, rule="traversal", temperature=1.0)
    with pytest.raises(TypeError, match="unexpected option"):
        specdecode.verify_tree(target, draft, tree, rule="gbv", temperature=1.0, epsilon=0.1)
    forked = TokenTree(tree.tokens, torch.tensor([[-1, 0, 0, 1, 1]]), tree.num_nodes)
    with pytest.raises(ValueError, match="parents: verify_tree, row 0: the gbv rule needs K disjoint paths"):
        specdecode.verify_tree(target, draft, forked, rule="gbv", temperature=1.0)
    same = TokenTree(torch.tensor([[0, 3, 3, 1, 2]]), tree.parents, tree.num_nodes)
    with pytest.raises(ValueError, match="tree_tokens: verify_tree, row 0: two children"):
        specdecode.verify_tree(target, draft, same, rule="traversal", temperature=1.0)
    wide = TokenTree(torch.tensor([[0, 9, 3, 1, 2]]), tree.parents, tree.num_nodes)
    with pytest.raises(ValueError, match="tree_tokens"):
        specdecode.verify_tree(target, draft, wide, rule="spechub", temperature=1.0)
    before = target.clone()
    specdecode.verify_tree(target, draft, tree, rule="traversal_iid", temperature=1.0)
    assert torch.equal(before, target)


def test_a_python_only_rule_runs_its_row_function(monkeypatch):
    """The dispatch kept for rules without a kernel (none now): a rule listed in PYTHON_ONLY runs
    verify_tree_python, with the compiled op's result here, and refuses Philox coins."""
    import specdecode.trees.python_rules as python_rules

    gen = torch.Generator().manual_seed(6)
    tree, target, draft = _batch(7, 3, gen)
    u = torch.rand(3, 5, generator=gen, dtype=torch.float64)
    compiled = specdecode.verify_tree(target, draft, tree, rule="spectr", temperature=1.0, uniforms=u)
    monkeypatch.setattr(python_rules, "PYTHON_ONLY", ("spectr",))
    in_python = specdecode.verify_tree(target, draft, tree, rule="spectr", temperature=1.0, uniforms=u)
    assert all(torch.equal(a, b) for a, b in zip(compiled, in_python))
    with pytest.raises(NotImplementedError, match="philox"):
        specdecode.verify_tree(target, draft, tree, rule="spectr", temperature=1.0, philox_seed=torch.tensor([1]),
                               philox_offset=torch.tensor([0]))


@pytest.mark.parametrize("rule, children", [("traversal", "without_replacement"), ("traversal_iid", "iid"),
                                            ("spectr", "iid"), ("gbv", "iid"), ("spechub", "hub")])
def test_generate_with_python_tree_rules(rule, children):
    """The engine verifies sampled trees with the rule (at temperature 0 every tree rule is the
    greedy walk, which the op-level test above checks)."""
    target, draft = make_pair("llama")
    ids = torch.tensor([[5, 9, 2, 7], [1, 2, 3, 4]])
    out = specdecode.generate(target, draft, ids, tree=[[0], [1], [0, 0], [1, 0]], tree_children=children,
                              rule=rule, max_new_tokens=12, do_sample=True, temperature=1.0,
                              generator=torch.Generator().manual_seed(0))
    assert out.sequences.shape == (2, ids.shape[1] + 12)
    assert out.stats.tree_rule == rule


def test_traversal_generation_keeps_the_target_law(sampling_pair):
    """Whole-loop exact test: 20000 rows of 3 new tokens through the engine with traversal."""
    target, draft = sampling_pair
    ids = torch.tensor([PROMPT]).expand(20000, -1)
    out = specdecode.generate(target, draft, ids, do_sample=True, max_new_tokens=K, eos_token_id=[], pad_token_id=PAD,
                              generator=torch.Generator().manual_seed(0), tree=[[0], [1], [0, 0], [0, 1], [1, 0]],
                              tree_children="without_replacement", rule="traversal")
    assert out.stats.tree_rule == "traversal"
    assert chi_square_p(out.sequences[:, len(PROMPT):], exact_joint(target, PROMPT)) > 1e-4


class HubClaimedIid(StaticTree):
    """Broken: SpecHub's hub pairs, verified as if they were i.i.d. draws (specinfer)."""

    def _draw(self, logits, counts, sampling, coins):
        stacked = torch.stack(logits, 1)
        b, m, V = stacked.shape
        k = max(counts)
        probs = processed_probs(stacked.reshape(b * m, V), sampling)
        drawn = draw_hub_children(probs, k, coins(b * m, k)).view(b, m, k)
        return [drawn[:, j, : counts[j]] for j in range(m)]


def _hub_run(target, draft, builder, n):
    ids = torch.tensor([PROMPT]).expand(n, -1)
    return specdecode.generate(target, draft, ids, do_sample=True, max_new_tokens=K, eos_token_id=[], pad_token_id=PAD,
                               generator=torch.Generator().manual_seed(1), tree=builder)


def test_spechub_generation_keeps_the_target_law_and_a_mislabelled_hub_tree_fails(sampling_pair):
    """Whole-loop exact test of hub-pair trees (tree_children="hub") verified by spechub; the
    same trees verified as i.i.d. children by specinfer fail it."""
    target, draft = sampling_pair
    joint = exact_joint(target, PROMPT)
    shape = [[0], [1], [0, 0], [1, 0]]
    out = _hub_run(target, draft, StaticTree(shape, children="hub"), 20000)
    assert out.stats.tree_rule == "spechub"
    assert chi_square_p(out.sequences[:, len(PROMPT):], joint) > 1e-4
    broken = _hub_run(target, draft, HubClaimedIid(shape, children="iid"), 20000)
    assert broken.stats.tree_rule == "specinfer"
    assert chi_square_p(broken.sequences[:, len(PROMPT):], joint) < 1e-6


def test_traversal_on_a_chain_equals_the_compiled_block_rule():
    """A chain as a tree, coins rolled by one column: traversal gives the chain op's block
    verification (ragged rows, V = 111, B = 3)."""
    gen = torch.Generator().manual_seed(5)
    B, gamma, V = 3, 4, 111
    for trial in range(20):
        target = torch.randn(B, gamma + 1, V, generator=gen) * 2
        draft = target[:, :gamma] + torch.randn(B, gamma, V, generator=gen)
        q = torch.softmax(draft, -1)
        drafts = torch.multinomial(q.reshape(-1, V), 1, generator=gen).view(B, gamma)
        num = torch.tensor([gamma, 2, 0])
        coins = torch.rand(B, gamma + 1, generator=gen, dtype=torch.float64)
        chain = specdecode.verify_logits(target, draft, drafts, rule="block", temperature=1.0, uniforms=coins,
                                         num_draft_tokens=num)
        tree = TokenTree.chain(torch.zeros(B, dtype=torch.int64), drafts, num)
        tree_draft = torch.cat([draft, torch.zeros(B, 1, V)], 1)
        out = specdecode.verify_tree(target, tree_draft, tree, rule="traversal_iid", temperature=1.0,
                                     uniforms=torch.roll(coins, 1, dims=1))
        assert torch.equal(out.accepted_len, chain.accepted_len), trial
        assert torch.equal(out.tokens, chain.tokens), trial
