"""Feature drafters drafting token trees on the static decode path (``decode_path="static"``,
:mod:`specdecode.engine.static_tree` with :mod:`specdecode.engine.static_features`), on the CPU:

- greedy output equals the target's own greedy ``generate`` (Llama, GPT-2, Qwen2; a left-padded
  batch of 3) for EAGLE (full head: a fixed shape and an EAGLE-2 dynamic tree; EAGLE-3-style
  features with a reduced head), Medusa and Hydra trees (rank paths that skip ranks), and every
  row's tree equals the one the eager path drafts for it, step by step (the drafter read the
  right features: the ones the eager loop hands over); also with prompts shorter than the tree;
- after every step the feature buffer holds a plain forward's features at every committed
  column of every row, the accepted path's features moved onto the chain columns; a step that
  leaves them where the tree put them fails that check;
- the joint law of the first tokens is the target's (EAGLE with ``rrs`` and ``specinfer``
  children, full and reduced head; EAGLE-2, Medusa and Hydra with the ``deterministic`` rule), and two
  broken steps fail the same test (each node's ``q`` reported as the root's; the accepted path's
  target keys/values left where the tree put them);
- no tensor value is read on the host while the steps run; layouts are keyed by the rank
  paths; what stays refused is refused with the argument named; the static dynamic tree's
  default depth.
"""

from __future__ import annotations

import pytest
import torch
from test_drafter_hydra import Oracle
from test_drafter_hydra import random_heads as hydra_heads
from test_drafter_medusa import Ahead
from test_drafter_medusa import random_heads as medusa_heads
from test_generate_models import PAD, _one_thread, left_padded, make_model  # noqa: F401
from test_generate_sampling import K, PROMPT, V, chi_square_p, exact_joint
from test_static_features import checked, eagle_drafter, no_host_reads, target_model

import specdecode
import specdecode.engine.static_layouts as static_layouts
import specdecode.engine.static_loop as static_loop
import specdecode.engine.static_tree as static_tree
import specdecode.models.static_cache as static_cache
from specdecode.drafters import HydraDrafter, MedusaDrafter
from specdecode.drafters.eagle import EagleDrafter, EagleModel
from specdecode.sampling import SamplingParams
from specdecode.trees.builders import DynamicTree
from specdecode.trees.static_growth import STATIC_DYNAMIC_DEPTH, plan_static_tree

MAX_NEW = 16
PASS_P, FAIL_P = 1e-4, 1e-6
SHAPE = [[0], [1], [0, 0], [0, 1], [1, 0]]
DEEP = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0], [1, 0, 0]]  # nodes with children below depth 1
RANKS = [(0,), (2,), (0, 0), (0, 2), (2, 1), (0, 0, 0)]  # Medusa rank paths that skip ranks
KINDS = ["eagle", "eagle_dynamic", "eagle3_reduced", "medusa", "hydra"]


@pytest.fixture(autouse=True)
def _fresh_sessions():
    static_loop.clear_static_sessions()
    yield
    static_loop.clear_static_sessions()


def tree_drafter(kind: str, target):
    """Drafters whose drafts depend on the features they read (EAGLE's feature weights are
    small enough that it is still accepted now and then)."""
    if kind == "eagle":
        return eagle_drafter(target, std=0.03).with_tree(DEEP)
    if kind == "eagle_dynamic":
        return eagle_drafter(target, std=0.03).with_tree(DynamicTree(10, 4, top_k=2, calibrated=False))
    if kind == "eagle3_reduced":
        return eagle_drafter(target, layers=(0, 2, -1), reduced=True, std=0.03).with_tree(DEEP)
    if kind == "medusa":
        return MedusaDrafter(target, medusa_heads(target), tree=RANKS)
    return HydraDrafter(target, hydra_heads(target), tree=RANKS)


def run(target, drafter, ids, mask=None, decode_path="static", **kwargs):
    kwargs.setdefault("max_new_tokens", MAX_NEW)
    return specdecode.generate(target, drafter, ids, mask, pad_token_id=PAD, decode_path=decode_path, **kwargs)


def hf_greedy(target, ids, mask=None, max_new_tokens=MAX_NEW, **kwargs):
    return target.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                           pad_token_id=PAD, **kwargs)


