"""SuffixDrafter and TokenCorpus: retrieval from earlier generations and documents.

The match search is checked against a one-row definition on random haystacks, the counting of
continuations by hand; generation reproduces the target's greedy output with chains and tries
(with and without a corpus, after remembering); sampled chains and tries keep the target's law
(exact joint distribution of the first K tokens), and mis-verified proposals fail the same test.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_drafter_ngram import NGRAM_PROMPT, hf_greedy, repetitive_prompts
from test_drafter_ngram import FakeState as NgramState
from test_generate_models import PAD, _one_thread, left_padded, make_pair  # noqa: F401
from test_generate_sampling import K, chi_square_p, exact_joint
from test_generate_sampling import pair as sampling_pair  # noqa: F401

import specdecode
from specdecode.drafters import Proposal, SuffixDrafter, TokenCorpus
from specdecode.drafters.suffix import frequent_path, frequent_prefixes, longest_matches

PASS_P, FAIL_P = 1e-4, 1e-6


# ------------------------------------------------------------------ the definitions


def reference_matches(haystack: list[int], context_len: int, max_ngram: int, min_ngram: int, max_match: int):
    """Every end e (something other than -1 follows it) by its match length with the
    haystack's suffix (capped at max_match, inside the context); the longest ones, if >= min_ngram."""
    H = len(haystack)
    best, ends = 0, []
    for e in range(H - 1):
        if haystack[e + 1] == -1:
            continue
        m = 0
        while m < min(max_match, context_len) and e - m >= 0 and haystack[e - m] == haystack[H - 1 - m]:
            m += 1
        if m > best:
            best, ends = m, [e]
        elif m == best and m:
            ends.append(e)
    # the vectorised search finds n <= max_ngram first: a match longer than max_ngram counts only
    # when the max_ngram-gram itself occurs, which every longer match implies
    return (ends, best) if best >= min_ngram else ([], 0)


@pytest.mark.parametrize("seed", range(6))
def test_longest_matches_equal_the_definition_on_random_haystacks(seed):
    rng = np.random.default_rng(seed)
    for _ in range(40):
        vocab = int(rng.integers(2, 5))
        docs = [list(rng.integers(0, vocab, int(rng.integers(1, 12)))) for _ in range(int(rng.integers(0, 4)))]
        context = list(rng.integers(0, vocab, int(rng.integers(1, 14))))
        haystack = [t for d in docs for t in d + [-1]] + context
        max_ngram = int(rng.integers(1, 4))
        min_ngram = int(rng.integers(1, max_ngram + 1))
        max_match = max_ngram + int(rng.integers(0, 6))
        want = reference_matches(haystack, len(context), max_ngram, min_ngram, max_match)
        ends, length = longest_matches(np.array(haystack, dtype=np.int64), len(context), max_ngram, min_ngram,
                                       max_match)
        assert (ends.tolist(), length) == want, (haystack, len(context), max_ngram, min_ngram, max_match)


def test_continuations_are_counted_by_frequency_then_depth_then_recency():
    paths = [(1, 2, 3), (1, 2, 4), (1, 5), (6,)]
    assert frequent_prefixes(paths, 10, 0.25) == [(1,), (1, 2), (6,), (1, 5), (1, 2, 4), (1, 2, 3)]
    assert frequent_prefixes(paths, 3, 0.25) == [(1,), (1, 2), (6,)]
    assert frequent_prefixes(paths, 10, 0.5) == [(1,), (1, 2)]
    assert frequent_path(paths, 8, 0.25) == (1, 2, 4)  # a tie goes to the most recent path
    assert frequent_path(paths, 8, 0.5) == (1, 2)
    assert frequent_path(paths, 1, 0.0) == (1,)
    assert frequent_path([(), ()], 4, 0.0) == ()


# ------------------------------------------------------------------ proposals


class FakeState(NgramState):
    """The part of a DraftState SuffixDrafter reads."""

    def __init__(self, rows, vocab_size=100):
        super().__init__(rows, vocab_size)
        self.row_ids = torch.arange(len(rows))


