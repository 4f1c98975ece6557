"""Speculative generation: greedy output equals the target's own greedy ``generate`` token for
token (five+ architectures, batch 1 and left-padded batch 4, both entry points), and the
behaviour around EOS, length limits, stopping criteria, streaming, processors, schedules,
vocabulary padding and statistics."""

from __future__ import annotations

import pytest
import torch
from test_generate_models import ARCHS, PAD, _one_thread, left_padded, make_pair  # noqa: F401

import specdecode.engine.batch as batch_layout
from specdecode import custom_generate, generate
from specdecode.engine import SpeculativeStats
from specdecode.models import facts

MAX_NEW = 20


def hf_greedy(target, ids, mask=None, **kwargs):
    kwargs.setdefault("max_new_tokens", MAX_NEW)
    kwargs.setdefault("pad_token_id", PAD)
    return target.generate(ids, attention_mask=mask, do_sample=False, **kwargs)


def ours(target, draft, ids, mask=None, **kwargs):
    kwargs.setdefault("max_new_tokens", MAX_NEW)
    kwargs.setdefault("pad_token_id", PAD)
    return generate(target, draft, ids, mask, **kwargs)


def plugin(target, draft, ids, mask=None, **kwargs):
    kwargs.setdefault("max_new_tokens", MAX_NEW)
    kwargs.setdefault("pad_token_id", PAD)
    return target.generate(ids, attention_mask=mask, custom_generate=custom_generate, draft_model=draft, **kwargs)


def new_tokens_of(seq: torch.Tensor, prompt_len: int) -> list[list[int]]:
    return [[t for t in row[prompt_len:].tolist()] for row in seq]


# ------------------------------------------------------------------------ greedy exactness


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_equals_target_generate(arch):
    target, draft = make_pair(arch)
    ids, mask = left_padded([5, 9, 2, 7], seed=1)
    one = ids[1:2]
    ref1 = hf_greedy(target, one)
    accepted = rejected = 0
    for rule in ("greedy", "token", "block"):
        for gamma in (1, 3, 6):
            out = ours(target, draft, one, num_draft_tokens=gamma, rule=rule)
            assert torch.equal(out.sequences, ref1), (arch, rule, gamma)
            accepted += out.stats.accepted_tokens
            rejected += out.stats.rejections
    assert accepted > 0 and rejected > 0  # the pair exercises both paths

    ref4 = hf_greedy(target, ids, mask)
    for rule, gamma in (("greedy", 2), ("token", 4), ("block", 5)):
        out = ours(target, draft, ids, mask, num_draft_tokens=gamma, rule=rule)
        assert torch.equal(out.sequences, ref4), (arch, rule, gamma)

    assert torch.equal(plugin(target, draft, ids, mask, num_draft_tokens=3, rule="block", do_sample=False), ref4)
    assert torch.equal(plugin(target, draft, one, num_draft_tokens=2, rule="token", do_sample=False), ref1)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_greedy_draft_equal_to_target_accepts_everything(arch):
    target, _ = make_pair(arch)
    ids, mask = left_padded([4, 8, 6], seed=2)
    out = ours(target, target, ids, mask, num_draft_tokens=6, rule="block")
    assert torch.equal(out.sequences, hf_greedy(target, ids, mask))
    assert out.stats.rejections == 0 and out.stats.acceptance_rate == 1.0


@pytest.mark.parametrize("arch", ["llama", "opt"])
def test_greedy_with_repacking_every_step(arch, monkeypatch):
    monkeypatch.setattr(batch_layout, "REPACK_MIN_WASTE", 1)
    monkeypatch.setattr(batch_layout, "REPACK_MIN_FRACTION", 0.0)
    target, draft = make_pair(arch)
    ids, mask = left_padded([3, 9, 5, 1, 7], seed=3)
    out = ours(target, draft, ids, mask, num_draft_tokens=4, rule="token", max_new_tokens=24)
    assert torch.equal(out.sequences, hf_greedy(target, ids, mask, max_new_tokens=24))
    assert out.stats.repacks > 0


