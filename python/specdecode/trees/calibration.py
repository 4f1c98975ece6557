"""Online calibration of a draft's confidence against the acceptance measured while generating.

A value-based tree (EAGLE-2) ranks its nodes by *path value*: the product, along the path from
the root, of the probability that each node is accepted once its parent is. EAGLE-2 uses the
draft's own probability of the node's token for that factor. That is only right when the draft
is calibrated; a small draft usually is not (on the demo pair, at temperature 0, a top-1 token
the draft gives 0.5 is the target's choice about 80% of the time), and the raw values then
build wide, shallow trees.

:class:`AcceptanceCalibration` replaces the raw probability with the measured rate. It keeps
counts per cell ``(depth, rank, confidence bucket)``: how often a node of that depth, that rank
among its siblings (the draft's top-k order) and whose draft probability fell in that bucket
was *offered* (its parent was on the accepted path) and how often it was *accepted* (it is on
the accepted path itself). Offered-and-accepted is exactly the factor the path value needs:
``P(node accepted | parent accepted)``; siblings' events are disjoint, so the expected number
of accepted tokens of a tree is the sum of its nodes' path values.

Few counts per cell are measured in a short generation, so the estimate shrinks towards
coarser ones (each step of the hierarchy is a beta-binomial posterior mean)::

    prior(r, c)     = centre(c) ** g_r                                 (one exponent per rank)
    pooled(r, c)    = (A[r, c] + w0 * prior(r, c)) / (N[r, c] + w0)    (all depths together)
    rate(d, r, c)   = (A[d, r, c] + w1 * pooled(r, c)) / (N[d, r, c] + w1)

``centre(c)`` is the middle of bucket ``c`` (the raw draft value, EAGLE-2's factor). The
exponent ``g_r`` is fitted to every measurement of rank ``r`` (all buckets and depths) by
maximum likelihood over a grid, with a penalty that keeps it at 1 (no correction) while nothing
is measured; one number per rank is learned within the first steps and already moves every
bucket (an underconfident draft gets ``g < 1``: 0.15 ** 0.3 = 0.57), and each bucket and depth
then refines its own rate as its counts grow. ``A`` / ``N`` are accepted / offered counts;
``w0`` and ``w1`` are pseudo-counts. Rates are clamped to ``[1e-4, 1 - 1e-4]`` (a path value
never reaches 0 or 1). Tuned on the tuning prompts of :mod:`specdecode.prompt_sets` (demo
pair, temperature 0): the power prior with ``w0 = 16`` built better trees than the raw centre as
prior (``w0 = 2``) and than a Platt-scaled prior ``sigmoid(alpha * logit(centre) + beta)``.

The state belongs to one calibration object: a builder keeps one, so calibration is per
generation when ``generate`` builds the builder from ``tree="dynamic"``, and per drafter when
you pass your own builder (``ModelDrafter(model, tree=DynamicTree(16))``), which then keeps
learning across generations. Nothing is keyed by object identity.

>>> import torch
>>> cal = AcceptanceCalibration()
>>> probs = torch.tensor([[0.55]])
>>> depth, rank = torch.tensor([[1]]), torch.tensor([[0]])
>>> round(float(cal.predict(probs, depth, rank)), 3)      # nothing measured: the bucket centre
0.55
>>> cal.update(probs.expand(20, 1), depth.expand(20, 1), rank.expand(20, 1),
...            accepted=torch.ones(20, 1, dtype=torch.bool), offered=torch.ones(20, 1, dtype=torch.bool))
>>> round(float(cal.predict(probs, depth, rank)), 3)      # 20 of 20 accepted
0.981
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["AcceptanceCalibration", "DEFAULT_CONFIDENCE_EDGES", "POWER_PRIOR_SD", "RATE_CLAMP", "calibration_key",
           "power_grid"]

#: Upper edges of the confidence buckets (the last bucket ends at 1).
DEFAULT_CONFIDENCE_EDGES = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99)
#: Rates are clamped to ``[RATE_CLAMP, 1 - RATE_CLAMP]``.
RATE_CLAMP = 1e-4
#: The standard deviation of the Gaussian penalty on ``log g`` (:meth:`AcceptanceCalibration.powers`).
POWER_PRIOR_SD = 0.5


def power_grid() -> Tensor:
    """The exponents ``g`` :meth:`AcceptanceCalibration.powers` tries: 81 values in ``[0.05, 2.7]``
    (float64, log-spaced)."""
    return torch.exp(torch.linspace(-3.0, 1.0, 81, dtype=torch.float64))


def _check_weight(value: float, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name}: expected a positive number, got {value!r}")
    return float(value)


class AcceptanceCalibration:
    """Measured ``P(node accepted | parent accepted)`` per (depth, rank, draft-confidence
    bucket), learned online (module docstring).

    Args:
        confidence_edges: increasing upper edges of the buckets in ``(0, 1)``.
        max_depth: depths above it share the last depth's counts.
        max_rank: ranks above it share the last rank's counts.
        pooled_weight: ``w0``, pseudo-counts of the raw confidence in the depth-pooled rate.
        depth_weight: ``w1``, pseudo-counts of the pooled rate in each depth's rate.
    """

    def __init__(self, confidence_edges: Sequence[float] = DEFAULT_CONFIDENCE_EDGES, max_depth: int = 16,
                 max_rank: int = 3, pooled_weight: float = 16.0, depth_weight: float = 6.0) -> None:
        edges = [float(e) for e in confidence_edges]
        if not edges or any(not 0.0 < e < 1.0 for e in edges) or any(b <= a for a, b in zip(edges, edges[1:])):
            raise ValueError(f"confidence_edges: expected increasing values in (0, 1), got {list(confidence_edges)}")
        for name, value in (("max_depth", max_depth), ("max_rank", max_rank)):
            if isinstance(value, bool) or not isinstance(value, int) or value < (1 if name == "max_depth" else 0):
                raise ValueError(f"{name}: expected an int >= {1 if name == 'max_depth' else 0}, got {value!r}")
        self.edges = torch.tensor(edges, dtype=torch.float64)
        bounds = [0.0] + edges + [1.0]
        self.centres = torch.tensor([(a + b) / 2 for a, b in zip(bounds, bounds[1:])], dtype=torch.float64)
        self.max_depth, self.max_rank = max_depth, max_rank
        self.pooled_weight = _check_weight(pooled_weight, "pooled_weight")
        self.depth_weight = _check_weight(depth_weight, "depth_weight")
        self.reset()

    @property
    def num_buckets(self) -> int:
        return int(self.centres.numel())

    def reset(self) -> None:
        """Forget every measurement."""
        shape = (self.max_depth, self.max_rank + 1, self.num_buckets)
        self.offered = torch.zeros(shape, dtype=torch.float64)
        self.accepted = torch.zeros(shape, dtype=torch.float64)
        self._rates: Tensor | None = None

    def _cells(self, probs: Tensor, depth: Tensor, rank: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        if not isinstance(probs, Tensor) or not probs.dtype.is_floating_point:
            raise TypeError(f"probs: expected a floating tensor, got {getattr(probs, 'dtype', type(probs).__name__)}")
        for name, t in (("depth", depth), ("rank", rank)):
            if not isinstance(t, Tensor) or t.dtype != torch.int64:
                raise TypeError(f"{name}: expected an int64 tensor, got {getattr(t, 'dtype', type(t).__name__)}")
            if t.shape != probs.shape:
                raise ValueError(f"{name}: expected shape {tuple(probs.shape)} (that of probs), got {tuple(t.shape)}")
        bucket = torch.bucketize(probs.detach().double().cpu(), self.edges)
        d = (depth.cpu() - 1).clamp(0, self.max_depth - 1)
        r = rank.cpu().clamp(0, self.max_rank)
        return d, r, bucket

    def powers(self) -> Tensor:
        """``[max_rank + 1]`` float64: per rank, the exponent ``g`` for which ``centre ** g`` best
        explains every measurement of that rank (maximum likelihood over a grid, with a
        Gaussian penalty ``(log g)^2 / (2 * 0.5^2)`` that keeps ``g`` near 1 while data is scarce)."""
        grid = power_grid()
        rate = self.centres[None, :] ** grid[:, None]                                   # [G, C]
        offered, accepted = self.offered.sum(0), self.accepted.sum(0)                   # [R, C]
        loglik = accepted @ torch.log(rate).T + (offered - accepted) @ torch.log1p(-rate.clamp(max=1 - 1e-12)).T
        loglik = loglik - torch.log(grid)[None, :] ** 2 / (2 * POWER_PRIOR_SD ** 2)      # [R, G]
        return grid[loglik.argmax(1)]

    def rates(self) -> Tensor:
        """The calibrated rate of every cell, ``[max_depth, max_rank + 1, buckets]`` float64."""
        if self._rates is None:
            prior = self.centres[None, :] ** self.powers()[:, None]
            pooled = (self.accepted.sum(0) + self.pooled_weight * prior) / (self.offered.sum(0) + self.pooled_weight)
            rate = (self.accepted + self.depth_weight * pooled) / (self.offered + self.depth_weight)
            self._rates = rate.clamp(RATE_CLAMP, 1.0 - RATE_CLAMP)
        return self._rates

    def predict(self, probs: Tensor, depth: Tensor, rank: Tensor) -> Tensor:
        """Calibrated acceptance of nodes whose draft probability is ``probs``.

        Shape:
            probs: any shape, float; depth, rank: the same shape, int64 (depth >= 1, rank >= 0);
            returns the same shape, float32, on ``probs``' device.
        """
        d, r, bucket = self._cells(probs, depth, rank)
        return self.rates()[d, r, bucket].to(device=probs.device, dtype=torch.float32)

    def add_counts(self, offered: Tensor, accepted: Tensor) -> None:
        """Add counts measured elsewhere (the static decode path counts on the device), in the
        cells' layout ``[max_depth, max_rank + 1, buckets]``."""
        shape = tuple(self.offered.shape)
        for name, t in (("offered", offered), ("accepted", accepted)):
            if not isinstance(t, Tensor) or tuple(t.shape) != shape:
                raise ValueError(f"{name}: expected a tensor of shape {shape}, got {getattr(t, 'shape', t)!r}")
        if bool((accepted > offered).any()) or bool((accepted < 0).any()):
            raise ValueError("accepted: expected 0 <= accepted <= offered in every cell")
        self.offered += offered.to(self.offered)
        self.accepted += accepted.to(self.accepted)
        self._rates = None

    def update(self, probs: Tensor, depth: Tensor, rank: Tensor, accepted: Tensor, offered: Tensor) -> None:
        """Add the nodes where ``offered`` (their parent was accepted); ``accepted`` says which
        of them were accepted too.

        Shape:
            probs, depth, rank, accepted, offered: one shape; accepted and offered bool.
        """
        d, r, bucket = self._cells(probs, depth, rank)
        for name, t in (("accepted", accepted), ("offered", offered)):
            if not isinstance(t, Tensor) or t.dtype != torch.bool or t.shape != probs.shape:
                raise ValueError(f"{name}: expected a bool tensor of shape {tuple(probs.shape)}")
        if bool((accepted & ~offered).any()):
            raise ValueError("accepted: a node can be accepted only where offered (its parent was accepted)")
        where = offered.cpu()
        flat = ((d * (self.max_rank + 1) + r) * self.num_buckets + bucket)[where]
        size = self.offered.numel()
        self.offered += torch.bincount(flat, minlength=size).view_as(self.offered).double()
        hits = ((d * (self.max_rank + 1) + r) * self.num_buckets + bucket)[accepted.cpu()]
        self.accepted += torch.bincount(hits, minlength=size).view_as(self.accepted).double()
        self._rates = None


def calibration_key(calibration: AcceptanceCalibration) -> tuple:
    """What fixes a calibration's device layout and fit (part of a calibrated plan's key)."""
    return (tuple(float(e) for e in calibration.edges.tolist()), calibration.max_depth, calibration.max_rank,
            calibration.pooled_weight, calibration.depth_weight)