def test_chain_proposals_from_the_corpus_and_the_context():
    drafter = SuffixDrafter([[7, 8, 9, 10, 11], [7, 8, 9, 12]], remember=False, min_token_prob=0.0, max_spec_factor=1.0)
    state = FakeState([[1, 7, 8, 9], [4, 5, 6], [2, 3, 2]])
    proposal = drafter.propose(state, 4)
    assert isinstance(proposal, Proposal) and proposal.is_deterministic
    # row 0 matches [7, 8, 9] three tokens long in both documents: a tie, the most recent wins
    # (12); the depth is max_spec_factor (1.0) x the match length 3
    assert proposal.num_draft_tokens.tolist() == [1, 0, 1]
    assert proposal.draft_tokens[0, :1].tolist() == [12] and proposal.draft_tokens[2, :1].tolist() == [3]
    deep = SuffixDrafter([[7, 8, 9, 10, 11]], remember=False, min_token_prob=0.1, max_spec_factor=2.0).propose(state, 4)
    assert deep.num_draft_tokens.tolist() == [2, 0, 2]  # the document ends after 11; row 2's context after 2
    assert deep.draft_tokens[0, :2].tolist() == [10, 11] and deep.draft_tokens[2, :2].tolist() == [3, 2]


def test_min_token_prob_cuts_where_continuations_disagree():
    corpus = [[5, 6, 1, 2], [5, 6, 1, 3], [5, 6, 1, 4], [5, 6, 9, 9]]
    state = FakeState([[8, 5, 6]])
    loose = SuffixDrafter(corpus, remember=False, min_token_prob=0.2, max_spec_factor=4.0).propose(state, 4)
    strict = SuffixDrafter(corpus, remember=False, min_token_prob=0.5, max_spec_factor=4.0).propose(state, 4)
    assert loose.draft_tokens[0, : loose.num_draft_tokens[0]].tolist() == [1, 4]  # 3 of 4, then 1 of 4
    assert strict.draft_tokens[0, : strict.num_draft_tokens[0]].tolist() == [1]


def test_trie_proposal_is_a_deterministic_tree_rooted_at_the_pending_token():
    corpus = [[5, 6, 1, 2], [5, 6, 1, 3], [5, 6, 4, 4]]
    drafter = SuffixDrafter(corpus, remember=False, min_token_prob=0.0, max_spec_factor=4.0, num_nodes=5)
    proposal = drafter.propose(FakeState([[8, 5, 6], [1, 2, 9]]), 99)
    tree = proposal.tree
    assert proposal.children == "deterministic" and proposal.is_deterministic
    assert tree.num_nodes.tolist() == [5, 1]
    assert tree.tokens[0, :5].tolist() == [6, 1, 4, 4, 3] and tree.parents[0, :5].tolist() == [-1, 0, 0, 2, 1]
    assert tree.tokens[1, 0].item() == 9
    tree.validate()


def test_ids_beyond_the_target_vocabulary_end_a_path():
    drafter = SuffixDrafter([[5, 6, 7, 150, 8]], remember=False, max_spec_factor=4.0)
    proposal = drafter.propose(FakeState([[5, 6]], vocab_size=100), 4)
    assert proposal.num_draft_tokens.tolist() == [1] and proposal.draft_tokens[0, 0].item() == 7


def test_corpus_copies_evicts_the_oldest_and_refuses_bad_documents():
    doc = np.array([1, 2, 3])
    corpus = TokenCorpus([doc, torch.tensor([4, 5])], max_tokens=6)
    doc[0] = 99
    assert corpus.haystack().tolist() == [1, 2, 3, -1, 4, 5, -1]
    corpus.add([[6, 7]])
    assert corpus.num_documents == 2 and corpus.haystack().tolist() == [4, 5, -1, 6, 7, -1]
    with pytest.raises(TypeError, match=r"sequences\[1\]"):
        corpus.add([[1], [[1, 2]]])
    with pytest.raises(ValueError, match=r"sequences\[0\]: token ids must be >= 0"):
        corpus.add([[-3]])
    with pytest.raises(TypeError, match="sequences"):
        corpus.add("abc")
    with pytest.raises(TypeError, match=r"sequences\[0\]"):
        corpus.add([[1.5]])
    corpus.clear()
    assert corpus.num_tokens == 0 and corpus.haystack().tolist() == []


