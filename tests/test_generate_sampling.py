"""Sampling exactness of the whole generate loop (not just one verify call): with a vocabulary of
8 tokens, the target's exact joint distribution of the first three new tokens is computed by
enumeration (73 forward passes), then a large batch of one prompt is sampled speculatively and
compared with a chi-square test. Deliberately broken loops must fail the same test."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from scipy import stats as scipy_stats
from test_generate_models import PAD, _one_thread, make_pair  # noqa: F401

import specdecode.engine.batch as batch_layout
import specdecode.engine.loop as engine_loop
from specdecode import ModelDrafter, custom_generate, generate
from specdecode.reference import process_logits

V = 8
K = 3  # new tokens whose joint distribution is tested
N = 20000  # samples per test
PASS_P, FAIL_P = 1e-4, 1e-6


@pytest.fixture(scope="module")
def pair():
    # Larger weights than the greedy tests: peaked, context-dependent distributions, so that a
    # wrong context or a wrong distribution shows up clearly.
    target, draft = make_pair("llama", vocab=V, init=0.3, seed=1)
    for model in (target, draft):  # no EOS: every row samples all K tokens
        model.config.eos_token_id = None
        model.generation_config.eos_token_id = None
    return target, draft


def exact_joint(target, prompt: list[int], temperature=1.0, top_k=0, top_p=1.0, processor=None) -> np.ndarray:
    """``p(x1) p(x2|x1) p(x3|x1,x2)`` after the processor and standardized sampling."""
    joint = np.zeros((V,) * K)
    cond = {}
    with torch.no_grad():
        for n in range(K):
            for prefix in itertools.product(range(V), repeat=n):
                ids = torch.tensor([prompt + list(prefix)])
                logits = target(ids).logits[:, -1].float()
                if processor is not None:
                    logits = processor(ids, logits)
                cond[prefix] = process_logits(logits[0], temperature, top_k, top_p).numpy()
    for x in itertools.product(range(V), repeat=K):
        joint[x] = np.prod([cond[x[:i]][x[i]] for i in range(K)])
    assert abs(joint.sum() - 1.0) < 1e-9
    return joint


def chi_square_p(samples: torch.Tensor, joint: np.ndarray) -> float:
    """p-value of the observed K-token sequences [n, K] under ``joint``; cells expected below 5
    are pooled into one."""
    counts = np.zeros(joint.shape)
    np.add.at(counts, tuple(samples.numpy().T), 1)
    expected = joint.flatten() * samples.shape[0]
    observed = counts.flatten()
    assert observed[expected == 0].sum() == 0, "sampled a sequence of probability 0"
    expected, observed = expected[expected > 0], observed[expected > 0]
    small = expected < 5
    if small.sum() > 1:
        expected = np.append(expected[~small], expected[small].sum())
        observed = np.append(observed[~small], observed[small].sum())
    return float(scipy_stats.chisquare(observed, expected).pvalue)


PROMPT = [3, 5, 2, 7]


def sample_standalone(target, draft, rule, seed=0, prompt=PROMPT, n=N, **kwargs):
    ids = torch.tensor([prompt]).expand(n, -1)
    out = generate(target, draft, ids, num_draft_tokens=2, rule=rule, do_sample=True, max_new_tokens=K,
                   eos_token_id=[], pad_token_id=PAD, generator=torch.Generator().manual_seed(seed), **kwargs)
    assert out.sequences.shape == (n, len(prompt) + K)
    return out


@pytest.mark.parametrize("rule", ["token", "block"])
def test_sampling_is_lossless(pair, rule):
    target, draft = pair
    joint = exact_joint(target, PROMPT)
    out = sample_standalone(target, draft, rule)
    assert 0.2 < out.stats.acceptance_rate < 0.9  # drafts are both accepted and rejected
    assert chi_square_p(out.sequences[:, len(PROMPT):], joint) > PASS_P


def test_sampling_with_top_k_top_p_and_left_padding_is_lossless(pair):
    target, draft = pair
    short = [6, 4]
    joint_long = exact_joint(target, PROMPT, temperature=0.8, top_k=6, top_p=0.9)
    joint_short = exact_joint(target, short, temperature=0.8, top_k=6, top_p=0.9)
    n = N // 2
    ids = torch.tensor([PROMPT, [PAD, PAD] + short]).repeat(n, 1)
    mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]]).repeat(n, 1)
    out = generate(target, draft, ids, mask, num_draft_tokens=2, rule="block", do_sample=True, temperature=0.8,
                   top_k=6, top_p=0.9, max_new_tokens=K, eos_token_id=[], pad_token_id=PAD,
                   generator=torch.Generator().manual_seed(1))
    new = out.sequences[:, 4:]
    assert chi_square_p(new[0::2], joint_long) > PASS_P
    assert chi_square_p(new[1::2], joint_short) > PASS_P


def test_plugin_sampling_with_processors_is_lossless(pair):
    from transformers import RepetitionPenaltyLogitsProcessor

    target, draft = pair
    joint = exact_joint(target, PROMPT, temperature=0.9, top_k=5, processor=RepetitionPenaltyLogitsProcessor(1.5))
    ids = torch.tensor([PROMPT]).expand(N, -1)
    seq = target.generate(ids, attention_mask=torch.ones_like(ids), custom_generate=custom_generate,
                          draft_model=draft, num_draft_tokens=2, rule="token", do_sample=True, temperature=0.9,
                          top_k=5, repetition_penalty=1.5, max_new_tokens=K, pad_token_id=PAD,
                          generator=torch.Generator().manual_seed(2))
    assert chi_square_p(seq[:, len(PROMPT):], joint) > PASS_P


class GreedyClaimingQDrafter(ModelDrafter):
    """Broken: proposes the draft's argmax but hands over the logits as if it had sampled."""

    def propose(self, state, num_tokens):
        proposal = super().propose(state, num_tokens)
        proposal.draft_tokens = proposal.draft_logits.argmax(-1)
        return proposal


def _break_rollback(monkeypatch):
    """Broken: rejected drafts stay visible to their rows (no holes)."""
    original = batch_layout.BatchState.advance

    def advance(self, accepted_len, next_tokens, num_draft, max_accepted):
        return original(self, torch.full_like(accepted_len, max_accepted), next_tokens, 0, max_accepted)

    monkeypatch.setattr(batch_layout.BatchState, "advance", advance)


def _break_bonus_position(monkeypatch):
    """Broken: the bonus token is drawn from p_gamma instead of p_{gamma+1}."""
    original = engine_loop.SpeculativeEngine._score

    def score(self, draft_tokens):
        logits = original(self, draft_tokens)
        if logits.shape[1] > 1:
            logits = torch.cat([logits[:, :-1], logits[:, -2:-1]], 1)
        return logits

    monkeypatch.setattr(engine_loop.SpeculativeEngine, "_score", score)


@pytest.mark.parametrize("broken", ["no_rollback", "bonus_position", "greedy_draft"])
def test_broken_loops_fail_the_same_test(pair, broken, monkeypatch):
    target, draft = pair
    joint = exact_joint(target, PROMPT)
    if broken == "no_rollback":
        _break_rollback(monkeypatch)
    elif broken == "bonus_position":
        _break_bonus_position(monkeypatch)
    else:
        draft = GreedyClaimingQDrafter(draft)
    out = sample_standalone(target, draft, "token")
    assert chi_square_p(out.sequences[:, len(PROMPT):], joint) < FAIL_P
