"""Host drafters on the static decode path (:mod:`specdecode.engine.host_drafts`): NgramDrafter
and SuffixDrafter propose on the host between two steps and feed the static or compiled step
their deterministic chains, or their tries (``num_nodes``), through persistent buffers.

- greedy output equals the target's own greedy ``generate`` and the eager path's, batch 1 and a
  left-padded batch of 3, with drafts accepted; the compiled step compiles once;
- the exact whole-loop sampling test (tests/test_generate_sampling.py) with NgramDrafter, which
  a broken variant (``q`` one-hot on another token than the one scored) fails;
- tries: greedy as above; the exact sampling test with prompt-lookup tries, which a broken
  variant (verification shown other node tokens than those scored) fails;
- what is refused: sampled host proposals (``draft``), trees from a drafter without
  ``num_nodes`` and tries the plan cannot hold (``tree``), drafters that neither run on the
  device nor opt in.
"""

from __future__ import annotations

import pytest
import torch
from test_generate_models import PAD, _one_thread, make_pair  # noqa: F401
from test_generate_sampling import K, PROMPT, V, chi_square_p, exact_joint
from test_static_generate import FAIL_P, PASS_P, pair  # noqa: F401
from torch._dynamo.utils import counters

import specdecode.engine.compiled as compiled
import specdecode.engine.static_loop as static_loop
from specdecode import NgramDrafter, SuffixDrafter, generate
from specdecode.drafters import DrafterBase, Proposal
from specdecode.drafters.base import point_mass_logits
from specdecode.engine.host_drafts import layout_view

MAX_NEW = 16
DRAFTERS = {"ngram": lambda: NgramDrafter(min_acceptance=0.0), "suffix": lambda: SuffixDrafter(min_token_prob=0.1)}
TRIE_DRAFTERS = {"ngram trie": lambda: NgramDrafter(num_nodes=6, tree_depth=3),
                 "suffix trie": lambda: SuffixDrafter(num_nodes=6, tree_depth=3)}


@pytest.fixture(autouse=True)
def _fresh_sessions():
    static_loop.clear_static_sessions()
    yield
    static_loop.clear_static_sessions()


@pytest.fixture
def traced_only(monkeypatch):
    """Compile with AOT autograd's eager backend: Dynamo traces the step whole as for Inductor."""
    monkeypatch.setattr(compiled, "BACKEND", "aot_eager")


@pytest.fixture(scope="module")
def target():
    return make_pair("llama")[0]


def repetitive(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """A left-padded batch of ``rows``."""
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, width - len(row):] = torch.tensor(row)
        mask[i, width - len(row):] = 1
    return ids, mask


BATCHES = {"one": repetitive([[5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7]]),
           "three": repetitive([[5, 6, 7, 5, 6, 7, 5, 6], [9, 10, 9, 10, 9], [11, 12, 13, 14, 11, 12, 13, 14, 11, 12]])}


def run(target, drafter, ids, mask, decode_path, **kwargs):
    kwargs.setdefault("max_new_tokens", MAX_NEW)
    kwargs.setdefault("num_draft_tokens", 4)
    return generate(target, drafter, ids, mask, pad_token_id=PAD, decode_path=decode_path, **kwargs)


def test_layout_view_puts_every_pending_token_last():
    tokens = torch.tensor([[0, 0, 3, 4, 5, 9, 9], [0, 6, 7, 8, 4, 9, 9]]).numpy()
    lengths, start = torch.tensor([4, 4]).numpy(), torch.tensor([2, 1]).numpy()
    view, mask = layout_view(tokens, lengths, start, torch.tensor([0, 1]).numpy())
    assert view.tolist() == [[0, 3, 4, 5], [6, 7, 8, 4]] and mask.tolist() == [[0, 1, 1, 1], [1, 1, 1, 1]]
    view, mask = layout_view(tokens, lengths, start, torch.tensor([1]).numpy())
    assert view.tolist() == [[6, 7, 8, 4]] and mask.tolist() == [[1, 1, 1, 1]]


@pytest.mark.parametrize("batch", sorted(BATCHES))
def test_greedy_equals_the_target_and_the_eager_path(target, batch, traced_only):
    ids, mask = BATCHES[batch]
    want = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW, pad_token_id=PAD)
    compiled_graphs = None
    for kind in sorted(DRAFTERS):
        assert torch.equal(run(target, DRAFTERS[kind](), ids, mask, "eager").sequences, want), kind
        for path in ("static", "compiled"):
            before = counters["stats"]["unique_graphs"]
            out = run(target, DRAFTERS[kind](), ids, mask, path)
            assert torch.equal(out.sequences, want), (kind, path)
            assert out.stats.accepted_tokens > 0 and out.stats.decode_path == path
            assert out.stats.draft_calls == 0  # no model ran
            if path == "compiled":  # the step and the prefill, once: the next drafter (any kind) reuses them
                added = counters["stats"]["unique_graphs"] - before
                assert (added > 0) if compiled_graphs is None else (added == 0), (kind, added)
                compiled_graphs = added


