"""Counting host synchronisations: every place where the engine waits for the device goes
through one :class:`HostSyncs`, so ``SpeculativeStats.host_syncs`` says how often a generation
stalled the host.

A *host synchronisation* is a point where the host needs a value computed on the device (a
tensor read with ``.cpu()``, ``int()``, ``bool()``), or waits for the device on purpose
(``torch.cuda.synchronize`` for a timing, waiting on a CUDA event). On a GPU each one drains the
queue of launched work; on the CPU nothing is asynchronous, so the count there is the number of
such points the same code would hit on a GPU (which is what the CPU tests check).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


class HostSyncs:
    """A counter of host synchronisations, split into those made inside decoding steps and the
    rest (setup, prefill, the final read of the results)."""

    def __init__(self) -> None:
        self.total = 0
        self.in_steps = 0
        self.stepping = False

    def count(self, n: int = 1) -> None:
        """Record ``n`` synchronisations made elsewhere (a wait on an event, one inside an op)."""
        self.total += n
        if self.stepping:
            self.in_steps += n

    def fetch(self, tensor: Tensor) -> Tensor:
        """``tensor`` on the host (one synchronisation)."""
        self.count()
        return tensor.cpu()

    def flag(self, tensor: Tensor) -> bool:
        """``bool(tensor)`` of a one-element tensor (one synchronisation)."""
        self.count()
        return bool(tensor)

    def integer(self, tensor: Tensor) -> int:
        """``int(tensor)`` of a one-element tensor (one synchronisation)."""
        self.count()
        return int(tensor)

    def synchronize(self, devices: Any) -> None:
        """Wait for every CUDA device in ``devices`` (one synchronisation per device)."""
        for device in devices:
            torch.cuda.synchronize(device)
            self.count()
