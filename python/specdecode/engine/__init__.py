"""The generation engine: batch layout (:mod:`~specdecode.engine.batch`), one step =
propose -> score -> verify -> commit (:mod:`~specdecode.engine.loop`), Hugging Face
processors and stopping criteria (:mod:`~specdecode.engine.processors`), draft-length
schedules, statistics and settings. It knows drafters only through
:class:`specdecode.drafters.Drafter`."""

from specdecode.engine.loop import DraftView, SpeculativeEngine, run_engine
from specdecode.engine.schedules import (
    ConstantSchedule,
    DraftSchedule,
    HeuristicSchedule,
    OptimalSchedule,
    make_schedule,
)
from specdecode.engine.settings import EngineSettings
from specdecode.engine.stats import SpeculativeStats

__all__ = [
    "ConstantSchedule",
    "DraftSchedule",
    "DraftView",
    "EngineSettings",
    "HeuristicSchedule",
    "OptimalSchedule",
    "SpeculativeEngine",
    "SpeculativeStats",
    "make_schedule",
    "run_engine",
]
