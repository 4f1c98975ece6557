"""The generation engine: batch layout (:mod:`~specdecode.engine.batch`), one step =
propose -> score -> verify -> commit on two decode paths: the eager loop
(:mod:`~specdecode.engine.loop`, its drafter's view in :mod:`~specdecode.engine.draft_view`) and
the static path (:mod:`~specdecode.engine.static_loop`: fixed-shape device-side steps over
:mod:`~specdecode.engine.static_state`, refusals in :mod:`~specdecode.engine.static_checks`, run
eagerly or as CUDA graphs by :mod:`~specdecode.engine.graphs`). What both paths do alike is
shared: the score and verify phases (:mod:`~specdecode.engine.step_phases`), stopping on EOS and
``max_new_tokens`` (:mod:`~specdecode.engine.stopping`) and the statistics' accounting
(:mod:`~specdecode.engine.accounting`). Hugging Face processors and stopping criteria
(:mod:`~specdecode.engine.processors`), draft-length schedules, statistics and settings complete
it. It knows drafters only through :class:`specdecode.drafters.Drafter` and
:class:`specdecode.drafters.StaticDrafter`."""

from specdecode.engine.draft_view import DraftView
from specdecode.engine.loop import SpeculativeEngine, run_engine
from specdecode.engine.schedules import (
    AdaptiveSchedule,
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
    "AdaptiveSchedule",
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
