"""Drafters that run a model of their own on the host, on the static decode path
(:mod:`specdecode.engine.host_drafts`): TokenizerBridgeDrafter (a draft model across tokenizers)
and a FallbackDrafter of two host drafters propose between two static or compiled steps.

- greedy output equals the target's own greedy ``generate`` on the static path (batch 1, a
  left-padded batch of 3, rows that finish early leaving the draft's cache through ``kept_rows``);
- the exact whole-loop sampling test with the bridge on the static path passes, and a broken
  variant (verification shown ``q`` one-hot on another token) fails it;
- a FallbackDrafter whose fallback drafts on the device is refused naming ``draft``.
"""

from __future__ import annotations

import pytest
import torch
from test_drafter_tokenizer_bridge import (SAMPLING_WORDS, WORDS, permutation, permuted_model,  # noqa: F401
                                           permuted_tokenizer, tokenizers, word_tokenizer)
from test_generate_models import PAD, _one_thread, left_padded, make_model, make_pair  # noqa: F401
from test_generate_sampling import K, PROMPT, V, chi_square_p, exact_joint
from test_static_generate import FAIL_P, PASS_P, pair  # noqa: F401

import specdecode.engine.static_loop as static_loop
from specdecode import NgramDrafter, SuffixDrafter, TokenizerBridgeDrafter, generate
from specdecode.drafters import FallbackDrafter
from specdecode.drafters.base import point_mass_logits


@pytest.fixture(autouse=True)
def _fresh_sessions():
    static_loop.clear_static_sessions()
    yield
    static_loop.clear_static_sessions()


def hf_greedy(target, ids, mask, max_new_tokens, **kwargs):
    return target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens,
                           pad_token_id=PAD, **kwargs)


@pytest.fixture(scope="module")
def perfect_bridge():
    """The target itself behind a permuted tokenizer: the bridge proposes its greedy tokens."""
    target, _ = make_pair("llama")
    tok = word_tokenizer(WORDS)
    perm = permutation(len(tok), 0, seed=1)
    return target, lambda: TokenizerBridgeDrafter(permuted_model(target, perm), permuted_tokenizer(tok, perm), tok)


def test_bridge_and_fallback_greedy_equal_the_target(perfect_bridge):
    """(The compiled path runs host drafters' steps as the static one does: tested with prompt
    lookup and suffix drafting in tests/test_static_host_drafters.py.)"""
    target, bridge = perfect_bridge
    path = "static"
    for lengths in ([7], [5, 9, 3]):
        ids, mask = left_padded(lengths, seed=len(lengths))
        want = hf_greedy(target, ids, mask, 20)
        for drafter in (bridge(), FallbackDrafter(NgramDrafter(), bridge(), min_tokens=2)):
            out = generate(target, drafter, ids, mask, num_draft_tokens=3, max_new_tokens=20, pad_token_id=PAD,
                           decode_path=path)
            assert torch.equal(out.sequences, want), (type(drafter).__name__, lengths)
            assert out.stats.decode_path == path and out.stats.acceptance_rate > 0.8
            assert out.stats.draft_calls > 0  # the bridge's draft model, counted on the host


def test_rows_that_finish_early_leave_the_draft_cache(tokenizers):
    """Different segmentations (byte-level target, SentencePiece-style draft); one row emits EOS
    early and leaves the batch (row 0 too: the EOS is the same word there): the bridge drops
    their rows through ``kept_rows``."""
    target_tok, draft_tok = tokenizers["bytelevel"], tokenizers["metaspace"]
    target = make_model("llama", vocab=len(target_tok), seed=1, init=0.3)
    draft = make_model("llama", vocab=len(draft_tok), layers=1, seed=2)
    target_tok.padding_side = "left"
    from test_drafter_tokenizer_bridge import corpus

    batch = target_tok([t[:90] for t in corpus()[:3]], return_tensors="pt", padding=True)
    want = hf_greedy(target, batch.input_ids, batch.attention_mask, 16)
    eos = int(want[1, batch.input_ids.shape[1] + 2])
    want = hf_greedy(target, batch.input_ids, batch.attention_mask, 16, eos_token_id=eos)
    drafter = TokenizerBridgeDrafter(draft, draft_tok, target_tok)
    kept = []
    commit = drafter.commit
    drafter.commit = lambda update: (kept.append(update.kept_rows), commit(update))[1]
    out = generate(target, drafter, batch.input_ids, batch.attention_mask, num_draft_tokens=3, max_new_tokens=16,
                   pad_token_id=PAD, eos_token_id=eos, decode_path="static")
    assert torch.equal(out.sequences, want)
    assert [k.tolist() for k in kept if k is not None] == [[2]]  # rows 0 and 1 left after their EOS, once


def test_fallback_with_a_device_drafter_is_refused(pair):
    target, draft = pair
    ids = torch.tensor([PROMPT])
    from specdecode import ModelDrafter

    with pytest.raises(ValueError, match="^draft: FallbackDrafter cannot draft on the static decode path"):
        generate(target, FallbackDrafter(SuffixDrafter(), ModelDrafter(draft)), ids, max_new_tokens=4,
                 decode_path="static")


# ------------------------------------------------------------------------ sampling exactness


@pytest.fixture(scope="module")
def sampling_bridge(pair):
    target, draft = pair
    tok = word_tokenizer(SAMPLING_WORDS)
    perm = permutation(V, 0, seed=5)
    return target, lambda: TokenizerBridgeDrafter(permuted_model(draft, perm), permuted_tokenizer(tok, perm), tok)


def sample_static(target, drafter, n):
    ids = torch.tensor([PROMPT]).expand(n, -1)
    out = generate(target, drafter, ids, num_draft_tokens=2, rule="token", do_sample=True, max_new_tokens=K,
                   eos_token_id=[], pad_token_id=PAD, decode_path="static", generator=torch.Generator().manual_seed(3))
    assert out.sequences.shape == (n, len(PROMPT) + K) and out.stats.drafted_tokens > n
    return out.sequences[:, len(PROMPT):]


def test_bridge_sampling_on_the_static_path_is_lossless(sampling_bridge):
    target, bridge = sampling_bridge
    assert chi_square_p(sample_static(target, bridge(), 12000), exact_joint(target, PROMPT)) > PASS_P


def test_bridge_q_on_another_token_fails_the_same_test(sampling_bridge, monkeypatch):
    """Broken: verification reads ``q`` one-hot on the next id after each bridged draft."""
    target, bridge = sampling_bridge
    original = static_loop.verify_chain

    def verify(target_logits, draft_tokens, draft_logits, *args, **kwargs):
        assert draft_logits is None
        return original(target_logits, draft_tokens, point_mass_logits((draft_tokens + 1) % V, V), *args, **kwargs)

    monkeypatch.setattr(static_loop, "verify_chain", verify)
    assert chi_square_p(sample_static(target, bridge(), 4000), exact_joint(target, PROMPT)) < FAIL_P
