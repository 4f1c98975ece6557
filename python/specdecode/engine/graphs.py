"""Running a decoding step made of phases: eagerly, compiled, or recorded once as CUDA graphs
and replayed.

A *phase* is a Python function over persistent tensors (it reads and writes buffers whose
addresses never change, and keeps the tensors it produces as attributes of its owner). Such a
function can run as it is (the CPU, or ``decode_path="static"``), compiled by ``torch.compile``
(:mod:`specdecode.engine.compiled`, ``decode_path="compiled"``), or be recorded into a CUDA
graph whose replay repeats the same kernels on the current contents of those buffers, without
any Python, module dispatch or per-kernel launch (``decode_path="graphed"``; ``"compiled"``
records the compiled phases on CUDA).

:class:`StepProgram` does each. With CUDA graphs, the first call runs the phases eagerly on a
side stream (a real step, and the warm-up that graph capture needs: lazy library handles,
workspace allocations), then records them: one graph for the whole step, or one graph per
phase when per-phase timings are wanted. Later calls replay. A step whose shapes change with a
host-known *variant* (the attended width of a chain step,
:mod:`specdecode.engine.attention_widths`) keeps one recording per variant, made the first time
:meth:`StepProgram.run` is given that variant. Compiled, the first call runs the
phases eagerly (it makes whatever buffers they create on first use), the second compiles them
(and on CUDA, runs them on a side stream and records them); later calls run the compiled code
(CPU) or replay (CUDA). A program whose second run changes nothing (``idempotent``: the
prefill) compiles in its first call, right after the eager run. Phase times come from CUDA
events recorded between replays (no synchronisation) and are read once at the end; on the CPU
they come from the host clock.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Hashable
from typing import Any, Callable

import torch


class StepProgram:
    """The phases of one step, run eagerly, compiled or as CUDA graphs.

    ``phases`` are ``(name, fn)`` pairs run in order. ``graphed`` records them into CUDA graphs
    (CUDA only); ``compiled`` compiles them with ``torch.compile`` first
    (:func:`~specdecode.engine.compiled.compile_phase`): the whole step as one function, or each
    phase alone with ``phase_timing``; ``phase_timing`` keeps one timing per phase (on CUDA: one
    graph per phase with an event between them; without it a graphed or compiled step is one
    graph or one compiled function and only the step's total is timed). ``idempotent``: running
    the phases twice in a row leaves what running them once does (a prefill, not a step), so a
    compiled program compiles in its first call. ``runs`` counts the calls of :meth:`run`.
    ``host``: a function run eagerly at the start of every :meth:`run`, outside any graph or
    compiled code (before the warm-up and the capture too): the step's host work, e.g. a host
    drafter filling the buffers the phases read (:mod:`specdecode.engine.host_drafts`).

    Graphed, :meth:`run`'s ``variant`` (hashable, e.g. the attended width) selects one recording
    of the phases among several, each made the first time its variant runs (:attr:`captures`
    counts them). ``owners``: the objects whose attributes the phases set to the tensors they
    produce (a step's :class:`~specdecode.engine.static_state.StepScratch`); after a recording
    those attributes would name the recorded variant's tensors whichever variant replays next, so
    the program snapshots them (``vars(owner)``) after each recording and restores the variant's
    snapshot before each replay; after a recording it restores the warm-up step's results (the
    recording itself ran nothing). What the host reads between steps is then always the last
    step's. The recordings share one memory pool: they never run concurrently (one stream), and
    the only pool tensors read after a replay (by the host or the next step) are the replayed
    variant's own outputs, which the snapshots keep allocated, so no later recording reuses them.
    """

    def __init__(self, phases: list[tuple[str, Callable[[], None]]], device: torch.device, *, graphed: bool,
                 phase_timing: bool, syncs: Any = None, compiled: bool = False, idempotent: bool = False,
                 host: Callable[[], None] | None = None, owners: tuple[Any, ...] = ()) -> None:
        from specdecode.engine.compiled import compile_phase, in_sequence

        if graphed and device.type != "cuda":
            raise ValueError(f"decode_path='graphed' needs a CUDA device, got {device}")
        self.eager_phases = phases
        self.compiled = compiled
        # the phases as later calls run them: compiled once the first, eager call made their buffers
        self.phases = phases
        if compiled:
            groups = phases if phase_timing or len(phases) == 1 else [("step", in_sequence(phases))]
            self.phases = [(name, compile_phase(name, fn)) for name, fn in groups]
        self.host = host
        self.runs = 0
        self.idempotent = idempotent
        self.device = device
        self.graphed = graphed
        self.phase_timing = phase_timing
        self.owners = tuple(owners)
        # variant -> (its graphs, a snapshot of every owner's attributes after its recording)
        self.recorded: dict[Hashable, tuple[list[torch.cuda.CUDAGraph], list[dict[str, Any]]]] = {}
        self.variant: Hashable = None  # the variant of the last run
        self._pool: Any = None  # one graph memory pool for every variant
        self.seconds = {name: 0.0 for name, _ in phases}
        self.step_seconds = 0.0
        self._events: list[list[torch.cuda.Event]] = []
        self.captures = 0
        self.syncs = syncs  # a HostSyncs: recording a graph synchronises the device first

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def graphs(self) -> list[torch.cuda.CUDAGraph] | None:
        """The graphs of the last run's variant (None before it was recorded)."""
        recorded = self.recorded.get(self.variant)
        return None if recorded is None else recorded[0]

    def run(self, variant: Hashable = None) -> None:
        """One step; graphed, the recording of ``variant`` replays (recorded first if new)."""
        first = self.runs == 0
        self.runs += 1
        if self.host is not None:
            self.host()
        if self.compiled and first:
            self._run_eager(self.eager_phases)  # makes what the phases create on first use
            if not self.idempotent:
                return  # compiled by the next step
        self.variant = variant
        if not self.graphed:
            self._run_eager(self.phases)
        elif variant not in self.recorded:
            self._warm_up_and_capture()
        else:
            self._replay()

    # ------------------------------------------------------------------ eager
    def _run_eager(self, phases: list[tuple[str, Callable[[], None]]]) -> None:
        if self.cuda:
            marks = self._mark() if self.phase_timing else self._mark(1)
            for i, (_, fn) in enumerate(phases):
                fn()
                if self.phase_timing:
                    marks[i + 1].record()
            if not self.phase_timing:
                marks[1].record()
            return
        start = time.perf_counter()
        for name, fn in phases:
            t0 = time.perf_counter()
            fn()
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0
        self.step_seconds += time.perf_counter() - start

    # ------------------------------------------------------------------ CUDA graphs
    def _warm_up_and_capture(self) -> None:
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _, fn in self.phases:  # the first step, run for real
                fn()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        results = self._snapshot()  # this step's results: the recording below runs nothing
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        pool = self._pool
        groups = [[fn] for _, fn in self.phases] if self.phase_timing else [[fn for _, fn in self.phases]]
        graphs = []
        # No cyclic garbage collection while recording: a collection that frees an earlier
        # generation's graph destroys it mid-capture, which CUDA forbids and which invalidates the
        # capture. (An H200 run saw a graph reset during a capture, then the capture fail, once,
        # with tests run one after another in one process.) torch.cuda.graph collects first.
        collecting = gc.isenabled()
        gc.disable()
        try:
            for group in groups:
                graph = torch.cuda.CUDAGraph()
                if self.syncs is not None:
                    self.syncs.count()
                with torch.cuda.graph(graph, pool=pool):
                    for fn in group:
                        fn()
                graphs.append(graph)
        except Exception as exc:  # noqa: BLE001 - re-raised with what to do about it
            path = "compiled" if self.compiled else "graphed"
            raise RuntimeError(
                f"decode_path={path!r}: recording the decoding step as a CUDA graph failed (some operation in the "
                f"models' forward synchronises with the host or changes shape): {exc}. decode_path='static' runs "
                "the same step without graphs"
            ) from exc
        finally:
            if collecting:
                gc.enable()
        self.recorded[self.variant] = (graphs, self._snapshot())
        self._restore(results)
        self.captures += 1

    def _replay(self) -> None:
        graphs, outputs = self.recorded[self.variant]
        self._restore(outputs)  # the owners name this variant's tensors, which its replay writes
        marks = self._mark() if self.phase_timing else self._mark(len(graphs))
        for i, graph in enumerate(graphs):
            graph.replay()
            marks[i + 1].record()

    def _snapshot(self) -> list[dict[str, Any]]:
        return [dict(vars(owner)) for owner in self.owners]

    def _restore(self, snapshot: list[dict[str, Any]]) -> None:
        for owner, attributes in zip(self.owners, snapshot):
            for name, value in attributes.items():
                setattr(owner, name, value)

    def _mark(self, phases: int | None = None) -> list[torch.cuda.Event]:
        n = len(self.phases) if phases is None else phases
        marks = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
        marks[0].record()
        self._events.append(marks)
        return marks

    def collect_timings(self) -> None:
        """Fold the recorded CUDA events into :attr:`seconds` / :attr:`step_seconds`; call after
        the device finished every recorded step (the results were read)."""
        for marks in self._events:
            self.step_seconds += marks[0].elapsed_time(marks[-1]) / 1000.0
            if len(marks) == len(self.phases) + 1:
                for i, (name, _) in enumerate(self.phases):
                    self.seconds[name] = self.seconds.get(name, 0.0) + marks[i].elapsed_time(marks[i + 1]) / 1000.0
        self._events = []

    def reset_timings(self) -> None:
        self.seconds = {name: 0.0 for name, _ in self.eager_phases}
        self.step_seconds = 0.0
        self._events = []
