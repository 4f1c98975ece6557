"""The drafter protocol: the engine accepts a drafter written by a user (here, in this file),
deterministic proposals stay lossless (a point-mass q), and ModelDrafter draws each token from
exactly the logits it hands to verification."""

from __future__ import annotations

import pytest
import torch
from test_generate_models import PAD, _one_thread, left_padded, make_pair  # noqa: F401
from test_generate_sampling import K, PROMPT, chi_square_p, exact_joint
from test_generate_sampling import pair as sampling_pair  # noqa: F401

import specdecode
from specdecode.drafters import CommitUpdate, DrafterBase, DraftState, ModelDrafter, Proposal
from specdecode.engine import DraftView
from specdecode.sampling import SamplingParams, sample_logits

PASS_P, FAIL_P = 1e-4, 1e-6


class EchoDrafter(DrafterBase):
    """A user drafter: proposes each row's last ``k`` context tokens again (deterministic, no
    model). It records every commit so the test can check the protocol."""

    name = "echo"

    def __init__(self) -> None:
        self.commits: list[CommitUpdate] = []
        self.resets = 0

    def reset(self) -> None:
        self.resets += 1

    def propose(self, state: DraftState, num_tokens: int) -> Proposal:
        rows = []
        for context in state.contexts():
            tail = context[-num_tokens:]
            rows.append(torch.cat([tail, tail.new_full((num_tokens - tail.numel(),), int(tail[-1]))]))
        return Proposal(torch.stack(rows).to(state.device))

    def commit(self, update: CommitUpdate) -> None:
        self.commits.append(update)


def hf_greedy(target, ids, mask=None, max_new_tokens=20):
    mask = torch.ones_like(ids) if mask is None else mask
    return target.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                           pad_token_id=PAD)


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2"])
def test_user_drafter_greedy_equals_target(arch):
    target, _ = make_pair(arch)
    ids, mask = left_padded([5, 9, 2, 7], seed=3)
    drafter = EchoDrafter()
    out = specdecode.generate(target, drafter, ids, mask, num_draft_tokens=3, max_new_tokens=20)
    assert torch.equal(out.sequences, hf_greedy(target, ids, mask))
    assert out.stats.drafter == "echo" and out.stats.draft_calls == 0
    assert drafter.resets == 2  # start and end of the generation
    assert len(drafter.commits) == out.stats.steps - 1  # every step but the last one
    assert all(c.accepted_len.shape[0] >= 1 for c in drafter.commits)


def test_user_drafter_through_custom_generate():
    target, _ = make_pair("llama")
    ids, mask = left_padded([4, 6], seed=5)
    seq = target.generate(ids, attention_mask=mask, custom_generate=specdecode.custom_generate,
                          draft_model=EchoDrafter(), num_draft_tokens=2, max_new_tokens=12, do_sample=False,
                          pad_token_id=PAD)
    assert torch.equal(seq, hf_greedy(target, ids, mask, max_new_tokens=12))


class UniformClaimingEchoDrafter(EchoDrafter):
    """Broken: a deterministic proposal verified as if it had been drawn from a uniform q."""

    def propose(self, state: DraftState, num_tokens: int) -> Proposal:
        proposal = super().propose(state, num_tokens)
        b, k = proposal.draft_tokens.shape
        proposal.draft_logits = torch.zeros((b, k, state.vocab_size), device=state.device)
        return proposal


@pytest.mark.parametrize("rule", ["token", "block"])
def test_deterministic_drafter_sampling_is_lossless(sampling_pair, rule):
    target, _ = sampling_pair
    joint = exact_joint(target, PROMPT)
    n = 20000
    ids = torch.tensor([PROMPT]).expand(n, -1)
    out = specdecode.generate(target, EchoDrafter(), ids, num_draft_tokens=2, rule=rule, do_sample=True,
                              max_new_tokens=K, eos_token_id=[], pad_token_id=PAD,
                              generator=torch.Generator().manual_seed(3))
    assert 0.05 < out.stats.acceptance_rate < 0.95
    assert chi_square_p(out.sequences[:, len(PROMPT):], joint) > PASS_P

    broken = specdecode.generate(target, UniformClaimingEchoDrafter(), ids, num_draft_tokens=2, rule=rule,
                                 do_sample=True, max_new_tokens=K, eos_token_id=[], pad_token_id=PAD,
                                 generator=torch.Generator().manual_seed(3))
    assert chi_square_p(broken.sequences[:, len(PROMPT):], joint) < FAIL_P