def recorded_trees(drafter):
    """Wrap ``propose`` and ``static_propose_tree`` (on the instance) to keep every tree: eager
    ones as (row ids, tokens, parents), static ones as (tokens, parents) ``[B, N]``."""
    eager, steps = [], []
    propose, propose_tree = drafter.propose, drafter.static_propose_tree

    def keep_eager(state, num_tokens):
        proposal = propose(state, num_tokens)
        eager.append((state.row_ids.tolist(), proposal.tree.tokens.clone(), proposal.tree.parents.clone()))
        return proposal

    def keep_static(state, plan):
        draft = propose_tree(state, plan)
        steps.append((draft.tokens.clone(), draft.parents.clone()))
        return draft

    drafter.propose, drafter.static_propose_tree = keep_eager, keep_static
    return eager, steps


# ------------------------------------------------------------------------ greedy exactness


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2"])
def test_greedy_trees_equal_the_target_and_the_eager_trees(arch):
    target = target_model(arch)
    ids, mask = left_padded([5, 9, 2], vocab=111, seed=3)
    want = hf_greedy(target, ids, mask)
    accepted = sum(assert_trees_of_the_eager_path(target, tree_drafter(kind, target), ids, mask, want)
                   for kind in KINDS)
    assert accepted > 0


def assert_trees_of_the_eager_path(target, drafter, ids, mask, want) -> int:
    """The static path's greedy output is ``want`` (the eager path's too), and every row's tree
    (tokens and parents) is the one the eager path drafts for it, step by step; returns the
    static path's accepted drafts."""
    eager, steps = recorded_trees(drafter)
    out = run(target, drafter, ids, mask)
    assert torch.equal(out.sequences, want)
    assert out.stats.decode_path == "static" and out.stats.tree_rule == "deterministic"
    assert torch.equal(run(target, drafter, ids, mask, decode_path="eager").sequences, want)
    for r in range(ids.shape[0]):
        mine = [(tokens[rows.index(r)], parents[rows.index(r)]) for rows, tokens, parents in eager if r in rows]
        assert mine and len(steps) >= len(mine)
        for step, ((tokens, parents), (got_tokens, got_parents)) in enumerate(zip(mine, steps)):
            assert torch.equal(got_tokens[r], tokens) and torch.equal(got_parents[r], parents), (r, step)
    del drafter.propose, drafter.static_propose_tree
    return out.stats.accepted_tokens


def test_prompts_shorter_than_the_tree():
    """Prompts of one and two tokens under trees of depth 3 and 4: EAGLE's first window starts at
    column 0 and its pending column's output is picked from it."""
    target = target_model("llama")
    ids, mask = left_padded([1, 2], vocab=111, seed=7)
    want = hf_greedy(target, ids, mask)
    for kind in ("eagle", "eagle_dynamic", "medusa"):
        assert_trees_of_the_eager_path(target, tree_drafter(kind, target), ids, mask, want)


def test_exact_heads_accept_whole_paths():
    """Exact Hydra heads on a tree whose rank-0 path is the continuation: every step accepts
    the tree's full depth (the path's features moved onto the chain columns are the ones the
    next step reads)."""
    target = target_model("qwen2", seed=3)
    ids = left_padded([6], vocab=111, seed=5)[0]
    want = hf_greedy(target, ids, max_new_tokens=12)
    out = run(target, HydraDrafter(target, Oracle(target, 3, want[0]).eval(), tree=RANKS), ids, max_new_tokens=12)
    assert torch.equal(out.sequences, want) and out.stats.steps == 3


# ------------------------------------------------------------------------ the feature buffer


def checked_trees(drafter, counter: list[int]):
    """``static_propose_tree`` checking the feature buffer first (:func:`checked`)."""
    return checked(drafter, counter, "static_propose_tree")