@pytest.mark.parametrize("schedule", ["heuristic", "optimal"])
def test_greedy_with_draft_schedules(schedule):
    target, draft = make_pair("llama")
    ids, mask = left_padded([6, 3], seed=4)
    out = ours(target, draft, ids, mask, num_draft_tokens=2, draft_schedule=schedule, max_num_draft_tokens=7,
               max_new_tokens=30)
    assert torch.equal(out.sequences, hf_greedy(target, ids, mask, max_new_tokens=30))
    history = out.stats.num_draft_tokens_history
    assert all(1 <= g <= 7 for g in history[:-1])
    if schedule == "heuristic":
        assert len(set(history)) > 1


def test_heuristic_schedule_rule():
    from specdecode.engine.schedules import HeuristicSchedule

    s = HeuristicSchedule(3, max_num_draft_tokens=6)
    stats = SpeculativeStats()
    full, partial = torch.tensor([3]), torch.tensor([1])
    s.update(num_draft_tokens=3, drafted=torch.tensor([3]), accepted=full, stats=stats)
    assert s.num_draft_tokens() == 5
    s.update(num_draft_tokens=5, drafted=torch.tensor([5]), accepted=torch.tensor([5]), stats=stats)
    assert s.num_draft_tokens() == 6  # bounded
    for _ in range(10):
        s.update(num_draft_tokens=6, drafted=torch.tensor([6]), accepted=partial, stats=stats)
    assert s.num_draft_tokens() == 1


def test_optimal_schedule_uses_leviathan_formula():
    from specdecode.analysis import optimal_num_draft_tokens
    from specdecode.engine.schedules import OptimalSchedule

    s = OptimalSchedule(4, max_num_draft_tokens=20)
    stats = SpeculativeStats(accepted_tokens=798, rejections=200, draft_calls=101, draft_time=1.0 + 0.5,
                             draft_prefill_time=0.5, target_calls=21, target_prefill_calls=1, target_time=2.0)
    s.update(num_draft_tokens=4, drafted=torch.tensor([4]), accepted=torch.tensor([4]), stats=stats)
    alpha = (798 + 1) / (798 + 200 + 2)
    assert s.num_draft_tokens() == optimal_num_draft_tokens(alpha, (1.0 / 100) / (2.0 / 20), 20)


# ---------------------------------------------------------------- EOS, lengths, stopping


def test_eos_in_the_middle_of_an_accepted_block():
    target, _ = make_pair("llama")
    ids = left_padded([6], seed=5)[0]
    free = ours(target, target, ids, eos_token_id=[], max_new_tokens=12).sequences[0, 6:].tolist()
    k = next(i for i in range(2, 8) if free[i] not in free[:i])  # an EOS strictly inside the block
    eos = free[k]
    out = ours(target, target, ids, eos_token_id=eos, num_draft_tokens=8, max_new_tokens=12)
    assert out.sequences[0, 6:].tolist() == free[: k + 1]
    assert torch.equal(out.sequences, hf_greedy(target, ids, eos_token_id=eos, max_new_tokens=12))
    # one step drafted past the EOS and accepted it mid-block; the tokens after it are dropped
    assert out.stats.steps == 1 and out.stats.accepted_tokens == 8 and out.stats.new_tokens == k + 1


def test_max_new_tokens_reached_mid_block():
    target, draft = make_pair("qwen2")
    ids, mask = left_padded([4, 7, 2], seed=6)
    for max_new in (1, 2, 7):
        out = ours(target, target, ids, mask, num_draft_tokens=5, max_new_tokens=max_new)
        assert out.sequences.shape == (3, 7 + max_new)
        assert torch.equal(out.sequences, hf_greedy(target, ids, mask, max_new_tokens=max_new))
        assert out.stats.new_tokens == 3 * max_new
        out = ours(target, draft, ids, mask, num_draft_tokens=5, eos_token_id=[], max_new_tokens=max_new)
        assert out.sequences.shape == (3, 7 + max_new)


