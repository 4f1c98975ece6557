"""The static decode path (``decode_path="static"``, :mod:`specdecode.engine.static_loop`) on
the CPU: the same step functions that ``decode_path="graphed"`` records as CUDA graphs, run
eagerly.

- greedy output equals the target's own greedy ``generate`` token for token (seven
  architectures, batch 1 and left-padded batches, three rules, several gammas, the target alone);
- EOS inside an accepted block, ``max_new_tokens`` reached mid-block, rows finishing at
  different steps, layouts reused across calls, ``stop_check_every``;
- host synchronisations counted as documented, on this path and on the eager one;
- the whole-loop sampling distribution (the exact enumeration of tests/test_generate_sampling.py)
  for the token and block rules, with left padding and filters, and three broken variants of
  the static step that the same test rejects;
- everything the static path refuses, with the argument named.
"""

from __future__ import annotations

import math

import pytest
import torch
from test_generate_models import PAD, _one_thread, left_padded, make_model, make_pair  # noqa: F401
from test_generate_sampling import K, PROMPT, V, chi_square_p, exact_joint

import specdecode.engine.attention_widths as attention_widths
import specdecode.engine.static_layouts as static_layouts
import specdecode.engine.static_loop as static_loop
import specdecode.engine.static_state as static_state
import specdecode.engine.step_phases as step_phases
import specdecode.models.static_cache as static_cache
from specdecode import LayerSkipDrafter, generate
from specdecode.drafters import DrafterBase
from specdecode.models.static_cache import ColumnCache, column_inputs

MAX_NEW = 20
ARCHS = ["llama", "gpt2", "qwen2", "opt", "gpt_neox", "gemma", "phi"]
PASS_P, FAIL_P = 1e-4, 1e-6


def hf_greedy(target, ids, mask=None, **kwargs):
    kwargs.setdefault("max_new_tokens", MAX_NEW)
    kwargs.setdefault("pad_token_id", PAD)
    return target.generate(ids, attention_mask=mask, do_sample=False, **kwargs)


def static(target, draft, ids, mask=None, **kwargs):
    kwargs.setdefault("max_new_tokens", MAX_NEW)
    kwargs.setdefault("pad_token_id", PAD)
    kwargs.setdefault("decode_path", "static")
    return generate(target, draft, ids, mask, **kwargs)


@pytest.fixture(autouse=True)
def _fresh_sessions():
    static_loop.clear_static_sessions()
    yield
    static_loop.clear_static_sessions()


# ------------------------------------------------------------------------ the cache itself


def test_column_cache_writes_per_row_columns_and_masks_the_rest():
    cache = ColumnCache(6)
    start = torch.tensor([0, 2])
    first = torch.tensor([1, 3])
    columns, positions, mask = column_inputs(first, start, 2, 6, torch.float32)
    assert columns.tolist() == [[1, 2], [3, 4]] and positions.tolist() == [[1, 2], [1, 2]]
    allowed = (mask[:, 0] == 0).int().tolist()
    assert allowed[0] == [[1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0]]
    assert allowed[1] == [[0, 0, 1, 1, 0, 0], [0, 0, 1, 1, 1, 0]]
    cache.columns = columns
    k = torch.arange(2 * 1 * 2 * 3, dtype=torch.float32).view(2, 1, 2, 3) + 1
    keys, values = cache.update(k, -k, 0)
    assert keys.shape == (2, 1, 6, 3) and cache.nbytes() == 2 * keys.numel() * 4
    assert torch.equal(keys[0, 0, 1:3], k[0, 0]) and torch.equal(keys[1, 0, 3:5], k[1, 0])
    assert keys[0, 0, 3:].abs().sum() == 0 and torch.equal(values, -keys)
    # a padding query (column before start) sees only itself
    _, positions, mask = column_inputs(torch.tensor([0, 0]), start, 3, 6, torch.float32)
    assert (mask[1, 0, 0] == 0).int().tolist() == [1, 0, 0, 0, 0, 0] and positions[1].tolist() == [0, 0, 0]
    with pytest.raises(RuntimeError, match="length"):
        cache.crop(1)