@pytest.mark.parametrize("batch", sorted(BATCHES))
def test_tries_greedy_equals_the_target_and_the_eager_path(target, batch, traced_only):
    ids, mask = BATCHES[batch]
    want = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW, pad_token_id=PAD)
    for kind in sorted(TRIE_DRAFTERS):
        eager = run(target, TRIE_DRAFTERS[kind](), ids, mask, "eager")
        assert torch.equal(eager.sequences, want), kind
        for path in ("static", "compiled"):
            out = run(target, TRIE_DRAFTERS[kind](), ids, mask, path)
            assert torch.equal(out.sequences, want), (kind, path)
            assert out.stats.accepted_tokens > 0 and out.stats.tree_rule == eager.stats.tree_rule == "deterministic"
            assert out.stats.draft_calls == 0
            assert out.stats.decode_steps_run <= eager.stats.steps + 1, (kind, path)  # as many steps as eager tries


def test_one_host_read_per_step_commits_and_the_suffix_drafter_remembers(target):
    ids, mask = BATCHES["three"]
    drafter = SuffixDrafter()
    out = run(target, drafter, ids, mask, "static")
    # a step: the host drafter's one read of the layout and the end-of-generation check
    assert out.stats.step_host_syncs == 2 * out.stats.decode_steps_run
    assert drafter.corpus.num_documents == 3  # the finished generation joined the corpus (reset at the end)

    committed = []
    ngram = NgramDrafter()  # learns its draft length from the accepted lengths, committed before each propose

    def commit(update):
        committed.append(update.accepted_len.sum().item())
        NgramDrafter.commit(ngram, update)

    ngram.commit = commit
    out = run(target, ngram, ids, mask, "static")
    assert len(committed) == out.stats.decode_steps_run - 1 and 0 < sum(committed) <= out.stats.accepted_tokens


class _Sampled(DrafterBase):
    """Opts in to the host path, then proposes sampled drafts (or trees)."""

    static_host_drafts = True

    def __init__(self, tree: bool = False) -> None:
        self.tree_proposal = tree

    def propose(self, state, num_tokens):
        tokens = state.tokens[:, -1:].clone()
        if self.tree_proposal:
            return Proposal(tokens, None, tree=object(), children="deterministic")
        return Proposal(tokens, point_mass_logits(tokens, state.vocab_size))


class _WideTrie(DrafterBase):
    """Opts in with tries of ``num_nodes = 4`` and ``tree_depth = 2``, then proposes a trie of 5
    nodes (or a path of depth 3)."""

    static_host_drafts = True
    num_nodes, tree_depth = 4, 2

    def __init__(self, deep: bool = False) -> None:
        self.deep = deep

    def propose(self, state, num_tokens):
        from specdecode.trees import TokenTree

        b = state.batch_size
        parents = [-1, 0, 1, 2] if self.deep else [-1, 0, 0, 0, 0]
        tokens = state.tokens[:, -1:].expand(b, len(parents)).clone()
        tree = TokenTree(tokens, torch.tensor([parents]).expand(b, -1).contiguous(), torch.full((b,), len(parents)))
        return Proposal(tokens, None, tree=tree, children="deterministic")


class _HostOnly(DrafterBase):
    def propose(self, state, num_tokens):
        return Proposal(state.tokens[:, -1:].clone())


def test_refusals_name_the_argument(target):
    ids, mask = BATCHES["one"]
    with pytest.raises(ValueError, match="^draft: _Sampled proposed sampled drafts"):
        run(target, _Sampled(), ids, mask, "static")
    with pytest.raises(ValueError, match="^tree: _Sampled proposed a token tree, but it has no num_nodes"):
        run(target, _Sampled(tree=True), ids, mask, "static")
    with pytest.raises(ValueError, match="^tree: _WideTrie proposed tries of up to 5 nodes"):
        run(target, _WideTrie(), ids, mask, "static")
    with pytest.raises(ValueError, match="^tree: _WideTrie proposed a trie deeper than 2"):
        run(target, _WideTrie(deep=True), ids, mask, "static")
    with pytest.raises(ValueError, match="^rule: 'traversal' is lossless only for children drafted"):
        run(target, NgramDrafter(num_nodes=6), ids, mask, "static", rule="traversal", do_sample=True)
    with pytest.raises(ValueError, match="^draft: _HostOnly cannot draft on the static decode path"):
        run(target, _HostOnly(), ids, mask, "static")


