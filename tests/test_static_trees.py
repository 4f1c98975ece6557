"""Token trees on the static decode path (``decode_path="static"``,
:mod:`specdecode.engine.static_tree`) on the CPU: the step functions ``decode_path="graphed"``
records, run eagerly.

- no tensor value read on the host while the steps run (every children scheme);
- greedy output equals the target's own greedy ``generate`` (three architectures, batch 1 and a
  left-padded batch of 3; fixed shapes, ``tree="static"``, Sequoia's shape and EAGLE-2 dynamic
  trees; ``LayerSkipDrafter`` too), EOS and ``max_new_tokens`` inside an accepted path, and a
  fixed tree accepts exactly what the eager path accepts (the draft's cache is moved along the
  accepted path correctly, or acceptance would differ);
- the whole-loop sampling law (the exact joint of the first three tokens) for every lossless
  tree rule the path offers, each with its children scheme, and two broken variants of the step
  that the same test rejects (a tree mask leaking sibling columns; the accepted path's
  keys/values not moved into place);
- what the path refuses for trees, with the argument named.
"""

from __future__ import annotations

import pytest
import torch
from test_generate_models import PAD, _one_thread, left_padded, make_model, make_pair  # noqa: F401
from test_generate_sampling import K, PROMPT, V, chi_square_p, exact_joint

import specdecode.engine.static_layouts as static_layouts
import specdecode.engine.static_loop as static_loop
import specdecode.models.static_cache as static_cache
from specdecode import LayerSkipDrafter, ModelDrafter, generate
from specdecode.drafters import DrafterBase, StaticTreeDrafter
from specdecode.trees.builders import DynamicTree, SequoiaTree, StaticTree, TreeBuilder

MAX_NEW = 20
PASS_P, FAIL_P = 1e-4, 1e-6
SHAPE = [[0], [1], [0, 0], [0, 1], [1, 0]]
PATHS = [[0], [1], [0, 0], [1, 0]]  # GBV's layout: K = 2 paths of length 2


@pytest.fixture(autouse=True)
def _fresh_sessions():
    static_loop.clear_static_sessions()
    yield
    static_loop.clear_static_sessions()


def hf_greedy(target, ids, mask=None, max_new_tokens=MAX_NEW, **kwargs):
    return target.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                           pad_token_id=PAD, **kwargs)


def run(target, draft, ids, mask=None, decode_path="static", **kwargs):
    kwargs.setdefault("max_new_tokens", MAX_NEW)
    return generate(target, draft, ids, mask, pad_token_id=PAD, decode_path=decode_path, **kwargs)


# ------------------------------------------------------------------------ greedy exactness


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2"])
def test_greedy_static_trees_equal_target_generate(arch):
    target, draft = make_pair(arch)
    ids, mask = left_padded([5, 9, 2], seed=1)
    ref3, ref1 = hf_greedy(target, ids, mask), hf_greedy(target, ids[1:2])
    trees = [("static", 8), (SHAPE, 0), ("sequoia", 7), ("dynamic", 8), (DynamicTree(10, 3, top_k=3), 0)]
    for tree, num_nodes in trees:
        extra = {"num_nodes": num_nodes} if num_nodes else {}
        out = run(target, draft, ids, mask, tree=tree, **extra)
        assert torch.equal(out.sequences, ref3), (arch, tree)
        assert out.stats.decode_path == "static" and out.stats.tree_rule == "deterministic"
        assert out.stats.accepted_tokens > 0
        assert torch.equal(run(target, draft, ids[1:2], tree=tree, **extra).sequences, ref1), (arch, tree)