@pytest.mark.parametrize("contiguous", [True, False])
def test_column_cache_writes_equal_a_scatter(contiguous):
    """Several heads and rows, odd sizes: the rows copied (contiguous layers) or scattered (not)
    land where a plain scatter over the columns puts them, new values taken from strided inputs."""
    torch.manual_seed(0)
    B, H, n, D, capacity = 3, 5, 4, 7, 11
    cache = ColumnCache(capacity)
    cache.columns = torch.stack([torch.randperm(capacity)[:n] for _ in range(B)])
    k = torch.randn(B, n, H, D).transpose(1, 2)  # [B, H, n, D] with a projection's strides
    v = torch.randn(B, n, H, D).transpose(1, 2)
    if not contiguous:
        cache.keys = [torch.zeros(B, capacity, H, D).transpose(1, 2)]
        cache.values = [torch.zeros(B, capacity, H, D).transpose(1, 2)]
    keys, values = cache.update(k, v, 0)
    index = cache.columns[:, None, :, None].expand(B, H, n, D)
    assert keys.is_contiguous() == contiguous
    assert torch.equal(keys, torch.zeros(B, H, capacity, D).scatter_(2, index, k))
    assert torch.equal(values, torch.zeros(B, H, capacity, D).scatter_(2, index, v))


# ------------------------------------------------------------------------ greedy exactness


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_equals_target_generate(arch):
    target, draft = make_pair(arch)
    ids, mask = left_padded([5, 9, 2, 7], seed=1)
    one = ids[1:2]
    ref1 = hf_greedy(target, one)
    accepted = rejected = 0
    for rule, gamma in (("greedy", 1), ("token", 3), ("block", 6)):
        out = static(target, draft, one, num_draft_tokens=gamma, rule=rule)
        assert torch.equal(out.sequences, ref1), (arch, rule, gamma)
        assert out.stats.decode_path == "static"
        accepted += out.stats.accepted_tokens
        rejected += out.stats.rejections
    assert accepted > 0 and rejected > 0  # both paths exercised
    assert torch.equal(static(target, None, one).sequences, ref1)  # the target alone on the same path

    ref4 = hf_greedy(target, ids, mask)
    for rule, gamma in (("token", 4), ("block", 2)):
        out = static(target, draft, ids, mask, num_draft_tokens=gamma, rule=rule)
        assert torch.equal(out.sequences, ref4), (arch, rule, gamma)
    assert torch.equal(static(target, None, ids, mask).sequences, ref4)


def _record_key_lengths(monkeypatch, num_columns: int) -> list[int]:
    """Record the key length of every forward (layer 0) that feeds ``num_columns`` columns: the
    target's steps (the draft model feeds fewer, the prefill more)."""
    lengths, original = [], ColumnCache.update

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        keys, values = original(self, key_states, value_states, layer_idx, *args, **kwargs)
        if layer_idx == 0 and key_states.shape[2] == num_columns:
            lengths.append(keys.shape[2])
        return keys, values

    monkeypatch.setattr(ColumnCache, "update", update)
    return lengths


