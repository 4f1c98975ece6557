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

Pass a :class:`DraftSchedule` instance for a schedule of your own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from specdecode.analysis import optimal_num_draft_tokens

if TYPE_CHECKING:
    from specdecode.engine.stats import SpeculativeStats

SCHEDULES = ("constant", "heuristic", "optimal")
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

    def update(self, *, num_draft_tokens: int, drafted: torch.Tensor, accepted: torch.Tensor,
               stats: SpeculativeStats) -> None:
        """Called after every step with that step's gamma, the drafts verified per row
        ``drafted [b]`` and the accepted counts ``accepted [b]`` (rows that were verified), and
        the running statistics."""

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
    cls = {"constant": ConstantSchedule, "heuristic": HeuristicSchedule, "optimal": OptimalSchedule}[schedule]
    return cls(num_draft_tokens, max_num_draft_tokens)