@pytest.mark.parametrize("kwargs, error, name", [
    ({"remember": 1}, TypeError, "remember"),
    ({"max_ngram": 0}, ValueError, "max_ngram"),
    ({"min_ngram": 3, "max_ngram": 2}, ValueError, "min_ngram"),
    ({"max_match": 2, "max_ngram": 4}, ValueError, "max_match"),
    ({"max_candidates": 0}, ValueError, "max_candidates"),
    ({"min_token_prob": 1.5}, ValueError, "min_token_prob"),
    ({"min_token_prob": "0.1"}, TypeError, "min_token_prob"),
    ({"max_spec_factor": 0.0}, ValueError, "max_spec_factor"),
    ({"num_nodes": 1}, ValueError, "num_nodes"),
    ({"tree_depth": 2.0}, TypeError, "tree_depth"),
    ({"corpus": 5}, TypeError, "corpus"),
    ({"corpus": [[1, -2]]}, ValueError, r"corpus: sequences\[0\]"),
])
def test_bad_arguments_name_the_argument(kwargs, error, name):
    with pytest.raises(error, match=name):
        SuffixDrafter(**kwargs)


# ------------------------------------------------------------------ through generate


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2"])
def test_greedy_generation_equals_the_targets_greedy_generate(arch):
    target, _ = make_pair(arch)
    for lengths in ([11], [9, 14, 5]):
        ids, mask = repetitive_prompts(lengths, seed=len(lengths))
        want = hf_greedy(target, ids, mask, 24)
        other, other_mask = left_padded([7, 12], seed=5)
        history = hf_greedy(target, other, other_mask, 24)  # other prompts' greedy outputs as documents
        history_mask = torch.cat([other_mask, torch.ones((2, history.shape[1] - 12), dtype=torch.long)], 1)
        corpus = [row[m.bool()] for row, m in zip(history, history_mask)]
        for drafter in (SuffixDrafter(), SuffixDrafter(corpus, min_token_prob=0.0, max_spec_factor=3.0),
                        SuffixDrafter(num_nodes=8), SuffixDrafter(corpus, num_nodes=6, tree_depth=3)):
            out = specdecode.generate(target, drafter, ids, mask, num_draft_tokens=4, max_new_tokens=24,
                                      pad_token_id=PAD, draft_schedule="constant")
            assert torch.equal(out.sequences, want), (arch, lengths, drafter.describe())
            assert out.stats.drafter == "suffix" and out.stats.draft_calls == 0
            assert out.stats.accepted_tokens > 0


def test_a_remembered_generation_is_drafted_again():
    target, _ = make_pair("llama")
    ids, mask = left_padded([10, 6], seed=9)  # random prompts: little to find in their own context
    want = hf_greedy(target, ids, mask, 32)
    drafter = SuffixDrafter(num_nodes=None)
    first = specdecode.generate(target, drafter, ids, mask, num_draft_tokens=8, max_new_tokens=32, pad_token_id=PAD)
    second = specdecode.generate(target, drafter, ids, mask, num_draft_tokens=8, max_new_tokens=32, pad_token_id=PAD)
    assert torch.equal(first.sequences, want) and torch.equal(second.sequences, want)
    # the first generation's rows (prompt and output) joined the corpus when it ended, then the second's
    assert drafter.corpus.num_documents == 4
    assert second.stats.target_calls < first.stats.target_calls / 3
    # through generate's tree= the copy drafts tries and remembers into the same corpus
    trie = specdecode.generate(target, drafter, ids, mask, tree="trie", num_nodes=8, max_new_tokens=32,
                               pad_token_id=PAD)
    assert torch.equal(trie.sequences, want) and trie.stats.tree_rule in ("deterministic", "greedy")
    assert drafter.num_nodes is None and drafter.corpus.num_documents == 6
    fresh = SuffixDrafter(remember=False)
    specdecode.generate(target, fresh, ids, mask, max_new_tokens=8, pad_token_id=PAD)
    assert fresh.corpus.num_documents == 0