def test_eos_and_max_new_tokens_inside_an_accepted_path():
    target, draft = make_pair("llama")
    ids, mask = left_padded([5, 8, 3, 6], seed=7)
    free = run(target, target, ids, mask, tree=SHAPE, eos_token_id=[], max_new_tokens=24).sequences[:, 8:].tolist()
    eos = [next(t for t in row[k:] if t not in row[:k]) for row, k in zip(free[:3], (2, 8, 15))]
    for drafter in (target, draft):  # a draft equal to the target accepts whole paths
        out = run(target, drafter, ids, mask, tree=SHAPE, eos_token_id=eos, max_new_tokens=24)
        assert torch.equal(out.sequences, hf_greedy(target, ids, mask, max_new_tokens=24, eos_token_id=eos))
    for max_new in (1, 2, 5):
        out = run(target, target, ids, mask, tree="dynamic", num_nodes=6, tree_depth=3, max_new_tokens=max_new)
        assert torch.equal(out.sequences, hf_greedy(target, ids, mask, max_new_tokens=max_new))
        assert out.stats.new_tokens == 4 * max_new


def test_layer_skip_drafter_drafts_static_trees():
    target = make_model("llama", layers=3, init=0.05)
    ids, mask = left_padded([5, 8, 3], seed=12)
    out = run(target, LayerSkipDrafter(target, layers=[0, 2]).with_tree(SHAPE), ids, mask)
    assert torch.equal(out.sequences, hf_greedy(target, ids, mask)) and out.stats.accepted_tokens > 0


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_fixed_trees_accept_what_the_eager_path_accepts(arch):
    """The same fixed tree drafted from the same draft logits: the static path accepts exactly
    as many tokens in as many steps as the eager one (whose draft cache is re-fed), so its draft
    cache holds the right keys/values after every move along an accepted path."""
    target, draft = make_pair(arch)
    ids, mask = left_padded([6, 3, 8], seed=2)
    for tree in (SHAPE, DynamicTree(8, 4, top_k=3, calibrated=False)):
        eager, static = (run(target, draft, ids, mask, decode_path=path, tree=tree) for path in ("eager", "static"))
        assert torch.equal(eager.sequences, static.sequences)
        assert (eager.stats.accepted_tokens, eager.stats.steps) == (static.stats.accepted_tokens, static.stats.steps)
        assert static.stats.rejections > 0  # rejected side branches were exercised


def test_tree_layouts_are_reused_and_keyed_by_the_tree():
    target, draft = make_pair("llama")
    ids, mask = left_padded([5, 8, 3], seed=7)
    first = run(target, draft, ids, mask, tree=SHAPE, eos_token_id=[])
    again = run(target, draft, ids, mask, tree=SHAPE, eos_token_id=[])
    assert torch.equal(first.sequences, again.sequences) and again.stats.graph_captures == 0
    assert again.stats.host_syncs_per_step == 1.0  # a tree step reads nothing on the host
    run(target, draft, ids, mask, tree=PATHS, eos_token_id=[])
    assert len(static_layouts.kept_layouts(target)) == 2  # one layout per tree shape


def test_tree_steps_read_no_tensor_on_the_host(monkeypatch):
    """The CPU's stand-in for CUDA's sync debug mode: while the steps run (no stop check asked
    for), every way Python reads a tensor's value raises."""
    target, draft = make_pair("llama")
    ids, mask = left_padded([5, 9, 2], seed=1)
    original = static_loop.StaticEngine._decode
    reads = ("item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__")

    def strict(self, session, program):
        saved = {name: getattr(torch.Tensor, name) for name in reads}

        def refuse(name):
            def read(*args, **kwargs):
                raise AssertionError(f"Tensor.{name} inside a static step")
            return read

        for name in reads:
            setattr(torch.Tensor, name, refuse(name))
        try:
            return original(self, session, program)
        finally:
            for name, method in saved.items():
                setattr(torch.Tensor, name, method)

    monkeypatch.setattr(static_loop.StaticEngine, "_decode", strict)
    sampled = dict(do_sample=True, generator=torch.Generator().manual_seed(0))
    for kwargs in (dict(tree=SHAPE), dict(tree="dynamic", num_nodes=6, tree_depth=3),
                   dict(tree=SHAPE, tree_children="iid", **sampled),
                   dict(tree=SHAPE, tree_children="without_replacement", **sampled),
                   dict(tree=SHAPE, tree_children="hub", top_k=5, **sampled)):
        out = run(target, draft, ids, mask, max_new_tokens=8, eos_token_id=[], stop_check_every=8, **kwargs)
        assert out.stats.step_host_syncs == 0 and out.stats.new_tokens == 3 * 8