class RecordingState:
    """A DraftState over a real engine view that records every coin handed out."""

    def __init__(self, view: DraftView) -> None:
        self.view = view
        self.coins: list[torch.Tensor] = []

    def __getattr__(self, name):
        return getattr(self.view, name)

    def uniforms(self, *shape):
        u = self.view.uniforms(*shape)
        self.coins.append(u.clone())
        return u


@pytest.mark.parametrize("sampling", [SamplingParams(1.0), SamplingParams(0.7, 5, 0.9, 0.05)])
def test_model_drafter_samples_from_exactly_the_logits_it_returns(sampling, monkeypatch):
    """Every drafted token equals sample_logits(returned logits, same settings, same coin):
    the draft distribution verification reads is the one the token was drawn from (no float64
    or other-dtype sampling path in between)."""
    import specdecode.engine.loop as engine_loop

    target, draft = make_pair("llama")
    drafter = ModelDrafter(draft)
    seen: list[tuple[Proposal, list[torch.Tensor]]] = []
    original = drafter.propose

    def propose(state, num_tokens):
        recording = RecordingState(state)
        proposal = original(recording, num_tokens)
        seen.append((proposal, recording.coins))
        return proposal

    monkeypatch.setattr(drafter, "propose", propose)
    ids, mask = left_padded([5, 3, 7], seed=6)
    specdecode.generate(target, drafter, ids, mask, num_draft_tokens=3, max_new_tokens=10, do_sample=True,
                        temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p,
                        min_p=sampling.min_p, generator=torch.Generator().manual_seed(0))
    assert seen and engine_loop  # the engine really drafted through the hook
    for proposal, coins in seen:
        assert len(coins) == proposal.num_tokens
        for i, u in enumerate(coins):
            again = sample_logits(proposal.draft_logits[:, i], sampling, uniforms=u)
            assert torch.equal(again, proposal.draft_tokens[:, i])


def test_bad_proposals_are_reported_with_the_drafter_name():
    target, _ = make_pair("llama")
    ids = left_padded([4], seed=1)[0]

    class WrongShape(EchoDrafter):
        def propose(self, state, num_tokens):
            return Proposal(torch.zeros((state.batch_size, num_tokens + 2), dtype=torch.long))

    with pytest.raises(ValueError, match="WrongShape.propose"):
        specdecode.generate(target, WrongShape(), ids, num_draft_tokens=2, max_new_tokens=5)

    class NotAProposal(EchoDrafter):
        def propose(self, state, num_tokens):
            return [1, 2]

    with pytest.raises(TypeError, match="NotAProposal.propose"):
        specdecode.generate(target, NotAProposal(), ids, num_draft_tokens=2, max_new_tokens=5)
    with pytest.raises(TypeError, match="draft"):
        specdecode.generate(target, object(), ids, max_new_tokens=5)


@pytest.mark.parametrize("kind", ["model", "layer_skip"])
def test_generate_tree_arguments_reach_a_drafter_instance(kind):
    """``generate(..., tree="dynamic", num_nodes=, tree_depth=)`` with a drafter instance that
    drafts with a model (``with_tree``): a tree-drafting copy, the target's greedy output, and
    the drafter passed in stays a chain drafter."""
    from specdecode.drafters import LayerSkipDrafter

    target, draft = make_pair("llama", vocab=111)
    drafter = ModelDrafter(draft) if kind == "model" else LayerSkipDrafter(target, num_layers=1)
    ids, mask = left_padded([5, 9, 2], vocab=111, seed=3)
    out = specdecode.generate(target, drafter, ids, mask, tree="dynamic", num_nodes=6, tree_depth=3, max_new_tokens=14)
    assert torch.equal(out.sequences, hf_greedy(target, ids, mask, max_new_tokens=14))
    assert drafter.tree is None and out.stats.draft_calls > 0
    copy = drafter.with_tree("static", num_nodes=5)
    assert copy.tree is not None and copy.model is drafter.model and type(copy) is type(drafter)


def test_a_partial_cache_drafter_refuses_trees():
    from specdecode.drafters.partial_cache import PartialCacheDrafter

    target, _ = make_pair("llama", vocab=111)
    ids, mask = left_padded([5, 9], vocab=111, seed=3)
    with pytest.raises(ValueError, match="^tree: PartialCacheDrafter drafts chains only"):
        specdecode.generate(target, PartialCacheDrafter(target, window=4, num_sink_tokens=1), ids, mask,
                            tree="dynamic", max_new_tokens=4)
