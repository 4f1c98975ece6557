"""What the statistics say, and what they record (issue 36, items 6 to 9; issue 35, "the
statistics screen"): acceptance per position in three honest forms, a screen whose lines add up
and cannot contradict their definitions, the settings that made a run, the drafted tree shape,
and tree rule options that reach the rule."""

from __future__ import annotations

import json
import re
import warnings

import pytest
import torch
from test_generate_models import left_padded, make_pair

from specdecode import SpeculativeStats, generate
from specdecode.trees import TokenTree, verify_tree


def _stats(**overrides: object) -> SpeculativeStats:
    fields = dict(rule="token", batch_size=1, steps=4, row_steps=4, target_calls=4, target_prefill_calls=1,
                  fused_prefills=1, draft_calls=13, drafted_tokens=15, accepted_tokens=10, rejections=2,
                  new_tokens=16, position_drafted=[4, 4, 4, 3], position_accepted=[4, 3, 2, 1],
                  position_reached=[4, 4, 3, 2], num_draft_tokens_history=[4, 4, 4, 3], num_draft_tokens=4,
                  draft_time=0.2, draft_prefill_time=0.01, target_time=0.4, target_prefill_time=0.1,
                  verify_time=0.01, bookkeeping_time=0.02, total_time=0.7)
    fields.update(overrides)
    return SpeculativeStats(**fields)  # type: ignore[arg-type]


def _row(stats: SpeculativeStats, name: str) -> tuple[str, str, str]:
    (row,) = [r for r in stats.summary() if r[0] == name]
    return row


def test_per_position_rates_are_named_for_what_they_are():
    """The issue's top_beta numbers: accepted / drafted, and the conditional rate, and the share
    of steps (non-increasing)."""
    stats = _stats(position_drafted=[22, 21, 20, 19], position_accepted=[6, 1, 1, 1], position_reached=[22, 6, 1, 1])
    assert stats.acceptance_rate_per_position == pytest.approx([6 / 22, 1 / 21, 1 / 20, 1 / 19])
    assert stats.conditional_acceptance_per_position == pytest.approx([6 / 22, 1 / 6, 1.0, 1.0])
    assert stats.acceptance_by_position == pytest.approx([6 / 22, 1 / 22, 1 / 22, 1 / 22])


def test_acceptance_by_position_cannot_rise():
    """Where fewer steps draft the last positions, accepted / drafted rises after falling (the
    issue's '1.00 1.00 0.67 1.00 1.00'); the screen shows the share of steps, which cannot."""
    stats = _stats(position_drafted=[3, 3, 3, 1, 1], position_accepted=[3, 3, 2, 1, 1],
                   position_reached=[3, 3, 3, 1, 1])
    assert stats.acceptance_rate_per_position == pytest.approx([1, 1, 2 / 3, 1, 1])
    shown = _row(stats, "acceptance by position")[1]
    assert shown == "1.00 1.00 0.67 0.33 0.33"
    values = [float(v) for v in shown.split()]
    assert values == sorted(values, reverse=True)


def test_calls_add_up():
    """'4 / 13 — 4 verification steps + 1 target prefill (1 fused)' read as 5 calls; now the
    parts sum to the calls shown."""
    fused = _row(_stats(), "target / draft calls")
    assert fused[1] == "4 / 13" and fused[2] == "target: 4 verify (1 also the prompt's prefill); draft: 13 forwards"
    separate = _row(_stats(target_calls=5, fused_prefills=0), "target / draft calls")
    assert separate[2].startswith("target: 1 prefill + 4 verify;")


def test_constant_gamma_is_shown_as_configured():
    """A constant num_draft_tokens=4 is not shown as 'gamma 3.70'; steps cut short are said."""
    row = _row(_stats(num_draft_tokens_history=[4] * 9 + [1]), "gamma")
    assert row[1] == "4" and "constant schedule; 1 step near the length limit drafted fewer" in row[2]
    assert "3.70" not in str(_stats(num_draft_tokens_history=[4] * 7 + [3] * 3))
    adaptive = _row(_stats(draft_schedule="heuristic", num_draft_tokens_history=[4, 6, 5, 3]), "gamma")
    assert adaptive[1] == "4.50" and "mean" in adaptive[2]


def test_explain_speedup_says_what_it_measured():
    """No 'costs 1.0 target decode steps here, not the 1 the formula assumes'."""
    stats = _stats()
    step = stats.target_time_per_call  # a verify call that costs exactly one decode step
    line = stats.explain_speedup(1.0 / step)
    assert "costs about one target decode step, as the formula assumes" in line and "not the 1" not in line
    assert re.search(r"Leviathan's formula predicts \d\.\d\dx from alpha and c", line)
    slow = stats.explain_speedup(2.0 / step)  # a decode step of half a verify call
    assert "costs 2.0 target decode steps (the formula assumes 1)" in slow


