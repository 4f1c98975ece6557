"""Speculative generation with Hugging Face models.

- :func:`generate`: ``specdecode.generate(target, draft, input_ids, attention_mask, ...)``.
- :func:`custom_generate`: ``target.generate(**inputs, custom_generate=specdecode.custom_generate,
  draft_model=draft, ...)``.
- :class:`SpeculativeStats`: counters, acceptance and the time split of one generation.
- Draft length schedules: ``"constant"``, ``"heuristic"``, ``"optimal"`` or a :class:`DraftSchedule`.
"""

from specdecode.generation.hf import check_compatibility, custom_generate
from specdecode.generation.loop import SpeculativeOutput, generate
from specdecode.generation.schedules import (
    ConstantSchedule,
    DraftSchedule,
    HeuristicSchedule,
    OptimalSchedule,
    make_schedule,
)
from specdecode.generation.stats import SpeculativeStats

__all__ = [
    "ConstantSchedule",
    "DraftSchedule",
    "HeuristicSchedule",
    "OptimalSchedule",
    "SpeculativeOutput",
    "SpeculativeStats",
    "check_compatibility",
    "custom_generate",
    "generate",
    "make_schedule",
]
