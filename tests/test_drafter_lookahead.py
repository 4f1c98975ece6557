"""Lookahead decoding (LookaheadDrafter), plain Jacobi decoding (JacobiDrafter) and the engine's
side tokens they rely on.

Side tokens change no verified logit; the lookahead mask is the one its definition states;
both drafters reproduce the target's greedy output on three architectures, at batch 1 and on a
left-padded batch; sampled generation keeps the target's law exactly (the joint distribution
of the first K tokens), and a mis-verified Lookahead trie fails the same test.
"""

from __future__ import annotations

import pytest
import torch
from test_drafter_ngram import NGRAM_PROMPT, hf_greedy, repetitive_prompts
from test_generate_models import PAD, _one_thread, make_pair  # noqa: F401
from test_generate_sampling import K, chi_square_p, exact_joint
from test_generate_sampling import pair as sampling_pair  # noqa: F401

import specdecode
from specdecode.drafters import JacobiDrafter, LookaheadDrafter, SideTokens
from specdecode.drafters.lookahead import lookahead_mask, lookahead_offsets

PASS_P, FAIL_P = 1e-4, 1e-6


# ------------------------------------------------------------------ the definition


def test_lookahead_mask_matches_its_definition():
    window, levels = 3, 3
    mask = lookahead_mask(window, levels)
    for a in range(window * levels):
        for b in range(window * levels):
            (ia, ja), (ib, jb) = divmod(a, window), divmod(b, window)
            want = (ib == 0 and jb <= ja) or (1 <= ib <= ia and jb == ja)
            assert bool(mask[a, b]) == want, (a, b)
    assert lookahead_offsets(window, levels).tolist() == [1 + i + j for i in range(levels) for j in range(window)]


# ------------------------------------------------------------------ side tokens


class Recording(LookaheadDrafter):
    """Records the verified logits the engine hands back at every commit (optionally without
    the side tokens). Its pools are emptied before every proposal, so its tries come from the
    context alone and both runs score the same trees at every step."""

    def __init__(self, drop_side: bool, **kwargs):
        super().__init__(**kwargs)
        self.drop_side, self.seen = drop_side, []

    def propose(self, state, num_tokens):
        for pool in self._pools.values():
            pool.clear()
        proposal = super().propose(state, num_tokens)
        if self.drop_side:
            proposal.side = None
        self.num_nodes = None if proposal.tree is None else proposal.tree.num_nodes
        return proposal

    def commit(self, update):
        logits = update.target_logits.clone()
        if self.num_nodes is not None:  # only the rows' nodes are verified (a one-path trie is scored as a chain)
            logits[torch.arange(logits.shape[1])[None, :] >= self.num_nodes[:, None]] = 0
        self.seen.append(logits)
        assert (update.side_logits is None) == self.drop_side
        if not self.drop_side:
            super().commit(update)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_side_tokens_change_no_verified_logit(arch):
    target, _ = make_pair(arch)
    ids, mask = repetitive_prompts([9, 14, 5], seed=3)
    runs = []
    for drop in (False, True):
        drafter = Recording(drop, window=3, ngram=3, use_context=True)
        specdecode.generate(target, drafter, ids, mask, max_new_tokens=12, pad_token_id=PAD)
        runs.append(drafter.seen)
    with_side, without = runs
    assert len(with_side) == len(without) > 3
    for a, b in zip(with_side, without):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_side_tokens_are_checked():
    target, _ = make_pair("llama")
    ids, _ = repetitive_prompts([8], seed=2)

    class BadSide(LookaheadDrafter):
        def __init__(self, change, **kwargs):
            super().__init__(**kwargs)
            self.change = change

        def propose(self, state, num_tokens):
            proposal = super().propose(state, num_tokens)
            side = proposal.side
            if self.change == "mask":
                proposal.side = SideTokens(side.tokens, side.positions, torch.zeros_like(side.mask))
            elif self.change == "token":
                proposal.side = SideTokens(side.tokens + 10_000, side.positions, side.mask)
            elif self.change == "shape":
                proposal.side = SideTokens(side.tokens, side.positions[:, :1], side.mask)
            return proposal

    for change, match in (("mask", "diagonal"), ("token", "token ids"), ("shape", "side.positions")):
        with pytest.raises(ValueError, match=match):
            specdecode.generate(target, BadSide(change, window=2, ngram=2), ids, max_new_tokens=4)


def test_arguments_are_checked():
    for kwargs, error, name in (({"window": 0}, ValueError, "window"), ({"ngram": 1}, ValueError, "ngram"),
                                ({"window": 2.0}, TypeError, "window"), ({"use_context": 1}, TypeError, "use_context"),
                                ({"max_candidates": 0}, ValueError, "max_candidates"),
                                ({"min_pool_gain": -1}, ValueError, "min_pool_gain"),
                                ({"min_pool_gain": "high"}, TypeError, "min_pool_gain"),
                                ({"occurrence": "oldest"}, ValueError, "occurrence")):
        with pytest.raises(error, match=name):
            LookaheadDrafter(**kwargs)
    with pytest.raises(ValueError, match="window"):
        JacobiDrafter(0)


