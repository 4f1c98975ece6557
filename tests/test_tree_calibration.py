"""Builders that learn from each step's accepted path: the calibration table behind calibrated
dynamic trees, the outcome bookkeeping, Sequoia shapes planned by rank *and* depth (against brute
force), greedy identity of calibrated trees, and the whole-loop exact test of sampled trees whose
shape is re-planned every step (with a broken planner that peeks at the step's own draws)."""

from __future__ import annotations

import pytest
import torch
from test_generate_models import PAD, _one_thread, left_padded, make_pair  # noqa: F401
from test_generate_sampling import K, PROMPT, chi_square_p, exact_joint
from test_generate_sampling import pair as sampling_pair  # noqa: F401
from test_tree_shapes import _all_trees, _depth, _paths, _size, _width

import specdecode
from specdecode import ModelDrafter
from specdecode.trees.builders import BuiltTree, DynamicTree, SequoiaTree, StaticTree, compact_tree
from specdecode.trees.calibration import AcceptanceCalibration
from specdecode.trees.outcomes import RankDepthCounts, path_outcomes, sibling_rank
from specdecode.trees.sequoia import (expected_accepted_length, expected_accepted_length_by_depth, sequoia_shape,
                                      sequoia_shape_by_depth)
from specdecode.trees.shapes import TreeShape

PASS_P, FAIL_P = 1e-4, 1e-6
N_SAMPLES = 20000


# ------------------------------------------------------------------ calibration table


def test_calibration_prior_then_measurements():
    cal = AcceptanceCalibration(max_depth=3)
    probs = torch.tensor([[0.03, 0.55, 0.97]])
    depth, rank = torch.tensor([[1, 2, 3]]), torch.tensor([[0, 1, 0]])
    assert torch.allclose(cal.predict(probs, depth, rank), torch.tensor([[0.025, 0.55, 0.97]]))
    # 30 nodes of confidence 0.03 at depth 1, all accepted: that cell rises, its depth-2 cell follows
    # through the pooled rate, and the fitted exponent of rank 0 lifts the other buckets too
    many = torch.full((30, 1), 0.03)
    ones = torch.ones((30, 1), dtype=torch.bool)
    cal.update(many, torch.ones((30, 1), dtype=torch.long), torch.zeros((30, 1), dtype=torch.long), ones, ones)
    after = cal.predict(torch.tensor([[0.03, 0.03, 0.55]]), torch.tensor([[1, 2, 1]]), torch.tensor([[0, 0, 0]]))
    assert after[0, 0] > 0.95 and 0.5 < after[0, 1] < after[0, 0] and after[0, 2] > 0.6
    assert float(cal.powers()[0]) < 0.5 and float(cal.powers()[1]) == pytest.approx(1.0)  # rank 1: nothing measured
    other_rank = cal.predict(torch.tensor([[0.55]]), torch.tensor([[1]]), torch.tensor([[1]]))
    assert float(other_rank) == pytest.approx(0.55)
    cal.reset()
    assert float(cal.offered.sum()) == 0.0


def test_calibration_bad_input():
    with pytest.raises(ValueError, match="confidence_edges"):
        AcceptanceCalibration(confidence_edges=(0.5, 0.2))
    with pytest.raises(ValueError, match="max_depth"):
        AcceptanceCalibration(max_depth=0)
    with pytest.raises(ValueError, match="pooled_weight"):
        AcceptanceCalibration(pooled_weight=0)
    cal = AcceptanceCalibration()
    probs = torch.tensor([[0.5]])
    with pytest.raises(TypeError, match="depth"):
        cal.predict(probs, torch.tensor([[1.0]]), torch.tensor([[0]]))
    with pytest.raises(ValueError, match="rank"):
        cal.predict(probs, torch.tensor([[1]]), torch.tensor([0]))
    yes, no = torch.tensor([[True]]), torch.tensor([[False]])
    with pytest.raises(ValueError, match="accepted"):
        cal.update(probs, torch.tensor([[1]]), torch.tensor([[0]]), yes, no)
    with pytest.raises(TypeError, match="calibration"):
        DynamicTree(8, calibration="table")