@pytest.mark.parametrize("gamma", [0, 3])
def test_static_steps_attend_only_to_reachable_columns(gamma, monkeypatch):
    """A chain step reads the columns a row can have reached (a step moves a row by at most
    gamma + 1), not the whole capacity; the output stays the target's greedy output, and with a
    broken bound (one column short; one that forgets the steps taken) it does not."""
    target, draft = make_pair("llama")
    ids, mask = left_padded([5, 9, 2, 7], seed=1)
    ref = hf_greedy(target, ids, mask)
    monkeypatch.setattr(attention_widths, "BUCKET_COLUMNS", 1)  # buckets of one column: the bound itself
    monkeypatch.setattr(attention_widths, "MAX_BUCKETS", 10 ** 6)  # (tests/test_static_buckets.py: real ones)
    steps = _record_key_lengths(monkeypatch, gamma + 1)
    out = static(target, draft if gamma else None, ids, mask, num_draft_tokens=max(gamma, 1))
    assert torch.equal(out.sequences, ref)
    assert steps[0] == ids.shape[1] + 1 + gamma  # the prompt (and its leading pad column), then gamma drafts
    assert all(b - a == gamma + 1 or b == max(steps) for a, b in zip(steps, steps[1:]))  # until the capacity
    assert steps[0] < max(steps)
    original = attention_widths.visible_columns
    if gamma == 0:  # the target alone moves every row by exactly one column a step: the bound is tight
        monkeypatch.setattr(attention_widths, "visible_columns", lambda *args: original(*args) - 1)  # one short
    else:  # a bound that forgets the steps taken
        monkeypatch.setattr(attention_widths, "visible_columns", lambda width, step, g, cap: original(width, 0, g, cap))
    assert not torch.equal(static(target, draft if gamma else None, ids, mask,
                                  num_draft_tokens=max(gamma, 1)).sequences, ref)


def test_greedy_one_token_prompt_and_draft_equal_to_target():
    target, draft = make_pair("llama")
    ids = left_padded([1], seed=2)[0]
    assert torch.equal(static(target, draft, ids, num_draft_tokens=3).sequences, hf_greedy(target, ids))
    ids, mask = left_padded([4, 1, 6], seed=2)
    out = static(target, target, ids, mask, num_draft_tokens=6, rule="block")
    assert torch.equal(out.sequences, hf_greedy(target, ids, mask))
    assert out.stats.rejections == 0 and out.stats.acceptance_rate == 1.0


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_layer_skip_drafter_on_the_static_path(arch):
    target = make_model(arch, layers=3, init=0.05)
    ids, mask = left_padded([5, 8, 3], seed=12)
    out = static(target, LayerSkipDrafter(target, layers=[0, 2]), ids, mask, num_draft_tokens=3)
    assert torch.equal(out.sequences, hf_greedy(target, ids, mask))
    assert out.stats.accepted_tokens > 0


def test_eos_in_the_middle_of_an_accepted_block():
    target, _ = make_pair("llama")
    ids = left_padded([6], seed=5)[0]
    free = static(target, target, ids, eos_token_id=[], max_new_tokens=12).sequences[0, 6:].tolist()
    k = next(i for i in range(2, 8) if free[i] not in free[:i])
    eos = free[k]
    out = static(target, target, ids, eos_token_id=eos, num_draft_tokens=8, max_new_tokens=12)
    assert out.sequences[0, 6:].tolist() == free[: k + 1]
    assert torch.equal(out.sequences, hf_greedy(target, ids, eos_token_id=eos, max_new_tokens=12))
    assert out.stats.steps == 1 and out.stats.accepted_tokens == 8 and out.stats.new_tokens == k + 1


def test_max_new_tokens_reached_mid_block():
    target, draft = make_pair("qwen2")
    ids, mask = left_padded([4, 7, 2], seed=6)
    for max_new in (1, 2, 7):
        out = static(target, target, ids, mask, num_draft_tokens=5, max_new_tokens=max_new)
        assert torch.equal(out.sequences, hf_greedy(target, ids, mask, max_new_tokens=max_new))
        assert out.stats.new_tokens == 3 * max_new
        out = static(target, draft, ids, mask, num_draft_tokens=5, eos_token_id=[], max_new_tokens=max_new)
        assert out.sequences.shape == (3, 7 + max_new)