def test_rows_finish_at_different_steps_and_stop_costing_draft_work():
    target, draft = make_pair("llama")
    ids, mask = left_padded([5, 8, 3, 6], seed=7)
    free = new_tokens_of(ours(target, draft, ids, mask, eos_token_id=[], max_new_tokens=24).sequences, 8)
    eos = []
    for row, k in zip(free[:3], (2, 8, 15)):
        eos.append(next(t for t in row[k:] if t not in row[:k]))
    batch_sizes = []
    hook = draft.register_forward_pre_hook(lambda m, args, kw: batch_sizes.append(kw["input_ids"].shape[0]),
                                           with_kwargs=True)
    try:
        out = ours(target, draft, ids, mask, num_draft_tokens=3, eos_token_id=eos, max_new_tokens=24)
    finally:
        hook.remove()
    ref = hf_greedy(target, ids, mask, eos_token_id=eos, max_new_tokens=24)
    assert torch.equal(out.sequences, ref)
    lengths = []
    for row in new_tokens_of(out.sequences, 8):
        stop = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        assert all(t == PAD for t in row[stop:])
        lengths.append(stop)
    assert len(set(lengths)) >= 3  # rows really finished at different steps
    assert batch_sizes[0] == 4 and batch_sizes[-1] < 4  # finished rows left the draft batch
    assert out.stats.row_steps < 4 * out.stats.steps


def test_stopping_criteria_per_row_like_generate():
    from transformers import StoppingCriteria, StoppingCriteriaList

    target, draft = make_pair("gpt2")
    ids, mask = left_padded([5, 8, 3], seed=8)
    free = new_tokens_of(ours(target, draft, ids, mask, eos_token_id=[], max_new_tokens=20).sequences, 8)
    stop_ids = {free[0][3], free[1][9]}

    class StopOn(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.isin(input_ids[:, -1], torch.tensor(sorted(stop_ids)))

    out = ours(target, draft, ids, mask, num_draft_tokens=4, stopping_criteria=StoppingCriteriaList([StopOn()]))
    ref = hf_greedy(target, ids, mask, stopping_criteria=StoppingCriteriaList([StopOn()]))
    assert torch.equal(out.sequences, ref)
    via_plugin = plugin(target, draft, ids, mask, num_draft_tokens=4, do_sample=False,
                        stopping_criteria=StoppingCriteriaList([StopOn()]))
    assert torch.equal(via_plugin, ref)


def test_logits_processors_are_applied_like_generate():
    from transformers import LogitsProcessorList, RepetitionPenaltyLogitsProcessor

    target, draft = make_pair("llama")
    ids, mask = left_padded([5, 8, 3, 6], seed=9)
    ref = hf_greedy(target, ids, mask, repetition_penalty=1.8, no_repeat_ngram_size=2, min_new_tokens=3)
    via_plugin = plugin(target, draft, ids, mask, num_draft_tokens=3, rule="block", do_sample=False,
                        repetition_penalty=1.8, no_repeat_ngram_size=2, min_new_tokens=3)
    assert torch.equal(via_plugin, ref)
    ref1 = hf_greedy(target, ids, mask, repetition_penalty=1.8)
    out = ours(target, draft, ids, mask, num_draft_tokens=3,
               logits_processor=LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.8)]))
    assert torch.equal(out.sequences, ref1)
    assert not torch.equal(ref1, hf_greedy(target, ids, mask))  # the penalty mattered


# ------------------------------------------------------------------ streamer and outputs


class Recorder:
    def __init__(self):
        self.puts, self.ends = [], 0

    def put(self, value):
        self.puts.append(value.clone())

    def end(self):
        self.ends += 1


@pytest.mark.parametrize("do_sample", [False, True])
def test_streamer_receives_exactly_the_generated_tokens(do_sample):
    target, draft = make_pair("llama")
    ids = left_padded([6], seed=10)[0]
    rec = Recorder()
    out = ours(target, draft, ids, num_draft_tokens=4, streamer=rec, do_sample=do_sample, max_new_tokens=15,
               generator=torch.Generator().manual_seed(0))
    assert rec.ends == 1
    assert torch.equal(rec.puts[0].reshape(1, -1), ids)  # the prompt first, as generate does
    streamed = torch.cat([p.reshape(-1) for p in rec.puts[1:]])
    assert streamed.tolist() == out.sequences[0, 6:].tolist()
    assert all(p.numel() >= 1 for p in rec.puts[1:]) and len(rec.puts) - 1 == out.stats.steps

    rec2 = Recorder()
    seq = plugin(target, draft, ids, num_draft_tokens=4, do_sample=False, max_new_tokens=15,
                 speculative_streamer=rec2)
    assert rec2.ends == 1 and torch.cat([p.reshape(-1) for p in rec2.puts[1:]]).tolist() == seq[0, 6:].tolist()


