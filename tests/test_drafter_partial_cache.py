"""PartialCacheDrafter (the target over attention sinks plus a recent window) and the hierarchy
(a VerticalCascadeDrafter with it as the draft, prompt lookup inside): greedy output is the
target's own on three RoPE architectures (batch 1 and a left-padded batch of 3) while columns
are evicted; with a window covering the whole context every draft distribution is the target's
own and acceptance at temperature 0 is 100%; the whole-loop exact sampling test passes (token
and block rules) with evictions and fails for a broken variant; bad arguments are refused."""

from __future__ import annotations

import pytest
import torch
from test_drafter_cascade import Recording, _sample, assert_draft_logits_are_the_models, assert_greedy_is_the_targets
from test_drafter_cascade import joint  # noqa: F401
from test_drafter_ngram import NGRAM_PROMPT, repetitive_prompts
from test_drafters import hf_greedy
from test_generate_models import PAD, _one_thread, make_pair  # noqa: F401
from test_generate_sampling import chi_square_p
from test_generate_sampling import pair as sampling_pair  # noqa: F401

import specdecode
from specdecode.drafters import NgramDrafter, PartialCacheDrafter, VerticalCascadeDrafter

PASS_P, FAIL_P = 1e-4, 1e-6
ARCHS = ["llama", "qwen2", "mistral"]


def _drafter(kind: str, target, window: int, sinks: int = 2):
    partial = PartialCacheDrafter(target, window=window, num_sink_tokens=sinks)
    if kind == "partial":
        return partial, partial
    return VerticalCascadeDrafter(partial, NgramDrafter(min_acceptance=0.0), inner_tokens=3), partial


@pytest.mark.parametrize("kind", ["partial", "hierarchy"])
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_equals_the_targets_greedy_generate(arch, kind):
    target, _ = make_pair(arch)
    partials = []

    def make():
        drafter, partial = _drafter(kind, target, window=4)
        partials.append(partial)
        return drafter

    assert_greedy_is_the_targets(target, make)
    assert all(p.evictions > 0 for p in partials)  # the middle of the context really left the draft's cache


class RecordingPartial(Recording, PartialCacheDrafter):
    pass


@pytest.mark.parametrize("arch", ARCHS)
def test_a_window_over_the_whole_context_drafts_the_targets_own_distribution(arch):
    """Nothing is evicted: each draft position's logits equal the target run without a cache on
    the row's context and the drafts before it, and at temperature 0 every draft is accepted."""
    target, _ = make_pair(arch)
    ids, mask = repetitive_prompts([9, 12, 6], seed=2)
    drafter = RecordingPartial(target, window=64, num_sink_tokens=4)
    out = specdecode.generate(target, drafter, ids, mask, num_draft_tokens=4, max_new_tokens=16, pad_token_id=PAD)
    assert drafter.evictions == 0 and out.stats.acceptance_rate == 1.0
    assert_draft_logits_are_the_models(target, drafter.seen)


@pytest.mark.parametrize("arch", ARCHS)
def test_the_hierarchy_with_a_whole_window_is_accepted_in_full(arch):
    target, _ = make_pair(arch)
    ids, mask = repetitive_prompts([11, 7, 13], seed=4)
    drafter, partial = _drafter("hierarchy", target, window=64)
    out = specdecode.generate(target, drafter, ids, mask, num_draft_tokens=4, max_new_tokens=16, pad_token_id=PAD)
    assert torch.equal(out.sequences, hf_greedy(target, ids, mask, max_new_tokens=16))
    assert partial.evictions == 0 and out.stats.acceptance_rate == 1.0 and drafter.guesses_used > 0


class OverconfidentPartial(PartialCacheDrafter):
    """Broken: hands over a sharper q (logits times 3) than the one its tokens were drawn from."""

    def propose(self, state, num_tokens):
        proposal = super().propose(state, num_tokens)
        proposal.draft_logits = proposal.draft_logits * 3
        return proposal


@pytest.mark.parametrize("kind", ["partial", "hierarchy"])
@pytest.mark.parametrize("rule", ["token", "block"])
def test_sampling_is_lossless_and_a_broken_variant_fails(sampling_pair, joint, rule, kind):
    target, _ = sampling_pair
    drafter, partial = _drafter(kind, target, window=3, sinks=1)  # the 8-token prompt is cut at once
    out = _sample(target, drafter, rule)
    assert partial.evictions > 0 and 0.1 < out.stats.acceptance_rate < 0.99
    assert chi_square_p(out.sequences[:, len(NGRAM_PROMPT):], joint) > PASS_P
    if rule == "token" and kind == "partial":
        broken = _sample(target, OverconfidentPartial(target, window=3, num_sink_tokens=1), rule, n=3000)
        assert chi_square_p(broken.sequences[:, len(NGRAM_PROMPT):], joint) < FAIL_P


def test_bad_arguments_are_refused():
    target, _ = make_pair("llama")
    with pytest.raises(TypeError, match="target: expected a Hugging Face causal LM"):
        PartialCacheDrafter("model")
    for bad in (1.5, True, "8"):
        with pytest.raises(TypeError, match="window"):
            PartialCacheDrafter(target, window=bad)
    for bad in (0, -3):
        with pytest.raises(ValueError, match="window"):
            PartialCacheDrafter(target, window=bad)
    with pytest.raises(TypeError, match="num_sink_tokens"):
        PartialCacheDrafter(target, num_sink_tokens=2.0)
    with pytest.raises(ValueError, match="num_sink_tokens"):
        PartialCacheDrafter(target, num_sink_tokens=-1)
    with pytest.raises(ValueError, match="decode_path"):
        PartialCacheDrafter(target).static_prefill(None, 3)