def test_a_run_records_how_it_was_made():
    """to_dict has the sampling settings, the seed, the rule options, the configured gamma and
    per-step accepted lengths; runs that differ only in an option export differently."""
    target, draft = make_pair("llama")
    ids, mask = left_padded([5], seed=1)
    runs = [generate(target, draft, ids, mask, rule="typical", do_sample=True, temperature=0.8, top_k=20,
                     num_draft_tokens=3, max_new_tokens=12, pad_token_id=0, epsilon=eps,
                     generator=torch.Generator().manual_seed(11)).stats.to_dict() for eps in (0.1, 0.2)]
    first = runs[0]
    assert first["sampling"] == {"temperature": 0.8, "top_k": 20, "top_p": 1.0, "min_p": 0.0}
    assert first["seed"] == 11 and first["num_draft_tokens"] == 3 and first["tree_shape"] == ""
    assert [r["rule_options"] for r in runs] == [{"epsilon": 0.1}, {"epsilon": 0.2}]
    lengths = first["accepted_lengths"]
    assert len(lengths) == first["steps"] and sum(sum(step) for step in lengths) == first["accepted_tokens"]
    json.dumps(first)  # plain Python types


def test_static_tree_at_small_budget_says_it_drafts_a_chain():
    """tree='static' when sampling at num_nodes=8 drafts a chain: a warning and the recorded shape
    say so; rank paths fix a branching shape, recorded as such."""
    target, draft = make_pair("llama")
    ids, mask = left_padded([5], seed=1)
    kwargs = dict(do_sample=True, max_new_tokens=10, pad_token_id=0, generator=torch.Generator().manual_seed(0))
    with pytest.warns(UserWarning, match="chain of 7"):
        out = generate(target, draft, ids, mask, tree="static", num_nodes=8, rule="rrs", **kwargs)
    assert out.stats.tree_shape.startswith("static, a chain of 7, children without_replacement")
    assert "tree shape" in str(out.stats)
    paths = [[0], [1], [0, 0], [0, 1], [1, 0]]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fixed = generate(target, draft, ids, mask, tree=paths, tree_children="without_replacement", rule="rrs",
                         **kwargs)
    assert fixed.stats.tree_shape == f"static, 6 nodes, children without_replacement: rank paths {paths}"
    assert max(len(line) for line in str(fixed.stats).splitlines()) <= 100


def test_typical_tree_options_reach_the_rule():
    """The argmax child always passes typical acceptance when delta <= 1 (exp(-H(p)) <= max p),
    which is why top-k trees showed [1.0, ...] whatever the options; options that can reject it
    do, and with sampled children the defaults and (0.9, 0.9) differ."""
    gen = torch.Generator().manual_seed(0)
    B, V = 300, 20
    logits = torch.randn(B, 4, V, generator=gen) * 3
    parents = torch.tensor([[-1, 0, 1, 2]] * B)
    argmax = TokenTree(torch.cat([torch.zeros(B, 1, dtype=torch.long), logits[:, :3].argmax(-1)], 1), parents,
                       torch.full((B,), 4))
    mean = lambda tree, **o: float(verify_tree(logits, None, tree, rule="typical", temperature=1.0,  # noqa: E731
                                               **o).accepted_len.double().mean())
    assert mean(argmax) == mean(argmax, epsilon=0.9, delta=0.9) == 3.0
    assert mean(argmax, epsilon=0.999, delta=100.0) < 1.0
    drawn = TokenTree(torch.multinomial(torch.softmax(logits.flatten(0, 1), -1), 1, generator=gen).view(B, 4),
                      parents, torch.full((B,), 4))
    assert mean(drawn) != mean(drawn, epsilon=0.9, delta=0.9)
    with pytest.raises(TypeError, match="unexpected option"):
        mean(drawn, beta=2)

    target, draft = make_pair("llama")
    ids, mask = left_padded([5], seed=1)
    rates = [generate(target, draft, ids, mask, tree="static", num_nodes=8, tree_children="deterministic",
                      rule="typical", do_sample=True, max_new_tokens=16, pad_token_id=0,
                      generator=torch.Generator().manual_seed(3), **o).stats.acceptance_rate
             for o in ({}, {"epsilon": 0.999, "delta": 100.0})]
    assert rates[1] < rates[0]
