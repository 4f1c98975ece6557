"""``SpeculativeStats``: what one speculative generation did, and how long each part took."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from specdecode.analysis import expected_speedup, expected_tokens_per_call


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
      first draft call, which also yields its first proposal).
    - ``drafted_tokens``: draft tokens that were verified; ``accepted_tokens``: those accepted
      (tau summed over rows); ``rejections``: row-steps that rejected a draft (tau < drafted).
    - ``new_tokens``: tokens in the output after EOS / max_new_tokens / stopping criteria cut
      a block short.
    - ``position_drafted[i]`` / ``position_accepted[i]``: how often draft position ``i`` (0-based)
      was verified / accepted.
    - ``decode_path``: ``"eager"`` (the dynamic loop), ``"static"`` (static caches, device-side
      steps run eagerly) or ``"graphed"`` (the same steps replayed as CUDA graphs).
    - ``host_syncs``: times the host waited for the device during the call
      (:mod:`specdecode.engine.syncs`: value reads, timing synchronisations, the CUDA verify op's
      status copy), of which ``step_host_syncs`` inside decoding steps (prefill, setup and the
      final read of the results excluded); see :attr:`host_syncs_per_step`. Static path only:
      ``decode_steps_run`` counts the steps launched (``steps`` those with an active row; the
      difference is masked work after the last row finished, before the host noticed) and
      ``graph_captures`` the CUDA graph recordings this call made (0 when it replayed graphs
      kept from an earlier call).
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
    draft_calls: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    rejections: int = 0
    new_tokens: int = 0
    repacks: int = 0
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
        """P(draft position i accepted | it was verified), i = 0..max gamma - 1."""
        return [_ratio(a, d) for a, d in zip(self.position_accepted, self.position_drafted)]

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
    def predicted_speedup(self) -> float:
        """Leviathan's expected speed-up ``(1 - a^(g+1)) / ((1 - a)(g c + 1))`` at the measured
        ``alpha``, cost ratio ``c`` and (rounded) mean gamma."""
        gamma = round(self.mean_num_draft_tokens)
        if gamma < 1 or self.target_time_per_call <= 0.0:
            return 0.0
        return expected_speedup(min(max(self.alpha, 0.0), 1.0), gamma, self.cost_ratio)

    @property
    def predicted_tokens_per_call(self) -> float:
        """Leviathan's expected tokens per target call ``(1 - a^(g+1)) / (1 - a)``."""
        gamma = round(self.mean_num_draft_tokens)
        if gamma < 1:
            return 0.0
        return expected_tokens_per_call(min(max(self.alpha, 0.0), 1.0), gamma)

    @property
    def other_time(self) -> float:
        """Wall time not in any of the four parts (setup, checks, Python overhead)."""
        return max(self.total_time - self.draft_time - self.target_time - self.verify_time - self.bookkeeping_time, 0.0)

    # ------------------------------------------------------------------- presentation
    def to_dict(self) -> dict[str, Any]:
        """Every counter and every derived value, as plain Python types."""
        data = asdict(self)
        for name in (
            "acceptance_rate", "acceptance_rate_per_position", "acceptance_by_rank", "alpha", "mean_accepted_length",
            "block_efficiency", "mean_num_draft_tokens", "draft_time_per_call", "target_time_per_call",
            "cost_ratio", "tokens_per_second", "predicted_speedup", "predicted_tokens_per_call", "other_time",
            "host_syncs_per_step",
        ):
            data[name] = getattr(self, name)
        return data

    def __str__(self) -> str:
        total = self.total_time or 1.0

        def share(t: float) -> str:
            return f"{t * 1000:9.1f} ms  {100.0 * t / total:5.1f}%"

        per_pos = " ".join(f"{r:.2f}" for r in self.acceptance_rate_per_position) or "-"
        lines = [
            f"SpeculativeStats  rule={self.rule}  drafter={self.drafter}  batch={self.batch_size}  "
            f"schedule={self.draft_schedule}  path={self.decode_path}",
            f"  new tokens            {self.new_tokens}   ({self.tokens_per_second:.1f} tok/s)",
            f"  steps / row-steps     {self.steps} / {self.row_steps}",
            f"  target calls          {self.target_calls}  (prefill {self.target_prefill_calls})",
            f"  draft calls           {self.draft_calls}",
            f"  drafted / accepted    {self.drafted_tokens} / {self.accepted_tokens}  "
            f"(acceptance {self.acceptance_rate:.3f}, alpha {self.alpha:.3f})",
            f"  per position          {per_pos}",
            f"  mean gamma            {self.mean_num_draft_tokens:.2f}",
            f"  mean accepted length  {self.mean_accepted_length:.3f}",
            f"  block efficiency      {self.block_efficiency:.3f} new tokens / target call / row",
            f"  cost ratio c          {self.cost_ratio:.3f}",
            f"  predicted speedup     {self.predicted_speedup:.2f}x (Leviathan, measured alpha and c)",
            f"  host syncs            {self.host_syncs}  ({self.host_syncs_per_step:.2f} per step)",
            "  time",
            f"    draft               {share(self.draft_time)}",
            f"    target              {share(self.target_time)}",
            f"    verify              {share(self.verify_time)}",
            f"    bookkeeping         {share(self.bookkeeping_time)}  (alignment {self.alignment_time * 1000:.1f} ms,"
            f" {self.repacks} re-packs)",
            f"    other               {share(self.other_time)}",
            f"    total               {self.total_time * 1000:9.1f} ms",
        ]
        return "\n".join(lines)
