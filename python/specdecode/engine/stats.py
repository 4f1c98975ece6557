"""``SpeculativeStats``: what one speculative generation did, and how long each part took."""

from __future__ import annotations

import html
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from specdecode import vocabulary as words
from specdecode.analysis import cost_aware_speedup, expected_speedup, expected_tokens_per_call


class Clock:
    """``perf_counter`` after synchronising the CUDA devices in use, so that phases are timed,
    not merely launched."""

    def __init__(self, *devices: torch.device, syncs: Any = None) -> None:
        self.cuda = sorted({d for d in devices if d.type == "cuda"}, key=str)
        self.syncs = syncs  # a specdecode.engine.syncs.HostSyncs that counts the waits, or None

    def __call__(self) -> float:
        if self.cuda:
            if self.syncs is not None:
                self.syncs.synchronize(self.cuda)
            else:
                for d in self.cuda:
                    torch.cuda.synchronize(d)
        return time.perf_counter()


def _ratio(num: float, den: float) -> float:
    return float(num) / float(den) if den else 0.0


@dataclass
class SpeculativeStats:
    """Counters and timings of one call to :func:`specdecode.generate` (or the plug-in).

    Counting conventions (for a batch, every counter sums over rows unless it says "calls"):

    - ``steps``: verification rounds (one batched target forward each, over the active rows);
      ``row_steps`` sums the active rows over those rounds.
    - ``target_calls`` / ``draft_calls``: forward passes of each model, prefill included
      (``target_prefill_calls`` is the target's share of prefill; the draft's prefill is the
      first draft call, which also yields its first proposal). ``fused_prefills``: prefills
      that were the first verification forward too (the prompt and the first chain draft
      scored in one forward; a drafter that reads target features cannot, its first
      proposal needs the prompt's features): that call counts in ``target_calls`` and
      ``target_prefill_calls`` and its time in ``target_prefill_time``, and its step in
      ``steps``.
    - ``drafted_tokens``: draft tokens that were verified; ``accepted_tokens``: those accepted
      (tau summed over rows); ``rejections``: row-steps that rejected a draft (tau < drafted).
    - ``new_tokens``: tokens in the output after EOS / max_new_tokens / stopping criteria cut
      a block short.
    - ``position_drafted[i]`` / ``position_accepted[i]``: how often draft position ``i`` (0-based)
      was verified / accepted; ``position_reached[i]``: how often it was verified with every
      position before it accepted (by depth for token trees).
    - ``num_draft_tokens_history``: per chain step, the tokens drafted (0: a plain target step,
      no draft); ``planned_num_draft_tokens``: per step, the gamma the draft schedule chose
      (before the length limit or a drafter's shorter proposal cut it); ``schedule_rates``: the
      ``"auto"`` schedule's last predicted tokens per second of a row by gamma (index), per batch
      size; ``plain_steps``: the steps that drafted nothing (the eager path: a schedule's gamma 0,
      the length limit, or a drafter that proposed no token), the target alone scoring the pending
      token.
    - ``accepted_lengths``: per step, each active row's accepted length (both paths; the
      static path logs them on the device and reads them once at the end).
    - How the run was made: ``sampling`` (temperature, top_k, top_p, min_p), ``seed`` (the
      ``generator``'s initial seed; None when torch's global generator drove the run),
      ``rule_options``, ``num_draft_tokens`` (the configured draft length; schedules change it
      from there) and ``tree_shape`` (what the drafter's tree builder drafts, "" for chains); a
      ``stats`` passed to several calls keeps the last call's.
    - ``decode_path``: ``"eager"`` (the dynamic loop), ``"static"`` (static caches, device-side
      steps run eagerly), ``"graphed"`` (the same steps replayed as CUDA graphs) or
      ``"compiled"`` (the same steps compiled by ``torch.compile``; on CUDA also replayed as
      CUDA graphs).
    - ``host_syncs``: times the host waited for the device during the call
      (:mod:`specdecode.engine.syncs`: value reads, timing synchronisations, the CUDA verify op's
      status copy), of which ``step_host_syncs`` inside decoding steps (prefill, setup and the
      final read of the results excluded); see :attr:`host_syncs_per_step`. Static path only:
      ``decode_steps_run`` counts the steps launched (``steps`` those with an active row; the
      difference is masked work after the last row finished, before the host noticed) and
      ``graph_captures`` the recordings of the step's CUDA graphs this call made (0 when it
      replayed graphs kept from an earlier call; the prefill's graph, recorded once per layout
      too, is not counted).
    - Times in seconds: ``draft_time`` (draft forwards + proposal sampling + HF processors on
      draft logits), ``target_time`` (target forwards + processors on target logits),
      ``verify_time`` (``verify_logits`` and the uniforms it uses), ``bookkeeping_time``
      (EOS / length / stopping checks, output writes, cache roll-back, dropping finished rows,
      re-packing rows), of which ``alignment_time`` is the batch alignment part (roll-back
      masks, row drops, re-packs). ``total_time`` is the whole call.
    """

    rule: str = "token"
    drafter: str = "model"
    batch_size: int = 0
    draft_schedule: str = "constant"
    decode_path: str = "eager"
    steps: int = 0
    row_steps: int = 0
    target_calls: int = 0
    target_prefill_calls: int = 0
    fused_prefills: int = 0
    draft_calls: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    rejections: int = 0
    new_tokens: int = 0
    repacks: int = 0
    plain_steps: int = 0
    host_syncs: int = 0
    step_host_syncs: int = 0
    decode_steps_run: int = 0
    graph_captures: int = 0
    tree_rule: str = ""
    rank_tried: list[int] = field(default_factory=list)
    rank_accepted: list[int] = field(default_factory=list)
    position_drafted: list[int] = field(default_factory=list)
    position_accepted: list[int] = field(default_factory=list)
    num_draft_tokens_history: list[int] = field(default_factory=list)
    planned_num_draft_tokens: list[int] = field(default_factory=list)
    schedule_rates: dict[int, list[float]] = field(default_factory=dict)
    position_reached: list[int] = field(default_factory=list)
    accepted_lengths: list[list[int]] = field(default_factory=list)
    sampling: dict[str, Any] = field(default_factory=dict)
    seed: int | None = None
    rule_options: dict[str, Any] = field(default_factory=dict)
    num_draft_tokens: int = 0
    tree_shape: str = ""
    draft_time: float = 0.0
    draft_prefill_time: float = 0.0
    target_time: float = 0.0
    target_prefill_time: float = 0.0
    verify_time: float = 0.0
    bookkeeping_time: float = 0.0
    alignment_time: float = 0.0
    total_time: float = 0.0

    # ------------------------------------------------------------------ derived values
    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted tokens."""
        return _ratio(self.accepted_tokens, self.drafted_tokens)

    @property
    def acceptance_rate_per_position(self) -> list[float]:
        """Accepted / drafted at each draft position i = 0..max gamma - 1 (depth for trees):
        ``position_accepted[i] / position_drafted[i]``, the chance that position i is accepted
        when it is drafted, whatever happened before it. Not a conditional rate: it falls with
        every rejection before i; and it may rise with i where fewer steps draft that far."""
        return [_ratio(a, d) for a, d in zip(self.position_accepted, self.position_drafted)]

    @property
    def conditional_acceptance_per_position(self) -> list[float]:
        """P(position i accepted | it was drafted and every position before it was accepted):
        ``position_accepted[i] / position_reached[i]`` (by depth for trees; alpha per position)."""
        return [_ratio(a, r) for a, r in zip(self.position_accepted, self.position_reached)]

    @property
    def acceptance_by_position(self) -> list[float]:
        """Share of the row-steps that drafted in which position i was accepted (``tau > i``),
        i = 0, 1, ...: what the screens show. It cannot rise with i (accepting position i needs
        every position before it), and is about ``alpha^(i+1)`` when positions are alike."""
        drafting = self.position_drafted[0] if self.position_drafted else 0
        return [_ratio(a, drafting) for a in self.position_accepted]

    @property
    def acceptance_by_rank(self) -> list[float]:
        """Token trees: P(the rank-r child of a node is accepted | the walk tried it), r = 0, 1, ...
        (rank = drafting order among siblings). Feed it to :func:`specdecode.trees.sequoia_shape`
        through :func:`specdecode.trees.acceptance_from_conditional`."""
        return [_ratio(a, t) for a, t in zip(self.rank_accepted, self.rank_tried)]

    @property
    def alpha(self) -> float:
        """Estimate of Leviathan's per-token acceptance ``alpha``: under the i.i.d. model the
        number of accepted drafts per row-step is a truncated geometric variable, whose maximum
        likelihood estimate is accepted / (accepted + rejections)."""
        return _ratio(self.accepted_tokens, self.accepted_tokens + self.rejections)

    @property
    def mean_accepted_length(self) -> float:
        """Mean number of accepted drafts (tau) per row-step."""
        return _ratio(self.accepted_tokens, self.row_steps)

    @property
    def block_efficiency(self) -> float:
        """New tokens per row per target verification call (tau + 1 on average, less where
        EOS or the length limit cut a block)."""
        return _ratio(self.new_tokens, self.row_steps)

    @property
    def mean_num_draft_tokens(self) -> float:
        """Mean gamma over the steps (changes with the ``heuristic`` / ``optimal`` schedules)."""
        return _ratio(sum(self.num_draft_tokens_history), len(self.num_draft_tokens_history))

    @property
    def draft_time_per_call(self) -> float:
        """Seconds per draft forward, prefill excluded."""
        return _ratio(self.draft_time - self.draft_prefill_time, self.draft_calls - (1 if self.draft_calls else 0))

    @property
    def target_time_per_call(self) -> float:
        """Seconds per target verification forward, prefill excluded."""
        return _ratio(self.target_time - self.target_prefill_time, self.target_calls - self.target_prefill_calls)

    @property
    def cost_ratio(self) -> float:
        """Measured ``c = t_draft / t_target`` per forward call."""
        return _ratio(self.draft_time_per_call, self.target_time_per_call)

    @property
    def host_syncs_per_step(self) -> float:
        """Host synchronisations per decoding step (``step_host_syncs / steps``)."""
        return _ratio(self.step_host_syncs, self.steps)

    @property
    def tokens_per_second(self) -> float:
        """New tokens (all rows) per second of wall time."""
        return _ratio(self.new_tokens, self.total_time)

    @property
    def gamma(self) -> int:
        """The draft length formulas use: the configured one under the constant schedule, else
        the rounded mean (steps cut short by ``max_new_tokens`` draft fewer either way)."""
        if self.draft_schedule == "constant" and self.num_draft_tokens > 0:
            return self.num_draft_tokens
        return round(self.mean_num_draft_tokens)

    @property
    def predicted_speedup(self) -> float:
        """Leviathan's expected speed-up ``(1 - a^(g+1)) / ((1 - a)(g c + 1))`` at the measured
        ``alpha``, cost ratio ``c`` and :attr:`gamma`."""
        gamma = self.gamma
        if gamma < 1 or self.target_time_per_call <= 0.0:
            return 0.0
        return expected_speedup(min(max(self.alpha, 0.0), 1.0), gamma, self.cost_ratio)

    @property
    def predicted_tokens_per_call(self) -> float:
        """Leviathan's expected tokens per target call ``(1 - a^(g+1)) / (1 - a)``."""
        gamma = self.gamma
        if gamma < 1:
            return 0.0
        return expected_tokens_per_call(min(max(self.alpha, 0.0), 1.0), gamma)

    @property
    def other_time(self) -> float:
        """Wall time not in any of the four parts (setup, checks, Python overhead)."""
        return max(self.total_time - self.draft_time - self.target_time - self.verify_time - self.bookkeeping_time, 0.0)

    # ------------------------------------------------------------------- presentation
    def to_dict(self) -> dict[str, Any]:
        """Every counter, every derived value and the settings that made them (sampling, seed,
        rule options, configured draft length, tree shape), as plain Python types."""
        data = asdict(self)
        for name in (
            "acceptance_rate", "acceptance_rate_per_position", "conditional_acceptance_per_position",
            "acceptance_by_position", "acceptance_by_rank", "alpha", "mean_accepted_length", "gamma",
            "block_efficiency", "mean_num_draft_tokens", "draft_time_per_call", "target_time_per_call",
            "cost_ratio", "tokens_per_second", "predicted_speedup", "predicted_tokens_per_call", "other_time",
            "host_syncs_per_step",
        ):
            data[name] = getattr(self, name)
        return data

    def summary(self) -> list[tuple[str, str, str]]:
        """``(quantity, value, meaning)`` rows: what ``str(stats)``, the Jupyter table and the
        demo show, with the names and number formats of :mod:`specdecode.vocabulary`."""
        tree = bool(self.tree_rule)
        by_position = words.ACCEPTANCE_BY_POSITION
        rows = [
            ("new tokens", str(self.new_tokens),
             f"in {self.total_time:.2f} s, {words.per_second(self.tokens_per_second)} tok/s"),
            ("target / draft calls", f"{self.target_calls} / {self.draft_calls}", self._calls_meaning()),
            ("drafted / accepted", f"{self.drafted_tokens} / {self.accepted_tokens}", "draft tokens"),
            (words.ACCEPTANCE_RATE.name, words.rate(self.acceptance_rate), words.ACCEPTANCE_RATE.short),
            (words.ALPHA.name, words.rate(self.alpha), words.ALPHA.short),
            ("acceptance by depth" if tree else by_position.name, words.rates(self.acceptance_by_position),
             "share of steps accepting depth i" if tree else by_position.short),
        ]
        if tree:
            rows.append(("acceptance by rank", words.rates(self.acceptance_by_rank),
                         "P(child of rank r accepted | tried)"))
            if self.tree_shape:
                rows.append(("tree shape", f"depth {len(self.position_drafted)}", self.tree_shape.split(": ")[0]))
        else:
            rows.append(self._gamma_row())
        rows += [
            (words.BLOCK_EFFICIENCY.name, words.tokens(self.block_efficiency), words.BLOCK_EFFICIENCY.short),
            (words.COST_RATIO.name, words.cost(self.cost_ratio), words.COST_RATIO.short),
        ]
        if not tree:
            rows.append((words.PREDICTED_SPEEDUP.name, words.speedup(self.predicted_speedup),
                         words.PREDICTED_SPEEDUP.short))
        if self.host_syncs:
            rows.append(("host syncs", str(self.host_syncs),
                         f"{self.host_syncs_per_step:.2f} per step: waits for the device"))
        return rows

    def _calls_meaning(self) -> str:
        """What the target and draft calls were, in counts that add up to the calls shown."""
        separate = self.target_prefill_calls - self.fused_prefills
        verify = self.target_calls - separate
        target = f"target: {separate} prefill + {verify} verify" if separate else f"target: {verify} verify"
        if self.fused_prefills:
            target += f" ({self.fused_prefills} also the prompt's prefill)"
        return f"{target}; draft: {self.draft_calls} forwards"

    def _gamma_row(self) -> tuple[str, str, str]:
        history = [g for g in self.num_draft_tokens_history if g > 0]
        if self.draft_schedule == "constant" and self.num_draft_tokens > 0:
            short = sum(1 for g in history if g < self.num_draft_tokens)
            cut = f"; {short} step{'s' if short != 1 else ''} near the length limit drafted fewer" if short else ""
            return (words.GAMMA.name, str(self.num_draft_tokens), f"{words.GAMMA.short} (constant schedule{cut})")
        plain = self.plain_steps
        plain = f"; {plain} of {len(self.num_draft_tokens_history)} steps plain (gamma 0)" if plain else ""
        return (words.GAMMA.name, f"{self.mean_num_draft_tokens:.2f}",
                f"mean {words.GAMMA.short} ({self.draft_schedule} schedule{plain})")

    def time_summary(self) -> list[tuple[str, str, str]]:
        """``(part, milliseconds, share of the total)`` rows of the wall-time split."""
        total = self.total_time or 1.0
        parts = [("draft", self.draft_time), ("target", self.target_time), ("verify", self.verify_time),
                 ("bookkeeping", self.bookkeeping_time), ("other", self.other_time)]
        rows = [(name, words.milliseconds(t), f"{100.0 * t / total:.1f}%") for name, t in parts]
        rows.append(("total", words.milliseconds(self.total_time), "100.0%"))
        return rows

    def _title(self) -> str:
        rule = f"tree rule {self.tree_rule}" if self.tree_rule else f"rule {self.rule}"
        return f"SpeculativeStats: {rule}, drafter {self.drafter}, batch {self.batch_size}, {self.decode_path} path"

    def explain_speedup(self, target_tokens_per_second: float) -> str:
        """One line on why the measured speed-up differs from Leviathan's prediction, given the
        tokens/s of the target alone on the same batch (e.g. from ``target.generate``).

        The formula assumes a verify call (a target forward over gamma + 1 tokens) costs one
        single-token decode step; this compares the measured verify call with that step and
        gives the prediction at the measured costs
        (:func:`specdecode.analysis.cost_aware_speedup`)."""
        if target_tokens_per_second <= 0 or self.tokens_per_second <= 0 or self.target_time_per_call <= 0:
            return "not enough measurements to compare the speed-up with its prediction"
        measured = self.tokens_per_second / target_tokens_per_second
        step_seconds = max(self.batch_size, 1) / target_tokens_per_second
        verify_steps = self.target_time_per_call / step_seconds
        overhead = (self.verify_time + self.bookkeeping_time + self.other_time) / (self.total_time or 1.0)
        if self.tree_rule:  # Leviathan's formula is for chains: say what a tree step costs and gives
            nodes = _ratio(self.drafted_tokens, self.row_steps) + 1
            return (f"{words.SPEEDUP.name} {words.speedup(measured)}: a verify call (a tree of {nodes:.1f} tokens on "
                    f"average) costs {verify_steps:.1f} target decode steps here and gives {self.block_efficiency:.2f} "
                    f"tokens; drafting adds {self.cost_ratio:.2f} of a target call per draft forward (verification "
                    f"and bookkeeping: {100 * overhead:.0f}% of the time)")
        gamma = max(self.gamma, 1)
        cost_aware = cost_aware_speedup(self.block_efficiency, gamma, self.draft_time_per_call,
                                        self.target_time_per_call, step_seconds)
        draft_steps = self.draft_time_per_call / step_seconds
        if abs(verify_steps - 1.0) < 0.05:
            verify = f"a verify call ({gamma + 1} tokens) costs about one target decode step, as the formula assumes"
        else:
            verify = (f"a verify call ({gamma + 1} tokens) costs {verify_steps:.1f} target decode steps (the formula "
                      "assumes 1)")
        return (f"{words.SPEEDUP.name} {words.speedup(measured)}; Leviathan's formula predicts "
                f"{words.speedup(self.predicted_speedup)} from alpha and c, and the measured "
                f"{words.tokens(self.block_efficiency)} tokens per call at the measured costs predict "
                f"{words.speedup(cost_aware)}: {verify}, a draft call {draft_steps:.2f}; verification, bookkeeping and "
                f"overhead take {100 * overhead:.0f}% of the time")

    def __str__(self) -> str:
        rows = self.summary()
        width = max(len(r[0]) for r in rows + self.time_summary()) + 2
        value_width = max(len(r[1]) for r in rows if r[0] not in ("acceptance by position", "acceptance by depth")) + 2
        lines = [self._title()]
        for name, value, meaning in rows:
            pad = max(value_width - len(value), 2)
            lines.append(f"  {name:<{width}}{value}{' ' * pad}{meaning}")
        lines.append("  time")
        for name, ms, share in self.time_summary():
            lines.append(f"    {name:<{width - 2}}{ms:>12}  {share:>6}")
        if self.repacks or self.alignment_time:
            lines[-3] += f"  (alignment {words.milliseconds(self.alignment_time)}, {self.repacks} re-packs)"
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        """An HTML table for Jupyter: the rows of :meth:`summary`, definitions as tooltips."""
        definitions = {t.name: t.definition for t in words.TERMS}
        cells = []
        for name, value, meaning in self.summary():
            tip = f' title="{html.escape(definitions[name], quote=True)}"' if name in definitions else ""
            cells.append(f'<tr><td style="text-align:left"{tip}>{html.escape(name)}</td>'
                         f'<td style="text-align:right"><code>{html.escape(value)}</code></td>'
                         f'<td style="text-align:left">{html.escape(meaning)}</td></tr>')
        times = ", ".join(f"{name} {share}" for name, _, share in self.time_summary()[:-1])
        cells.append(f'<tr><td style="text-align:left">time</td><td style="text-align:right"><code>'
                     f'{html.escape(words.milliseconds(self.total_time))}</code></td>'
                     f'<td style="text-align:left">{html.escape(times)}</td></tr>')
        return (f"<table><caption style=\"text-align:left\"><b>{html.escape(self._title())}</b></caption>"
                f"<tr><th>quantity</th><th>value</th><th>meaning</th></tr>{''.join(cells)}</table>")

    def plot(self, ax: Any = None) -> Any:
        """Bar chart of the acceptance by draft position (by depth for trees); for chains also
        ``alpha^i``, what it would be if every position were accepted with probability alpha.
        Needs matplotlib; returns the ``matplotlib.axes.Axes`` (a new figure when ``ax`` is None).
        """
        try:
            import matplotlib.pyplot as plt
        except ImportError as exc:  # pragma: no cover - matplotlib is a test dependency
            raise ImportError("SpeculativeStats.plot needs matplotlib: pip install matplotlib") from exc
        new_figure = ax is None
        if new_figure:
            _, ax = plt.subplots(figsize=(5, 3.2))
        measured = self.acceptance_by_position
        positions = list(range(1, len(measured) + 1))
        what = "depth" if self.tree_rule else "draft position"
        ax.bar(positions, measured, color="tab:blue", alpha=0.8, label=f"measured acceptance by {what.split()[-1]}")
        if positions and not self.tree_rule:
            ax.plot(positions, [self.alpha ** i for i in positions], color="tab:orange", marker="o",
                    label=f"alpha^i (alpha = {words.rate(self.alpha)})")
        ax.set_xlabel(what)
        ax.set_ylabel("share of steps accepted")
        ax.set_ylim(0, 1.05)
        ax.set_xticks(positions)
        ax.set_title(f"{self._title().split(': ', 1)[1]}; block efficiency {words.tokens(self.block_efficiency)}",
                     fontsize=9)
        ax.legend(fontsize=8)
        if new_figure:
            ax.figure.tight_layout()
        return ax
