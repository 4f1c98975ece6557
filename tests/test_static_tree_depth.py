"""Static trees that pay (issue 40): a dynamic tree's depth chosen from the acceptance it
measured, the accepted path's moves fused over the stacked cache layers, and the kernels of a
tree level.

- the depth rule (:mod:`specdecode.trees.static_depth`): nothing measured, 6 levels; acceptance
  near 1, the node budget's chain-like limit; poor acceptance, shallow; the last depth kept
  unless another beats it by the margin; bad counts refused, naming the argument;
- a drafter equal to the target (acceptance 1): the builder's second generation drafts
  ``num_nodes - 1`` levels, and greedy output equals the target's own at both depths (Llama,
  GPT-2, Qwen2; a left-padded batch of 3 and batch 1); ``tree_depth`` stays the user's;
- sampling with top-k children at a depth chosen from measurements keeps the target's joint law;
- the caches' layers are stacked after the prefill and moved with one gather and one scatter
  (equal to moving them layer by layer); moving the keys but not the values fails the joint
  law (broken variant);
- the draft side of a tree step (each level's mask rows built from its parents' rows, the draft
  cache moved along the path): every tree equals the eager path's, and two broken variants
  fail that check;
- the calibration on the device: its fit is the host's, its counts are the path outcomes, and
  a calibrated builder drafts the eager path's trees on the static path, step by step, over two
  generations of a kept builder; counting nothing, or not loading the builder's counts, fails
  that check;
- a level of a dynamic tree costs 8 kernels besides its draft forward (11 calibrated), and no host
  read.
"""

from __future__ import annotations

import pytest
import torch
from test_generate_models import PAD, _one_thread, left_padded, make_pair  # noqa: F401
from test_generate_sampling import chi_square_p
from test_static_feature_trees import assert_trees_of_the_eager_path, recorded_trees
from test_static_feature_trees import hf_greedy as hf_greedy_16
from test_static_feature_trees import run as run_16
from test_static_trees import FAIL_P, PASS_P, hf_greedy, pair, run, sample_tree  # noqa: F401

import specdecode.engine.static_layouts as static_layouts
import specdecode.engine.static_loop as static_loop
import specdecode.models.static_cache as static_cache
from specdecode import ModelDrafter, generate
from specdecode.models.static_cache import ColumnCache, move_columns
from specdecode.sampling import SamplingParams
from specdecode.trees.builders import DynamicTree
from specdecode.trees.calibration import AcceptanceCalibration
from specdecode.trees.calibration import calibration_key
from specdecode.trees.static_calibration import DeviceCalibration
from specdecode.trees.static_depth import STATIC_DYNAMIC_DEPTH, DepthAcceptance, best_depth
from specdecode.trees.static_growth import LevelInputs, plan_static_tree

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(autouse=True)
def _fresh_sessions():
    static_loop.clear_static_sessions()
    yield
    static_loop.clear_static_sessions()


# ------------------------------------------------------------------------ the depth rule


def test_the_depth_follows_the_measured_acceptance():
    record = DepthAcceptance()
    assert record.rates() == [] and record.choose(15) == STATIC_DYNAMIC_DEPTH == 6 and record.choose(4) == 4
    record.add(6, reached=[200] * 6, accepted=[200] * 6)
    assert record.depth == 6 and record.choose(15) == 15 and record.choose(9) == 9
    poor = DepthAcceptance()
    poor.add(6, reached=[100, 40, 16, 6, 2, 1], accepted=[40, 16, 6, 2, 1, 0])
    assert poor.choose(15) <= 3
    # the expected tokens per unit cost of depths 8 and 9 at a = 0.9 are within the margin
    assert best_depth([0.9], 15) == 9 and best_depth([0.9], 15, current=8) == 8
    assert best_depth([0.9], 15, current=3) == 9
    for reached, accepted in (([1, 2], [1, 2, 3]), ([5], [6]), ([5], [-1])):
        with pytest.raises(ValueError, match="^accepted: "):
            DepthAcceptance().add(len(reached), reached, accepted)
    with pytest.raises(ValueError, match="^rates: "):
        best_depth([], 4)