# ------------------------------------------------------------------ through generate


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2"])
def test_greedy_generation_equals_the_targets_greedy_generate(arch):
    target, _ = make_pair(arch)
    harvested = 0
    for lengths in ([11], [9, 14, 5]):
        ids, mask = repetitive_prompts(lengths, seed=len(lengths))
        want = hf_greedy(target, ids, mask, 24)
        for drafter in (LookaheadDrafter(window=3, ngram=3), LookaheadDrafter(window=2, ngram=2, use_context=False),
                        JacobiDrafter(3)):
            out = specdecode.generate(target, drafter, ids, mask, max_new_tokens=24, pad_token_id=PAD,
                                      num_draft_tokens=3)
            assert torch.equal(out.sequences, want), (arch, lengths, drafter.name)
            harvested += getattr(drafter, "harvested", 0)
    assert harvested > 0


class ChainCounting(LookaheadDrafter):
    """Counts the steps proposed as chains (no side tokens, every trie one path)."""

    chains = 0

    def propose(self, state, num_tokens):
        proposal = super().propose(state, num_tokens)
        self.chains += proposal.tree is None
        return proposal


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_steps_without_side_tokens_verify_one_path_as_a_chain(arch):
    """With the lookahead branch off most steps, single-path tries go through the chain path;
    greedy output stays the target's, at batch 1 and on a left-padded batch."""
    target, _ = make_pair(arch)
    for lengths in ([11], [9, 14, 5]):
        ids, mask = repetitive_prompts(lengths, seed=len(lengths))
        drafter = ChainCounting(window=2, ngram=2, context_candidates=1, min_pool_gain=100.0, explore_every=3,
                                occurrence="first" if arch == "gpt2" else "recent")
        out = specdecode.generate(target, drafter, ids, mask, max_new_tokens=24, pad_token_id=PAD)
        assert torch.equal(out.sequences, hf_greedy(target, ids, mask, 24)), (arch, lengths)
        assert drafter.chains > 0 and drafter.harvested > 0


def test_lookahead_pool_alone_gets_tokens_accepted():
    """Without the context's n-grams, what is accepted came from the lookahead branch."""
    target, _ = make_pair("qwen2")
    accepted = 0
    for seed in range(3):
        ids, mask = repetitive_prompts([11, 7], seed=seed)
        out = specdecode.generate(target, LookaheadDrafter(window=4, ngram=3, use_context=False), ids, mask,
                                  max_new_tokens=32, pad_token_id=PAD)
        accepted += out.stats.accepted_tokens
    assert accepted > 0


# ------------------------------------------------------------------ sampling


def sample(target, drafter, n=20000, seed=5, **kwargs):
    ids = torch.tensor([NGRAM_PROMPT]).expand(n, -1)
    return specdecode.generate(target, drafter, ids, do_sample=True, max_new_tokens=K, eos_token_id=[],
                               pad_token_id=PAD, generator=torch.Generator().manual_seed(seed), **kwargs)


class UniformClaimingLookahead(LookaheadDrafter):
    """Broken: the trie verified as if every node's children were i.i.d. draws from a uniform q."""

    def propose(self, state, num_tokens):
        proposal = super().propose(state, num_tokens)
        b, n = proposal.draft_tokens.shape
        proposal.draft_logits = torch.zeros((b, n, state.vocab_size), device=state.device)
        proposal.children = "iid"
        return proposal


@pytest.fixture(scope="module")
def joint(sampling_pair):
    return exact_joint(sampling_pair[0], NGRAM_PROMPT)


def test_sampled_lookahead_is_lossless(sampling_pair, joint):
    target, _ = sampling_pair
    out = sample(target, LookaheadDrafter(window=2, ngram=3))
    assert out.stats.tree_rule == "deterministic" and out.stats.accepted_tokens > 1000
    assert chi_square_p(out.sequences[:, len(NGRAM_PROMPT):], joint) > PASS_P


def test_sampled_lookahead_with_chain_steps_is_lossless(sampling_pair, joint):
    target, _ = sampling_pair
    drafter = ChainCounting(window=2, ngram=3, context_candidates=1, min_pool_gain=100.0, explore_every=2)
    out = sample(target, drafter)
    assert drafter.chains > 0 and out.stats.accepted_tokens > 1000
    assert chi_square_p(out.sequences[:, len(NGRAM_PROMPT):], joint) > PASS_P


def test_sampled_jacobi_is_lossless(sampling_pair, joint):
    target, _ = sampling_pair
    out = sample(target, JacobiDrafter(2), num_draft_tokens=2)
    assert chi_square_p(out.sequences[:, len(NGRAM_PROMPT):], joint) > PASS_P


def test_a_mis_verified_lookahead_trie_fails_the_same_test(sampling_pair, joint):
    target, _ = sampling_pair
    broken = sample(target, UniformClaimingLookahead(window=2, ngram=3), n=4000)
    assert broken.stats.tree_rule == "specinfer"
    assert chi_square_p(broken.sequences[:, len(NGRAM_PROMPT):], joint) < FAIL_P
