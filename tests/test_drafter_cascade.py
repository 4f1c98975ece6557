"""Cascades (specdecode.drafters.cascade): greedy output is the target's own on three
architectures (batch 1 and a left-padded batch of 3); the vertical cascade's every draft
distribution equals the draft model's own, recomputed without a cache, while n-gram guesses save
draft forwards; the horizontal cascade's positions carry the right q (the model's logits, then
point masses); the whole-loop exact sampling test passes for both (token and block rules) and
fails for a broken variant of each; bad arguments are refused."""

from __future__ import annotations

import pytest
import torch
from test_drafter_ngram import NGRAM_PROMPT, repetitive_prompts
from test_drafters import hf_greedy
from test_generate_models import PAD, _one_thread, make_pair  # noqa: F401
from test_generate_sampling import K, chi_square_p, exact_joint
from test_generate_sampling import pair as sampling_pair  # noqa: F401

import specdecode
from specdecode.drafters import HorizontalCascadeDrafter, ModelDrafter, NgramDrafter, VerticalCascadeDrafter

PASS_P, FAIL_P = 1e-4, 1e-6
ARCHS = ["llama", "gpt2", "qwen2"]


def _cascades(draft):
    return {
        "vertical": VerticalCascadeDrafter(draft, NgramDrafter(min_acceptance=0.0), inner_tokens=3),
        "horizontal": HorizontalCascadeDrafter(draft, NgramDrafter(min_acceptance=0.0), first_tokens=1),
    }


def assert_greedy_is_the_targets(target, make_drafter) -> list:
    """Generate with ``make_drafter()`` on a repetitive prompt at batch 1 and on a left-padded
    batch of 3; the output must be the target's own greedy one. Returns the drafters."""
    drafters = []
    for lengths in ([11], [9, 14, 5]):
        ids, mask = repetitive_prompts(lengths, seed=len(lengths))
        drafter = make_drafter()
        out = specdecode.generate(target, drafter, ids, mask, num_draft_tokens=4, max_new_tokens=20,
                                  pad_token_id=PAD, draft_schedule="constant")
        assert torch.equal(out.sequences, hf_greedy(target, ids, mask, max_new_tokens=20))
        assert out.stats.drafter == drafter.name and out.stats.accepted_tokens > 0
        drafters.append(drafter)
    return drafters


@pytest.mark.parametrize("kind", ["vertical", "horizontal"])
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_equals_the_targets_greedy_generate(arch, kind):
    target, draft = make_pair(arch)
    for drafter in assert_greedy_is_the_targets(target, lambda: _cascades(draft)[kind]):
        if kind == "vertical":
            assert drafter.guessed > 0  # n-gram guesses were really fed (used or not, the output is the same)


def test_vertical_needs_fewer_draft_forwards_for_the_same_proposals():
    target, draft = make_pair("llama")
    ids, mask = repetitive_prompts([11, 7], seed=5)
    plain = specdecode.generate(target, ModelDrafter(draft), ids, mask, num_draft_tokens=5, max_new_tokens=24,
                                pad_token_id=PAD, draft_schedule="constant")
    vertical = specdecode.generate(target, VerticalCascadeDrafter(draft, NgramDrafter()), ids, mask,
                                   num_draft_tokens=5, max_new_tokens=24, pad_token_id=PAD, draft_schedule="constant")
    assert torch.equal(vertical.sequences, plain.sequences)
    assert vertical.stats.accepted_tokens == plain.stats.accepted_tokens  # the same drafts, greedily
    assert vertical.stats.draft_calls < plain.stats.draft_calls


class Recording:
    """Mixin: records every proposal with the row contexts it was drafted from."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[tuple[list[torch.Tensor], object]] = []

    def propose(self, state, num_tokens):
        contexts = [c.clone() for c in state.contexts()]
        proposal = super().propose(state, num_tokens)
        self.seen.append((contexts, proposal))
        return proposal


class RecordingVertical(Recording, VerticalCascadeDrafter):
    pass


def assert_draft_logits_are_the_models(model, seen) -> None:
    """Every recorded position's logits equal ``model`` run without a cache on the row's context
    and the tokens drafted before it."""
    with torch.no_grad():
        for contexts, proposal in seen:
            for row, context in enumerate(contexts):
                for i in range(proposal.num_tokens):
                    seq = torch.cat([context, proposal.draft_tokens[row, :i]])[None]
                    expected = model(seq).logits[0, -1]
                    torch.testing.assert_close(proposal.draft_logits[row, i], expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
def test_every_vertical_draft_distribution_is_the_draft_models_own(arch):
    """Across a generation of a left-padded batch (holes, guesses that hold and guesses that
    fail, placeholder columns, roll-backs), each position's logits equal the draft model run
    without a cache on the row's context and the tokens drafted before it."""
    target, draft = make_pair(arch)
    ids, mask = repetitive_prompts([9, 12, 6], seed=2)
    drafter = RecordingVertical(draft, NgramDrafter(min_acceptance=0.0), inner_tokens=3)
    specdecode.generate(target, drafter, ids, mask, num_draft_tokens=4, max_new_tokens=16, pad_token_id=PAD,
                        draft_schedule="constant")
    assert drafter.guesses_used > 0 and drafter.guessed > drafter.guesses_used  # some guesses failed
    assert_draft_logits_are_the_models(draft, drafter.seen)


class RecordingHorizontal(HorizontalCascadeDrafter):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[object] = []

    def propose(self, state, num_tokens):
        proposal = super().propose(state, num_tokens)
        self.seen.append(proposal)
        return proposal