def test_path_outcomes_and_counts_on_a_ragged_batch():
    parents = torch.tensor([[-1, 0, 0, 1, 1, 2], [-1, 0, 1, 2, 0, 0]])
    num = torch.tensor([6, 4])
    nodes = torch.tensor([[0, 1, 4], [0, -1, -1]])
    offered, accepted = path_outcomes(parents, num, nodes)
    assert offered.int().tolist() == [[0, 1, 1, 1, 1, 0], [0, 1, 0, 0, 0, 0]]
    assert accepted.int().tolist() == [[0, 1, 0, 0, 1, 0], [0, 0, 0, 0, 0, 0]]
    assert sibling_rank(parents, num).tolist() == [[0, 0, 1, 0, 1, 0], [0, 0, 0, 0, 0, 0]]
    counts = RankDepthCounts(max_depth=3, max_rank=2)
    counts.update(parents, num, nodes)
    # row 0: depth 1 ranks 0 (accepted; rank 1 never tried), depth 2 ranks 0, 1 (1 accepted)
    # row 1: depth 1 rank 0 tried, rejected (its only child)
    assert counts.tried.tolist() == [[2, 0, 0], [1, 1, 0], [0, 0, 0]]
    assert counts.accepted.tolist() == [[1, 0, 0], [0, 1, 0], [0, 0, 0]]
    assert path_outcomes(parents, num, nodes[:1]) == (None, None)  # another batch: ignored


# ------------------------------------------------------------------ Sequoia by depth


def _value_by_depth(tree: tuple, table: list[list[float]], depth: int = 0) -> float:
    row = table[min(depth, len(table) - 1)]
    return sum(row[i] * (1.0 + _value_by_depth(child, table, depth + 1)) for i, child in enumerate(tree))


@pytest.mark.parametrize("table", [[[0.9], [0.3, 0.3], [0.2, 0.5]], [[0.4, 0.3], [0.8], [0.1, 0.1, 0.1]],
                                   [[0.6, 0.2], [0.6, 0.2]], [[0.0, 0.5], [0.95, 0.01]]])
def test_sequoia_by_depth_matches_brute_force(table):
    width = max(len(row) for row in table)
    trees = [t for t in _all_trees(8) if _width(t) <= width]
    padded = [row + [0.0] * (width - len(row)) for row in table]
    scored = [(_size(t), _depth(t), _value_by_depth(t, padded)) for t in trees]
    for n in range(1, 9):
        for d in range(0, n):
            best = max(v for size, depth, v in scored if size <= n and depth <= d)
            shape, value = sequoia_shape_by_depth(table, n, d)
            assert shape.num_nodes <= n and shape.max_depth <= d
            assert abs(value - best) <= 1e-12, (table, n, d, value, best)
            assert abs(value - _value_by_depth(_tree_of(shape), padded)) <= 1e-12
    # one row for every depth is plain Sequoia
    shape, value = sequoia_shape_by_depth([[0.6, 0.2]], 7, 4)
    assert (shape, value) == (sequoia_shape([0.6, 0.2], 7, 4)[0], expected_accepted_length(shape, [0.6, 0.2]))
    with pytest.raises(TypeError, match="acceptance_by_depth"):
        sequoia_shape_by_depth([], 4, 2)
    with pytest.raises(ValueError, match="sum"):
        expected_accepted_length_by_depth(TreeShape.chain(2), [[0.7, 0.7]])


def _tree_of(shape: TreeShape, node: int = 0) -> tuple:
    return tuple(_tree_of(shape, c) for c in shape.children(node))


def test_paths_helper_round_trip():
    for tree in _all_trees(5):
        if tree:
            assert _tree_of(TreeShape.from_paths(_paths(tree))) == tree


# ------------------------------------------------------------------ generation


