"""NgramDrafter (prompt lookup): the matching logic against a plain-Python definition, its
learned draft length, bad arguments, greedy output identical to the target's own greedy
generate, and the exact whole-loop distribution with sampling (token and block rules), which a
deliberately broken verification of the same proposals fails."""

from __future__ import annotations

import pytest
import torch
from test_generate_models import PAD, _one_thread, left_padded, make_pair  # noqa: F401
from test_generate_sampling import K, chi_square_p, exact_joint
from test_generate_sampling import pair as sampling_pair  # noqa: F401

import specdecode
from specdecode.drafters import CommitUpdate, NgramDrafter, Proposal
from specdecode.drafters.ngram import ngram_lookup, packed_contexts

PASS_P, FAIL_P = 1e-4, 1e-6


# ------------------------------------------------------------------ the matching logic


def reference_lookup(row: list[int], k: int, max_ngram: int, min_ngram: int, extend_period: bool
                     ) -> tuple[list[int], int]:
    """The definition, one row at a time: the first n (from max_ngram down) whose last-n tokens
    occur earlier; its most recent earlier occurrence; what followed it."""
    L = len(row)
    for n in range(max_ngram, min_ngram - 1, -1):
        if n > L - 1:
            continue
        suffix = row[L - n:]
        for start in range(L - n - 1, -1, -1):  # occurrence row[start:start+n], most recent first
            if row[start: start + n] == suffix:
                follow = start + n
                period = L - follow
                if extend_period:
                    return [row[follow + i % period] for i in range(k)], n
                return row[follow: follow + min(k, period)], n
    return [], 0


def batch_of(rows: list[list[int]], holes: dict[int, list[int]] | None = None, pad: int = 0):
    """Left-padded [b, W] tokens and mask for ``rows``; ``holes[r]`` inserts masked columns
    (holding junk ids) at those positions of row r's real tokens."""
    holes = holes or {}
    laid = []
    for r, row in enumerate(rows):
        cells = [(t, 1) for t in row]
        for pos in sorted(holes.get(r, []), reverse=True):
            cells.insert(pos, (row[pos % len(row)], 0))  # a junk id equal to a real token
        laid.append(cells)
    W = max(len(c) for c in laid)
    tokens = torch.full((len(rows), W), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), W), dtype=torch.long)
    for r, cells in enumerate(laid):
        for j, (t, m) in enumerate(cells):
            tokens[r, W - len(cells) + j] = t
            mask[r, W - len(cells) + j] = m
    return tokens, mask


def lookup(rows, k, max_ngram=3, min_ngram=1, extend_period=True, holes=None, pad=0, occurrence="recent"):
    tokens, mask = batch_of(rows, holes, pad)
    context, lengths = packed_contexts(tokens.numpy(), mask.numpy())
    draft, counts, ngram = ngram_lookup(context, lengths, k, max_ngram, min_ngram, extend_period, occurrence)
    return [draft[r, : int(counts[r])].tolist() for r in range(len(rows))], ngram.tolist()


def test_most_recent_occurrence_wins():
    row = [1, 2, 9, 4, 1, 2, 8, 5, 1, 2]
    assert lookup([row], 2, max_ngram=2)[0] == [[8, 5]]
    assert lookup([row], 2, max_ngram=2)[1] == [2]


def test_first_occurrence_on_request():
    """occurrence="first": the earliest occurrence of the longest matching suffix, as Hugging
    Face's prompt lookup; a longer match still wins over an earlier shorter one."""
    row = [1, 2, 9, 4, 1, 2, 8, 5, 1, 2]
    assert lookup([row], 2, max_ngram=2, occurrence="first") == ([[9, 4]], [2])
    row = [2, 7, 7, 3, 1, 2, 6, 6, 3, 1, 2]
    assert lookup([row], 2, max_ngram=3, occurrence="first") == ([[6, 6]], [3])
    assert lookup([row, [5, 2, 4, 2]], 1, max_ngram=1, occurrence="first") == ([[7], [4]], [1, 1])


def test_longest_ngram_first_then_shorter():
    # "1 2 3" occurred once (followed by 7); "2 3" more recently (followed by 6)
    row = [1, 2, 3, 7, 5, 2, 3, 6, 4, 1, 2, 3]
    assert lookup([row], 1, max_ngram=3) == ([[7]], [3])
    assert lookup([row], 1, max_ngram=2) == ([[6]], [2])
    # a 1-gram only: the most recent earlier "3" is followed by 6
    assert lookup([row], 1, max_ngram=1) == ([[6]], [1])
    # nothing of length >= 4 matches, and min_ngram=4 forbids shorter ones
    assert lookup([row], 1, max_ngram=5, min_ngram=4) == ([[]], [0])