def test_rows_finish_at_different_steps_and_layouts_are_reused():
    target, draft = make_pair("llama")
    ids, mask = left_padded([5, 8, 3, 6], seed=7)
    free = static(target, draft, ids, mask, eos_token_id=[], max_new_tokens=24).sequences[:, 8:].tolist()
    eos = [next(t for t in row[k:] if t not in row[:k]) for row, k in zip(free[:3], (2, 8, 15))]
    out = static(target, draft, ids, mask, num_draft_tokens=3, eos_token_id=eos, max_new_tokens=24)
    assert torch.equal(out.sequences, hf_greedy(target, ids, mask, eos_token_id=eos, max_new_tokens=24))
    lengths = []
    for row in out.sequences[:, 8:].tolist():
        stop = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        assert all(t == PAD for t in row[stop:])
        lengths.append(stop)
    assert len(set(lengths)) >= 3 and out.stats.row_steps < 4 * out.stats.steps
    # Same shapes again (other prompts of another length in the same capacity bucket): the
    # layout is reused, and the state is fully reset.
    assert len(static_layouts.kept_layouts(target)) == 2  # eos=[] and eos=... are two layouts
    ids2, mask2 = left_padded([7, 2, 9, 4], seed=8)
    out2 = static(target, draft, ids2, mask2, num_draft_tokens=3, eos_token_id=eos, max_new_tokens=24)
    assert len(static_layouts.kept_layouts(target)) == 2
    assert torch.equal(out2.sequences, hf_greedy(target, ids2, mask2, eos_token_id=eos, max_new_tokens=24))
    out3 = static(target, draft, ids, mask, num_draft_tokens=3, eos_token_id=eos, max_new_tokens=24)
    assert torch.equal(out3.sequences, out.sequences)


# ------------------------------------------------------------------------ host synchronisations


def test_static_path_syncs_once_per_checked_step():
    target, draft = make_pair("llama")
    ids, mask = left_padded([5, 8, 3], seed=12)
    out = static(target, draft, ids, mask, num_draft_tokens=4, eos_token_id=[], max_new_tokens=16)
    s = out.stats
    assert s.new_tokens == 3 * 16 and s.target_calls == s.steps + 1
    assert sum(s.position_accepted) == s.accepted_tokens and sum(s.position_drafted) == s.drafted_tokens
    # the loop stops when the check after the last step sees every row finished
    assert s.decode_steps_run == s.steps and s.step_host_syncs == s.steps
    assert s.host_syncs == s.step_host_syncs + 2  # + the padding check and the final read of the results
    assert s.host_syncs_per_step == 1.0
    assert s.draft_time > 0 and s.target_time > 0 and s.verify_time > 0 and s.bookkeeping_time > 0
    assert "static path" in str(s) and "host syncs" in str(s)

    for every in (3, 100):
        out = static(target, draft, ids, mask, num_draft_tokens=4, eos_token_id=[], max_new_tokens=16,
                     stop_check_every=every)
        assert torch.equal(out.sequences[:, :8 + 16], hf_greedy(target, ids, mask, max_new_tokens=16,
                                                                  eos_token_id=None))
        t = out.stats
        checks = t.decode_steps_run // every if t.decode_steps_run < 16 else (16 - 1) // every
        assert t.step_host_syncs == checks and t.steps == s.steps
        assert t.steps <= t.decode_steps_run < t.steps + every  # masked extra steps, fewer than one period
    assert t.step_host_syncs == 0 and t.decode_steps_run == 16  # every >= max_new_tokens: no check at all


def test_eager_path_counts_its_syncs():
    """Batch 1 with a draft equal to the target (every draft accepted): per step the eager loop
    reads the remaining budget, the step's results, and whether the kept columns left a hole
    (not in the last step, which ends before rolling back); plus the padding check before and
    the output length after."""
    target, _ = make_pair("llama")
    ids = left_padded([6], seed=3)[0]
    out = generate(target, target, ids, num_draft_tokens=3, eos_token_id=[], max_new_tokens=12, pad_token_id=PAD,
                   draft_schedule="constant")
    s = out.stats
    assert s.decode_path == "eager" and s.rejections == 0
    assert s.steps >= 3 and s.step_host_syncs == 3 * s.steps - 1 and s.host_syncs == s.step_host_syncs + 2
    static_out = static(target, target, ids, num_draft_tokens=3, eos_token_id=[], max_new_tokens=12)
    assert torch.equal(static_out.sequences, out.sequences)
    assert static_out.stats.host_syncs_per_step == 1.0 < s.host_syncs_per_step