def test_calibrated_trees_give_the_targets_greedy_output():
    target, draft = make_pair("llama")
    ids, mask = left_padded([5, 9, 2], seed=1)
    ref = target.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False, pad_token_id=PAD)
    builder = DynamicTree(num_nodes=8)  # one builder, two generations: it keeps learning
    for _ in range(2):
        out = specdecode.generate(target, ModelDrafter(draft, tree=builder), ids, mask, max_new_tokens=20)
        assert torch.equal(out.sequences, ref)
    assert float(builder.calibration.offered.sum()) > 0
    assert float(builder.calibration.accepted.sum()) == pytest.approx(out.stats.accepted_tokens * 2, abs=12)
    seq = specdecode.generate(target, draft, ids, mask, tree="sequoia", num_nodes=8, max_new_tokens=20)
    assert torch.equal(seq.sequences, ref)


class Replanned(SequoiaTree):
    """Re-planned every step (by depth); remembers the shapes it used. Its prior makes the first
    shape wide (four root children), unlike the measured profile."""

    PRIOR = SAMPLED_PRIOR = (0.15, 0.15, 0.15, 0.15)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, adapt_sampled=True, **kwargs)

    def build(self, root_tokens, root_logits, expand, sampling, coins):
        self.used = getattr(self, "used", []) + [self.shape.paths()]
        return super().build(root_tokens, root_logits, expand, sampling, coins)


class PeekingPlanner(Replanned):
    """Broken (token-trees §4): the root's children are planned *after* they are drawn, from the
    draws themselves: of the two drawn, only the one the draft likes more is kept (with its
    subtree). (Keeping the second draw only when the draft likes it more than the first is
    biased too, but too little for this test to see at 20000 samples: p ~ 1e-4.)"""

    def build(self, root_tokens, root_logits, expand, sampling, coins):
        built = super().build(root_tokens, root_logits, expand, sampling, coins)
        tree = built.tree
        second = [i for i in range(1, tree.max_nodes) if self.shape.child_rank[i] == 1 and self.shape.parents[i] == 0]
        if not second:
            return built
        q = torch.softmax(root_logits.float(), -1).gather(1, tree.tokens[:, [1, second[0]]])
        valid = torch.ones_like(tree.tokens, dtype=torch.bool)
        valid[:, second[0]] = q[:, 1] > q[:, 0]
        valid[:, 1] = ~valid[:, second[0]]
        small, keep = compact_tree(tree.tokens, tree.parents, valid & (torch.arange(tree.max_nodes) < tree.num_nodes[:, None]))
        logits = built.draft_logits.gather(1, keep[:, :, None].expand(-1, -1, built.draft_logits.shape[2]))
        return BuiltTree(small, logits, built.children, built.forward_calls)