# ------------------------------------------------------------------------ sampling exactness

N_SAMPLES = 6000
LOSSLESS = [("specinfer", "iid", SHAPE), ("rrs", "without_replacement", SHAPE),
            ("deterministic", "deterministic", SHAPE), ("traversal", "without_replacement", SHAPE),
            ("traversal_iid", "iid", SHAPE), ("gbv", "iid", PATHS), ("spectr", "iid", SHAPE), ("spechub", "hub", SHAPE)]


@pytest.fixture(scope="module")
def pair():
    """The V = 8 pair of tests/test_generate_sampling.py (as many key/value heads as query heads,
    see tests/test_static_generate.py)."""
    target, draft = make_pair("llama", vocab=V, init=0.3, seed=1, num_key_value_heads=4)
    for model in (target, draft):
        model.config.eos_token_id = None
        model.generation_config.eos_token_id = None
    return target, draft, exact_joint(target, PROMPT)


def sample_tree(target, draft, n=N_SAMPLES, seed=0, **kwargs):
    ids = torch.tensor([PROMPT]).expand(n, -1)
    out = generate(target, draft, ids, do_sample=True, max_new_tokens=K, eos_token_id=[], pad_token_id=PAD,
                   generator=torch.Generator().manual_seed(seed), decode_path="static", **kwargs)
    return out.sequences[:, len(PROMPT):], out.stats


@pytest.mark.parametrize("rule, children, shape", LOSSLESS, ids=[case[0] for case in LOSSLESS])
def test_static_tree_sampling_is_lossless(pair, rule, children, shape):
    target, draft, joint = pair
    tokens, stats = sample_tree(target, draft, tree=shape, tree_children=children, rule=rule)
    assert stats.tree_rule == rule and stats.accepted_tokens > 0
    assert chi_square_p(tokens, joint) > PASS_P


def test_static_dynamic_tree_sampling_is_lossless(pair):
    """A dynamic tree samples in the Sequoia shape of the sampled profile (rrs), or keeps its
    top-k children at every temperature (deterministic)."""
    target, draft, joint = pair
    for children, rule in (("without_replacement", "rrs"), ("deterministic", "deterministic")):
        tokens, stats = sample_tree(target, draft, tree="dynamic", num_nodes=5, tree_depth=2, tree_children=children)
        assert stats.tree_rule == rule
        assert chi_square_p(tokens, joint) > PASS_P


def test_static_tree_sampling_with_filters_is_lossless(pair):
    """Children without replacement under top-k / top-p are drawn from the processed q itself."""
    target, draft, _ = pair
    filters = dict(temperature=0.8, top_k=6, top_p=0.9)
    tokens, stats = sample_tree(target, draft, tree=SHAPE, tree_children="without_replacement", **filters)
    assert stats.tree_rule == "rrs"
    assert chi_square_p(tokens, exact_joint(target, PROMPT, **filters)) > PASS_P


def _break_stale_mask(monkeypatch):
    """Broken: every node also sees the tree columns before its own (its elder siblings and
    their subtrees): the causal mask of a chain laid over a tree."""
    original = static_cache.tree_inputs

    def leaky(lengths, start, visible, capacity, dtype):
        S = visible.shape[2]
        lower = torch.ones(S, S, dtype=torch.bool).tril()[: visible.shape[1]]
        return original(lengths, start, visible | lower, capacity, dtype)

    monkeypatch.setattr(static_cache, "tree_inputs", leaky)


