"""The generation engine: batch layout (:mod:`~specdecode.engine.batch`), one step =
propose -> score -> verify -> commit (:mod:`~specdecode.engine.loop`), Hugging Face
processors and stopping criteria (:mod:`~specdecode.engine.processors`), draft-length
schedules, statistics and settings; the static decode path (:mod:`~specdecode.engine.static_loop`:
fixed-shape device-side steps, run eagerly or as CUDA graphs by :mod:`~specdecode.engine.graphs`).
It knows drafters only through :class:`specdecode.drafters.Drafter` and
:class:`specdecode.drafters.StaticDrafter`."""

from specdecode.engine.loop import DraftView, SpeculativeEngine, run_engine
from specdecode.engine.schedules import (
    ConstantSchedule,
    DraftSchedule,
    HeuristicSchedule,
    OptimalSchedule,
    make_schedule,
)
from specdecode.engine.settings import EngineSettings
from specdecode.engine.static_loop import StaticEngine, clear_static_sessions, run_static_engine
from specdecode.engine.stats import SpeculativeStats
from specdecode.engine.syncs import HostSyncs

__all__ = [
    "ConstantSchedule",
    "DraftSchedule",
    "DraftView",
    "EngineSettings",
    "HeuristicSchedule",
    "HostSyncs",
    "OptimalSchedule",
    "SpeculativeEngine",
    "SpeculativeStats",
    "StaticEngine",
    "clear_static_sessions",
    "make_schedule",
    "run_engine",
    "run_static_engine",
]