def test_no_match_proposes_nothing():
    assert lookup([[1, 2, 3, 4, 5]], 3) == ([[]], [0])
    assert lookup([[7]], 3) == ([[]], [0])  # a one-token context


def test_continuation_shorter_than_k():
    row = [5, 1, 2, 3, 1, 2]  # "1 2" last occurred 2 tokens before the end: only "3 1 2" follows
    assert lookup([row], 5, max_ngram=2, extend_period=False) == ([[3, 1, 2]], [2])
    # extended periodically: the copy runs on into what it just proposed
    assert lookup([row], 5, max_ngram=2) == ([[3, 1, 2, 3, 1]], [2])
    # a token repeated: period 1
    assert lookup([[4, 4]], 3) == ([[4, 4, 4]], [1])
    assert lookup([[4, 4]], 3, extend_period=False) == ([[4]], [1])


def test_rows_of_different_lengths_and_left_padding_never_match():
    rows = [[1, 2, 9, 1, 2], [0, 5], [3], [6, 0, 6]]
    drafts, ngram = lookup(rows, 2, pad=0)  # the pad id 0 is also a real token of rows 1 and 3
    assert drafts == [[9, 1], [], [], [0, 6]]
    assert ngram == [2, 0, 0, 1]
    # the pad id equal to the last token of a short row: still no match in the padding
    drafts, _ = lookup([[1, 2, 3, 4, 5, 6, 7, 8], [8]], 2, pad=8)
    assert drafts == [[], []]


def test_holes_are_skipped():
    row = [1, 2, 9, 4, 1, 2]
    drafts, _ = lookup([row, row], 2, max_ngram=2, holes={1: [1, 3, 4]})
    assert drafts == [[9, 4], [9, 4]]


@pytest.mark.parametrize("extend_period", [True, False])
def test_matches_the_definition_on_random_batches(extend_period):
    g = torch.Generator().manual_seed(0)
    for trial in range(60):
        b = int(torch.randint(1, 6, (1,), generator=g))
        vocab = int(torch.randint(2, 7, (1,), generator=g))
        rows = [torch.randint(0, vocab, (int(torch.randint(1, 25, (1,), generator=g)),), generator=g).tolist()
                for _ in range(b)]
        holes = {r: torch.randint(0, len(rows[r]), (2,), generator=g).tolist() for r in range(b) if trial % 2}
        k = int(torch.randint(1, 7, (1,), generator=g))
        max_ngram = int(torch.randint(1, 5, (1,), generator=g))
        min_ngram = int(torch.randint(1, max_ngram + 1, (1,), generator=g))
        got = lookup(rows, k, max_ngram, min_ngram, extend_period, holes=holes, pad=0)
        want = [reference_lookup(r, k, max_ngram, min_ngram, extend_period) for r in rows]
        assert got == ([w[0] for w in want], [w[1] for w in want]), (rows, k, max_ngram, min_ngram)


# ------------------------------------------------------------------ the drafter on a state


class FakeState:
    """The part of a DraftState NgramDrafter reads."""

    def __init__(self, rows, vocab_size=100, holes=None):
        self.tokens, self.attention_mask = batch_of(rows, holes)
        self.num_columns = self.tokens.shape[1]
        self.has_holes = bool((self.attention_mask == 0).any())
        self.batch_size = len(rows)
        self.vocab_size = vocab_size
        self.device = torch.device("cpu")


def test_proposal_is_deterministic_and_trimmed_to_the_longest_row():
    drafter = NgramDrafter(min_acceptance=0.0)
    state = FakeState([[1, 2, 9, 1, 2], [5, 6, 7], [3, 4, 3]])
    proposal = drafter.propose(state, 4)
    assert isinstance(proposal, Proposal) and proposal.is_deterministic
    assert proposal.num_draft_tokens.tolist() == [4, 0, 4]
    assert proposal.draft_tokens[0].tolist() == [9, 1, 2, 9]
    assert proposal.draft_tokens[2].tolist() == [4, 3, 4, 3]
    empty = drafter.propose(FakeState([[1, 2, 3]]), 4)
    assert empty.num_tokens == 0 and empty.num_draft_tokens.tolist() == [0]


def test_ids_beyond_the_target_vocabulary_end_a_proposal():
    drafter = NgramDrafter(min_acceptance=0.0)
    proposal = drafter.propose(FakeState([[1, 2, 7, 150, 8, 1, 2]], vocab_size=100), 4)
    assert proposal.num_draft_tokens.tolist() == [1]
    assert proposal.draft_tokens[0, 0].item() == 7


