"""The compiled static decode path (``decode_path="compiled"``) on the CPU: the static step
compiled whole by ``torch.compile`` (Inductor's C++ backend) once per layout, and the target's
prefill once per prompt bucket. A C++ compiler runs for every new layout (a minute or more on a
busy 2-core machine), so the Inductor tests are few and small (tiny models, short generations,
few layouts):

- greedy output equals the target's own greedy ``generate``: the target alone and a draft
  model's chains on a left-padded batch;
- each layout is compiled once: another call, prompts of other lengths in the same bucket and
  other prompts of the same batch size compile nothing (Dynamo's counters) and share the layout;
- a compiled step launches at most a third of the kernels of the eager static step
  (:func:`specdecode.engine.launch_count.step_launches`);
- the exact whole-loop sampling test (tests/test_generate_sampling.py) for the token rule, which
  a broken step (drafts and verification sharing coins) fails, and for a tree rule (specinfer,
  i.i.d. children);
- the other drafter kinds trace whole, compile once and give the target's greedy output: a
  draft model's dynamic trees, EAGLE chains, Medusa trees (target features moved along the
  accepted path) and Hydra chains, traced by Dynamo and run by AOT autograd's eager backend
  (:data:`specdecode.engine.compiled.BACKEND`: the same graphs, guards and mutations as
  Inductor gets, without a C++ compiler);
- prompts share a layout per bucket of PROMPT_MULTIPLE columns, with sliding windows too;
- what it refuses, naming the argument.
"""

from __future__ import annotations

import pytest
import torch
from test_generate_models import PAD, _one_thread, left_padded, make_pair  # noqa: F401
from test_generate_sampling import K, PROMPT, chi_square_p, exact_joint
from test_static_features import eagle_drafter, hydra_heads, medusa_heads, target_model
from test_static_generate import FAIL_P, PASS_P, _break_coin_reuse, pair  # noqa: F401
from torch._dynamo.utils import counters

import specdecode.engine.compiled as compiled
import specdecode.engine.static_loop as static_loop
from specdecode import ModelDrafter, generate
from specdecode.drafters import HydraDrafter, MedusaDrafter
from specdecode.engine.launch_count import step_launches
from specdecode.engine.static_layouts import kept_layouts
from specdecode.trees.builders import DynamicTree

MAX_NEW = 12
SHAPE = [[0], [1], [0, 0], [0, 1], [1, 0]]


@pytest.fixture(autouse=True)
def _fresh_sessions():
    static_loop.clear_static_sessions()
    yield
    static_loop.clear_static_sessions()


def hf_greedy(target, ids, mask=None):
    return target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW, pad_token_id=PAD)


def run(target, draft, ids, mask=None, decode_path="compiled", **kwargs):
    kwargs.setdefault("max_new_tokens", MAX_NEW)
    return generate(target, draft, ids, mask, pad_token_id=PAD, decode_path=decode_path, **kwargs)


def graphs_compiled() -> int:
    return counters["stats"]["unique_graphs"]


def layout_of(target, path: str):
    """The most recently used layout of ``target`` on ``path``."""
    return [layout for layout in kept_layouts(target) if layout.program.compiled == (path == "compiled")][-1]


# ------------------------------------------------------------------------ greedy, compiled once


def test_greedy_equals_the_target_each_layout_compiles_once_and_launches_a_third():
    target, draft = make_pair("llama")
    batches = [left_padded([5, 9, 2], seed=1), left_padded([7, 3, 12], seed=2)]  # one prompt bucket
    wants = [hf_greedy(target, ids, mask) for ids, mask in batches]
    for source, gamma in ((None, 1), (draft, 3)):  # a draft model: a new ModelDrafter at every call
        before = graphs_compiled()
        out = run(target, source, *batches[0], num_draft_tokens=gamma)
        assert torch.equal(out.sequences, wants[0]) and out.stats.decode_path == "compiled"
        assert graphs_compiled() == before + 2  # the step and the prefill
        layouts = len(kept_layouts(target))
        for (ids, mask), want in zip(batches, wants):  # again, and prompts of other lengths: nothing compiles
            assert torch.equal(run(target, source, ids, mask, num_draft_tokens=gamma).sequences, want)
        assert graphs_compiled() == before + 2 and len(kept_layouts(target)) == layouts
        if source is not None:
            assert out.stats.accepted_tokens > 0 and out.stats.rejections > 0
        # kernels per step, counted with the drafter object of the layout's last generation
        drafter = static_loop.TargetOnly() if source is None else ModelDrafter(draft)
        launched = {}
        for path in ("compiled", "static"):
            again = run(target, None if source is None else drafter, *batches[0], num_draft_tokens=gamma,
                        decode_path=path)
            assert torch.equal(again.sequences, wants[0])
            launched[path] = step_launches(layout_of(target, path), drafter)
        assert graphs_compiled() == before + 2  # nor did counting
        assert 0 < 3 * launched["compiled"] <= launched["static"], launched


