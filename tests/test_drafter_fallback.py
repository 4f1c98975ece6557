"""FallbackDrafter: a model-free chain where it is confident, a model's chain elsewhere.

Greedy output is the target's (a draft model and EAGLE behind SuffixDecoding, batch 1 and
left-padded batches, steps of both kinds in one generation); sampling keeps the target's law with
steps of both kinds (exact joint law of the first K tokens), and a variant that mixes the two
proposals row by row without the rows' own q fails the same test; bad arguments are refused.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_drafter_eagle import eagle, target_model
from test_drafter_ngram import NGRAM_PROMPT
from test_generate_models import PAD, _one_thread, left_padded, make_pair  # noqa: F401
from test_generate_sampling import K, chi_square_p, exact_joint
from test_generate_sampling import pair as sampling_pair  # noqa: F401

import specdecode
from specdecode.drafters import FallbackDrafter, ModelDrafter, NgramDrafter, SuffixDrafter
from specdecode.integrations.hf.arguments import draft_model_of
from specdecode.trees.builders import DynamicTree

PASS_P, FAIL_P = 1e-4, 1e-6


def hf_greedy(target, ids, mask, max_new_tokens):
    return target.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                           pad_token_id=PAD)


@pytest.mark.parametrize("fallback", ["model", "eagle"])
def test_greedy_generation_equals_the_targets_with_steps_of_both_kinds(fallback):
    if fallback == "model":
        target, draft = make_pair("llama")
        behind, vocab = ModelDrafter(draft), 128
    else:
        target = target_model("llama")
        behind, vocab = eagle(target), 111
    drafter = FallbackDrafter(SuffixDrafter(), behind, min_tokens=3)
    for lengths in ([7], [5, 9, 2]):
        ids, mask = left_padded(lengths, vocab=vocab, seed=len(lengths))
        want = hf_greedy(target, ids, mask, 20)
        for _ in range(2):  # the second time, the suffix drafter has the first in its corpus
            out = specdecode.generate(target, drafter, ids, mask, num_draft_tokens=6, max_new_tokens=20,
                                      pad_token_id=PAD)
            assert torch.equal(out.sequences, want), (fallback, lengths)
            assert out.stats.drafter == "fallback"
    assert drafter.first_steps > 0 and drafter.fallback_steps > 0
    assert draft_model_of(drafter) is behind.model  # the CPU fast path runs the fallback's model too


def test_the_fallback_drafts_its_own_chain_length_and_its_sampling_variant_is_used():
    target, draft = make_pair("llama")
    behind = ModelDrafter(draft)
    behind.default_num_draft_tokens = 2
    drafter = FallbackDrafter(NgramDrafter(), behind)
    ids, mask = left_padded([6], seed=4)  # random tokens: prompt lookup finds no 4-token chain
    out = specdecode.generate(target, drafter, ids, mask, num_draft_tokens=8, max_new_tokens=12, pad_token_id=PAD)
    assert torch.equal(out.sequences, hf_greedy(target, ids, mask, 12))
    assert out.stats.drafted_tokens <= 2 * out.stats.steps and drafter.first_steps == 0
    sampling = ModelDrafter(draft)
    behind.sampling_drafter = sampling
    assert drafter.for_sampling().fallback is sampling and drafter.for_sampling().first is drafter.first
    assert FallbackDrafter(NgramDrafter(), ModelDrafter(draft)).for_sampling().fallback is not sampling


def test_bad_arguments_are_refused():
    target, draft = make_pair("llama")
    model = ModelDrafter(draft)
    with pytest.raises(TypeError, match="first: expected a SuffixDrafter or NgramDrafter"):
        FallbackDrafter(model, model)
    with pytest.raises(ValueError, match="first: expected a drafter drafting chains"):
        FallbackDrafter(SuffixDrafter(num_nodes=4), model)
    with pytest.raises(TypeError, match="fallback: expected a drafter"):
        FallbackDrafter(SuffixDrafter(), draft.config)
    with pytest.raises(ValueError, match="fallback: expected a drafter drafting chains"):
        FallbackDrafter(SuffixDrafter(), ModelDrafter(draft, tree=DynamicTree(6)))
    with pytest.raises(ValueError, match="min_tokens"):
        FallbackDrafter(SuffixDrafter(), model, min_tokens=0)
    with pytest.raises(TypeError, match="fallback_tokens"):
        FallbackDrafter(SuffixDrafter(), model, fallback_tokens=2.5)


# ------------------------------------------------------------------ sampling


class MixedRowsKeepFallbackQ(FallbackDrafter):
    """Broken: takes the suffix chain for the rows it is confident in and the fallback's for the
    others, but hands over the fallback's q for every row (the suffix rows' q must be a point
    mass on their own tokens)."""

    def propose(self, state, num_tokens):
        first = self.first.propose(state, num_tokens)
        model = self.fallback.propose(state, num_tokens)
        k = model.num_tokens
        counts = first.num_draft_tokens
        if first.num_tokens < k or counts is None:
            return model
        take = counts >= k
        model.draft_tokens = torch.where(take[:, None], first.draft_tokens[:, :k], model.draft_tokens)
        return model


def sample(target, drafter, n=20000, seed=3):
    ids = torch.tensor([NGRAM_PROMPT]).expand(n, -1)
    return specdecode.generate(target, drafter, ids, do_sample=True, num_draft_tokens=2, max_new_tokens=K,
                               eos_token_id=[], pad_token_id=PAD, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def fallback_joint(sampling_pair):
    return exact_joint(sampling_pair[0], NGRAM_PROMPT)


@pytest.fixture(scope="module")
def likely_documents(fallback_joint):
    """The prompt's last tokens followed by the target's 8 likeliest K-token continuations."""
    likeliest = np.argsort(fallback_joint.ravel())[::-1][:8]
    return [NGRAM_PROMPT[-3:] + list(np.unravel_index(i, fallback_joint.shape)) for i in likeliest]


def suffix(documents):
    return SuffixDrafter(documents, remember=False, min_token_prob=0.0, max_spec_factor=2.0)


def test_sampling_with_steps_of_both_kinds_is_lossless(sampling_pair, fallback_joint, likely_documents):
    target, draft = sampling_pair
    drafter = FallbackDrafter(suffix(likely_documents), ModelDrafter(draft), min_tokens=2)
    out = sample(target, drafter)
    # every row shares the prompt, so the first step is the suffix drafter's; the rows diverge after
    assert drafter.first_steps >= 1 and drafter.fallback_steps >= 1
    assert 0.05 < out.stats.acceptance_rate < 0.95
    assert chi_square_p(out.sequences[:, len(NGRAM_PROMPT):], fallback_joint) > PASS_P


def test_rows_mixed_without_their_own_q_fail_the_same_test(sampling_pair, fallback_joint, likely_documents):
    target, draft = sampling_pair
    broken = MixedRowsKeepFallbackQ(suffix(likely_documents), ModelDrafter(draft), min_tokens=2)
    out = sample(target, broken, n=4000)
    assert chi_square_p(out.sequences[:, len(NGRAM_PROMPT):], fallback_joint) < FAIL_P