def test_max_lookback_limits_the_search():
    row = [1, 2, 9, 3, 4, 6, 7, 1, 2]
    assert NgramDrafter(min_acceptance=0.0).propose(FakeState([row]), 1).draft_tokens.tolist() == [[9]]
    far = NgramDrafter(min_acceptance=0.0, max_lookback=6).propose(FakeState([row]), 1)
    assert far.num_tokens == 0
    holes = NgramDrafter(min_acceptance=0.0, max_lookback=6).propose(FakeState([row], holes={0: [2, 5]}), 1)
    assert holes.num_tokens == 0


def test_learned_length_cuts_weak_matches_and_keeps_strong_ones():
    drafter = NgramDrafter(min_acceptance=0.3)
    strong = [1, 2, 3, 4, 5, 6, 1, 2, 3]  # a 3-gram match
    weak = [7, 8, 9, 5, 10, 11, 12, 9]  # a 1-gram match
    state = FakeState([strong, weak])
    first = drafter.propose(state, 4)
    assert first.num_draft_tokens.tolist() == [4, 4]  # optimistic prior: estimates 0.75, 0.56, 0.42, 0.32
    for _ in range(20):  # the 3-gram row accepts everything, the 1-gram row nothing
        drafter.propose(state, 4)
        drafter.commit(CommitUpdate(accepted_len=torch.tensor([4, 0]), num_columns=state.num_columns))
    estimates = drafter.acceptance_estimates(4)
    assert estimates[3].min() > 0.8 and estimates[1, 0] < 0.3
    assert drafter.propose(state, 4).num_draft_tokens.tolist() == [4, 0]
    drafter.commit(CommitUpdate(accepted_len=torch.tensor([4, 0]), num_columns=state.num_columns))
    # a commit without a proposal before it (a forced re-pack) counts nothing
    before = drafter.verified.copy()
    drafter.commit(CommitUpdate(accepted_len=torch.tensor([0, 0]), num_columns=state.num_columns))
    drafter.commit(CommitUpdate(accepted_len=torch.tensor([0, 0]), num_columns=state.num_columns))
    assert (drafter.verified == before).all()
    drafter.reset()
    assert drafter.propose(state, 4).num_draft_tokens.tolist() == [4, 4]


