"""How both decode paths account a generation in :class:`~specdecode.engine.stats.SpeculativeStats`.

A chain step is summed up in one vector of counters (:func:`step_counters`): the eager loop
computes it from the step's results on the host, the static path adds it up on the device step
after step (inside CUDA graphs) and reads the sum once at the end. :func:`add_step_counters`
turns either into the statistics, so that both paths count steps, drafts and acceptances by the
same definitions (those of ``SpeculativeStats``' docstring). Token trees add counts by depth and
by child rank (:func:`count_tree_step`).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Protocol

import torch
from torch import Tensor

from specdecode.engine.stats import SpeculativeStats
from specdecode.engine.syncs import HostSyncs
from specdecode.trees import TokenTree

#: Counters before the per-position ones in a :func:`step_counters` vector: steps with an
#: active row, active rows, new tokens, verified drafts, accepted drafts, rejections.
FIXED_COUNTERS = 6


def num_counters(num_drafts: int) -> int:
    """Length of a :func:`step_counters` vector for ``num_drafts`` drafts per step."""
    return FIXED_COUNTERS + 3 * num_drafts


def step_counters(active: Tensor, accepted: Tensor, verified: Tensor, keep: Tensor, positions: Tensor,
                  drafted: Tensor | None = None, rejected: Tensor | None = None) -> Tensor:
    """One chain step's counts, as ``[num_counters(k)]`` int64 on the tensors' device.

    ``active`` rows count; a row verified ``verified`` drafts, accepted ``accepted`` of them and
    kept ``keep`` new tokens (0 for inactive rows). ``positions`` is ``arange(k)``: the last
    ``3 k`` counters say how often each draft position was verified, then accepted, then
    reached (verified with every draft before it accepted). ``drafted`` / ``rejected``, when
    given, are the rows' verified drafts / rejections instead of ``verified`` and ``accepted <
    verified`` (for token trees: :func:`tree_step_counters`).

    Shape:
        active: ``[b]`` bool; accepted, verified, keep: ``[b]`` int64; drafted: ``[b]`` int64;
        rejected: ``[b]`` bool.
    """
    accepted = torch.where(active, accepted, 0)
    position = positions[None, :]
    drafted = verified if drafted is None else drafted
    rejected = active & (accepted < verified) if rejected is None else rejected
    return torch.cat([
        torch.stack([active.any().long(), active.sum(), keep.sum(), drafted.sum(), accepted.sum(), rejected.sum()]),
        (verified[:, None] > position).sum(0), (accepted[:, None] > position).sum(0),
        ((verified[:, None] > position) & (accepted[:, None] >= position)).sum(0),
    ])


def tree_step_counters(active: Tensor, accepted: Tensor, depth: Tensor, keep: Tensor, positions: Tensor,
                       drafted: Tensor, stopped_early: Tensor) -> Tensor:
    """One token-tree step's counts in the :func:`step_counters` layout, by the definitions of
    :func:`count_tree_step`: the verified drafts are the tree's nodes below the root
    (``drafted``), a rejection is a row whose accepted path stops at a node with children
    (``stopped_early``), positions are depths (``depth``: each row's tree depth, 0 for a step
    that drafted nothing).

    Shape:
        active, stopped_early: ``[b]`` bool; accepted, depth, keep, drafted: ``[b]`` int64.
    """
    counted = active & (depth > 0)
    return step_counters(active, accepted, depth, keep, positions, drafted=torch.where(counted, drafted, 0),
                         rejected=counted & stopped_early)


def counted_drafts(active: Tensor, remaining: Tensor, accepted: Tensor, verified: Tensor) -> tuple[Tensor, Tensor]:
    """What the eager loop counts of a step, as ``(accepted, verified)`` ``[b]`` int64: it drafts
    nothing (a plain step: no drafts verified or accepted) when no active row has two tokens
    left to generate (``remaining`` before the step), and drafts otherwise, whatever the length
    then cuts. The static path drafts every step; it counts its steps through this.

    Shape:
        active: ``[b]`` bool; remaining, accepted, verified: ``[b]`` int64.
    """
    drafting = (active & (remaining >= 2)).any()
    return torch.where(drafting, accepted, 0), torch.where(drafting, verified, 0)


def record_accepted_lengths(stats: SpeculativeStats, accepted: list[int]) -> None:
    """Keep one step's accepted lengths, one per active row (``stats.accepted_lengths``)."""
    stats.accepted_lengths.append([int(a) for a in accepted])


def record_logged_lengths(stats: SpeculativeStats, log: Tensor) -> None:
    """Keep the accepted lengths the static path logged on the device, one step per row of
    ``log`` (read on the host), -1 for a row that was not active; steps with no active row
    (masked steps after every row finished) are not steps and are left out.

    Shape:
        log: ``[steps, b]`` int64.
    """
    for row in log.tolist():
        accepted = [a for a in row if a >= 0]
        if accepted:
            record_accepted_lengths(stats, accepted)


def add_step_counters(stats: SpeculativeStats, counters: list[int], num_drafts: int) -> None:
    """Add a (sum of) :func:`step_counters` vector(s), read on the host, to ``stats``; steps with
    no drafts (``num_drafts`` 0: plain decoding, or a token tree counted by
    :func:`count_tree_step`) add steps and tokens only."""
    stats.steps += counters[0]
    stats.row_steps += counters[1]
    stats.new_tokens += counters[2]
    if num_drafts == 0:
        return
    stats.drafted_tokens += counters[3]
    stats.accepted_tokens += counters[4]
    stats.rejections += counters[5]
    for lst in (stats.position_drafted, stats.position_accepted, stats.position_reached):
        _grow(lst, num_drafts - 1)
    for i in range(num_drafts):
        stats.position_drafted[i] += counters[FIXED_COUNTERS + i]
        stats.position_accepted[i] += counters[FIXED_COUNTERS + num_drafts + i]
        stats.position_reached[i] += counters[FIXED_COUNTERS + 2 * num_drafts + i]


