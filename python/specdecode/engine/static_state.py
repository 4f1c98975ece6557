"""The persistent buffers of one layout of the static decode path: :class:`StaticState`,
what a :class:`~specdecode.drafters.StaticDrafter` reads and samples with
(:class:`~specdecode.drafters.StaticDraftState`; for token trees
:class:`~specdecode.drafters.StaticTreeDraftState`). Its tensors keep their addresses for the
layout's lifetime, so CUDA graphs recorded over them replay on their current contents.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor

from specdecode._ops import ops
from specdecode.engine.syncs import HostSyncs
from specdecode.sampling import SamplingParams


class StepScratch:
    """The tensors one phase of a static step hands to the next, as attributes (the same ones at
    every step, so that a compiled phase finds the same object layout each time, where a dict
    would change its keys on the first step). A chain step sets ``draft_tokens``,
    ``draft_logits``, ``target_logits``, ``tokens``, ``accepted`` and ``verified``; a tree step
    also ``tree``, ``depths``, ``drafted`` and ``stopped_early``
    (:mod:`specdecode.engine.static_tree`)."""

    def __init__(self) -> None:
        self.draft_tokens: Tensor | None = None
        self.draft_logits: Tensor | None = None
        self.target_logits: Tensor | None = None
        self.tokens: Tensor | None = None
        self.accepted: Tensor | None = None
        self.verified: Tensor | None = None
        self.tree: Any = None
        self.depths: Tensor | None = None
        self.drafted: Tensor | None = None
        self.stopped_early: Tensor | None = None


class StaticState:
    """The persistent buffers of one static layout (the drafter's
    :class:`~specdecode.drafters.StaticDraftState`).

    Shape:
        features: ``[B, capacity, F]`` or None — the target's features at every column, for a
            drafter with ``feature_layers`` (:mod:`specdecode.engine.static_features`, which
            allocates and writes it); None otherwise.
    """

    def __init__(self, batch: int, capacity: int, vocab_size: int, sampling: SamplingParams, device: torch.device,
                 syncs: HostSyncs) -> None:
        self._batch, self._capacity, self._vocab, self._sampling, self._device = (
            batch, capacity, vocab_size, sampling, device)
        self.syncs = syncs
        self.prompt_width = 0
        self._tokens = torch.zeros((batch, capacity), dtype=torch.long, device=device)
        self._lengths = torch.zeros(batch, dtype=torch.long, device=device)
        self._start = torch.zeros(batch, dtype=torch.long, device=device)
        self.philox_seed = torch.zeros(1, dtype=torch.long, device=device)
        self.philox_offset = torch.zeros(1, dtype=torch.long, device=device)
        self.features: Tensor | None = None
        self._store: dict[str, Any] = {}

    tokens = property(lambda self: self._tokens)
    lengths = property(lambda self: self._lengths)
    start = property(lambda self: self._start)
    capacity = property(lambda self: self._capacity)
    prompt_columns = property(lambda self: self.prompt_width - 1)
    batch_size = property(lambda self: self._batch)
    vocab_size = property(lambda self: self._vocab)
    device = property(lambda self: self._device)
    sampling = property(lambda self: self._sampling)

    def sample(self, logits: Tensor) -> Tensor:
        """One token per row from ``logits [B, V]``: the argmax when greedy, else drawn with the
        coins of the generation's Philox counter, which advances on the device."""
        if self._sampling.is_greedy:
            return logits.argmax(-1)
        tokens = ops.sample_logits_philox(logits, self.philox_seed, self.philox_offset, *self._sampling.op_args())
        self.philox_offset.add_(1)
        self.count_op_sync()
        return tokens.clamp_min(0)  # a bad row (only possible inside a graph) must not index out of range

    def sample_weights(self, weights: Tensor) -> Tensor:
        """One token per row drawn in proportion to ``weights`` (>= 0, some mass in every row;
        e.g. a processed ``q`` with tokens already drawn set to 0), unprocessed (no temperature or
        filters), with the coins of the generation's Philox counter, which advances on the device.

        Shape:
            weights: ``[M, V]`` float64; returns ``[M]`` int64.
        """
        tokens = ops.sample_logits_philox(weights.log(), self.philox_seed, self.philox_offset, 1.0, 0, 1.0, 0.0)
        self.philox_offset.add_(1)
        self.count_op_sync()
        return tokens.clamp_min(0)

    def count_op_sync(self) -> None:
        """Count the host synchronisation of a CUDA Philox op just run: outside graph capture it
        copies its per-row statuses to the host. Not counted inside compiled code
        (``decode_path="compiled"``), whose calls on CUDA are the one warm-up step before the
        capture."""
        if (self._device.type == "cuda" and not torch.compiler.is_compiling()
                and not torch.cuda.is_current_stream_capturing()):
            self.syncs.count()

    def buffer(self, name: str, factory: Callable[[], Any]) -> Any:
        """The drafter's persistent buffer ``name``, made by ``factory`` on first use."""
        if name not in self._store:
            self._store[name] = factory()
        return self._store[name]