@pytest.mark.parametrize(
    "kwargs, error, name",
    [
        (dict(max_ngram=0), ValueError, "max_ngram"),
        (dict(max_ngram=2.0), TypeError, "max_ngram"),
        (dict(min_ngram=0), ValueError, "min_ngram"),
        (dict(min_ngram=True), TypeError, "min_ngram"),
        (dict(max_ngram=2, min_ngram=3), ValueError, "min_ngram"),
        (dict(max_lookback=1), ValueError, "max_lookback"),
        (dict(max_lookback="8"), TypeError, "max_lookback"),
        (dict(extend_period=1), TypeError, "extend_period"),
        (dict(min_acceptance=1.0), ValueError, "min_acceptance"),
        (dict(min_acceptance=-0.1), ValueError, "min_acceptance"),
        (dict(min_acceptance="0.2"), TypeError, "min_acceptance"),
        (dict(prior_accepted=0.0), ValueError, "prior_accepted"),
        (dict(prior_rejected=float("nan")), ValueError, "prior_rejected"),
        (dict(occurrence="last"), ValueError, "occurrence"),
        (dict(occurrence=None), ValueError, "occurrence"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, error, name):
    with pytest.raises(error, match=name):
        NgramDrafter(**kwargs)


# ------------------------------------------------------------------ whole generations


def repetitive_prompts(lengths: list[int], vocab: int = 128, seed: int = 0):
    """A left-padded batch whose rows repeat a short random phrase (so n-grams match)."""
    ids, mask = left_padded(lengths, vocab=vocab, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    for r, n in enumerate(lengths):
        phrase = torch.randint(3, vocab, (4,), generator=g)
        ids[r, ids.shape[1] - n:] = phrase.repeat((n + 3) // 4)[:n]
    return ids, mask


def hf_greedy(target, ids, mask, max_new_tokens):
    return target.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                           pad_token_id=PAD)


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2", "gpt_neox"])
def test_greedy_equals_the_targets_greedy_generate(arch):
    target, _ = make_pair(arch)
    for lengths in ([11], [9, 14, 5]):
        ids, mask = repetitive_prompts(lengths, seed=len(lengths))
        want = hf_greedy(target, ids, mask, 24)
        for drafter in (NgramDrafter(), NgramDrafter(max_ngram=2, extend_period=False, min_acceptance=0.0),
                        NgramDrafter(occurrence="first"), NgramDrafter(occurrence="first", num_nodes=8)):
            out = specdecode.generate(target, drafter, ids, mask, num_draft_tokens=4, max_new_tokens=24,
                                      pad_token_id=PAD, draft_schedule="constant")
            assert torch.equal(out.sequences, want)
            assert out.stats.drafter == "ngram" and out.stats.draft_calls == 0
            assert out.stats.accepted_tokens > 0  # the lookups really drafted accepted tokens


def test_through_custom_generate():
    target, _ = make_pair("llama")
    ids, mask = repetitive_prompts([6, 10], seed=4)
    seq = target.generate(ids, attention_mask=mask, custom_generate=specdecode.custom_generate,
                          draft_model=NgramDrafter(), num_draft_tokens=3, max_new_tokens=16, do_sample=False,
                          pad_token_id=PAD)
    assert torch.equal(seq, hf_greedy(target, ids, mask, 16))


# The start of the target's own greedy output (it settles into repeating 3s): most steps find a
# match that the target often accepts.
NGRAM_PROMPT = [6, 3, 1, 1, 2, 3, 3, 3]


class UniformClaimingNgram(NgramDrafter):
    """Broken: the n-gram proposal verified as if it had been drawn from a uniform q."""

    def propose(self, state, num_tokens):
        proposal = super().propose(state, num_tokens)
        b, k = proposal.draft_tokens.shape
        proposal.draft_logits = torch.zeros((b, k, state.vocab_size), device=state.device)
        return proposal


def _verify_as_if_q_were_p(monkeypatch):
    """Broken engine: a deterministic proposal verified with the target's own p as q (every
    draft accepted with probability 1)."""
    import specdecode.engine.loop as engine_loop

    original = engine_loop.SpeculativeEngine._verify

    def verify(self, target_logits, proposal, remaining):
        if proposal is not None and proposal.num_tokens and proposal.draft_logits is None:
            proposal.draft_logits = target_logits[:, : proposal.num_tokens].clone()
        return original(self, target_logits, proposal, remaining)

    monkeypatch.setattr(engine_loop.SpeculativeEngine, "_verify", verify)


def sample(target, drafter, rule, n=20000, seed=3):
    ids = torch.tensor([NGRAM_PROMPT]).expand(n, -1)
    return specdecode.generate(target, drafter, ids, num_draft_tokens=2, rule=rule, do_sample=True,
                               max_new_tokens=K, eos_token_id=[], pad_token_id=PAD,
                               generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def ngram_joint(sampling_pair):
    return exact_joint(sampling_pair[0], NGRAM_PROMPT)


@pytest.mark.parametrize("rule", ["token", "block"])
def test_sampling_is_lossless(sampling_pair, ngram_joint, rule):
    target, _ = sampling_pair
    out = sample(target, NgramDrafter(), rule)
    assert 0.05 < out.stats.acceptance_rate < 0.95 and out.stats.drafted_tokens > 5000
    assert chi_square_p(out.sequences[:, len(NGRAM_PROMPT):], ngram_joint) > PASS_P


@pytest.mark.parametrize("rule", ["token", "block"])
def test_broken_verifications_of_the_same_proposals_fail(sampling_pair, ngram_joint, rule, monkeypatch):
    target, _ = sampling_pair
    n = 4000  # the shifts are large: fewer samples than the lossless test already reject them
    broken = sample(target, UniformClaimingNgram(min_acceptance=0.0), rule, n=n)
    assert chi_square_p(broken.sequences[:, len(NGRAM_PROMPT):], ngram_joint) < FAIL_P
    _verify_as_if_q_were_p(monkeypatch)
    broken = sample(target, NgramDrafter(min_acceptance=0.0), rule, n=n)
    assert chi_square_p(broken.sequences[:, len(NGRAM_PROMPT):], ngram_joint) < FAIL_P


@pytest.mark.cuda
def test_drafter_on_cuda_proposes_what_it_proposes_on_cpu():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    rows = [[1, 2, 9, 1, 2], [5, 6, 7], [3, 4, 3]]
    cpu = NgramDrafter(min_acceptance=0.0).propose(FakeState(rows), 4)
    state = FakeState(rows)
    state.tokens, state.attention_mask, state.device = state.tokens.cuda(), state.attention_mask.cuda(), torch.device("cuda")
    gpu = NgramDrafter(min_acceptance=0.0).propose(state, 4)
    assert gpu.draft_tokens.device.type == "cuda" and gpu.num_draft_tokens.device.type == "cuda"
    assert torch.equal(gpu.draft_tokens.cpu(), cpu.draft_tokens)
    assert torch.equal(gpu.num_draft_tokens.cpu(), cpu.num_draft_tokens)