# ------------------------------------------------------------------------ sampling exactness


def sample_static(target, n):
    ids = torch.tensor([PROMPT]).expand(n, -1)
    out = generate(target, NgramDrafter(min_acceptance=0.0), ids, num_draft_tokens=2, rule="token", do_sample=True,
                   max_new_tokens=K, eos_token_id=[], pad_token_id=PAD, decode_path="static",
                   generator=torch.Generator().manual_seed(3))
    assert out.sequences.shape == (n, len(PROMPT) + K) and out.stats.accepted_tokens > 0
    return out.sequences[:, len(PROMPT):]


def test_static_sampling_is_lossless(pair):
    target, _ = pair
    assert chi_square_p(sample_static(target, 20000), exact_joint(target, PROMPT)) > PASS_P


def test_q_on_another_token_fails_the_same_test(pair, monkeypatch):
    """Broken: verification reads ``q`` one-hot on the next id after each draft, not on the
    draft the target scored."""
    target, _ = pair
    original = static_loop.verify_chain

    def verify(target_logits, draft_tokens, draft_logits, *args, **kwargs):
        assert draft_logits is None  # a host drafter's chains are deterministic
        return original(target_logits, draft_tokens, point_mass_logits((draft_tokens + 1) % V, V), *args, **kwargs)

    monkeypatch.setattr(static_loop, "verify_chain", verify)
    assert chi_square_p(sample_static(target, 6000), exact_joint(target, PROMPT)) < FAIL_P


def sample_static_tries(target, n):
    ids = torch.tensor([PROMPT]).expand(n, -1)
    out = generate(target, NgramDrafter(num_nodes=5, tree_depth=2), ids, do_sample=True, max_new_tokens=K,
                   eos_token_id=[], pad_token_id=PAD, decode_path="static", generator=torch.Generator().manual_seed(4))
    assert out.sequences.shape == (n, len(PROMPT) + K) and out.stats.accepted_tokens > 0
    assert out.stats.tree_rule == "deterministic"
    return out.sequences[:, len(PROMPT):]


def test_static_tries_sampling_is_lossless(pair):
    target, _ = pair
    assert chi_square_p(sample_static_tries(target, 20000), exact_joint(target, PROMPT)) > PASS_P


def test_tries_verified_against_other_tokens_fail_the_same_test(pair, monkeypatch):
    """Broken: verification is shown node tokens one id above those the target scored."""
    import specdecode.engine.static_tree as static_tree

    target, _ = pair
    real = static_tree.ops

    class Shifted:
        def __getattr__(self, name):
            return getattr(real, name)

        @staticmethod
        def verify_tree_philox(target_logits, draft_logits, tokens, *args):
            shifted = torch.cat([tokens[:, :1], (tokens[:, 1:] + 1) % V], 1)
            return real.verify_tree_philox(target_logits, draft_logits, shifted, *args)

    monkeypatch.setattr(static_tree, "ops", Shifted())
    assert chi_square_p(sample_static_tries(target, 6000), exact_joint(target, PROMPT)) < FAIL_P


# ------------------------------------------------------------------------ CUDA graphs (not yet run on a GPU)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_graphed_greedy_equals_the_target_recorded_once():
    model = make_pair("llama")[0].cuda()
    ids, mask = (t.cuda() for t in BATCHES["three"])
    want = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW, pad_token_id=PAD)
    captures = []
    for kind in sorted(DRAFTERS) * 2:  # the second round replays the layout's graphs
        out = run(model, DRAFTERS[kind](), ids, mask, "graphed")
        assert torch.equal(out.sequences, want) and out.stats.accepted_tokens > 0, kind
        captures.append(out.stats.graph_captures)
    assert captures[0] > 0 and captures[1:] == [0, 0, 0]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_graphed_tries_greedy_equals_the_target():
    model = make_pair("llama")[0].cuda()
    ids, mask = (t.cuda() for t in BATCHES["three"])
    want = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW, pad_token_id=PAD)
    for kind in sorted(TRIE_DRAFTERS):
        out = run(model, TRIE_DRAFTERS[kind](), ids, mask, "graphed")
        assert torch.equal(out.sequences, want) and out.stats.accepted_tokens > 0, kind
