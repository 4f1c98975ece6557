"""Feature drafters (EAGLE, Medusa, Hydra) on the static decode path (``decode_path="static"``,
chains), on the CPU:

- greedy output equals the target's own greedy ``generate`` (three architectures, each drafter
  kind: EAGLE with the full head and EAGLE-3-style features with a reduced head, Medusa,
  Hydra; batch 1 and a left-padded batch of 3), and every row's drafts are the ones the eager
  path drafts for it;
- the feature buffer holds, before every proposal, the features of a plain forward at every
  committed column of every row (rows accepting different lengths, EOS); features written one
  column off fail that check and cost acceptance; exact heads are accepted at every draft;
- the joint law of the first tokens is the target's (EAGLE full and reduced, Medusa),
  and drafts whose reported ``q`` was computed from other features than the ones they were
  drawn with fail the same test;
- ``static_propose`` reads no tensor value on the host; layouts are reused and freed with the
  drafter's network; bad arguments are refused, naming them.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from test_drafter_hydra import Oracle
from test_drafter_hydra import random_heads as hydra_heads
from test_drafter_medusa import Ahead
from test_drafter_medusa import random_heads as medusa_heads
from test_generate_models import INIT, PAD, _one_thread, left_padded, make_model  # noqa: F401
from test_generate_sampling import K, PROMPT, chi_square_p, exact_joint
from test_static_generate import FAIL_P, PASS_P, hf_greedy, pair  # noqa: F401

import specdecode
import specdecode.drafters.eagle as eagle_module
import specdecode.engine.static_features as static_features
import specdecode.engine.static_layouts as static_layouts
import specdecode.engine.static_loop as static_loop
from specdecode.drafters import HydraDrafter, MedusaDrafter
from specdecode.drafters.eagle import EagleDrafter, EagleModel
from specdecode.drafters.last_feature import static_features_at
from specdecode.drafters.medusa import product_tree
from specdecode.models.static_cache import column_inputs

ARCHS = ["llama", "gpt2", "qwen2"]
KINDS = ["eagle", "eagle3_reduced", "medusa", "medusa_reduced", "hydra"]
MAX_NEW = 16


@pytest.fixture(autouse=True)
def _fresh_sessions():
    static_loop.clear_static_sessions()
    yield
    static_loop.clear_static_sessions()


def target_model(arch: str, seed: int = 0, vocab: int = 111):
    return make_model(arch, seed=seed, vocab=vocab, layers=3, init=INIT.get(arch, 0.02))


def eagle_drafter(target, layers=(-1,), reduced: bool = False, std: float = 0.5, seed: int = 0) -> EagleDrafter:
    """An EAGLE network started as a layer-skip drafter (accepted now and then), its feature
    input made to matter by random weights."""
    torch.manual_seed(seed)
    vocab = target.get_output_embeddings().weight.shape[0]
    ids = torch.arange(vocab - 1, -1, -2) if reduced else None  # every other id, scrambled
    model = EagleModel(target, layers, ids, init_from_target=True).eval()
    H = model.hidden_size
    with torch.no_grad():
        model.fc.weight[:, :H] += (torch.randn(H, H) * std / H ** 0.5).to(model.fc.weight.device)
        if model.reduce is not None:
            model.reduce.weight.normal_(0.0, model.feature_size ** -0.5)
    return EagleDrafter(target, model)


def make_drafter(kind: str, target):
    if kind == "eagle":
        return eagle_drafter(target)
    if kind == "eagle3_reduced":
        return eagle_drafter(target, layers=(0, 2, -1), reduced=True)
    if kind.startswith("medusa"):
        heads = medusa_heads(target)
        if kind == "medusa_reduced":
            heads.set_head_tokens(torch.arange(1, heads.target_vocab, 2))  # every other id
        return MedusaDrafter(target, heads)
    return HydraDrafter(target, hydra_heads(target))


def static(target, drafter, ids, mask=None, **kwargs):
    kwargs.setdefault("max_new_tokens", MAX_NEW)
    kwargs.setdefault("pad_token_id", PAD)
    kwargs.setdefault("num_draft_tokens", 3)
    return specdecode.generate(target, drafter, ids, mask, decode_path="static", **kwargs)


def recorded(drafter):
    """Wrap the drafter's ``propose`` and ``static_propose`` (on the instance) to keep every
    proposal: eager ones as (row ids, drafts), static ones as drafts ``[B, k]``."""
    eager, steps = [], []
    propose, static_propose = drafter.propose, drafter.static_propose

    def keep_eager(state, num_tokens):
        proposal = propose(state, num_tokens)
        eager.append((state.row_ids.tolist(), proposal.draft_tokens.clone()))
        return proposal

    def keep_static(state, num_tokens):
        tokens, logits = static_propose(state, num_tokens)
        steps.append(tokens.clone())
        return tokens, logits

    drafter.propose, drafter.static_propose = keep_eager, keep_static
    return eager, steps


def assert_same_drafts(eager, steps, batch: int) -> None:
    """Row by row, the static path drafted what the eager path drafted, step after step (the
    eager path drafts fewer tokens near ``max_new_tokens``: their prefix)."""
    for r in range(batch):
        mine = [tokens[rows.index(r)] for rows, tokens in eager if r in rows]
        assert mine and len(steps) >= len(mine)
        for step, (want, got) in enumerate(zip(mine, steps)):
            assert torch.equal(got[r, : want.numel()], want), (r, step)


# ------------------------------------------------------------------------ greedy exactness


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_equals_target_and_drafts_equal_the_eager_paths(arch, kind):
    target = target_model(arch)
    drafter = make_drafter(kind, target)
    one = left_padded([7], vocab=111, seed=2)[0]
    ids, mask = left_padded([5, 9, 2], vocab=111, seed=3)
    for x, m in ((one, None), (ids, mask)):
        eager, steps = recorded(drafter)
        out = static(target, drafter, x, m)
        assert torch.equal(out.sequences, hf_greedy(target, x, m, max_new_tokens=MAX_NEW)), (arch, kind)
        assert out.stats.decode_path == "static" and out.stats.drafter == drafter.name
        reference = specdecode.generate(target, drafter, x, m, num_draft_tokens=3, max_new_tokens=MAX_NEW,
                                        pad_token_id=PAD, draft_schedule="constant")
        assert_same_drafts(eager, steps, x.shape[0])
        assert out.stats.accepted_tokens == reference.stats.accepted_tokens
        del drafter.propose, drafter.static_propose


def test_one_token_prompts_and_short_prompts():
    """A pending token that is its row's first (no feature before it) and prompts shorter than
    the draft window (EAGLE's first window starts at column 0)."""
    target = target_model("llama")
    ids, mask = left_padded([1, 2, 6], vocab=111, seed=7)
    for kind in KINDS:
        out = static(target, make_drafter(kind, target), ids, mask, num_draft_tokens=3)
        assert torch.equal(out.sequences, hf_greedy(target, ids, mask, max_new_tokens=MAX_NEW)), kind
    out = static(target, make_drafter("eagle", target), ids[:1, -1:], num_draft_tokens=5)
    assert torch.equal(out.sequences, hf_greedy(target, ids[:1, -1:], max_new_tokens=MAX_NEW))


# ------------------------------------------------------------------------ the feature buffer


def checked(drafter, counter: list[int], method: str = "static_propose"):
    """Wrap ``method`` (``static_propose``, or ``static_propose_tree`` for trees): first assert
    that ``state.features`` holds, at every committed column ``[start, lengths)`` of every row,
    the hidden states of a plain forward over the row's tokens (its context up to the pending
    one)."""
    propose = getattr(drafter, method)
    target, layers = drafter.target, drafter.feature_layers

    def check(state, *args):
        with torch.no_grad():
            for r in range(state.batch_size):
                start, length = int(state.start[r]), int(state.lengths[r])
                hidden = target(state.tokens[r, start: length + 1][None], output_hidden_states=True).hidden_states
                want = torch.cat([hidden[i] for i in layers], -1)[0, :-1]
                torch.testing.assert_close(state.features[r, start:length], want, rtol=1e-4, atol=1e-4)
                counter[0] += 1
        return propose(state, *args)

    setattr(drafter, method, check)
    return drafter


def test_features_are_the_committed_columns(monkeypatch):
    """Exact Medusa heads that go wrong at every third position: rows accept different lengths
    and stop at EOS at different steps; before every proposal each row's committed columns hold
    its true features, the rejected drafts' are never read. Also for EAGLE-3-style features."""
    target = target_model("llama", seed=1)
    ids, mask = left_padded([5, 9, 1], vocab=111, seed=4)
    want = hf_greedy(target, ids, mask, max_new_tokens=24, eos_token_id=[7])
    sequences = [row[m.bool()] for row, m in zip(want, torch.cat([mask, torch.ones_like(want[:, 9:])], 1))]
    counter = [0]
    drafter = checked(MedusaDrafter(target, Ahead(target, 3, sequences, wrong_every=3)), counter)
    out = static(target, drafter, ids, mask, max_new_tokens=24, eos_token_id=[7])
    assert torch.equal(out.sequences, want)
    assert counter[0] > 10 and 0.3 < out.stats.acceptance_rate < 1.0
    good = out.stats.acceptance_rate

    drafter = checked(eagle_drafter(target, layers=(0, 2, -1)), counter)
    assert torch.equal(static(target, drafter, ids, mask, max_new_tokens=24, eos_token_id=[7]).sequences, want)

    # Broken: every forward's features written one column late (the drafter then reads, at
    # column lengths - 1, the feature of the token before it): the check sees it, and exact
    # heads lose their acceptance.
    original = static_features.write_features
    monkeypatch.setattr(static_features, "write_features",
                        lambda state, features, columns: original(state, features, columns + 1))
    drafter = checked(MedusaDrafter(target, Ahead(target, 3, sequences, wrong_every=3)), counter)
    with pytest.raises(AssertionError):
        static(target, drafter, ids, mask, max_new_tokens=24, eos_token_id=[7])
    out = static(target, MedusaDrafter(target, Ahead(target, 3, sequences, wrong_every=3)), ids, mask,
                 max_new_tokens=24, eos_token_id=[7])
    assert torch.equal(out.sequences, want) and out.stats.acceptance_rate < good / 2


@pytest.mark.parametrize("kind", ["medusa", "hydra"])
def test_exact_heads_are_always_accepted(kind):
    target = target_model("qwen2", seed=3)
    ids = left_padded([6], vocab=111, seed=5)[0]
    want = hf_greedy(target, ids, max_new_tokens=12)
    if kind == "medusa":
        drafter = MedusaDrafter(target, Ahead(target, 3, [want[0]]).eval())
    else:
        drafter = HydraDrafter(target, Oracle(target, 3, want[0]).eval())
    out = static(target, drafter, ids, max_new_tokens=12)
    assert torch.equal(out.sequences, want)
    assert out.stats.acceptance_rate == 1.0 and out.stats.steps == 3


def test_move_columns_reads_before_it_writes():
    original = torch.arange(2 * 6 * 2, dtype=torch.float32).view(2, 6, 2)
    buffer, expected = original.clone(), original.clone()
    source, destination = torch.tensor([[2, 4], [1, 2]]), torch.tensor([[1, 2], [2, 3]])  # overlapping
    static_features.move_columns(buffer, source, destination)
    for b in range(2):
        for s, d in zip(source[b].tolist(), destination[b].tolist()):
            expected[b, d] = original[b, s]
    assert torch.equal(buffer, expected)


# ------------------------------------------------------------------------ no host reads


@contextlib.contextmanager
def no_host_reads():
    """Any read of a tensor's value on the host (``item``, ``tolist``, ``bool``, ``int``,
    ``float``) raises inside the block."""

    def refuse(*args, **kwargs):
        raise AssertionError("a tensor value was read on the host")

    names = ("item", "tolist", "__bool__", "__int__", "__float__")
    own = {name: torch.Tensor.__dict__[name] for name in names if name in torch.Tensor.__dict__}
    for name in names:
        setattr(torch.Tensor, name, refuse)
    try:
        yield
    finally:
        for name in names:
            if name in own:
                setattr(torch.Tensor, name, own[name])
            else:
                delattr(torch.Tensor, name)


def guard_static_propose(drafter, method: str = "static_propose") -> list[int]:
    """Make ``drafter``'s ``method`` fail on any host read; returns its call counter."""
    propose = getattr(drafter, method)
    calls = [0]

    def guarded(*args):
        with no_host_reads():
            result = propose(*args)
        calls[0] += 1
        return result

    setattr(drafter, method, guarded)
    return calls


@pytest.mark.parametrize("kind", KINDS)
def test_static_propose_reads_nothing_on_the_host(kind):
    target = target_model("llama")
    drafter = make_drafter(kind, target)
    calls = guard_static_propose(drafter)
    ids, mask = left_padded([5, 3], vocab=111, seed=8)
    out = static(target, drafter, ids, mask, do_sample=True, generator=torch.Generator().manual_seed(0))
    assert calls[0] == out.stats.decode_steps_run > 0


# ------------------------------------------------------------------------ sampling exactness

N = 20000


def sample_static(target, drafter, rule: str, n: int = N):
    ids = torch.tensor([PROMPT]).expand(n, -1)
    out = specdecode.generate(target, drafter, ids, num_draft_tokens=2, rule=rule, do_sample=True,
                              max_new_tokens=K, eos_token_id=[], pad_token_id=PAD, decode_path="static",
                              generator=torch.Generator().manual_seed(3))
    assert out.sequences.shape == (n, len(PROMPT) + K)
    return out


def sampling_drafter(kind: str, target):
    if kind.startswith("eagle"):
        torch.manual_seed(1)
        vocab = target.get_output_embeddings().weight.shape[0]
        ids = torch.arange(vocab - 1, -1, -2) if kind == "eagle_reduced" else None
        return EagleDrafter(target, EagleModel(target, (-1,), ids).eval())
    if kind.startswith("medusa"):
        heads = medusa_heads(target)
        if kind == "medusa_reduced":
            heads.set_head_tokens(torch.tensor([0, 2, 3, 4, 6, 7]))  # of the sampling pair's 8 ids
        return MedusaDrafter(target, heads)
    return HydraDrafter(target, hydra_heads(target))


@pytest.mark.parametrize("kind, rule", [("eagle", "token"), ("eagle_reduced", "block"), ("medusa", "token"),
                                        ("medusa_reduced", "block")])
def test_static_sampling_is_lossless(pair, kind, rule):
    target, _ = pair
    out = sample_static(target, sampling_drafter(kind, target), rule)
    assert 0.05 < out.stats.acceptance_rate < 0.95
    assert chi_square_p(out.sequences[:, len(PROMPT):], exact_joint(target, PROMPT)) > PASS_P


def _medusa_q_from_stale_features(monkeypatch):
    """Broken: Medusa draws its drafts from the feature of the last committed column but reports
    ``q`` from the feature one column earlier (a stale feature)."""
    original = MedusaDrafter.static_propose

    def propose(self, state, num_tokens):
        tokens, _ = original(self, state, num_tokens)
        stale = static_features_at(state, (state.lengths - 2)[:, None])[:, 0].to(self.heads.dtype)
        q = self.heads.logits(stale, self.target.get_output_embeddings(), state.vocab_size)
        return tokens, q[:, :num_tokens].float()

    monkeypatch.setattr(MedusaDrafter, "static_propose", propose)
    return "medusa"


def _eagle_q_from_rejected_features(monkeypatch):
    """Broken: EAGLE draws its first draft from the window fed with true features, but reports
    its ``q`` from the window fed with each column's own feature (at the pending column: the
    feature the last score forward computed there, a rejected draft's or a stale one)."""
    original = EagleDrafter.static_propose

    def propose(self, state, num_tokens):
        tokens, logits = original(self, state, num_tokens)
        first = (state.lengths - num_tokens).clamp_min(0)
        with monkeypatch.context() as m:
            m.setattr(eagle_module, "static_features_at", lambda s, columns: static_features_at(s, columns + 1))
            inputs = column_inputs(first, state.start, num_tokens + 1, state.capacity, self.model.fc.weight.dtype)
            window = self._static_window(state, inputs)
        hidden = window.gather(1, (state.lengths - first)[:, None, None].expand(-1, 1, window.shape[-1]))[:, 0]
        return tokens, torch.cat([self._logits(state, hidden)[:, None], logits[:, 1:]], 1)

    monkeypatch.setattr(EagleDrafter, "static_propose", propose)
    return "eagle"


@pytest.mark.parametrize("broken", [_medusa_q_from_stale_features, _eagle_q_from_rejected_features],
                         ids=["medusa_stale", "eagle_rejected"])
def test_q_from_other_features_fails_the_same_test(pair, broken, monkeypatch):
    target, _ = pair
    kind = broken(monkeypatch)
    out = sample_static(target, sampling_drafter(kind, target), "token", n=6000)
    assert chi_square_p(out.sequences[:, len(PROMPT):], exact_joint(target, PROMPT)) < FAIL_P


# ------------------------------------------------------------------------ layouts and refusals


def test_layouts_are_reused_and_freed_with_the_heads():
    import gc

    target = target_model("gpt2")
    ids, mask = left_padded([4, 6], vocab=111, seed=9)
    heads = medusa_heads(target)
    first = static(target, MedusaDrafter(target, heads), ids, mask).sequences
    assert torch.equal(static(target, MedusaDrafter(target, heads), ids, mask).sequences, first)
    assert len(static_layouts.kept_layouts(target)) == 1
    other = medusa_heads(target, seed=1)
    static(target, MedusaDrafter(target, other), ids, mask)
    assert len(static_layouts.kept_layouts(target)) == 2
    del other
    gc.collect()
    assert len(static_layouts.kept_layouts(target)) == 1
    with torch.no_grad():
        heads.weight.data = heads.weight.data.clone()  # re-allocated: the layout's graphs would read stale addresses
    assert torch.equal(static(target, MedusaDrafter(target, heads), ids, mask).sequences, first)
    assert len(static_layouts.kept_layouts(target)) == 1


def test_refusals_name_the_argument():
    target = target_model("llama")
    ids, mask = left_padded([5, 3], vocab=111, seed=10)
    with pytest.raises(ValueError, match="num_draft_tokens"):
        static(target, MedusaDrafter(target, medusa_heads(target)), ids, mask, num_draft_tokens=4)
    with pytest.raises(ValueError, match="num_draft_tokens"):
        static(target, HydraDrafter(target, hydra_heads(target, num_heads=2)), ids, mask)
    with pytest.raises(ValueError, match="^tree: a path asks for the rank-200"):  # trees: test_static_feature_trees
        static(target, MedusaDrafter(target, medusa_heads(target), tree=product_tree([201])), ids, mask)
    drafter = MedusaDrafter(target, medusa_heads(target))
    drafter.feature_layers = (9,)
    with pytest.raises(ValueError, match="feature_layers"):
        static(target, drafter, ids, mask)


def test_prefill_attends_over_the_prompt_columns_only():
    from specdecode.models.static_cache import ColumnCache, prefill_inputs

    cache = ColumnCache(8)
    start = torch.tensor([0, 2])
    with prefill_inputs(cache, start, 3, torch.float32) as (columns, positions, mask):
        assert columns.tolist() == [[0, 1, 2], [0, 1, 2]] and positions.tolist() == [[0, 1, 2], [0, 0, 0]]
        assert mask.shape == (2, 1, 3, 3)
        keys, values = cache.update(torch.ones(2, 1, 3, 4), torch.ones(2, 1, 3, 4), 0)
        assert keys.shape == values.shape == (2, 1, 3, 4) and cache.keys[0].shape == (2, 1, 8, 4)
    assert cache.visible is None
    cache.columns = torch.tensor([[3], [3]])
    assert cache.update(torch.ones(2, 1, 1, 4), torch.ones(2, 1, 1, 4), 0)[0].shape == (2, 1, 8, 4)