def test_tree_arguments_are_checked():
    target, _ = make_pair("llama")
    ids, _ = repetitive_prompts([8], seed=2)
    for tree in ("dynamic", "static", [[0], [1]]):
        with pytest.raises(ValueError, match="tree: SuffixDrafter drafts its own trie"):
            specdecode.generate(target, SuffixDrafter(), ids, tree=tree, max_new_tokens=4)
    with pytest.raises(ValueError, match="tree_children"):
        specdecode.generate(target, SuffixDrafter(), ids, tree="trie", tree_children="iid", max_new_tokens=4)
    with pytest.raises(ValueError, match="chain rule"):
        specdecode.generate(target, SuffixDrafter(num_nodes=4), ids, rule="block", max_new_tokens=8)


# ------------------------------------------------------------------ sampling



def sample(target, drafter, n=20000, seed=3, **kwargs):
    ids = torch.tensor([NGRAM_PROMPT]).expand(n, -1)
    return specdecode.generate(target, drafter, ids, do_sample=True, max_new_tokens=K, eos_token_id=[],
                               pad_token_id=PAD, generator=torch.Generator().manual_seed(seed), **kwargs)


class UniformClaimingSuffix(SuffixDrafter):
    """Broken: the proposal verified as if it had been drawn from a uniform q (chains), or as if
    each node's children were i.i.d. draws from a uniform q (tries: the SpecInfer rule)."""

    def propose(self, state, num_tokens):
        proposal = super().propose(state, num_tokens)
        b, n = proposal.draft_tokens.shape
        if n:
            proposal.draft_logits = torch.zeros((b, n, state.vocab_size), device=state.device)
            if proposal.tree is not None:
                proposal.children = "iid"
        return proposal


@pytest.fixture(scope="module")
def suffix_joint(sampling_pair):
    return exact_joint(sampling_pair[0], NGRAM_PROMPT)


@pytest.fixture(scope="module")
def likely_documents(suffix_joint):
    """The prompt's last tokens followed by each of the target's 8 likeliest K-token continuations:
    documents that continue the prompt in several ways, each often enough to be accepted."""
    likeliest = np.argsort(suffix_joint.ravel())[::-1][:8]
    return [NGRAM_PROMPT[-3:] + list(np.unravel_index(i, suffix_joint.shape)) for i in likeliest]


def settings(corpus, num_nodes):
    return {"corpus": corpus, "remember": False, "min_token_prob": 0.0, "max_spec_factor": 2.0,
            "num_nodes": num_nodes, "tree_depth": 2}


@pytest.mark.parametrize("num_nodes", [None, 6])
def test_sampling_is_lossless(sampling_pair, suffix_joint, likely_documents, num_nodes):
    target, _ = sampling_pair
    out = sample(target, SuffixDrafter(**settings(likely_documents, num_nodes)), num_draft_tokens=2)
    assert out.stats.drafted_tokens > 5000 and 0.05 < out.stats.acceptance_rate < 0.95
    if num_nodes:
        assert out.stats.tree_rule == "deterministic" and out.stats.rank_accepted[1] > 100
    assert chi_square_p(out.sequences[:, len(NGRAM_PROMPT):], suffix_joint) > PASS_P


@pytest.mark.parametrize("num_nodes", [None, 6])
def test_mis_verified_proposals_fail_the_same_test(sampling_pair, suffix_joint, likely_documents, num_nodes):
    target, _ = sampling_pair
    broken = sample(target, UniformClaimingSuffix(**settings(likely_documents, num_nodes)), n=4000,
                    num_draft_tokens=2)
    if num_nodes:
        assert broken.stats.tree_rule == "specinfer"
    assert chi_square_p(broken.sequences[:, len(NGRAM_PROMPT):], suffix_joint) < FAIL_P
