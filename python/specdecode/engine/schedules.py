"""Draft length schedules: how many tokens (gamma) the draft proposes at each step.

A schedule is asked for gamma before every step (``num_draft_tokens()``) and told what happened
after it (``update``). Built-in schedules, chosen by name with ``draft_schedule=``:

- ``"constant"``: always ``num_draft_tokens``.
- ``"heuristic"``: +2 after a fully accepted block, -1 otherwise, within
  ``[1, max_num_draft_tokens]`` (the rule of Hugging Face's assisted generation). In a batch the
  block counts as fully accepted when at least half of the verified rows accepted all their
  drafts.
- ``"optimal"``: the gamma that maximises Leviathan's expected speed-up
  ``(1 - a^(g+1)) / ((1 - a)(g c + 1))`` (:func:`specdecode.optimal_num_draft_tokens`) at the
  running estimates of ``a`` (acceptance, with a uniform prior) and ``c`` (draft / target time
  per forward call). Until both models have been timed it uses ``num_draft_tokens``. Because
  ``c`` comes from wall-clock timings, the chosen gammas (and so sampled outputs) can vary
  between runs even with a fixed generator; the output distribution is unaffected.

- ``"auto"`` (the default of :func:`specdecode.generate` on the eager path,
  :class:`AdaptiveSchedule`): the gamma in ``0 .. max_num_draft_tokens`` (default: up to
  ``num_draft_tokens``) that maximises the tokens per second predicted from what this
  generation measured, per batch size: the expected tokens per step at gamma (from the
  acceptance by draft position so far) over the step's cost (the target's call over
  ``gamma + 1`` tokens at that batch size, ``gamma`` draft calls, the rest of the step). Gamma 0
  is a plain target step: the target scores the pending token alone and its token is sampled
  from it exactly; the drafter does not run and is told that nothing was drafted. So when a
  large batch makes the target's multi-token call cost more than the accepted drafts give (a
  CPU, a saturated accelerator), speculation turns itself down, down to none.

Every schedule is asked through :meth:`DraftSchedule.plan` (the batch size and the statistics;
by default it returns :meth:`~DraftSchedule.num_draft_tokens`), and the loop records the gamma
asked for per step in ``SpeculativeStats.planned_num_draft_tokens`` (what was drafted in
``num_draft_tokens_history``).

Pass a :class:`DraftSchedule` instance for a schedule of your own.

How ``"auto"`` decides (:class:`AdaptiveSchedule`). It keeps, per batch size (active rows), the
last ``window`` timings of each step: the target's call by number of scored tokens ``n = gamma +
1`` (steps whose call was also a prefill are left out), the draft time by gamma (the drafter's
own prefill left out) and the rest of the step (verification and bookkeeping; plain steps and
drafting steps apart). Medians make it robust to a busy machine. A batch size it has not
timed yet first drafts ``num_draft_tokens`` (today's behaviour), then runs one plain step, so
that both ends of the cost curve are measured; costs in between are interpolated linearly in
``n`` (beyond the largest measured ``n``, extrapolated from the last two). The expected tokens
per step of a row at gamma ``g`` is ``1 + sum_{i<g} prod_{j<=i} p_j``, where ``p_j`` is the
conditional acceptance of draft position ``j`` so far, shrunk towards the overall ``alpha``
with a prior worth two observations. While it chooses 0 it still drafts one step in every
``probe_every`` (the acceptance and the draft cost may change); while drafting pays less than
``margin`` times a plain step, it re-times a plain step as often. Timings come from the wall
clock, so the gammas chosen (and, when sampling, the outputs drawn) can vary between runs even
with a fixed generator; the output distribution is unaffected, and greedy outputs are the
target's whatever the gammas. An instance passed to several calls keeps its measurements (pass
a fresh one, or a name, after changing the models or the device).
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from typing import TYPE_CHECKING

import torch

from specdecode.analysis import optimal_num_draft_tokens

if TYPE_CHECKING:
    from specdecode.engine.stats import SpeculativeStats
    from specdecode.sampling import SamplingParams

SCHEDULES = ("constant", "heuristic", "optimal", "auto")
DEFAULT_MAX_NUM_DRAFT_TOKENS = 32


class DraftSchedule:
    """Base class: a constant gamma. Subclasses override :meth:`update` (and may override
    :meth:`num_draft_tokens`)."""

    name = "constant"

    def __init__(self, num_draft_tokens: int, max_num_draft_tokens: int | None = None) -> None:
        self.initial = int(num_draft_tokens)
        self.maximum = int(max_num_draft_tokens) if max_num_draft_tokens is not None else max(
            self.initial, DEFAULT_MAX_NUM_DRAFT_TOKENS
        )
        if self.initial < 1:
            raise ValueError(f"num_draft_tokens: expected an int >= 1, got {num_draft_tokens!r}")
        if self.maximum < self.initial:
            raise ValueError(
                f"max_num_draft_tokens: expected >= num_draft_tokens = {self.initial}, got {max_num_draft_tokens!r}"
            )
        self.current = self.initial

    def num_draft_tokens(self) -> int:
        """Gamma for the next step (>= 1; the loop may lower it near max_new_tokens)."""
        return self.current

    def plan(self, *, batch_size: int, stats: SpeculativeStats) -> int:
        """Gamma for the next step of ``batch_size`` active rows (0: a plain target step, no
        draft); the loop asks this before every step. Default: :meth:`num_draft_tokens`."""
        return self.num_draft_tokens()

    def update(self, *, num_draft_tokens: int, drafted: torch.Tensor, accepted: torch.Tensor,
               stats: SpeculativeStats) -> None:
        """Called after every chain step (gamma 0 included) with that step's gamma, the drafts
        verified per row and the accepted counts (rows that were verified), and the running
        statistics.

        Shape:
            drafted: ``[b]`` int64; accepted: ``[b]`` int64.
        """

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_draft_tokens={self.initial}, max_num_draft_tokens={self.maximum})"


class ConstantSchedule(DraftSchedule):
    """Always ``num_draft_tokens``."""

    name = "constant"


class HeuristicSchedule(DraftSchedule):
    """+2 after a fully accepted block, -1 otherwise, bounded to ``[1, max_num_draft_tokens]``."""

    name = "heuristic"

    def update(self, *, num_draft_tokens: int, drafted: torch.Tensor, accepted: torch.Tensor,
               stats: SpeculativeStats) -> None:
        used = drafted > 0
        if not bool(used.any()):
            return
        full = (accepted[used] >= drafted[used]).float().mean().item() >= 0.5
        self.current = min(self.current + 2, self.maximum) if full else max(self.current - 1, 1)


class OptimalSchedule(DraftSchedule):
    """Leviathan-optimal gamma from running estimates of alpha and c (docs/verification.md §9)."""

    name = "optimal"

    def __init__(self, num_draft_tokens: int, max_num_draft_tokens: int | None = None,
                 prior_accepted: float = 1.0, prior_rejected: float = 1.0) -> None:
        super().__init__(num_draft_tokens, max_num_draft_tokens)
        self.prior_accepted = float(prior_accepted)
        self.prior_rejected = float(prior_rejected)

    def alpha(self, stats: SpeculativeStats) -> float:
        """Posterior-mean style estimate (accepted + a0) / (accepted + rejections + a0 + b0)."""
        num = stats.accepted_tokens + self.prior_accepted
        return num / (stats.accepted_tokens + stats.rejections + self.prior_accepted + self.prior_rejected)

    def update(self, *, num_draft_tokens: int, drafted: torch.Tensor, accepted: torch.Tensor,
               stats: SpeculativeStats) -> None:
        if stats.draft_time_per_call <= 0.0 or stats.target_time_per_call <= 0.0:
            return
        self.current = optimal_num_draft_tokens(self.alpha(stats), stats.cost_ratio, self.maximum)


class _Costs:
    """One batch size's recent step timings (seconds): the target's call by scored tokens, the
    draft time by gamma, the rest of the step for plain (False) and drafting (True) steps."""

    def __init__(self, window: int) -> None:
        self.window = window
        self.target: dict[int, deque] = {}
        self.draft: dict[int, deque] = {}
        self.other: dict[bool, deque] = {}
        self.plain_run = 0  # consecutive plain steps chosen
        self.since_plain = 0  # drafting steps since the last plain one

    def add(self, table: dict, key: int | bool, seconds: float) -> None:
        table.setdefault(key, deque(maxlen=self.window)).append(max(float(seconds), 0.0))

    def target_seconds(self, n: int) -> float:
        """The target's call over ``n`` tokens: measured, else interpolated linearly in ``n``."""
        points = sorted((k, statistics.median(v)) for k, v in self.target.items())
        for (n0, t0), (n1, t1) in zip(points, points[1:]):
            if n0 <= n <= n1:
                return t0 + (t1 - t0) * (n - n0) / (n1 - n0)
        if n <= points[0][0]:
            return points[0][1]
        (n0, t0), (n1, t1) = points[-2:] if len(points) > 1 else (points[0], points[0])
        slope = max((t1 - t0) / (n1 - n0), 0.0) if n1 > n0 else 0.0
        return t1 + slope * (n - n1)

    def draft_seconds(self, gamma: int, per_call: float) -> float:
        """Draft time of a step drafting ``gamma``: measured, else ``gamma`` times the measured
        seconds per drafted token (``per_call``, the statistics' own, before any sample)."""
        if gamma == 0:
            return 0.0
        if gamma in self.draft:
            return statistics.median(self.draft[gamma])
        per_token = [t / g for g, v in self.draft.items() for t in v]
        return gamma * (statistics.median(per_token) if per_token else per_call)

    def other_seconds(self, drafting: bool) -> float:
        times = self.other.get(drafting) or self.other.get(not drafting)
        return statistics.median(times) if times else 0.0