def test_a_depth_given_is_kept():
    builder = DynamicTree(10, max_depth=3)
    builder.static_depths.add(3, [50] * 3, [50] * 3)
    assert plan_static_tree(builder, GREEDY, 100).max_depth == 3
    free = DynamicTree(10)
    free.static_depths.add(6, [50] * 6, [50] * 6)
    assert plan_static_tree(free, GREEDY, 100).max_depth == 9  # min(num_nodes - 1, 16)
    assert plan_static_tree(DynamicTree(32, calibrated=False), GREEDY, 100).max_depth == 6  # its max_depth


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2"])
def test_depth_grows_to_the_node_budget_when_the_draft_is_the_target(arch):
    target, _ = make_pair(arch)
    target.config.eos_token_id = target.generation_config.eos_token_id = None
    with torch.no_grad():  # a confident model, so that its own tree (by its probabilities) is a chain
        target.get_output_embeddings().weight.mul_(100)
    ids, mask = left_padded([5, 9, 2], seed=1)
    want3, want1 = hf_greedy(target, ids, mask), hf_greedy(target, ids[1:2])
    builder = DynamicTree(10)
    drafter = ModelDrafter(target, tree=builder)
    assert torch.equal(run(target, drafter, ids, mask).sequences, want3)
    assert builder.static_depths.depth == STATIC_DYNAMIC_DEPTH
    assert drafter.static_tree_plan(GREEDY, 128).max_depth == 9
    out = run(target, drafter, ids, mask)
    assert torch.equal(out.sequences, want3) and builder.static_depths.depth == 9
    assert max(max(step) for step in out.stats.accepted_lengths) == 9  # whole 9-level paths accepted
    assert torch.equal(run(target, drafter, ids[1:2]).sequences, want1)
    assert len(static_layouts.kept_layouts(target)) == 3  # depth 6 and 9 at B = 3, depth 9 at B = 1


def test_sampling_at_a_chosen_depth_is_lossless(pair):
    target, draft, joint = pair
    builder = DynamicTree(5, sampled_children=None)
    builder.static_depths.add(2, [100, 100], [100, 100])
    assert plan_static_tree(builder, SamplingParams(temperature=1.0), 8).max_depth == 4
    tokens, stats = sample_tree(target, draft, tree=builder)
    assert stats.tree_rule == "deterministic" and builder.static_depths.depth == 4
    assert chi_square_p(tokens, joint) > PASS_P


# ------------------------------------------------------------------------ fused moves


def test_stacked_layers_move_as_layer_by_layer():
    torch.manual_seed(0)
    stacked, apart = ColumnCache(12), ColumnCache(12)
    for cache in (stacked, apart):
        cache.keys = [torch.randn(2, 3, 12, 4, generator=torch.Generator().manual_seed(i)) for i in range(3)]
        cache.values = [torch.randn(2, 3, 12, 4, generator=torch.Generator().manual_seed(9 + i)) for i in range(3)]
    stacked.stack_layers()
    assert stacked.stacked is not None and stacked.stacked.shape == (6, 2, 3, 12, 4) and apart.stacked is None
    assert stacked.values[1].data_ptr() == stacked.stacked[4].data_ptr()
    source, target = torch.tensor([[5, 9, 3], [7, 4, 8]]), torch.tensor([[4, 5, 6], [5, 6, 7]])  # overlapping
    for cache in (stacked, apart):
        move_columns(cache, source, target)
    for mine, theirs in zip((*stacked.keys, *stacked.values), (*apart.keys, *apart.values)):
        assert torch.equal(mine, theirs)
    odd = ColumnCache(12)
    odd.keys, odd.values = [torch.zeros(1, 2, 12, 4), torch.zeros(1, 2, 12, 8)], [torch.zeros(1, 2, 12, 4)] * 2
    odd.stack_layers()
    assert odd.stacked is None  # layers of different shapes stay apart


def test_generation_caches_are_stacked():
    target, draft = make_pair("llama")
    ids, mask = left_padded([5, 8, 3], seed=7)
    run(target, draft, ids, mask, tree="dynamic", num_nodes=8)
    session = static_layouts.kept_layouts(target)[-1]
    for cache in (session.cache, session.state.buffer("draft_cache", lambda: None)):
        layers = cache.keys + cache.values
        assert cache.stacked is not None and cache.stacked.shape[0] == len(layers)
        assert all(t.data_ptr() == cache.stacked[i].data_ptr() for i, t in enumerate(layers))