@pytest.fixture
def traced_only(monkeypatch):
    """Compile with AOT autograd's eager backend: Dynamo traces the phases whole as for Inductor."""
    monkeypatch.setattr(compiled, "BACKEND", "aot_eager")


def reduced_heads(heads):
    """``heads`` over a reduced head of every other id (traced like the target's own head)."""
    heads.set_head_tokens(torch.arange(1, heads.target_vocab, 2))
    return heads


def test_every_drafter_kind_traces_whole_and_compiles_once(traced_only):
    target, draft = make_pair("llama")
    ids, mask = left_padded([5, 9, 2], seed=1)
    features = target_model("llama")
    cases = [(target, draft, dict(tree=DynamicTree(6, 3, top_k=2, calibrated=False))),
             (features, eagle_drafter(features), dict(num_draft_tokens=3)),
             (features, MedusaDrafter(features, medusa_heads(features), tree=[(0,), (1,), (0, 0)]), {}),
             (features, HydraDrafter(features, hydra_heads(features)), dict(num_draft_tokens=2)),
             (features, HydraDrafter(features, reduced_heads(hydra_heads(features))), dict(num_draft_tokens=2))]
    feature_ids = left_padded([5, 9, 2], vocab=111, seed=3)
    for model, drafter, kwargs in cases:
        batch = (ids, mask) if model is target else feature_ids
        want = hf_greedy(model, *batch)
        out = run(model, drafter, *batch, **kwargs)
        before = graphs_compiled()
        again = run(model, drafter, *batch, **kwargs)
        assert torch.equal(out.sequences, want) and torch.equal(again.sequences, want), (drafter, kwargs)
        assert graphs_compiled() == before and out.stats.decode_path == "compiled"


def test_prompt_buckets_and_sliding_windows(traced_only):
    """Prompts are padded to a multiple of PROMPT_MULTIPLE columns, sliding windows or not: a
    sliding layer's mask counts the tokens of each row's own sequence, never the padding, so
    every row gives its own greedy output (alone, unpadded) past the window."""
    target, draft = make_pair("mistral", sliding_window=6)
    ids, mask = left_padded([5, 9], seed=16)
    out = run(target, draft, ids, mask, num_draft_tokens=3, max_new_tokens=8)
    for row in range(2):
        alone = ids[row: row + 1, mask[row].bool()]
        want = target.generate(alone, do_sample=False, max_new_tokens=8, pad_token_id=PAD)
        assert torch.equal(out.sequences[row, -want.shape[1]:], want[0])
    assert kept_layouts(target)[-1].state.prompt_width == static_loop.PROMPT_MULTIPLE + 1


# ------------------------------------------------------------------------ sampling exactness

N = 6000  # tests/test_static_trees.py's size: the broken step below gives p = 0.0 already


def sample(target, draft, n=N, **kwargs):
    """The second generation of a layout: the first compiles (its first step runs eagerly), the
    second runs the compiled step at every step."""
    ids = torch.tensor([PROMPT]).expand(n, -1)
    for seed in (1, 0):
        out = run(target, draft, ids, do_sample=True, max_new_tokens=K, eos_token_id=[],
                  generator=torch.Generator().manual_seed(seed), **kwargs)
    return out.sequences[:, len(PROMPT):], out.stats


@pytest.mark.parametrize("broken", [False, True], ids=["token", "coin_reuse"])
def test_sampling_is_lossless_and_a_broken_step_fails(pair, broken, monkeypatch):
    """The token rule (the other compiled chain rules are the same op call with another name;
    tests/test_static_generate.py runs the block rule on the same step functions)."""
    target, draft = pair
    if broken:
        _break_coin_reuse(monkeypatch)  # before the layout is made: the compiled step is the broken one
    tokens, stats = sample(target, draft, num_draft_tokens=2, rule="token")
    assert stats.decode_path == "compiled" and 0.2 < stats.acceptance_rate < 0.9
    p = chi_square_p(tokens, exact_joint(target, PROMPT))
    assert (p < FAIL_P) if broken else (p > PASS_P)


def test_tree_sampling_is_lossless(pair):
    target, draft = pair
    tokens, stats = sample(target, draft, tree=SHAPE, tree_children="iid", rule="specinfer")
    assert stats.tree_rule == "specinfer" and stats.accepted_tokens > 0
    assert chi_square_p(tokens, exact_joint(target, PROMPT)) > PASS_P


# ------------------------------------------------------------------------ refusals


def test_refusals_name_the_argument():
    target, draft = make_pair("llama")
    ids, mask = left_padded([5, 3], seed=14)
    with pytest.raises(ValueError, match="^cpu_fast_path: decode_path='compiled'"):
        run(target, draft, ids, mask, cpu_fast_path=True)
    with pytest.raises(ValueError, match="'compiled'"):
        run(target, draft, ids, mask, decode_path="compile")
    with pytest.raises(TypeError, match="^cpu_fast_path"):
        run(target, draft, ids, mask, cpu_fast_path="yes")