class AdaptiveSchedule(DraftSchedule):
    """Chooses gamma in ``0 .. max_num_draft_tokens`` per batch size from the step costs and the
    acceptance this generation measured (the module's docstring says how); 0 is a plain target
    step. ``max_num_draft_tokens`` defaults to ``num_draft_tokens``: it shortens the draft where
    drafting does not pay, and lengthens it only up to a maximum you give."""

    name = "auto"

    def __init__(self, num_draft_tokens: int, max_num_draft_tokens: int | None = None, *, window: int = 8,
                 probe_every: int = 8, margin: float = 1.25) -> None:
        super().__init__(num_draft_tokens, num_draft_tokens if max_num_draft_tokens is None else max_num_draft_tokens)
        for name, value in (("window", window), ("probe_every", probe_every)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {value!r}")
        if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not margin >= 1.0:
            raise ValueError(f"margin: expected a number >= 1, got {margin!r}")
        self.window, self.probe_every, self.margin = window, probe_every, float(margin)
        self.costs: dict[int, _Costs] = {}
        self._step: tuple | None = None  # the planned step: batch size, start time, the statistics' times then

    # ------------------------------------------------------------------ predictions
    @staticmethod
    def expected_tokens(gamma: int, stats: SpeculativeStats) -> float:
        """Expected new tokens per row of a step drafting ``gamma`` (accepted drafts + 1), from the
        conditional acceptance by draft position so far (shrunk towards the overall alpha)."""
        alpha = (stats.accepted_tokens + 1.0) / (stats.accepted_tokens + stats.rejections + 2.0)
        total, reach = 1.0, 1.0
        for j in range(gamma):
            accepted = stats.position_accepted[j] if j < len(stats.position_accepted) else 0
            reached = stats.position_reached[j] if j < len(stats.position_reached) else 0
            reach *= (accepted + 2.0 * alpha) / (reached + 2.0)
            total += reach
        return total

    def predicted_rates(self, batch_size: int, stats: SpeculativeStats) -> dict[int, float] | None:
        """Predicted new tokens per second of a row, by gamma ``0 .. maximum``, at ``batch_size``
        active rows; None until both a plain and a drafting step were timed at that size."""
        costs = self.costs.get(batch_size)
        if costs is None or 1 not in costs.target or not any(n > 1 for n in costs.target):
            return None
        rates = {}
        for gamma in range(self.maximum + 1):
            seconds = (costs.target_seconds(gamma + 1) + costs.draft_seconds(gamma, stats.draft_time_per_call)
                       + costs.other_seconds(gamma > 0))
            rates[gamma] = self.expected_tokens(gamma, stats) / seconds if seconds > 0 else float("inf")
        return rates

    def observe(self, batch_size: int, num_draft_tokens: int, *, target_seconds: float | None,
                draft_seconds: float | None, other_seconds: float | None) -> None:
        """Add one step's timings at ``batch_size`` rows drafting ``num_draft_tokens`` (None: not
        measured); :meth:`update` calls it, and a caller may seed the tables from another run."""
        costs = self.costs.setdefault(int(batch_size), _Costs(self.window))
        if target_seconds is not None:
            costs.add(costs.target, num_draft_tokens + 1, target_seconds)
        if draft_seconds is not None and num_draft_tokens > 0:
            costs.add(costs.draft, num_draft_tokens, draft_seconds)
        if other_seconds is not None:
            costs.add(costs.other, num_draft_tokens > 0, other_seconds)

    # ------------------------------------------------------------------ the schedule
    def _choose(self, batch_size: int, stats: SpeculativeStats) -> int:
        costs = self.costs.setdefault(batch_size, _Costs(self.window))
        if not any(n > 1 for n in costs.target):
            return self.initial  # time a drafting step first
        if 1 not in costs.target:
            return 0  # then a plain one
        rates = self.predicted_rates(batch_size, stats)
        best = max(range(1, self.maximum + 1), key=lambda g: (rates[g], -g))
        stats.schedule_rates[batch_size] = [round(rates[g], 3) for g in range(self.maximum + 1)]
        if rates[0] >= rates[best]:
            costs.plain_run += 1
            if costs.plain_run % self.probe_every == 0:
                return best  # a drafting step now and then: acceptance and costs change
            return 0
        costs.plain_run = 0
        costs.since_plain += 1
        if rates[best] < self.margin * rates[0] and costs.since_plain >= self.probe_every:
            return 0  # close to a plain step: time one again
        return best

    def plan(self, *, batch_size: int, stats: SpeculativeStats) -> int:
        gamma = self._choose(int(batch_size), stats)
        if gamma == 0:
            self.costs[int(batch_size)].since_plain = 0
        self.current = gamma
        self._step = (int(batch_size), time.perf_counter(), stats.target_time, stats.target_prefill_time,
                      stats.draft_time, stats.draft_prefill_time)
        return gamma

    def num_draft_tokens(self) -> int:
        return self.current

    def update(self, *, num_draft_tokens: int, drafted: torch.Tensor, accepted: torch.Tensor,
               stats: SpeculativeStats) -> None:
        if self._step is None:
            return
        batch_size, start, target, target_prefill, draft, draft_prefill = self._step
        self._step = None
        wall = time.perf_counter() - start
        target_s, draft_s = stats.target_time - target, stats.draft_time - draft
        prefill = stats.target_prefill_time > target_prefill  # the call was the prompt's prefill too
        self.observe(batch_size, int(num_draft_tokens), target_seconds=None if prefill else target_s,
                     draft_seconds=None if stats.draft_prefill_time > draft_prefill else draft_s,
                     other_seconds=None if prefill else wall - target_s - draft_s)

    def __repr__(self) -> str:
        return (f"AdaptiveSchedule(num_draft_tokens={self.initial}, max_num_draft_tokens={self.maximum}, "
                f"window={self.window}, probe_every={self.probe_every}, margin={self.margin})")


def default_schedule(decode_path: str, sampling: SamplingParams, generator: torch.Generator | None) -> str:
    """The schedule ``draft_schedule=None`` means: ``"auto"`` on the eager path, except when
    sampling with a ``generator`` (timed choices would change which coins are drawn, and a seed
    must fix the output); ``"constant"`` on the static paths (one shape per step) and under
    ``torch.distributed`` with more than one rank (each rank would time its own steps and could
    choose another gamma than the others, whose collectives then never meet)."""
    if decode_path != "eager" or (generator is not None and not sampling.is_greedy):
        return "constant"
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    if distributed and torch.distributed.get_world_size() > 1:
        return "constant"
    return "auto"


def make_schedule(schedule: str | DraftSchedule, num_draft_tokens: int,
                  max_num_draft_tokens: int | None = None) -> DraftSchedule:
    """A schedule object from a name in :data:`SCHEDULES` or a :class:`DraftSchedule`."""
    if isinstance(schedule, DraftSchedule):
        return schedule
    if not isinstance(schedule, str) or schedule not in SCHEDULES:
        raise ValueError(
            f"draft_schedule: expected one of {', '.join(repr(s) for s in SCHEDULES)} or a DraftSchedule, "
            f"got {schedule!r}"
        )
    cls = {"constant": ConstantSchedule, "heuristic": HeuristicSchedule, "optimal": OptimalSchedule,
           "auto": AdaptiveSchedule}[schedule]
    return cls(num_draft_tokens, max_num_draft_tokens)