def test_features_are_the_committed_columns_after_every_tree_step(monkeypatch):
    """Exact Medusa heads that go wrong at every third position, on a tree whose depth-2 nodes
    sit two columns after their chain column: rows accept paths of different depths and stop at
    EOS at different steps; before every tree each row's committed columns hold its true
    features. Also for an EAGLE-3-style tree. Leaving the path's features where the tree put
    them fails the check."""
    target = target_model("llama", seed=1)
    ids, mask = left_padded([5, 9, 1], vocab=111, seed=4)
    want = hf_greedy(target, ids, mask, max_new_tokens=24, eos_token_id=[7])
    sequences = [row[m.bool()] for row, m in zip(want, torch.cat([mask, torch.ones_like(want[:, 9:])], 1))]
    tree = [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]

    def medusa():
        return MedusaDrafter(target, Ahead(target, 3, sequences, wrong_every=3), tree=tree)

    counter = [0]
    out = run(target, checked_trees(medusa(), counter), ids, mask, max_new_tokens=24, eos_token_id=[7])
    assert torch.equal(out.sequences, want)
    assert counter[0] > 10 and out.stats.accepted_tokens > out.stats.steps  # paths deeper than one node
    drafter = checked_trees(eagle_drafter(target, layers=(0, 2, -1), std=0.03).with_tree(SHAPE), counter)
    assert torch.equal(run(target, drafter, ids, mask, max_new_tokens=24, eos_token_id=[7]).sequences, want)

    monkeypatch.setattr(static_tree, "move_feature_columns", lambda buffer, source, destination: None)
    with pytest.raises(AssertionError):
        run(target, checked_trees(medusa(), counter), ids, mask, max_new_tokens=24, eos_token_id=[7])


# ------------------------------------------------------------------------ no host reads


def test_tree_steps_read_no_tensor_on_the_host(monkeypatch):
    original = static_loop.StaticEngine._decode

    def strict(self, session, program):
        with no_host_reads():
            return original(self, session, program)

    monkeypatch.setattr(static_loop.StaticEngine, "_decode", strict)
    target = target_model("llama")
    ids, mask = left_padded([5, 3], vocab=111, seed=8)
    sampled = dict(do_sample=True, generator=torch.Generator().manual_seed(0))
    eagle = eagle_drafter(target, std=0.03)
    for drafter, kwargs in ((tree_drafter("eagle_dynamic", target), {}), (tree_drafter("medusa", target), sampled),
                            (tree_drafter("hydra", target), sampled),
                            (eagle.with_tree(SHAPE, tree_children="without_replacement"), sampled)):
        out = run(target, drafter, ids, mask, max_new_tokens=8, eos_token_id=[], stop_check_every=8, **kwargs)
        assert out.stats.step_host_syncs == 0 and out.stats.new_tokens == 2 * 8


# ------------------------------------------------------------------------ sampling exactness

N_SAMPLES = 6000


@pytest.fixture(scope="module")
def target_v8():
    """The V = 8 target of tests/test_generate_sampling.py (as many key/value heads as query
    heads, as tests/test_static_trees.py has it)."""
    target = make_model("llama", vocab=V, init=0.3, seed=1, num_key_value_heads=4)
    target.config.eos_token_id = None
    target.generation_config.eos_token_id = None
    return target, exact_joint(target, PROMPT)


def random_eagle(target, reduced: bool = False) -> EagleDrafter:
    torch.manual_seed(1)
    ids = torch.arange(V - 1, -1, -2) if reduced else None
    return EagleDrafter(target, EagleModel(target, (-1,), ids).eval())


def sample_tree(target, drafter, n=N_SAMPLES, **kwargs):
    ids = torch.tensor([PROMPT]).expand(n, -1)
    out = specdecode.generate(target, drafter, ids, do_sample=True, max_new_tokens=K, eos_token_id=[],
                              pad_token_id=PAD, generator=torch.Generator().manual_seed(0), decode_path="static",
                              **kwargs)
    return out.sequences[:, len(PROMPT):], out.stats


SAMPLED = [("eagle", "rrs", "without_replacement"), ("eagle_reduced", "specinfer", "iid"),
           ("eagle_dynamic", "deterministic", None), ("medusa", "deterministic", None),
           ("hydra", "deterministic", None)]


@pytest.mark.parametrize("kind, rule, children", SAMPLED, ids=[case[0] for case in SAMPLED])
def test_static_feature_tree_sampling_is_lossless(target_v8, kind, rule, children):
    target, joint = target_v8
    if kind in ("medusa", "hydra"):
        tree = [(0,), (1,), (0, 0), (1, 0)]
        drafter = (MedusaDrafter(target, medusa_heads(target), tree=tree) if kind == "medusa"
                   else HydraDrafter(target, hydra_heads(target), tree=tree))
    elif kind == "eagle_dynamic":
        drafter = random_eagle(target).with_tree("dynamic", num_nodes=5, tree_depth=2, tree_children="deterministic")
    else:
        drafter = random_eagle(target, reduced=kind == "eagle_reduced").with_tree(SHAPE, tree_children=children)
    tokens, stats = sample_tree(target, drafter, rule=rule)
    assert stats.tree_rule == rule and stats.accepted_tokens > 0
    assert chi_square_p(tokens, joint) > PASS_P


