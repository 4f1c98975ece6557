"""NgramDrafter drafting tries: several matches merged into one token tree.

The candidate order and the trie are checked against a one-row-at-a-time definition; tree
generation reproduces the target's greedy output; sampled tries keep the target's law (exact
joint distribution of the first K tokens), and a mis-verified trie fails the same test.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_drafter_ngram import NGRAM_PROMPT, FakeState, batch_of, hf_greedy, repetitive_prompts
from test_generate_models import PAD, _one_thread, make_pair  # noqa: F401
from test_generate_sampling import K, chi_square_p, exact_joint
from test_generate_sampling import pair as sampling_pair  # noqa: F401

import specdecode
from specdecode.drafters import DrafterBase, NgramDrafter, Proposal
from specdecode.drafters.ngram import merge_into_trie, ngram_candidates, packed_contexts

PASS_P, FAIL_P = 1e-4, 1e-6


# ------------------------------------------------------------------ the definition


def reference_candidates(row: list[int], num_candidates: int, depth: int, max_ngram: int, min_ngram: int,
                         extend_period: bool) -> list[list[int]]:
    """Every earlier occurrence of the row's suffix, at its longest matching n, ordered by n
    (longest first) then recency; what followed each."""
    L = len(row)
    found: list[tuple[int, int]] = []  # (n, end)
    for end in range(L - 1):
        best = 0
        for n in range(min_ngram, max_ngram + 1):
            if n <= end + 1 and n <= L and row[end - n + 1: end + 1] == row[L - n:]:
                best = n
        if best:
            found.append((best, end))
    found.sort(key=lambda f: (-f[0], -f[1]))
    out = []
    for _, end in found[:num_candidates]:
        follow, period = end + 1, L - end - 1
        if extend_period:
            out.append([row[follow + i % period] for i in range(depth)])
        else:
            out.append(row[follow: follow + min(depth, period)])
    return out


def reference_trie(paths: list[list[int]], max_nodes: int) -> tuple[list[int], list[int]]:
    """Insert the paths one after the other into a trie (a dict per node), numbering new nodes
    in insertion order, until max_nodes - 1 draft nodes exist."""
    tokens: list[int] = []
    parents: list[int] = []
    children: dict[tuple[int, int], int] = {}  # (parent node, token) -> node
    for path in paths:
        node = 0
        for token in path:
            if (node, token) not in children:
                if len(tokens) == max_nodes - 1:
                    return tokens, parents
                tokens.append(token)
                parents.append(node)
                children[(node, token)] = len(tokens)
            node = children[(node, token)]
    return tokens, parents


def trie_of(paths: list[list[list[int]]], max_nodes: int, depth: int | None = None):
    """merge_into_trie on ragged per-row path lists, as per-row (tokens, parents) lists."""
    b = len(paths)
    M = max(1, max(len(p) for p in paths))
    D = depth or max(1, max((len(x) for p in paths for x in p), default=1))
    arr = np.zeros((b, M, D), dtype=np.int64)
    lengths = np.zeros((b, M), dtype=np.int64)
    for r, row in enumerate(paths):
        for m, path in enumerate(row):
            arr[r, m, : len(path)] = path
            lengths[r, m] = len(path)
    tokens, parents, num_nodes = merge_into_trie(arr, lengths, max_nodes)
    assert tokens.shape == parents.shape == (b, max_nodes - 1)
    out = []
    for r in range(b):
        n = int(num_nodes[r]) - 1
        assert (parents[r, n:] == -1).all()
        out.append((tokens[r, :n].tolist(), parents[r, :n].tolist()))
    return out


def test_shared_prefixes_become_one_path_and_diverging_tokens_siblings():
    paths = [[1, 2, 3], [1, 2, 4], [5, 6], [1, 7]]
    assert trie_of([paths], 16) == [([1, 2, 3, 4, 5, 6, 7], [0, 1, 2, 2, 0, 5, 1])]


def test_identical_continuations_merge_and_siblings_are_distinct():
    assert trie_of([[[1, 2], [1, 2], [1, 3], [1]]], 16) == [([1, 2, 3], [0, 1, 1])]
    # a token equal to a sibling's elsewhere in the tree stays a separate node
    assert trie_of([[[4, 4, 4], [5, 4]]], 16) == [([4, 4, 4, 5, 4], [0, 1, 2, 0, 4])]


def test_truncation_keeps_the_first_nodes_in_priority_order():
    paths = [[1, 2, 3], [1, 2, 4], [5, 6]]
    assert trie_of([paths], 4) == [([1, 2, 3], [0, 1, 2])]
    assert trie_of([paths], 6) == [([1, 2, 3, 4, 5], [0, 1, 2, 2, 0])]
    assert trie_of([paths], 2) == [([1], [0])]


def test_ragged_rows_and_rows_without_paths():
    rows = [[[1, 2], [3]], [], [[9, 8, 7]]]
    assert trie_of(rows, 5) == [([1, 2, 3], [0, 1, 0]), ([], []), ([9, 8, 7], [0, 1, 2])]


@pytest.mark.parametrize("extend_period", [True, False])
def test_candidates_and_trie_match_the_definition_on_random_batches(extend_period):
    rng = np.random.default_rng(5)
    for trial in range(40):
        b = int(rng.integers(1, 5))
        rows = [rng.integers(0, 4, int(rng.integers(1, 14))).tolist() for _ in range(b)]
        max_ngram = int(rng.integers(1, 4))
        min_ngram = int(rng.integers(1, max_ngram + 1))
        M, D, max_nodes = int(rng.integers(1, 7)), int(rng.integers(1, 5)), int(rng.integers(2, 12))
        tokens, mask = batch_of(rows)
        context, lengths = packed_contexts(tokens.numpy(), mask.numpy())
        paths, path_lengths = ngram_candidates(context, lengths, M, D, max_ngram, min_ngram, extend_period)
        assert paths.shape == (b, M, D)
        want_paths = [reference_candidates(row, M, D, max_ngram, min_ngram, extend_period) for row in rows]
        for r in range(b):
            got = [paths[r, m, : path_lengths[r, m]].tolist() for m in range(M) if path_lengths[r, m]]
            assert got == want_paths[r], (trial, rows[r])
        got_trie = merge_into_trie(paths, path_lengths, max_nodes)
        for r in range(b):
            want_tokens, want_parents = reference_trie(want_paths[r], max_nodes)
            n = int(got_trie[2][r]) - 1
            assert got_trie[0][r, :n].tolist() == want_tokens and got_trie[1][r, :n].tolist() == want_parents


def test_proposal_is_a_deterministic_tree_rooted_at_the_pending_token():
    # row 0: suffix [1, 2] matched at two places with different continuations; row 1: no match;
    # row 2: a 1-gram match only
    rows = [[1, 2, 9, 5, 1, 2, 7, 1, 2], [5, 6, 7], [3, 4, 3]]
    proposal = NgramDrafter(num_nodes=6, tree_depth=3).propose(FakeState(rows), 5)
    tree = proposal.tree
    assert proposal.is_deterministic and proposal.children == "deterministic"
    tree.validate()
    assert torch.equal(proposal.draft_tokens, tree.tokens)
    assert tree.num_nodes.tolist() == [6, 1, 4]
    assert tree.tokens[:, 0].tolist() == [2, 7, 3]  # each row's pending token
    # most recent [1, 2] first: 7 1 2, then 9 5 1 (diverges at the first token); the 1-gram
    # match of 2 is the same end as the first 2-gram one
    assert tree.tokens[0, 1:].tolist() == [7, 1, 2, 9, 5] and tree.parents[0, 1:].tolist() == [0, 1, 2, 0, 4]
    assert tree.tokens[2, 1:4].tolist() == [4, 3, 4] and tree.parents[2, 1:4].tolist() == [0, 1, 2]
    empty = NgramDrafter(num_nodes=6).propose(FakeState([[1, 2, 3]]), 5)
    assert empty.tree is None and empty.num_tokens == 0


def test_ids_beyond_the_target_vocabulary_end_a_path():
    proposal = NgramDrafter(num_nodes=8).propose(FakeState([[1, 2, 7, 150, 8, 1, 2]], vocab_size=100), 4)
    assert proposal.tree.num_nodes.tolist() == [2] and proposal.tree.tokens[0, 1].item() == 7


# ------------------------------------------------------------------ through generate


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2"])
def test_greedy_trie_generation_equals_the_targets_greedy_generate(arch):
    target, _ = make_pair(arch)
    accepted = 0
    for lengths in ([11], [9, 14, 5]):
        ids, mask = repetitive_prompts(lengths, seed=len(lengths))
        want = hf_greedy(target, ids, mask, 24)
        out = specdecode.generate(target, NgramDrafter(), ids, mask, tree="trie", num_nodes=8, max_new_tokens=24,
                                  pad_token_id=PAD)
        assert torch.equal(out.sequences, want), (arch, lengths)
        assert out.stats.drafter == "ngram" and out.stats.draft_calls == 0
        accepted += out.stats.accepted_tokens
        drafter = NgramDrafter(max_ngram=2, extend_period=False, num_nodes=5, tree_depth=3)
        out = specdecode.generate(target, drafter, ids, mask, max_new_tokens=24, pad_token_id=PAD)
        assert torch.equal(out.sequences, want), (arch, lengths)
    assert accepted > 0  # the tries really drafted accepted tokens


def test_through_custom_generate():
    target, _ = make_pair("llama")
    ids, mask = repetitive_prompts([6, 10], seed=4)
    seq = target.generate(ids, attention_mask=mask, custom_generate=specdecode.custom_generate,
                          draft_model=NgramDrafter(), tree="trie", num_nodes=6, max_new_tokens=16, do_sample=False,
                          pad_token_id=PAD)
    assert torch.equal(seq, hf_greedy(target, ids, mask, 16))


class ChainOnly(DrafterBase):
    def propose(self, state, num_tokens):
        return Proposal(state.tokens.new_zeros((state.batch_size, 0)))


def test_tree_arguments_are_checked_and_the_callers_drafter_is_untouched():
    target, _ = make_pair("llama")
    ids, _ = repetitive_prompts([8], seed=2)
    drafter = NgramDrafter()
    for tree in ("dynamic", "sequoia", "static", [[0], [1]]):
        with pytest.raises(ValueError, match="tree: NgramDrafter drafts its own trie"):
            specdecode.generate(target, drafter, ids, tree=tree, max_new_tokens=4)
    with pytest.raises(ValueError, match="tree_children"):
        specdecode.generate(target, drafter, ids, tree="trie", tree_children="iid", max_new_tokens=4)
    with pytest.raises(ValueError, match="num_nodes"):
        specdecode.generate(target, drafter, ids, tree="trie", num_nodes=1, max_new_tokens=4)
    with pytest.raises(ValueError, match="tree_depth"):
        NgramDrafter(num_nodes=4, tree_depth=0)
    with pytest.raises(TypeError, match="num_nodes"):
        NgramDrafter(num_nodes=4.0)
    with pytest.raises(ValueError, match="chain rule"):
        specdecode.generate(target, NgramDrafter(num_nodes=4), ids, rule="block", max_new_tokens=8)
    with pytest.raises(ValueError, match="ChainOnly drafts chains only"):
        specdecode.generate(target, ChainOnly(), ids, tree="trie", max_new_tokens=4)
    out = specdecode.generate(target, drafter, ids, tree="trie", num_nodes=4, max_new_tokens=8)
    assert drafter.num_nodes is None and out.stats.tree_rule in ("deterministic", "greedy")


# ------------------------------------------------------------------ sampling


def sample(target, drafter, n=20000, seed=3):
    ids = torch.tensor([NGRAM_PROMPT]).expand(n, -1)
    return specdecode.generate(target, drafter, ids, do_sample=True, max_new_tokens=K, eos_token_id=[],
                               pad_token_id=PAD, generator=torch.Generator().manual_seed(seed))


class UniformClaimingTrie(NgramDrafter):
    """Broken: the trie verified as if every node's children were i.i.d. draws from a uniform q
    (so the engine picks the SpecInfer rule)."""

    def propose(self, state, num_tokens):
        proposal = super().propose(state, num_tokens)
        if proposal.tree is not None:
            b, n = proposal.draft_tokens.shape
            proposal.draft_logits = torch.zeros((b, n, state.vocab_size), device=state.device)
            proposal.children = "iid"
        return proposal


@pytest.fixture(scope="module")
def ngram_joint(sampling_pair):
    return exact_joint(sampling_pair[0], NGRAM_PROMPT)


def test_sampled_tries_are_lossless(sampling_pair, ngram_joint):
    target, _ = sampling_pair
    out = sample(target, NgramDrafter(num_nodes=6, tree_depth=2))
    assert out.stats.tree_rule == "deterministic"
    assert out.stats.rank_accepted[1] > 100  # second siblings really get accepted
    assert chi_square_p(out.sequences[:, len(NGRAM_PROMPT):], ngram_joint) > PASS_P


def test_a_mis_verified_trie_fails_the_same_test(sampling_pair, ngram_joint):
    target, _ = sampling_pair
    broken = sample(target, UniformClaimingTrie(num_nodes=6, tree_depth=2), n=4000)
    assert broken.stats.tree_rule == "specinfer"
    assert chi_square_p(broken.sequences[:, len(NGRAM_PROMPT):], ngram_joint) < FAIL_P