def _keys_only(cache, source, target):
    """Broken: the fused move skips the values (the second half of the stack)."""
    half = cache.stacked[: cache.stacked.shape[0] // 2]
    S, B, H, _, D = half.shape
    m = source.shape[1]
    moved = half.gather(3, source[None, :, None, :, None].expand(S, B, H, m, D))
    half.scatter_(3, target[None, :, None, :, None].expand(S, B, H, m, D), moved)


def test_broken_fused_move_fails_the_joint_law(pair, monkeypatch):
    target, draft, joint = pair
    monkeypatch.setattr(static_cache, "move_columns", _keys_only)
    tokens, _ = sample_tree(target, draft, tree=[[0], [1], [2]], tree_children="without_replacement", rule="rrs")
    assert chi_square_p(tokens, joint) < FAIL_P


# ------------------------------------------------------------------------ the draft side


def _rows_of_the_first_parent(monkeypatch):
    """Broken: every node of a level gets the mask row of the level's first parent."""
    original = LevelInputs.level
    monkeypatch.setattr(LevelInputs, "level", lambda self, tokens, parent_index, columns, depth: original(
        self, tokens, torch.zeros_like(parent_index), columns, depth))


def _path_not_moved_in_the_draft(monkeypatch):
    """Broken: the accepted path's draft keys/values stay where the tree fed them."""
    monkeypatch.setattr(ModelDrafter, "static_accept_path", lambda *args: None)


@pytest.mark.parametrize("broken", [None, _rows_of_the_first_parent, _path_not_moved_in_the_draft],
                         ids=["correct", "rows_of_the_first_parent", "path_not_moved_in_the_draft"])
def test_draft_side_trees_are_the_eager_ones(broken, monkeypatch):
    """A draft that reads its context (weights at 0.1), frontiers of three and two nodes (paths of
    three accepted: the draft cache's moves matter; nodes of the second frontier node kept)."""
    target, draft = make_pair("llama", init=0.1)
    ids, mask = left_padded([6, 3, 8], seed=2)
    want = hf_greedy_16(target, ids, mask)  # that check's 16 new tokens

    def check() -> None:
        for top_k in (3, 2):
            drafter = ModelDrafter(draft, tree=DynamicTree(8, 4, top_k=top_k, calibrated=False))
            assert assert_trees_of_the_eager_path(target, drafter, ids, mask, want) > 0

    if broken is None:
        check()
        return
    broken(monkeypatch)
    with pytest.raises(AssertionError):
        check()


# ------------------------------------------------------------------------ the calibration on the device


def test_the_device_fit_is_the_calibrations():
    torch.manual_seed(0)
    calibration = AcceptanceCalibration(max_depth=4)
    offered = torch.randint(0, 30, calibration.offered.shape).double()
    calibration.add_counts(offered, (offered * torch.rand(offered.shape)).floor())
    device = DeviceCalibration(calibration_key(calibration), 3, 4, torch.device("cpu"))
    device.load(calibration)
    assert torch.equal(device.refit(), calibration.rates().float().log().flatten())
    with pytest.raises(ValueError, match="^accepted: "):
        calibration.add_counts(offered, offered + 1)
    with pytest.raises(ValueError, match="^offered: "):
        calibration.add_counts(offered[:2], offered[:2])


def test_device_counts_are_the_path_outcomes():
    """A step's counts by cell are those of :func:`~specdecode.trees.outcomes.path_outcomes`,
    active rows only."""
    from specdecode.trees.outcomes import path_outcomes

    parents = torch.tensor([[-1, 0, 0, 1, 1, 3], [-1, 0, 1, 2, 0, 4], [-1, 0, 0, 0, 1, 2]])
    nodes = torch.tensor([[0, 1, 3, 5], [0, 4, -1, -1], [0, 2, 5, -1]])
    cells = torch.randint(0, 40, parents.shape, generator=torch.Generator().manual_seed(1))
    active = torch.tensor([True, True, False])
    device = DeviceCalibration(calibration_key(AcceptanceCalibration(max_depth=2)), 2, 3, torch.device("cpu"))
    device.count(cells, parents, nodes, active)
    offered, accepted = path_outcomes(parents, torch.full((3,), 6), nodes)
    offered, accepted = offered & active[:, None], accepted & active[:, None]
    size = device.offered.numel()
    assert torch.equal(device.offered.flatten(), torch.bincount(cells[offered], minlength=size).double())
    assert torch.equal(device.accepted.flatten(), torch.bincount(cells[accepted], minlength=size).double())


def assert_same_trees(target, pairs, ids, mask) -> None:
    """For each ``(static drafter, eager drafter)`` of ``pairs`` (one generation each, in
    order): the two draft the same trees, row by row and step by step."""
    want = hf_greedy_16(target, ids, mask)
    for static_drafter, eager_drafter in pairs:
        _, steps = recorded_trees(static_drafter)
        eager, _ = recorded_trees(eager_drafter)
        assert torch.equal(run_16(target, static_drafter, ids, mask).sequences, want)
        assert torch.equal(run_16(target, eager_drafter, ids, mask, decode_path="eager").sequences, want)
        for r in range(ids.shape[0]):
            mine = [(tokens[rows.index(r)], parents[rows.index(r)]) for rows, tokens, parents in eager if r in rows]
            assert mine and len(steps) >= len(mine)
            for step, ((tokens, parents), (got_tokens, got_parents)) in enumerate(zip(mine, steps)):
                assert torch.equal(got_tokens[r], tokens) and torch.equal(got_parents[r], parents), (r, step)
        for drafter in (static_drafter, eager_drafter):
            del drafter.propose, drafter.static_propose_tree


@pytest.mark.parametrize("broken", [None, "not_counted", "not_loaded"])
def test_calibrated_static_trees_are_the_eager_ones(broken, monkeypatch):
    """The calibrated builder on both paths drafts the same trees: counts updated after every
    step, carried to the next generation by a kept builder, and a fresh builder starting from
    nothing on a layout kept from another builder's generations. A device calibration that
    counts nothing, or that does not load the builder's counts, fails the check."""
    target, draft = make_pair("llama", init=0.1)
    ids, mask = left_padded([6, 3, 8], seed=2)
    if broken == "not_counted":
        monkeypatch.setattr(DeviceCalibration, "count", lambda *args: None)
    elif broken == "not_loaded":
        monkeypatch.setattr(DeviceCalibration, "load", lambda *args: None)

    def check() -> None:
        for top_k in (3, 2):
            def drafters() -> tuple:
                return tuple(ModelDrafter(draft, tree=DynamicTree(8, 4, top_k=top_k)) for _ in range(2))

            kept = drafters()
            assert_same_trees(target, [kept, kept, drafters()], ids, mask)

    if broken is None:
        check()
        return
    with pytest.raises(AssertionError):
        check()


# ------------------------------------------------------------------------ kernels


@pytest.mark.parametrize("calibrated, per_level", [(False, 8), (True, 11)])
def test_a_dynamic_level_costs_a_few_kernels_and_no_host_read(calibrated, per_level):
    """Besides its draft forward, a level costs 8 kernels (11 calibrated: a bucket, a cell and a
    table look-up per candidate)."""
    from specdecode.bench.kernels import count_step

    target, draft = make_pair("llama")
    ids = left_padded([6], seed=3)[0]

    def step(depth: int):
        builder = DynamicTree(16, depth, calibrated=calibrated)
        return count_step(lambda: generate(target, ModelDrafter(draft, tree=builder), ids, max_new_tokens=12,
                                           eos_token_id=[], pad_token_id=PAD, decode_path="static"),
                          target, [target, draft])

    shallow, deep = step(3), step(7)
    assert shallow.host_reads == deep.host_reads == 0
    assert (deep.total("forward") - shallow.total("forward")) / 4 == shallow.kernels["draft"]["forward"] / 3
    assert (deep.total("bookkeeping") - shallow.total("bookkeeping")) / 4 == per_level
