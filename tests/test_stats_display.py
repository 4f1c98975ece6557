"""SpeculativeStats on screen: the shared vocabulary and number formats, the plain-text table,
the HTML table Jupyter shows, the plot, and the one-line explanation of a speed-up gap."""

from __future__ import annotations

import re

import pytest

from specdecode import SpeculativeStats
from specdecode import vocabulary as words
from specdecode.analysis import cost_aware_speedup


def _stats(**overrides: object) -> SpeculativeStats:
    """A hand-filled record: 10 steps of gamma 4, batch 1, 40 drafted, 25 accepted, 8 rejections."""
    fields = dict(rule="block", batch_size=1, steps=10, row_steps=10, target_calls=11, target_prefill_calls=1,
                  draft_calls=41, drafted_tokens=40, accepted_tokens=25, rejections=8, new_tokens=35,
                  position_drafted=[10, 10, 10, 10], position_accepted=[9, 7, 5, 4],
                  num_draft_tokens_history=[4] * 10, draft_time=0.41, draft_prefill_time=0.01, target_time=1.01,
                  target_prefill_time=0.01, verify_time=0.02, bookkeeping_time=0.03, total_time=1.5)
    fields.update(overrides)
    return SpeculativeStats(**fields)  # type: ignore[arg-type]


def test_str_uses_the_vocabulary_and_fits_100_columns() -> None:
    text = str(_stats())
    for term in (words.ACCEPTANCE_RATE, words.ALPHA, words.ACCEPTANCE_BY_POSITION, words.BLOCK_EFFICIENCY,
                 words.COST_RATIO, words.PREDICTED_SPEEDUP):
        assert term.name in text
    assert max(len(line) for line in text.splitlines()) <= 100
    assert "acceptance rate         0.62" in text  # 25 / 40, two decimals
    assert "alpha                   0.76" in text  # 25 / 33
    assert "0.90 0.70 0.50 0.40" in text
    assert "block efficiency        3.50" in text
    assert "cost ratio c            0.100" in text  # (0.4 / 40) / (1.0 / 10)
    assert re.search(r"predicted speedup\s+\d\.\d\dx", text)


def test_numbers_have_one_format_per_quantity() -> None:
    assert words.per_second(4.0) == "4.0" and words.per_second(25.63) == "25.6"
    assert words.speedup(1.581) == "1.58x" and words.rate(1.0) == "1.00" and words.cost(0.0741) == "0.074"


def test_html_table_for_jupyter() -> None:
    page = _stats(rule="a<b")._repr_html_()
    assert page.startswith("<table>") and page.endswith("</table>")
    assert "a&lt;b" in page and "a<b" not in page  # escaped
    assert page.count("<tr>") == len(_stats().summary()) + 2  # header + rows + time
    assert words.ALPHA.definition.split(":")[0] in page  # definitions as tooltips


def test_tree_stats_name_depth_and_rank() -> None:
    text = str(_stats(tree_rule="rrs", rank_tried=[10, 3], rank_accepted=[7, 1]))
    assert "tree rule rrs" in text and "acceptance by depth" in text and "0.70 0.33" in text
    assert words.PREDICTED_SPEEDUP.name not in text  # Leviathan's chain formula does not apply


def test_plot_draws_acceptance_by_position_and_alpha_powers() -> None:
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    stats = _stats()
    ax = stats.plot()
    heights = [bar.get_height() for bar in ax.patches]
    assert heights == pytest.approx(stats.acceptance_by_position)
    (line,) = ax.get_lines()
    assert list(line.get_ydata()) == pytest.approx([stats.alpha ** i for i in range(1, 5)])
    import matplotlib.pyplot as plt

    plt.close(ax.figure)


def test_explain_speedup_uses_the_measured_verify_cost() -> None:
    stats = _stats()
    target_tps = 20.0  # target alone: one decode step = 0.05 s; a verify call here is 0.1 s = 2 steps
    line = stats.explain_speedup(target_tps)
    expected = cost_aware_speedup(stats.block_efficiency, 4, stats.draft_time_per_call,
                                  stats.target_time_per_call, 1 / target_tps)
    assert "costs 2.0 target decode steps" in line
    assert words.speedup(expected) in line and words.speedup(stats.tokens_per_second / target_tps) in line
    assert "\n" not in line
    assert "not enough" in SpeculativeStats().explain_speedup(10.0)


def test_explain_speedup_of_a_tree_does_not_use_the_chain_formula() -> None:
    import dataclasses

    stats = dataclasses.replace(_stats(), tree_rule="deterministic", num_draft_tokens_history=[])
    line = stats.explain_speedup(20.0)
    nodes = stats.drafted_tokens / stats.row_steps + 1
    assert f"a tree of {nodes:.1f} tokens on average" in line and "costs 2.0 target decode steps" in line
    assert "predicted" not in line and f"gives {stats.block_efficiency:.2f} tokens" in line


def test_cost_aware_speedup_checks_its_inputs() -> None:
    assert cost_aware_speedup(2.0, 1, 0.0, 0.5, 0.5) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="verify_call_seconds"):
        cost_aware_speedup(2.0, 3, 0.0, 0.0, 1.0)
    with pytest.raises(ValueError, match="block_efficiency"):
        cost_aware_speedup(-1.0, 3, 0.1, 0.1, 1.0)