def test_plugin_return_dict_carries_stats():
    target, draft = make_pair("llama")
    ids, mask = left_padded([5, 3], seed=11)
    res = plugin(target, draft, ids, mask, num_draft_tokens=3, do_sample=False, return_dict_in_generate=True)
    assert torch.equal(res.sequences, hf_greedy(target, ids, mask))
    assert isinstance(res.stats, SpeculativeStats) and res.stats.new_tokens > 0
    assert res["sequences"] is res.sequences
    filled = SpeculativeStats()
    plugin(target, draft, ids, mask, num_draft_tokens=3, do_sample=False, speculative_stats=filled)
    assert filled.steps > 0 and filled.batch_size == 2


def test_stats_are_consistent_and_printable():
    target, draft = make_pair("llama")
    ids, mask = left_padded([5, 8, 3], seed=12)
    out = ours(target, draft, ids, mask, num_draft_tokens=4, eos_token_id=[], max_new_tokens=16)
    s = out.stats
    assert s.new_tokens == 3 * 16
    assert s.fused_prefills == 1  # the prompt was scored with the first draft: one target call fewer
    assert s.target_calls == s.steps + s.target_prefill_calls - s.fused_prefills
    assert s.accepted_tokens <= s.drafted_tokens
    assert sum(s.position_accepted) == s.accepted_tokens and sum(s.position_drafted) == s.drafted_tokens
    assert s.block_efficiency == pytest.approx(s.new_tokens / s.row_steps)
    parts = s.draft_time + s.target_time + s.verify_time + s.bookkeeping_time
    assert 0 < parts <= s.total_time and s.alignment_time <= s.bookkeeping_time
    d = s.to_dict()
    for key in ("target_calls", "draft_calls", "drafted_tokens", "accepted_tokens", "acceptance_rate_per_position",
                "mean_accepted_length", "block_efficiency", "draft_time", "target_time", "verify_time",
                "bookkeeping_time", "tokens_per_second", "predicted_speedup", "alpha", "cost_ratio"):
        assert key in d
    text = str(s)
    assert "predicted speedup" in text and "bookkeeping" in text and "acceptance" in text


# --------------------------------------------------------------------------- sampling basics


def test_same_seed_same_output():
    target, draft = make_pair("llama")
    ids, mask = left_padded([5, 8, 3], seed=13)
    runs = [ours(target, draft, ids, mask, do_sample=True, temperature=0.9, top_k=50, num_draft_tokens=3,
                 rule=rule, generator=torch.Generator().manual_seed(seed)).sequences
            for rule, seed in (("block", 7), ("block", 7), ("block", 8))]
    assert torch.equal(runs[0], runs[1])
    assert not torch.equal(runs[0], runs[2])


def test_user_rule_and_lossy_rules_run_in_the_loop():
    import specdecode.rules as rules

    def reject_all(target_probs, draft_probs, draft_tokens, *, num_draft_tokens, uniforms):
        B, gamma = draft_tokens.shape
        tokens = torch.full((B, gamma + 1), -1, dtype=torch.int64)
        tokens[:, 0] = target_probs[:, 0].argmax(-1)
        return tokens, torch.zeros(B, dtype=torch.int64)

    target, draft = make_pair("llama")
    ids, mask = left_padded([5, 3], seed=14)
    rules.register_rule("_test_reject_all", reject_all, lossless=False, needs_draft_probs=False, overwrite=True)
    try:
        out = ours(target, draft, ids, mask, rule="_test_reject_all", num_draft_tokens=3)
    finally:
        rules.unregister_rule("_test_reject_all")
    assert torch.equal(out.sequences, hf_greedy(target, ids, mask))
    assert out.stats.accepted_tokens == 0
    for rule, opts in (("typical", {"epsilon": 0.2}), ("top_beta", {"beta": 2})):
        out = ours(target, draft, ids, mask, rule=rule, do_sample=True, generator=torch.Generator().manual_seed(0),
                   **opts)
        assert out.sequences.shape[1] <= 5 + MAX_NEW and int(out.sequences.max()) < 128