# ------------------------------------------------------------------------ sampling exactness

N = 20000


@pytest.fixture(scope="module")
def pair():
    """The V = 8 pair of tests/test_generate_sampling.py, with as many key/value heads as query
    heads: Hugging Face's SDPA path copies grouped keys/values for every query head whenever a
    mask is passed, which the static path always does, over its whole capacity."""
    target, draft = make_pair("llama", vocab=V, init=0.3, seed=1, num_key_value_heads=4)
    for model in (target, draft):
        model.config.eos_token_id = None
        model.generation_config.eos_token_id = None
    return target, draft


def sample_static(target, draft, rule, seed=0, n=N, **kwargs):
    ids = torch.tensor([PROMPT]).expand(n, -1)
    out = generate(target, draft, ids, num_draft_tokens=2, rule=rule, do_sample=True, max_new_tokens=K,
                   eos_token_id=[], pad_token_id=PAD, generator=torch.Generator().manual_seed(seed),
                   decode_path="static", **kwargs)
    assert out.sequences.shape == (n, len(PROMPT) + K)
    return out


@pytest.mark.parametrize("rule", ["token", "block"])
def test_static_sampling_is_lossless(pair, rule):
    target, draft = pair
    out = sample_static(target, draft, rule)
    assert 0.2 < out.stats.acceptance_rate < 0.9
    assert chi_square_p(out.sequences[:, len(PROMPT):], exact_joint(target, PROMPT)) > PASS_P


def test_static_sampling_with_filters_and_left_padding_is_lossless(pair):
    target, draft = pair
    short = [6, 4]
    n = N // 2
    ids = torch.tensor([PROMPT, [PAD, PAD] + short]).repeat(n, 1)
    mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]]).repeat(n, 1)
    out = generate(target, draft, ids, mask, num_draft_tokens=2, rule="block", do_sample=True, temperature=0.8,
                   top_k=6, top_p=0.9, max_new_tokens=K, eos_token_id=[], pad_token_id=PAD,
                   generator=torch.Generator().manual_seed(1), decode_path="static")
    new = out.sequences[:, 4:]
    assert chi_square_p(new[0::2], exact_joint(target, PROMPT, temperature=0.8, top_k=6, top_p=0.9)) > PASS_P
    assert chi_square_p(new[1::2], exact_joint(target, short, temperature=0.8, top_k=6, top_p=0.9)) > PASS_P


def test_static_sampling_is_seeded():
    target, draft = make_pair("llama")
    ids, mask = left_padded([5, 8, 3], seed=13)
    runs = [static(target, draft, ids, mask, do_sample=True, temperature=0.9, num_draft_tokens=3,
                   generator=torch.Generator().manual_seed(seed)).sequences for seed in (7, 7, 8)]
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], runs[2])


def _break_coin_reuse(monkeypatch):
    """Broken: the sampler never advances the Philox offset, so drafts and verification share coins."""

    def sample(self, logits):
        return static_state.ops.sample_logits_philox(logits, self.philox_seed, self.philox_offset,
                                                     *self.sampling.op_args())

    monkeypatch.setattr(static_state.StaticState, "sample", sample)


def _break_stale_columns(monkeypatch):
    """Broken: queries also see the columns after their own (stale rejected drafts, later drafts)."""
    original = static_cache.column_inputs

    def leaky(first, start, num_columns, capacity, dtype):
        columns, positions, mask = original(first, start, num_columns, capacity, dtype)
        keys = torch.arange(capacity)[None, None, None, :]
        visible = (keys >= start[:, None, None, None]) & (keys <= columns[:, None, :, None] + 2)
        return columns, positions, mask.masked_fill(visible, 0.0)

    monkeypatch.setattr(static_cache, "column_inputs", leaky)


