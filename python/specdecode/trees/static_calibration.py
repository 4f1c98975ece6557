"""The EAGLE-2 calibration on the device: a calibrated :class:`~specdecode.trees.builders.DynamicTree`
ranks its nodes on the static decode path by the acceptance measured while generating, as it
does on the eager path (:mod:`specdecode.trees.calibration`), counted and re-fitted inside the
steps (no host read, so CUDA graphs record it).

A draft that is not calibrated (a small one usually gives its top token too little
probability) makes raw EAGLE-2 values build wide, shallow trees: on the demo pair, at
temperature 0 and 512 new tokens, a 16-node tree allowed 15 levels never grew past 6 and
accepted 5.9 tokens a step, where the calibrated eager builder's reached 13. So the static
tree values a node by ``log rate(depth, rank, confidence bucket)`` summed along its path, the
rate of :meth:`~specdecode.trees.calibration.AcceptanceCalibration.rates`, and keeps that
calibration up to date step by step:

- :class:`DeviceCalibration` (one per layout, in the state's buffers) holds the builder's
  offered / accepted counts by cell on the device, loaded before each generation
  (:func:`~specdecode.trees.static_draft.prepare_static_tree`, called by the drafter's ``static_prefill``) and handed back
  after it (only what this generation added:
  :func:`~specdecode.engine.static_tree.record_tree_acceptance`);
- each step's draft phase re-fits the rates from the counts (:meth:`DeviceCalibration.refit`:
  the power prior by rank over the same grid, then the two shrinkages, the eager formulas), and
  each level looks its candidates' factors up (:meth:`DeviceCalibration.log_factors`: the
  bucket of the draft's log-probability, one ``take`` from the table);
- the verify phase counts the step's nodes (:meth:`DeviceCalibration.count`): offered (the
  parent on the accepted path), accepted (on it), active rows only.

So within a generation the static builder learns as the eager one does between steps (one step
later: the eager builder's counts are the same, its trees stop growing early). Buckets are found
on log-probabilities against the logs of the bucket edges (float32): a probability within
rounding of an edge may fall in the neighbouring bucket.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from specdecode.trees.calibration import POWER_PRIOR_SD, RATE_CLAMP, AcceptanceCalibration, power_grid

__all__ = ["DeviceCalibration", "device_calibration"]


class DeviceCalibration:
    """Counts, constants and the fit of an :class:`~specdecode.trees.calibration.AcceptanceCalibration`
    with configuration ``key`` (:func:`~specdecode.trees.calibration.calibration_key`) on ``device``, for a dynamic plan of
    ``top_k`` children and ``max_depth`` levels (module docstring).

    Shape:
        offered, accepted: ``[max_depth, max_rank + 1, buckets]`` float64 counts on the device.
    """

    def __init__(self, key: tuple, top_k: int, max_depth: int, device: torch.device) -> None:
        edges, self.cal_depth, self.max_rank, self.pooled_weight, self.depth_weight = key
        self.cal = AcceptanceCalibration(edges, self.cal_depth, self.max_rank, self.pooled_weight, self.depth_weight)
        f64 = dict(dtype=torch.float64, device=device)
        grid = power_grid().to(device)
        centres = self.cal.centres.to(device)
        rate = centres[None, :] ** grid[:, None]  # [G, C], as AcceptanceCalibration.powers
        self.grid, self.centres = grid, centres
        self.log_rate_t = torch.log(rate).T.contiguous()
        self.log_miss_t = torch.log1p(-rate.clamp(max=1 - 1e-12)).T.contiguous()
        self.penalty = (torch.log(grid) ** 2 / (2 * POWER_PRIOR_SD ** 2))[None, :]
        self.log_edges = torch.log(torch.tensor(edges, **f64)).float()
        shape = (self.cal_depth, self.max_rank + 1, self.cal.num_buckets)
        self.offered, self.accepted = torch.zeros(shape, **f64), torch.zeros(shape, **f64)
        self._loaded = (torch.zeros(shape, dtype=torch.float64), torch.zeros(shape, dtype=torch.float64))
        C, R = self.cal.num_buckets, self.max_rank + 1
        ranks = torch.arange(top_k, device=device).clamp(max=self.max_rank)
        #: level d (1 .. max_depth): the cell of (d, rank) with bucket 0, by rank
        self.level_cells = [((min(d, self.cal_depth) - 1) * R + ranks) * C for d in range(1, max_depth + 1)]

    # ---------------------------------------------------------------- host side, between generations
    def load(self, calibration: AcceptanceCalibration) -> None:
        """Start a generation from ``calibration``'s counts (outside CUDA graphs)."""
        self.offered.copy_(calibration.offered)
        self.accepted.copy_(calibration.accepted)
        self._loaded = (calibration.offered.clone(), calibration.accepted.clone())

    def save(self, calibration: AcceptanceCalibration, syncs: Any) -> None:
        """Add to ``calibration`` what the device counted since :meth:`load` (or the last save):
        one read of the counts (``syncs.fetch``), outside the steps."""
        both = syncs.fetch(torch.stack([self.offered, self.accepted]))
        offered, accepted = both[0], both[1]
        calibration.add_counts(offered - self._loaded[0], accepted - self._loaded[1])
        self._loaded = (offered, accepted)

    # ---------------------------------------------------------------- device side, inside the steps
    def refit(self) -> Tensor:
        """The log rate of every cell from the current counts, ``[cells]`` float32 (flat
        ``[max_depth, max_rank + 1, buckets]``): :meth:`AcceptanceCalibration.rates`' formulas."""
        A, N = self.accepted, self.offered
        A_rc, N_rc = A.sum(0), N.sum(0)
        loglik = A_rc @ self.log_rate_t + (N_rc - A_rc) @ self.log_miss_t - self.penalty  # [R, G]
        g = self.grid.take(loglik.argmax(1))
        prior = self.centres[None, :] ** g[:, None]
        pooled = (A_rc + self.pooled_weight * prior) / (N_rc + self.pooled_weight)
        rate = (A + self.depth_weight * pooled) / (N + self.depth_weight)
        return rate.clamp(RATE_CLAMP, 1.0 - RATE_CLAMP).float().log().flatten()

    def log_factors(self, table: Tensor, log_q: Tensor, depth: int) -> tuple[Tensor, Tensor]:
        """The log factor of each child (by rank) of a level's frontier at ``depth``, and its cell.

        Shape:
            table: ``[cells]`` (:meth:`refit`); log_q: ``[B, f, k]`` the children's
            log-probabilities in rank order; returns two ``[B, f * k]`` tensors (float32, int64).
        """
        cells = (torch.bucketize(log_q, self.log_edges) + self.level_cells[depth - 1]).flatten(1)
        return table.take(cells), cells

    def count(self, cells: Tensor, parents: Tensor, accepted_nodes: Tensor, active: Tensor) -> None:
        """Count one step's trees (every row has all ``N`` nodes): the nodes whose parent is on
        the accepted path were offered, those on it accepted; rows not ``active`` count nothing.

        Shape:
            cells, parents: ``[B, N]`` int64; accepted_nodes: ``[B, D + 1]`` int64 (root first,
            ``-1`` padded); active: ``[B]`` bool.
        """
        B, N = parents.shape
        on_path = torch.zeros((B, N + 1), dtype=torch.bool, device=parents.device)
        on_path.scatter_(1, accepted_nodes.remainder(N + 1), True)  # -1 lands in the spare column N
        offered = on_path.gather(1, parents.clamp_min(0)) & (parents >= 0) & active[:, None]
        accepted = on_path[:, :N] & offered
        self.offered.view(-1).index_add_(0, cells.flatten(), offered.flatten().double())
        self.accepted.view(-1).index_add_(0, cells.flatten(), accepted.flatten().double())


def device_calibration(state: Any, plan: Any) -> DeviceCalibration | None:
    """The layout's :class:`DeviceCalibration` for a calibrated dynamic ``plan`` (made on first
    use, kept in ``state``'s buffers), None for other plans."""
    if plan.kind != "dynamic" or plan.calibration is None:
        return None
    return state.buffer(f"static_tree_calibration:{plan.key}",
                        lambda: DeviceCalibration(plan.calibration, plan.top_k, plan.max_depth, state.device))