# ------------------------------------------------------------------------ vocabulary padding


@pytest.mark.parametrize("target_vocab,draft_vocab", [(136, 128), (128, 136)])
def test_vocab_padding_pair(target_vocab, draft_vocab):
    from transformers import LogitsProcessorList, SuppressTokensLogitsProcessor

    target, draft = make_pair("llama", vocab=target_vocab, draft_vocab=draft_vocab)
    with torch.no_grad():  # make the padding rows attractive, so that using them would show
        for model in (target, draft):
            head = model.get_output_embeddings().weight
            if head.shape[0] > 128:
                head[128:] = 3.0 * head[: head.shape[0] - 128]
    ids, mask = left_padded([5, 8, 3], seed=15, vocab=128)
    out = ours(target, draft, ids, mask, num_draft_tokens=4)
    extra = list(range(128, target_vocab))
    suppress = LogitsProcessorList([SuppressTokensLogitsProcessor(extra)]) if extra else None
    ref = hf_greedy(target, ids, mask, logits_processor=suppress)
    assert torch.equal(out.sequences, ref)
    if extra:  # the target alone would have used a padding id here
        assert not torch.equal(ref, hf_greedy(target, ids, mask))
    sampled = ours(target, draft, ids, mask, num_draft_tokens=4, do_sample=True, temperature=1.5,
                   generator=torch.Generator().manual_seed(1), rule="block")
    assert int(sampled.sequences.max()) < 128
    via_plugin = plugin(target, draft, ids, mask, num_draft_tokens=4, do_sample=False, suppress_tokens=extra or None)
    assert torch.equal(via_plugin, ref)


def test_stats_passed_in_accumulate_over_calls():
    """A SpeculativeStats passed to several calls sums every counter, the whole-call time
    included: the total can never fall below the sum of the phases it contains."""
    target, draft = make_pair("llama")
    ids, mask = left_padded([5, 8], seed=3)
    stats = SpeculativeStats()
    for _ in range(3):
        generate(target, draft, ids, mask, max_new_tokens=6, eos_token_id=[], stats=stats)
    assert stats.new_tokens == 3 * 2 * 6
    phases = stats.draft_time + stats.target_time + stats.verify_time + stats.bookkeeping_time
    assert stats.total_time >= phases > 0


def test_the_prompt_is_scored_with_the_first_chain_draft():
    """A drafter that reads no target features proposes from the prompt, and the prompt's forward
    verifies that first chain (one target call fewer), or a first tree that is one path (scored
    as a chain, verified by the tree rule); a branching first tree keeps its prefill. Every run
    gives the target's own greedy output (n-grams: nothing to propose on random prompts)."""
    from specdecode import ModelDrafter, NgramDrafter
    from specdecode.trees.builders import make_tree_builder

    target, draft = make_pair("llama")
    ids, mask = left_padded([5, 8, 3], seed=21)
    want = target.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=PAD)
    facts.check_decoder_forward(target)  # the forward probe runs once per model: before the counted calls
    calls = []
    hook = target.register_forward_hook(lambda m, a, out: calls.append(out.logits.shape[1]))
    try:
        for drafter, kwargs, fused in ((draft, dict(num_draft_tokens=3), 1),  # random prompts: no n-gram draft
                                       (NgramDrafter(), dict(num_draft_tokens=3), 1),
                                       (ModelDrafter(draft, tree=make_tree_builder([[0], [0, 0]])), {}, 1),  # a path
                                       (ModelDrafter(draft, tree=make_tree_builder("static", num_nodes=4)), {}, 0)):
            calls.clear()
            out = generate(target, drafter, ids, mask, max_new_tokens=10, pad_token_id=PAD, **kwargs)
            assert torch.equal(out.sequences, want)
            s = out.stats
            assert s.fused_prefills == fused and s.target_prefill_calls == 1
            assert s.target_calls == s.steps + 1 - fused
            if fused:  # the first forward held the prompt and the draft: logits for the draft's 3 + 1 only
                assert calls[0] == {draft: 4}.get(drafter, 1 if kwargs else 3) and "also the prompt's prefill" in str(s)
    finally:
        hook.remove()