def _break_path_write_back(monkeypatch):
    """Broken: the accepted path's keys/values are never moved next to the root, so column
    ``lengths + j`` keeps node ``j``'s (a sibling of the accepted node, or a node off the path)."""
    monkeypatch.setattr(static_cache, "move_columns", lambda cache, source, target: None)


@pytest.mark.parametrize("broken", ["stale_mask", "path_write_back"])
def test_broken_static_tree_steps_fail_the_same_test(pair, broken, monkeypatch):
    target, draft, joint = pair
    {"stale_mask": _break_stale_mask, "path_write_back": _break_path_write_back}[broken](monkeypatch)
    # three distinct children of depth 1: every third token comes from a second step, whose
    # context holds the first step's accepted child (often not the first one) at column lengths + 1
    tokens, _ = sample_tree(target, draft, tree=[[0], [1], [2]], tree_children="without_replacement", rule="rrs")
    assert chi_square_p(tokens, joint) < FAIL_P


def test_static_tree_sampling_is_seeded():
    target, draft = make_pair("llama")
    ids, mask = left_padded([5, 8, 3], seed=13)
    runs = [run(target, draft, ids, mask, tree=SHAPE, tree_children="without_replacement", do_sample=True,
                temperature=0.9, top_k=20, generator=torch.Generator().manual_seed(seed)).sequences
            for seed in (7, 7, 8)]
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], runs[2])


# ------------------------------------------------------------------------ refusals


def test_tree_refusals_name_the_argument():
    target, draft = make_pair("llama")
    ids, mask = left_padded([5, 3], seed=14)
    sampled = dict(do_sample=True, generator=torch.Generator().manual_seed(0))
    cases = [
        (dict(tree=SHAPE, tree_children="iid", rule="rrs", **sampled), "rule: 'rrs' is lossless only"),
        (dict(tree=SHAPE, rule="block"), "rule: 'block' is a chain rule"),
        (dict(tree=SHAPE, tree_children="iid", rule="gbv", **sampled), "rule: 'gbv' verifies K paths"),
        (dict(tree="dynamic", tree_children="iid", rule="gbv", **sampled), "rule: 'gbv' verifies K paths"),
        (dict(tree=SHAPE, tree_children="hub", decode_path="graphed", **sampled), "^tree_children: 'hub'"),
        (dict(tree=SHAPE, tree_children="without_replacement", decode_path="graphed", top_p=0.9, **sampled),
         "^tree_children: 'without_replacement' children under top_k"),
        (dict(tree=SHAPE, decode_path="graphed"), "^decode_path: 'graphed' records CUDA graphs"),
    ]
    for kwargs, match in cases:
        with pytest.raises(ValueError, match=match):
            run(target, draft, ids, mask, max_new_tokens=4, **kwargs)

    class HostBuilt(TreeBuilder):  # a builder that decides on the host
        max_nodes = 3

    with pytest.raises(ValueError, match="^tree: HostBuilt builds its trees on the host"):
        run(target, ModelDrafter(draft, tree=HostBuilt()), ids, mask, max_new_tokens=4)

    class ChainsOnly(DrafterBase):  # a static drafter of chains only, given a tree
        tree = StaticTree(SHAPE)

        def static_key(self):
            return ("chains-only",)

        def static_prefill(self, state, num_tokens):
            return None

        def static_propose(self, state, num_tokens):
            raise AssertionError("never called")

    assert not isinstance(ChainsOnly(), StaticTreeDrafter)
    with pytest.raises(ValueError, match="^tree: ChainsOnly cannot draft token trees"):
        run(target, ChainsOnly(), ids, mask, max_new_tokens=4)
    # a typical-acceptance tree (lossy, compiled) runs; a Sequoia tree is frozen at its current shape
    run(target, draft, ids, mask, max_new_tokens=4, tree=SHAPE, rule="typical", **sampled)
    run(target, ModelDrafter(draft, tree=SequoiaTree(6)), ids, mask, max_new_tokens=4)