def test_horizontal_positions_carry_the_model_q_then_point_masses():
    target, draft = make_pair("llama")
    ids, mask = repetitive_prompts([11, 8, 13], seed=1)
    drafter = RecordingHorizontal(draft, NgramDrafter(min_acceptance=0.0), first_tokens=2)
    specdecode.generate(target, drafter, ids, mask, num_draft_tokens=5, max_new_tokens=16, pad_token_id=PAD,
                        draft_schedule="constant")
    tails = 0
    for proposal in drafter.seen:
        logits = proposal.draft_logits
        assert torch.isfinite(logits[:, :2]).all()  # the model's q: every token possible
        if proposal.num_tokens > 2:
            tail = logits[:, 2:]
            assert ((tail == 0).sum(-1) == 1).all() and (torch.isinf(tail).sum(-1) == tail.shape[-1] - 1).all()
            assert torch.equal(tail.argmax(-1), proposal.draft_tokens[:, 2:])
            tails += 1
    assert tails > 0


class TrustingGuessVertical(VerticalCascadeDrafter):
    """Broken: takes the inner n-gram guess as the draft's token whenever there is one (no draw
    from q), while still handing over q."""

    @staticmethod
    def _verify_guess(drawn, guess, has_guess):
        return torch.where(has_guess, guess, drawn), has_guess


class UniformTailHorizontal(HorizontalCascadeDrafter):
    """Broken: the prompt-lookup positions claimed to be drawn from a uniform q."""

    @staticmethod
    def _tail_logits(tokens, vocab_size):
        return torch.zeros((*tokens.shape, vocab_size), device=tokens.device)


def _sample(target, drafter, rule, n=10000, seed=3):
    ids = torch.tensor([NGRAM_PROMPT]).expand(n, -1)
    return specdecode.generate(target, drafter, ids, num_draft_tokens=3, rule=rule, do_sample=True,
                               max_new_tokens=K, eos_token_id=[], pad_token_id=PAD,
                               generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def joint(sampling_pair):
    return exact_joint(sampling_pair[0], NGRAM_PROMPT)


@pytest.mark.parametrize("rule", ["token", "block"])
def test_vertical_sampling_is_lossless_and_a_broken_variant_fails(sampling_pair, joint, rule):
    target, draft = sampling_pair
    drafter = VerticalCascadeDrafter(draft, NgramDrafter(min_acceptance=0.0), inner_tokens=2)
    out = _sample(target, drafter, rule)
    assert 0.1 < out.stats.acceptance_rate < 0.9 and drafter.guesses_used > 400
    assert chi_square_p(out.sequences[:, len(NGRAM_PROMPT):], joint) > PASS_P
    if rule == "token":  # the shift is large: a few thousand samples reject it
        broken = _sample(target, TrustingGuessVertical(draft, NgramDrafter(min_acceptance=0.0), inner_tokens=2),
                         rule, n=3000)
        assert chi_square_p(broken.sequences[:, len(NGRAM_PROMPT):], joint) < FAIL_P


@pytest.mark.parametrize("rule", ["token", "block"])
def test_horizontal_sampling_is_lossless_and_a_broken_variant_fails(sampling_pair, joint, rule):
    target, draft = sampling_pair
    drafter = HorizontalCascadeDrafter(draft, NgramDrafter(min_acceptance=0.0), first_tokens=1)
    out = _sample(target, drafter, rule)
    assert 0.1 < out.stats.acceptance_rate < 0.9
    assert drafter.tail_tokens > 1000  # prompt-lookup positions were really proposed
    assert chi_square_p(out.sequences[:, len(NGRAM_PROMPT):], joint) > PASS_P
    if rule == "token":
        broken = _sample(target, UniformTailHorizontal(draft, NgramDrafter(min_acceptance=0.0), first_tokens=1),
                         rule, n=3000)
        assert chi_square_p(broken.sequences[:, len(NGRAM_PROMPT):], joint) < FAIL_P


def test_bad_arguments_are_refused():
    _, draft = make_pair("llama")
    with pytest.raises(TypeError, match="draft: expected a draft model"):
        VerticalCascadeDrafter("model")
    with pytest.raises(TypeError, match="inner: expected an NgramDrafter"):
        VerticalCascadeDrafter(draft, inner=ModelDrafter(draft))
    with pytest.raises(TypeError, match="inner: expected an NgramDrafter drafting chains"):
        VerticalCascadeDrafter(draft, inner=NgramDrafter(num_nodes=8))
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="inner_tokens"):
            VerticalCascadeDrafter(draft, inner_tokens=bad)
    with pytest.raises(ValueError, match="draft: cascades draft chains"):
        VerticalCascadeDrafter(ModelDrafter(draft, tree=specdecode.trees.builders.DynamicTree(8)))
    with pytest.raises(TypeError, match="first: expected a draft model or a drafter"):
        HorizontalCascadeDrafter(3)
    with pytest.raises(TypeError, match="then: expected an NgramDrafter"):
        HorizontalCascadeDrafter(draft, then=ModelDrafter(draft))
    for bad in (0, 2.0):
        with pytest.raises(ValueError, match="first_tokens"):
            HorizontalCascadeDrafter(draft, first_tokens=bad)
    with pytest.raises(ValueError, match="first: cascades draft chains"):
        HorizontalCascadeDrafter(NgramDrafter(num_nodes=8))