def _q_reported_as_the_roots(monkeypatch):
    """Broken: EAGLE draws each node's children from that node's logits but reports the root's
    logits as every node's ``q``."""
    original = EagleDrafter.static_propose_tree

    def propose(self, state, plan):
        draft = original(self, state, plan)
        draft.draft_logits = draft.draft_logits[:, :1].expand_as(draft.draft_logits).contiguous()
        return draft

    monkeypatch.setattr(EagleDrafter, "static_propose_tree", propose)


def _path_not_moved(monkeypatch):
    """Broken: the accepted path's target keys/values stay where the tree put them."""
    monkeypatch.setattr(static_cache, "move_columns", lambda cache, source, target: None)


@pytest.mark.parametrize("broken, tree", [(_q_reported_as_the_roots, SHAPE), (_path_not_moved, [[0], [1], [2]])],
                         ids=["q_of_the_root", "path_not_moved"])
def test_broken_feature_tree_steps_fail_the_same_test(target_v8, broken, tree, monkeypatch):
    target, joint = target_v8
    broken(monkeypatch)
    drafter = random_eagle(target).with_tree(tree, tree_children="without_replacement")
    tokens, _ = sample_tree(target, drafter, rule="rrs")
    assert chi_square_p(tokens, joint) < FAIL_P


# ------------------------------------------------------------------------ layouts, refusals, plans


def test_layouts_are_keyed_by_the_rank_paths():
    target = target_model("gpt2")
    ids, mask = left_padded([4, 6], vocab=111, seed=9)
    heads = medusa_heads(target)
    want = hf_greedy(target, ids, mask)
    for tree in ([(0,), (1,), (0, 0)], [(0,), (2,), (0, 0)], [(0,), (1,), (0, 0)]):
        assert torch.equal(run(target, MedusaDrafter(target, heads, tree=tree), ids, mask).sequences, want)
    assert len(static_layouts.kept_layouts(target)) == 2  # same shape, other ranks: another layout


def test_feature_tree_refusals_name_the_argument():
    target = target_model("llama")
    ids, mask = left_padded([5, 3], vocab=111, seed=10)
    sampled = dict(do_sample=True, generator=torch.Generator().manual_seed(0))
    medusa = MedusaDrafter(target, medusa_heads(target), tree=[(0,), (1,)])
    cases = [
        (MedusaDrafter(target, medusa_heads(target), tree=[(0,), (200,)]), {}, "^tree: a path asks for the rank-200"),
        (medusa, dict(rule="rrs", **sampled), "^rule: 'rrs' is lossless only"),
        (HydraDrafter(target, hydra_heads(target), tree=[(0,), (1,)]), dict(rule="block"), "^rule: 'block' is a chain"),
        (medusa, dict(decode_path="graphed"), "^decode_path: 'graphed' records CUDA graphs"),
    ]

    class Resorted(DynamicTree):  # a subclass may build otherwise: refused
        pass

    cases.append((EagleDrafter(target, EagleModel(target).eval(), tree=Resorted(6)), {},
                  "^tree: Resorted builds its trees on the host"))
    for drafter, kwargs, match in cases:
        with pytest.raises(ValueError, match=match):
            run(target, drafter, ids, mask, max_new_tokens=4, **kwargs)


def test_static_dynamic_tree_depth():
    """A dynamic tree given no depth grows at most STATIC_DYNAMIC_DEPTH levels on the static
    path (every level is a draft forward there); a depth given is kept."""
    greedy = SamplingParams(temperature=0.0)
    assert plan_static_tree(DynamicTree(32), greedy, 100).max_depth == STATIC_DYNAMIC_DEPTH == 6
    assert plan_static_tree(DynamicTree(4), greedy, 100).max_depth == 3
    assert plan_static_tree(DynamicTree(32, max_depth=10), greedy, 100).max_depth == 10
    assert plan_static_tree(DynamicTree(32, calibrated=False), greedy, 100).max_depth == 6