def _sample(target, drafter):
    ids = torch.tensor([PROMPT]).expand(N_SAMPLES, -1)
    return specdecode.generate(target, drafter, ids, do_sample=True, max_new_tokens=K, eos_token_id=[],
                               pad_token_id=PAD, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("children", ["without_replacement", "iid"])
def test_replanned_sampled_shapes_are_lossless(sampling_pair, children):
    target, draft = sampling_pair
    builder = Replanned(num_nodes=5, max_depth=2, children=children)
    out = _sample(target, ModelDrafter(draft, tree=builder))
    assert len(builder.used) >= 2 and builder.used[1] != builder.used[0]  # the shape really changed
    assert out.stats.rank_accepted[1] > 0
    assert chi_square_p(out.sequences[:, len(PROMPT):], exact_joint(target, PROMPT)) > PASS_P


def test_planner_peeking_at_its_draws_fails_the_same_test(sampling_pair):
    target, draft = sampling_pair
    builder = PeekingPlanner(num_nodes=3, max_depth=1, acceptance_by_rank=[0.4, 0.4])
    out = _sample(target, ModelDrafter(draft, tree=builder))
    assert chi_square_p(out.sequences[:, len(PROMPT):], exact_joint(target, PROMPT)) < FAIL_P


def test_calibrated_dynamic_trees_keep_the_law_when_sampling(sampling_pair):
    """The tree of a step depends on earlier steps' outcomes (the calibration), never on this
    step's coins: the deterministic rule keeps the target's law (the broken builders of
    test_tree_generation.py fail this same test)."""
    target, draft = sampling_pair
    builder = DynamicTree(num_nodes=5, top_k=2, sampled_children=None)
    out = _sample(target, ModelDrafter(draft, tree=builder))
    assert out.stats.tree_rule == "deterministic" and float(builder.calibration.offered.sum()) > 0
    assert chi_square_p(out.sequences[:, len(PROMPT):], exact_joint(target, PROMPT)) > PASS_P


@pytest.mark.parametrize("children,rule", [("without_replacement", "rrs"), ("iid", "specinfer")])
def test_dynamic_trees_sample_replanned_shapes_when_sampling(sampling_pair, children, rule):
    """At temperature > 0 the dynamic tree samples its children in a shape planned from earlier
    steps (its Sequoia planner), verified by the stochastic rule: the law holds (the peeking
    planner above fails this same test), and greedy steps still use top-k children."""
    target, draft = sampling_pair
    builder = DynamicTree(num_nodes=5, max_depth=3, top_k=2, sampled_children=children)
    out = _sample(target, ModelDrafter(draft, tree=builder))
    assert out.stats.tree_rule == rule and float(builder.calibration.offered.sum()) == 0
    assert int(builder.sampled.counts.tried.sum()) > 0
    assert chi_square_p(out.sequences[:, len(PROMPT):], exact_joint(target, PROMPT)) > PASS_P
    ids = torch.tensor([PROMPT])
    greedy = specdecode.generate(target, ModelDrafter(draft, tree=builder), ids, max_new_tokens=K, pad_token_id=PAD)
    assert greedy.stats.tree_rule == "deterministic" and float(builder.calibration.offered.sum()) > 0
    for bad in ("deterministic", "sampled", 3):
        with pytest.raises(ValueError, match="sampled_children"):
            DynamicTree(num_nodes=5, sampled_children=bad)


def test_the_named_static_tree_samples_its_children_when_sampling(sampling_pair):
    """tree="static": top-k children at temperature 0, children sampled without replacement
    (verified by rrs) when sampling; the law holds."""
    from specdecode.trees.builders import make_tree_builder

    target, draft = sampling_pair
    out = _sample(target, ModelDrafter(draft, tree=make_tree_builder("static", num_nodes=5, max_depth=2)))
    assert out.stats.tree_rule == "rrs"
    assert chi_square_p(out.sequences[:, len(PROMPT):], exact_joint(target, PROMPT)) > PASS_P
    assert make_tree_builder([[0], [1]]).children == "deterministic"  # a shape of the caller's: top-k by default


def test_the_named_static_tree_has_a_deeper_shape_for_sampled_children():
    """tree="static" keeps its two-then-one shape for top-k children and, when sampling, draws
    the Sequoia shape fixed for SAMPLED_PROFILE (a long chain with a few side branches:
    at temperature 1 depth is worth more than width); the same shape every step."""
    from specdecode.sampling import SamplingParams
    from specdecode.trees.builders import SAMPLED_PROFILE, StaticTree, make_tree_builder
    from specdecode.trees.sequoia import acceptance_from_conditional

    builder = make_tree_builder("static", num_nodes=16)
    profile = acceptance_from_conditional(list(SAMPLED_PROFILE))
    assert builder.sampled_shape == sequoia_shape(profile, 16, 15)[0]
    assert builder.sampled_shape.max_depth > builder.shape.max_depth and builder.max_nodes == 16
    assert make_tree_builder("static", num_nodes=16, children="deterministic").sampled_shape is None
    V, b = 11, 3
    gen = torch.Generator().manual_seed(0)

    def expand(ids, tokens, parents, depth):
        return torch.randn(b, ids.shape[1], V, generator=gen)

    def coins(*shape):
        return torch.rand(*shape, generator=gen, dtype=torch.float64)

    root = torch.randn(b, V, generator=gen)
    for sampling, shape in ((SamplingParams(temperature=0.0), builder.shape),
                            (SamplingParams(temperature=1.0), builder.sampled_shape)):
        built = builder.build(torch.zeros(b, dtype=torch.long), root, expand, sampling, coins)
        assert built.tree.parents[0].tolist()[: shape.num_nodes] == list(shape.parents)
    with pytest.raises(ValueError, match="sampled_shape"):
        StaticTree([[0]], "without_replacement", sampled_shape=TreeShape.from_paths([]))


def test_sequoia_plans_sampled_steps_for_the_sampled_profile(sampling_pair):
    """SequoiaTree (so the dynamic tree's sampling steps): sampled children get the fixed shape of
    SAMPLED_PROFILE, kept while tries are still counted; greedy steps are re-planned from the
    counts; adapt_sampled=True re-plans sampled steps too."""
    from specdecode.trees.builders import SAMPLED_PROFILE
    from specdecode.trees.sequoia import acceptance_from_conditional

    target, draft = sampling_pair
    fixed = sequoia_shape(acceptance_from_conditional(list(SAMPLED_PROFILE)), 6, 5)[0]
    builder = SequoiaTree(num_nodes=6)
    ids = torch.tensor([PROMPT]).expand(64, -1)
    specdecode.generate(target, ModelDrafter(draft, tree=builder), ids, do_sample=True, max_new_tokens=K,
                        eos_token_id=[], pad_token_id=PAD, generator=torch.Generator().manual_seed(0))
    assert builder.shape == fixed and int(builder.counts.tried.sum()) > 0
    adaptive = SequoiaTree(num_nodes=6, adapt_sampled=True)
    adaptive.counts.tried[0, 0], adaptive.counts.accepted[0, 0] = 1000.0, 50.0  # rank 0 at depth 1: 5%
    specdecode.generate(target, ModelDrafter(draft, tree=adaptive), ids[:2], do_sample=True, max_new_tokens=K,
                        eos_token_id=[], pad_token_id=PAD, generator=torch.Generator().manual_seed(0))
    assert adaptive.shape != fixed
    with pytest.raises(TypeError, match="adapt_sampled"):
        SequoiaTree(num_nodes=6, adapt_sampled=1)


class UniformClaimingPath(StaticTree):
    """Broken: the path's children are drawn from the draft's q but claimed as draws from a
    uniform q (zero logits), so rrs accepts them at the wrong rate."""

    def build(self, root_tokens, root_logits, expand, sampling, coins):
        built = super().build(root_tokens, root_logits, expand, sampling, coins)
        return BuiltTree(built.tree, torch.zeros_like(built.draft_logits), built.children, built.forward_calls)


def test_a_path_tree_scored_as_a_chain_keeps_the_law(sampling_pair, joint_of_prompt):
    """A tree that is one path in every row is scored through the chain forward (the first one
    with the prompt) and verified by its tree rule: the law holds, and a path whose q is
    misstated fails the same test."""
    target, draft = sampling_pair
    path = [[0], [0, 0]]
    out = _sample(target, ModelDrafter(draft, tree=StaticTree(path, "without_replacement")))
    assert out.stats.tree_rule == "rrs" and out.stats.fused_prefills == 1
    assert chi_square_p(out.sequences[:, len(PROMPT):], joint_of_prompt) > PASS_P
    broken = _sample(target, ModelDrafter(draft, tree=UniformClaimingPath(path, "without_replacement")))
    assert chi_square_p(broken.sequences[:, len(PROMPT):], joint_of_prompt) < FAIL_P


@pytest.fixture(scope="module")
def joint_of_prompt(sampling_pair):
    return exact_joint(sampling_pair[0], PROMPT)