def count_tree_step(stats: SpeculativeStats, tree: TokenTree, accepted: Tensor, nodes: Tensor,
                    syncs: HostSyncs) -> None:
    """Add one token-tree step: drafts and acceptances, acceptance by depth and by child rank
    (what Sequoia's shape is planned from).

    Shape:
        accepted: ``[b]`` int64 on the host, each row's accepted depth; nodes: ``[b, D + 1]``
        int64 on the host, the nodes of each row's accepted path (root first).
    """
    parents, num, depth = (syncs.fetch(t) for t in (tree.parents, tree.num_nodes, tree.depth))
    N = parents.shape[1]
    index = torch.arange(N)
    real = index[None, :] < num[:, None]
    same = (parents[:, :, None] == parents[:, None, :]) & real[:, None, :] & (index[None, None, :] < index[None, :, None])
    rank = same.sum(2)  # rank of each node among its siblings
    children = ((parents[:, None, :] == index[None, :, None]) & real[:, None, :]).sum(2)  # [b, N]
    for row in range(parents.shape[0]):
        tau = int(accepted[row])
        path = nodes[row, : tau + 1].tolist()
        max_depth = int((depth[row] * real[row]).max())
        for d in range(max_depth):
            _bump(stats.position_drafted, d)
            if d < tau:
                _bump(stats.position_accepted, d)
            else:
                _grow(stats.position_accepted, d)
            if d <= tau:
                _bump(stats.position_reached, d)
            else:
                _grow(stats.position_reached, d)
        for j in range(tau):
            r = int(rank[row, path[j + 1]])
            for q in range(r + 1):
                _bump(stats.rank_tried, q)
            _bump(stats.rank_accepted, r)
        stop = path[-1]
        for q in range(int(children[row, stop])):
            _bump(stats.rank_tried, q)
        if int(children[row, stop]) > 0:
            stats.rejections += 1
        stats.drafted_tokens += int(num[row]) - 1
        stats.accepted_tokens += tau
    for lst in (stats.rank_tried, stats.rank_accepted):
        _grow(lst, max(len(stats.rank_tried), len(stats.rank_accepted)) - 1)


def label_run(stats: SpeculativeStats, *, rule: str, drafter: Any, batch_size: int, schedule: str,
              decode_path: str, settings: Any = None) -> None:
    """Name what generated: the rule, the drafter, the batch size, the draft schedule, the path;
    with ``settings`` (the run's ``EngineSettings``) also the sampling settings, the seed of its
    generator, the rule's options, the configured draft length and the drafter's tree shape."""
    stats.rule = rule
    stats.drafter = name_of(drafter)
    stats.batch_size = batch_size
    stats.draft_schedule = schedule
    stats.decode_path = decode_path
    if settings is None:
        return
    sampling = settings.sampling
    stats.sampling = {"temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p,
                      "min_p": sampling.min_p}
    stats.seed = settings.generator.initial_seed() if settings.generator is not None else None
    stats.rule_options = dict(settings.rule_options)
    stats.num_draft_tokens = settings.schedule.initial
    builder = getattr(drafter, "tree", None)
    describe = getattr(builder, "describe", None)
    stats.tree_shape = describe(sampling) if callable(describe) else ""


def name_of(obj: Any) -> str:
    """The ``name`` a drafter or a schedule shows in statistics, else its class name."""
    return getattr(obj, "name", type(obj).__name__)


def count_prefill(stats: SpeculativeStats, seconds: float) -> None:
    """Add the target's prefill forward (over the prompt) that took ``seconds``."""
    stats.target_calls += 1
    stats.target_prefill_calls += 1
    stats.target_time += seconds
    stats.target_prefill_time += seconds


def count_syncs(stats: SpeculativeStats, syncs: HostSyncs) -> None:
    """Add the host synchronisations ``syncs`` counted."""
    stats.host_syncs += syncs.total
    stats.step_host_syncs += syncs.in_steps


class Engine(Protocol):
    """What :func:`timed_run` needs of an engine."""

    stats: SpeculativeStats

    def generate(self, input_ids: Tensor, attention_mask: Tensor | None) -> Tensor: ...

    def clock(self) -> float: ...


def timed_run(make_engine: Callable[[], Engine], input_ids: Tensor, attention_mask: Tensor | None,
              stats: SpeculativeStats | None, start_time: float | None) -> tuple[Tensor, SpeculativeStats]:
    """Generate with the engine ``make_engine`` builds around ``stats``; returns ``(sequences,
    stats)``. ``stats.total_time`` grows by the time since ``start_time`` (a
    ``time.perf_counter()`` value taken when the caller started checking its arguments), or since
    now: a ``stats`` passed in accumulates over calls like every other counter."""
    if stats is not None and not isinstance(stats, SpeculativeStats):
        raise TypeError(f"stats: expected a SpeculativeStats or None, got {type(stats).__name__}")
    start = time.perf_counter() if start_time is None else start_time
    engine = make_engine()
    total_before = engine.stats.total_time
    sequences = engine.generate(input_ids, attention_mask)
    engine.stats.total_time = total_before + (engine.clock() - start)
    return sequences, engine.stats


def _grow(values: list[int], index: int) -> None:
    while len(values) <= index:
        values.append(0)


def _bump(values: list[int], index: int) -> None:
    _grow(values, index)
    values[index] += 1
