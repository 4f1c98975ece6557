"""The batch as the eager loop's drafter sees it: :class:`DraftView`, the
:class:`~specdecode.drafters.DraftState` of :class:`~specdecode.engine.loop.SpeculativeEngine`.

It reads the live batch layout (:mod:`specdecode.engine.batch`) without copying it, draws the
generation's uniforms and runs Hugging Face logits processors on draft logits, so that a drafter
samples its proposals as the target's processed distribution would be sampled.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specdecode.engine.batch import BatchState
from specdecode.engine.processors import ProcessorRunner
from specdecode.engine.settings import EngineSettings
from specdecode.engine.stats import Clock
from specdecode.sampling import SamplingParams


class DraftView:
    """The :class:`~specdecode.drafters.DraftState` the engine hands to its drafter."""

    def __init__(self, batch: BatchState, settings: EngineSettings, processors: ProcessorRunner,
                 clock: Clock) -> None:
        self._batch, self._settings, self._processors, self._clock = batch, settings, processors, clock

    @property
    def tokens(self) -> Tensor:
        return self._batch.tokens

    @property
    def attention_mask(self) -> Tensor:
        return self._batch.mask

    @property
    def positions(self) -> Tensor:
        return self._batch.positions

    @property
    def num_columns(self) -> int:
        return self._batch.pending + 1

    @property
    def has_holes(self) -> bool:
        return self._batch.holes

    @property
    def row_ids(self) -> Tensor:
        return self._batch.rows

    @property
    def batch_size(self) -> int:
        return self._batch.num_active

    @property
    def vocab_size(self) -> int:
        return self._settings.vocab_size

    @property
    def device(self) -> torch.device:
        return self._batch.device

    @property
    def sampling(self) -> SamplingParams:
        return self._settings.sampling

    @property
    def generator(self) -> torch.Generator | None:
        return self._settings.generator

    def contexts(self) -> list[Tensor]:
        return self._batch.contexts()

    def uniforms(self, *shape: int) -> Tensor:
        gen = self._settings.generator
        device = gen.device if gen is not None else self._batch.device
        return torch.rand(shape, dtype=torch.float64, device=device, generator=gen).to(self._batch.device)

    def process_draft_logits(self, logits: Tensor, drafted: Tensor) -> Tensor:
        return self._processors.process(logits, drafted)

    def clock(self) -> float:
        return self._clock()