def _break_bonus_position(monkeypatch):
    """Broken: the bonus token is drawn from p_gamma instead of p_{gamma+1}."""
    original = step_phases.verify_logits

    def shifted(target_logits, *args, **kwargs):
        return original(torch.cat([target_logits[:, :-1], target_logits[:, -2:-1]], 1), *args, **kwargs)

    monkeypatch.setattr(step_phases, "verify_logits", shifted)


@pytest.mark.parametrize("broken", ["coin_reuse", "stale_columns", "bonus_position"])
def test_broken_static_steps_fail_the_same_test(pair, broken, monkeypatch):
    target, draft = pair
    joint = exact_joint(target, PROMPT)
    {"coin_reuse": _break_coin_reuse, "stale_columns": _break_stale_columns,
     "bonus_position": _break_bonus_position}[broken](monkeypatch)
    out = sample_static(target, draft, "token", n=6000)  # each broken variant gives p = 0.0 already at 8000
    assert chi_square_p(out.sequences[:, len(PROMPT):], joint) < FAIL_P


# ------------------------------------------------------------------------ what the path refuses


def test_refusals_name_the_argument():
    from transformers import LogitsProcessorList, RepetitionPenaltyLogitsProcessor

    target, draft = make_pair("llama")
    ids, mask = left_padded([5, 3], seed=14)
    cases = [
        (dict(decode_path="fast"), ValueError, "decode_path"),
        (dict(decode_path="graphed"), ValueError, "CUDA device"),
        (dict(logits_processor=LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.2)])), ValueError,
         "logits_processor"),
        (dict(streamer=object()), ValueError, "streamer"),
        (dict(draft_schedule="heuristic"), ValueError, "draft_schedule"),
        (dict(tree="static", num_nodes=4, rule="block"), ValueError, "rule: 'block' is a chain rule"),  # trees: test_static_trees.py
        (dict(rule="typical", do_sample=True), None, None),  # a compiled lossy rule runs
        (dict(stop_check_every=0), ValueError, "stop_check_every"),
    ]
    for kwargs, error, match in cases:
        if error is None:
            static(target, draft, ids, mask, **kwargs)
            continue
        with pytest.raises(error, match=match):
            static(target, draft, ids, mask, **kwargs)
    with pytest.raises(ValueError, match="draft: None"):
        generate(target, None, ids, mask, max_new_tokens=4, pad_token_id=PAD)

    class RepeatDrafter(DrafterBase):  # an eager-only drafter
        def propose(self, state, num_tokens):
            raise AssertionError("never called")

    with pytest.raises(ValueError, match="draft: RepeatDrafter"):
        static(target, RepeatDrafter(), ids, mask)
    gaps = mask.clone()
    gaps[1, 2:] = torch.tensor([1, 0, 1])
    with pytest.raises(ValueError, match="left padding"):
        static(target, draft, ids, gaps)

    def reject_all(target_probs, draft_probs, draft_tokens, *, num_draft_tokens, uniforms):
        raise AssertionError("never called")

    import specdecode.rules as rules

    rules.register_rule("_static_python_rule", reject_all, lossless=False, needs_draft_probs=False, overwrite=True)
    try:
        with pytest.raises(ValueError, match="Python rule"):
            static(target, draft, ids, mask, rule="_static_python_rule")
    finally:
        rules.unregister_rule("_static_python_rule")


def test_capacity_is_bucketed():
    assert static_loop.CAPACITY_MULTIPLE >= 1
    target, draft = make_pair("llama")
    ids = left_padded([6], seed=3)[0]
    static(target, draft, ids, num_draft_tokens=2, max_new_tokens=5)
    (session,) = static_layouts.kept_layouts(target)
    needed = 6 + 1 + 5 + 2
    assert session.state.capacity == math.ceil(needed / static_loop.CAPACITY_MULTIPLE) * static_loop.CAPACITY_MULTIPLE
