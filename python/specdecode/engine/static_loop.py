"""The static decode path: speculative decoding with no per-token host work.

:class:`~specdecode.engine.loop.SpeculativeEngine` decides on the host, step by step, what the
next forward looks like (how many columns, which rows, where the holes are), which costs several
host synchronisations and thousands of small launches per step. This engine fixes every shape
up front so that a whole step can be recorded once as CUDA graphs and replayed:

- **Static caches** (:mod:`specdecode.models.static_cache`): target and draft keep
  ``[B, H, capacity, D]`` keys/values with ``capacity >= prompt + max_new_tokens + gamma``.
  Row ``b``'s committed tokens are columns ``[start[b], lengths[b])``, its pending token sits at
  column ``lengths[b]``. A step writes the drafts at the next ``gamma`` columns of every row;
  rolling back the rejected ones is moving ``lengths[b]`` past the accepted ones only (no crop,
  no copy, no holes, no re-packing).
- **A fixed-size step** of four phases over persistent buffers: *draft* (the drafter's
  ``static_propose``: ``gamma`` draft forwards, each a one-token step except the first, which
  also re-feeds the last committed column), *score* (one target forward over ``gamma + 1``
  columns), *verify* (``verify_logits`` with Philox coins read from device tensors, the offset
  advanced on the device) and *commit* (EOS and length checks, output writes, length pointers,
  the next pending token, statistics counters: all tensor operations). Finished rows keep
  running, masked: their results are never written.
- **At most one host synchronisation per step**, to learn whether every row has finished;
  ``stop_check_every=k`` checks every ``k`` steps (``k >= max_new_tokens``: none at all, the
  loop runs ``max_new_tokens`` steps, the most any generation needs). On CUDA the check reads a
  flag copied asynchronously after the step *before* the one just launched, so the device never
  idles while the host waits (at worst ``k`` extra masked steps run at the end).

``decode_path="static"`` runs the phases eagerly (any device; this is what the CPU tests
exercise), ``decode_path="graphed"`` records them as CUDA graphs on the first step and replays
them (:mod:`specdecode.engine.graphs`; a chain step attends over a bucketed width that grows
with the steps taken, :mod:`specdecode.engine.attention_widths`, one graph per bucket reached,
and the static path attends over the same widths), ``decode_path="compiled"`` compiles them with
``torch.compile`` (:mod:`specdecode.engine.compiled`; on CUDA it then records the compiled
phases as CUDA graphs). Graphs, compiled code, caches and buffers are kept for the next
generation with the same shapes (:mod:`specdecode.engine.static_layouts`: the
:data:`SESSION_CACHE_SIZE` most recent layouts per target, freed with their models;
:func:`clear_static_sessions` frees them all). With ``draft=None`` the same path decodes the target alone
(one target forward per token): the baseline the speculative gain is measured against.

On the graphed and compiled paths the prompt block is rounded up to a multiple of
:data:`PROMPT_MULTIPLE` columns (more left padding, never attended), so that every prompt of a
*bucket* shares one layout, and the target's prefill is one more program of that layout
(a :class:`~specdecode.engine.graphs.StepProgram`): compiled, or recorded as a CUDA graph and
replayed, like the steps. The drafter's own prefill runs eagerly.

Token trees run here too, with a node budget fixed before the generation: their draft, score
and verify phases are :mod:`specdecode.engine.static_tree`'s, the commit phase is the chain's
(draft models, and the feature drafters EAGLE, Medusa and Hydra).

Not supported here (``ValueError``, use the eager path): Hugging Face logits processors,
stopping criteria, streamers, adaptive draft schedules, Python rules, drafters without
:class:`~specdecode.drafters.StaticDrafter` (or, for trees,
:class:`~specdecode.drafters.StaticTreeDrafter`) other than host drafters of deterministic
chains and tries (:mod:`~specdecode.engine.host_drafts`: NgramDrafter and SuffixDrafter propose on
the host before each step, into buffers the step reads), sharded or offloaded models, models that
ignore custom 4D attention masks, inputs with gaps in their attention mask (only left padding);
:mod:`~specdecode.engine.static_checks` refuses them up front. The buffers a drafter reads are
:class:`~specdecode.engine.static_state.StaticState` (with the target's features at every column
for a drafter with ``feature_layers``: :mod:`~specdecode.engine.static_features`, written by the
prefill and the score phase); the step's tensor work shared with the eager loop is in
:mod:`~specdecode.engine.step_phases`, :mod:`~specdecode.engine.stopping` and
:mod:`~specdecode.engine.accounting`.
"""

from __future__ import annotations

import time
import weakref
from typing import Any, Callable

import torch
from torch import Tensor

from specdecode.engine.accounting import (FIXED_COUNTERS, add_step_counters, count_prefill, count_syncs,
                                          counted_drafts, label_run, num_counters, record_logged_lengths,
                                          step_counters, timed_run, tree_step_counters)
from specdecode.engine.attention_widths import attended_columns, visible_columns  # noqa: F401 (re-exported)
from specdecode.engine.graphs import StepProgram
from specdecode.engine.host_drafts import HostDrafts, is_host_drafter
from specdecode.engine.settings import EngineSettings
from specdecode.engine.static_checks import check_static_path
from specdecode.engine.static_features import drafter_modules, feature_layers_of, target_forward
from specdecode.engine.static_layouts import SESSION_CACHE_SIZE, clear_static_sessions  # noqa: F401 (re-exported)
from specdecode.engine.static_layouts import keep_layout, kept_layout
from specdecode.engine.static_state import StaticState, StepScratch
from specdecode.engine.static_target import TargetOnly, label_phase
from specdecode.engine.static_tree import record_tree_acceptance, tree_phases, tree_span
from specdecode.engine.stats import SpeculativeStats
from specdecode.engine.step_phases import scored_logits, verify_chain
from specdecode.engine.stopping import emitted_lengths, finished_rows, output_columns, verify_budget
from specdecode.engine.syncs import HostSyncs
from specdecode.models import facts
from specdecode.rules import get_rule

#: Cache capacities are rounded up to a multiple of this, so that prompts of similar lengths
#: share one layout (and its graphs).
CAPACITY_MULTIPLE = 16
#: On the graphed and compiled paths the prompt block is rounded up to a multiple of this (its
#: prefill is compiled or recorded once per bucket).
PROMPT_MULTIPLE = 16
DECODE_PATHS = ("eager", "static", "compiled", "graphed")


# ---------------------------------------------------------------------- state
class _Session:
    """One static layout: state, target cache, output buffers, counters and the step program.

    Shape:
        accepted_log: ``[max_new_tokens, B]`` int64 — each step's accepted length per row (-1:
            the row had finished), written at row ``step`` (a device scalar) by the commit phase.
    """

    def __init__(self, engine: "StaticEngine", batch: int, capacity: int) -> None:
        from specdecode.models.static_cache import ColumnCache

        s, device, gamma = engine.settings, engine.device, engine.gamma
        self.syncs = HostSyncs()
        self.state = StaticState(batch, capacity, s.vocab_size, s.sampling, device, self.syncs)
        self.cache = ColumnCache.for_model(engine.target, capacity, tree_span(engine.tree, gamma))
        self.width = s.max_new_tokens + gamma + 2  # output columns; the last one is a trash column
        self.out = torch.zeros((batch, self.width), dtype=torch.long, device=device)
        self.generated = torch.zeros(batch, dtype=torch.long, device=device)
        self.finished = torch.zeros(batch, dtype=torch.bool, device=device)
        self.all_finished = torch.zeros((), dtype=torch.bool, device=device)
        self.counters = torch.zeros(num_counters(gamma), dtype=torch.long, device=device)
        self.accepted_log = torch.full((max(s.max_new_tokens, 1), batch), -1, dtype=torch.long, device=device)
        self.step = torch.zeros(1, dtype=torch.long, device=device)
        self.eos = torch.tensor(s.eos_ids, dtype=torch.long, device=device) if s.eos_ids else None
        self.arange = torch.arange(gamma + 1, device=device)
        self.flag_host = torch.zeros(2, dtype=torch.bool, pin_memory=device.type == "cuda")
        self.drafter: Any = None  # set only while a generation runs
        self.program: StepProgram | None = None
        # a host drafter's proposal buffers (engine/host_drafts.py), None for other drafters
        self.host = HostDrafts(batch, gamma, device, engine.tree and engine.tree.plan) if engine.host else None
        self.prefill: StepProgram | None = None  # the target's prefill, where the layout fixes the prompt block
        # Chain steps (static, graphed): the columns a step attends to, a host bound on every row's
        # last column rounded up to a bucket (engine/attention_widths.py); None: the whole capacity
        self.visible: int | None = None


# ---------------------------------------------------------------------- engine
class StaticEngine:
    """Generations of ``target`` with ``drafter`` (a :class:`~specdecode.drafters.StaticDrafter`,
    or :class:`TargetOnly`) on the static decode path; see the module docstring."""

    def __init__(self, target: torch.nn.Module, drafter: Any, settings: EngineSettings,
                 stats: SpeculativeStats | None = None, *, decode_path: str = "static", stop_check_every: int = 1,
                 phase_timing: bool = False) -> None:
        self.target, self.drafter, self.settings = target, drafter, settings
        self.stats = stats if stats is not None else SpeculativeStats()
        if decode_path not in DECODE_PATHS[1:]:
            raise ValueError(f"decode_path: expected one of {DECODE_PATHS}, got {decode_path!r}")
        self.decode_path = decode_path
        self.gamma, self.tree = check_static_path(target, None if isinstance(drafter, TargetOnly) else drafter,
                                                  settings, decode_path)
        if isinstance(stop_check_every, bool) or not isinstance(stop_check_every, int) or stop_check_every < 1:
            raise ValueError(f"stop_check_every: expected an int >= 1, got {stop_check_every!r}")
        self.stop_check_every = stop_check_every
        self.phase_timing = phase_timing
        self.device = facts.input_device(target)
        self.compiled = decode_path == "compiled"
        self.graphed = decode_path == "graphed" or (self.compiled and self.device.type == "cuda")
        self.rule = get_rule(settings.rule or "token") if self.tree is None else None
        self._logits_to_keep_ok = facts.accepts_logits_to_keep(target)
        self.feature_layers = feature_layers_of(target, drafter)  # the target features the drafter reads
        self.host = is_host_drafter(drafter)  # it proposes on the host between steps (engine/host_drafts.py)

    # ------------------------------------------------------------------ public
    @torch.no_grad()
    def generate(self, input_ids: Tensor, attention_mask: Tensor | None) -> Tensor:
        """Generate for a checked, left-padded batch; returns ``[B, L + new]`` sequences.

        Shape:
            input_ids: ``[B, L]`` int64; attention_mask: ``[B, L]`` 0/1 or None.
        """
        s = self.settings
        B, L = input_ids.shape
        span = tree_span(self.tree, self.gamma)
        # > the last column any step writes
        prompt_width = self._prompt_width(L, span)
        capacity = -(-(prompt_width + s.max_new_tokens + span) // CAPACITY_MULTIPLE) * CAPACITY_MULTIPLE
        session = self._session(B, capacity, prompt_width if self.decode_path != "static" else None)
        session.drafter = self.drafter
        session.cache.attach(self.target)  # (a cache of recurrent layers steps their mixers: recurrent_static)
        try:
            syncs = session.syncs
            syncs.total = syncs.in_steps = 0
            if input_ids.device != self.device and self.device.type == "cuda":
                syncs.count()  # the prompt's copy to the device
            input_ids = input_ids.to(self.device)
            self._reset(session, input_ids, attention_mask, prompt_width)
            self._prefill(session)
            program = session.program
            assert program is not None
            program.reset_timings()
            captures = program.captures
            steps = self._decode(session, program)
            if self.host:
                self.drafter.reset()  # as the eager loop, at the end too (a SuffixDrafter remembers the generation)
            log = session.accepted_log[:steps].flatten()
            host = syncs.fetch(torch.cat([session.counters, session.generated, log]))  # the one read at the end
            program.collect_timings()
            num = session.counters.numel()
            counters, generated, log = host[:num], host[num: num + B], host[num + B:].view(steps, B)
            new = int(generated.max()) if B else 0
            sequences = torch.cat([input_ids, session.out[:, :new]], 1)
            self._record(session, counters, steps, program.captures - captures)
            record_logged_lengths(self.stats, log)
            return sequences
        finally:
            session.drafter = None  # a kept layout holds no model between generations
            session.cache.detach()

    def clock(self) -> float:
        """The host clock: the static path needs no device synchronisation to time a whole
        generation, whose last act is reading its results on the host."""
        return time.perf_counter()

    def _decode(self, session: _Session, program: StepProgram) -> int:
        """Run steps until every row has finished (checked every ``stop_check_every`` steps) or
        ``max_new_tokens`` steps ran (the most any row needs: each step emits >= 1 token per
        active row); returns the steps run."""
        syncs, every, max_steps = session.syncs, self.stop_check_every, self.settings.max_new_tokens
        steps = 0
        previous: tuple[Any, int] | None = None  # CUDA: the event and host slot of the last flag copy
        syncs.stepping = True
        # chains, static or graphed (one graph per width): bucketed widths; compiled, trees: the whole capacity
        bounded = self.decode_path in ("static", "graphed") and self.tree is None
        state = session.state
        try:
            while steps < max_steps:
                if bounded:
                    session.visible = attended_columns(state.prompt_width, steps, self.gamma, state.capacity)
                program.run(session.visible)
                steps += 1
                if steps % every or steps == max_steps:
                    continue
                if self.device.type != "cuda":
                    if syncs.flag(session.all_finished):
                        break
                    continue
                # Copy this step's flag without waiting; wait for the previous check's flag (its
                # step is done or nearly done) while this step runs on the device.
                slot = (steps // every) % 2
                session.flag_host[slot].copy_(session.all_finished, non_blocking=True)
                event = torch.cuda.Event()
                event.record()
                if previous is not None:
                    previous[0].synchronize()
                    syncs.count()
                    if bool(session.flag_host[previous[1]]):
                        break
                previous = (event, slot)
        finally:
            syncs.stepping = False
            session.visible = None
        return steps

    # ------------------------------------------------------------------ setup
    def _prompt_width(self, prompt_len: int, span: int) -> int:
        """Columns of the prompt block, its leading padding column included (the first step
        re-feeds column ``prompt_width - 2``): ``prompt_len + 1`` on the static path, rounded up
        to a multiple of :data:`PROMPT_MULTIPLE` (+ 1) on the graphed and compiled paths."""
        if self.decode_path == "static":
            return prompt_len + 1
        return -(-max(prompt_len, 1) // PROMPT_MULTIPLE) * PROMPT_MULTIPLE + 1

    def _session(self, batch: int, capacity: int, prompt_width: int | None) -> _Session:
        s = self.settings
        rule = self.rule.name if self.rule is not None else self.tree.key  # type: ignore[union-attr]
        drafter_key = ("host drafter",) if self.host else self.drafter.static_key()  # host drafters: any one
        key = (drafter_key, str(self.device), batch, capacity, prompt_width, self.gamma, s.sampling,
               rule, tuple(sorted(s.rule_options.items())), s.vocab_size, s.eos_ids, s.max_new_tokens,
               self.decode_path, self.phase_timing, self.feature_layers)
        models = (self.target, *drafter_modules(self.drafter))
        session = kept_layout(self.target, key, models)
        if session is None:
            session = _Session(self, batch, capacity)
            session.program = self._program(session)
            if prompt_width is not None:  # the prompt block is the layout's: its prefill is a program too
                session.prefill = StepProgram([("target prefill", self._prefill_phase(session, prompt_width))],
                                              self.device, graphed=self.graphed, phase_timing=False,
                                              syncs=session.syncs, compiled=self.compiled, idempotent=True)
            keep_layout(self.target, key, models, session)
        return session

    def _reset(self, session: _Session, input_ids: Tensor, attention_mask: Tensor | None, prompt_width: int) -> None:
        s, state, syncs = self.settings, session.state, session.syncs
        B, L = input_ids.shape
        if attention_mask is None:
            pads = torch.zeros(B, dtype=torch.long, device=self.device)
        else:
            mask = attention_mask.to(device=self.device, dtype=torch.long)
            pads = L - mask.sum(1)
            expected = (torch.arange(L, device=self.device)[None, :] >= pads[:, None]).long()
            if not syncs.flag((mask == expected).all()):
                raise ValueError("attention_mask: the static decode path takes left padding only (each row: zeros, "
                                 "then ones); use decode_path='eager' for other masks")
        shift = prompt_width - L  # leading padding columns (1 on the static path)
        state.prompt_width = prompt_width
        state.tokens.zero_()
        state.tokens[:, shift: shift + L] = input_ids
        state.start.copy_(pads + shift)
        state.lengths.fill_(prompt_width - 1)
        session.out.fill_(s.pad_id)
        session.generated.zero_()
        session.finished.zero_()
        session.all_finished.zero_()
        session.counters.zero_()
        session.accepted_log.fill_(-1)
        session.step.zero_()
        gen = s.generator
        seed = torch.randint(-(2 ** 62), 2 ** 62, (1,), generator=gen, device=gen.device if gen is not None else "cpu")
        if seed.device.type != "cpu":
            seed = syncs.fetch(seed)
        state.philox_seed.copy_(seed)
        state.philox_offset.zero_()

    def _prefill(self, session: _Session) -> None:
        state, stats = session.state, self.stats
        t0 = time.perf_counter()
        if session.prefill is not None:  # compiled or graphed, once per layout
            session.prefill.reset_timings()
            session.prefill.run()
        else:
            self._prefill_phase(session, state.prompt_width)()
        count_prefill(stats, time.perf_counter() - t0)
        t0 = time.perf_counter()
        if session.host is not None:  # a host drafter absorbs nothing ahead: it reads the layout at each step
            self.drafter.reset()
            session.host.begin()
        else:
            self.drafter.static_prefill(state, self.gamma)
        stats.draft_prefill_time += time.perf_counter() - t0
        stats.draft_time += time.perf_counter() - t0

    @staticmethod
    def _dtype(model: torch.nn.Module) -> torch.dtype:
        return model.dtype if hasattr(model, "dtype") else torch.float32

    def _prefill_phase(self, session: _Session, prompt_width: int) -> Callable[[], None]:
        """The target's prefill of the ``prompt_width - 1`` columns before the first pending
        token (a phase: it holds the target weakly, as the step's phases do)."""
        from specdecode.models.static_cache import prefill_inputs

        target_ref, state, layers = weakref.ref(self.target), session.state, self.feature_layers
        logits_to_keep_ok, dtype, width = self._logits_to_keep_ok, self._dtype(self.target), prompt_width - 1

        def prefill() -> None:
            with prefill_inputs(session.cache, state.start, width, dtype) as (_, positions, mask):
                target_forward(target_ref(), state.tokens[:, :width], mask, positions, session.cache, state, layers,
                               last_only=True, logits_to_keep_ok=logits_to_keep_ok)

        return prefill

    # ------------------------------------------------------------------ the step
    def _program(self, session: _Session) -> StepProgram:
        # The step functions outlive this engine (the layout is kept for the next generation):
        # they hold the target weakly and find the drafter in the session, so they keep no model alive.
        target_ref = weakref.ref(self.target)
        logits_to_keep_ok, rule, device = self._logits_to_keep_ok, self.rule, self.device
        state = session.state
        gamma = self.gamma
        s = self.settings
        dtype = self._dtype(self.target)
        layers = self.feature_layers
        scratch = StepScratch()
        is_tree = self.tree is not None
        host = session.host

        def draft() -> None:
            if host is not None:  # proposed on the host before the step (propose_on_host)
                tokens, logits = host.tokens, None
            else:
                tokens, logits = session.drafter.static_propose(state, gamma)
            scratch.draft_tokens, scratch.draft_logits = tokens, logits
            state.tokens.scatter_(1, state.lengths[:, None] + session.arange[None, 1:], tokens)

        def score() -> None:
            from specdecode.models.static_cache import column_inputs

            visible = session.visible  # None: the whole capacity (compiled steps)
            columns, positions, mask = column_inputs(state.lengths, state.start, gamma + 1,
                                                     state.capacity if visible is None else visible, dtype)
            session.cache.columns, session.cache.visible = columns, visible
            try:
                ids = state.tokens.gather(1, columns)
                logits = target_forward(target_ref(), ids, mask, positions, session.cache, state, layers,
                                        last_only=False, logits_to_keep_ok=logits_to_keep_ok)
            finally:
                session.cache.visible = None
            scratch.target_logits = scored_logits(logits, s.vocab_size, device)

        def verify() -> None:
            active = ~session.finished
            if gamma == 0:
                tokens = state.sample(scratch.target_logits[:, 0])[:, None]
                accepted = torch.zeros_like(session.generated)
                verified = accepted
            else:
                verified = torch.where(active, verify_budget(s.max_new_tokens - session.generated, gamma), 0)
                if host is not None:  # a row's padded drafts are never verified
                    verified = torch.minimum(verified, host.counts)
                result = verify_chain(scratch.target_logits, scratch.draft_tokens, scratch.draft_logits,
                                      verified, rule, s, philox_seed=state.philox_seed,
                                      philox_offset=state.philox_offset)
                state.philox_offset.add_(1)
                state.count_op_sync()
                tokens, accepted = result.tokens, result.accepted_len
            scratch.tokens, scratch.accepted, scratch.verified = tokens, accepted, verified

        def commit() -> None:
            tokens, accepted, verified = scratch.tokens, scratch.accepted, scratch.verified
            idx = session.arange
            active = ~session.finished
            remaining = s.max_new_tokens - session.generated
            keep, has_eos = emitted_lengths(tokens, accepted, remaining, session.eos, idx)
            keep = torch.where(active, keep, 0)
            session.out.scatter_(1, output_columns(keep, session.generated, idx, session.width - 1),
                                 tokens.clamp_min(0))
            session.generated.add_(keep)
            done = active & finished_rows(has_eos, session.generated, s.max_new_tokens)
            continuing = active & ~done
            session.finished.logical_or_(done)
            torch.all(session.finished, out=session.all_finished)
            # roll back = move the length pointers past the committed columns only
            state.lengths.add_(torch.where(continuing, accepted + 1, 0))
            if not is_tree:  # (a tree's verify phase keeps its path's states)
                session.cache.keep_states(accepted)  # states that follow no column (recurrent layers)
            next_token = tokens.gather(1, accepted[:, None]).clamp_min(0)
            current = state.tokens.gather(1, state.lengths[:, None])
            state.tokens.scatter_(1, state.lengths[:, None], torch.where(continuing[:, None], next_token, current))
            # counted as the eager loop counts (no drafts when no row has two tokens left), on the device
            counted, counted_verified = counted_drafts(active, remaining, accepted, verified)
            if is_tree:
                session.counters.add_(tree_step_counters(active, counted, counted_verified, keep, idx[:gamma],
                                                         scratch.drafted, scratch.stopped_early))
            else:
                session.counters.add_(step_counters(active, counted, counted_verified, keep, idx[:gamma]))
            session.accepted_log.index_copy_(0, session.step, torch.where(active, counted, -1)[None])
            session.step.add_(1)

        if self.tree is not None:  # token trees: their own draft, score and verify; the same commit
            draft, score, verify = tree_phases(session, scratch, self.tree, target_ref, dtype, logits_to_keep_ok, s,
                                               layers)
        phases: list[tuple[str, Callable[[], None]]] = [("draft", draft)] if gamma > 0 else []
        phases += [("target", score), ("verify", verify), ("bookkeeping", commit)]
        if isinstance(self.drafter, TargetOnly) and self.drafter.label_top_k is not None:  # training labels
            phases.insert(-2, ("labels", label_phase(state, scratch, self.drafter.label_top_k)))
        propose_on_host = None if host is None else (  # the host drafter, before each step
            lambda: host.step(session.drafter, state, session.finished, scratch.accepted, session.syncs))
        return StepProgram(phases, self.device, graphed=self.graphed, phase_timing=self.phase_timing,
                           syncs=session.syncs, compiled=self.compiled, host=propose_on_host, owners=(scratch,))

    # ------------------------------------------------------------------ statistics
    def _record(self, session: _Session, counters: Tensor, steps_run: int, captures: int) -> None:
        stats, gamma, program = self.stats, self.gamma, session.program
        assert program is not None
        c = counters.tolist()
        steps = c[0]
        label_run(stats, rule=self.rule.name if self.rule is not None else self.tree.rule,  # type: ignore[union-attr]
                  drafter=self.drafter, batch_size=session.state.batch_size, schedule="constant",
                  decode_path=self.decode_path, settings=self.settings)
        listed = gamma
        if self.tree is not None:  # as the eager path, depths that no tree reached are not listed
            record_tree_acceptance(self.drafter, self.tree, session.state, c)  # what a dynamic tree learns
            stats.tree_rule = self.tree.rule
            listed = sum(1 for n in c[FIXED_COUNTERS: FIXED_COUNTERS + gamma] if n > 0)
            c = c[:FIXED_COUNTERS] + [c[FIXED_COUNTERS + i * gamma + d] for i in range(3) for d in range(listed)]
        add_step_counters(stats, c, listed)
        stats.target_calls += steps
        host = session.host  # a host drafter counts its model's forward calls (prompt lookup runs none)
        stats.draft_calls += host.forward_calls if host else steps * gamma + (gamma and session.state.prompt_columns > 1)
        if gamma:
            stats.num_draft_tokens_history.extend([gamma] * steps)
        seconds = program.seconds
        stats.draft_time += seconds.get("draft", 0.0) + (host.seconds if host is not None else 0.0)
        stats.target_time += seconds.get("target", 0.0)
        stats.verify_time += seconds.get("verify", 0.0)
        stats.bookkeeping_time += seconds.get("bookkeeping", 0.0)
        count_syncs(stats, session.syncs)
        stats.graph_captures += captures
        stats.decode_steps_run += steps_run


def run_static_engine(target: torch.nn.Module, drafter: Any, input_ids: Tensor, attention_mask: Tensor | None,
                      settings: EngineSettings, stats: SpeculativeStats | None = None, *, decode_path: str = "static",
                      stop_check_every: int = 1, phase_timing: bool = False,
                      start_time: float | None = None) -> tuple[Tensor, SpeculativeStats]:
    """Generate with a :class:`StaticEngine`; returns ``(sequences, stats)``
    (:func:`~specdecode.engine.accounting.timed_run` says how ``stats.total_time`` counts)."""
    return timed_run(
        lambda: StaticEngine(target, drafter, settings, stats, decode_path=decode_path,
                             stop_check_every=stop_check_every, phase_timing=phase_timing),
        input_ids, attention_mask, stats, start_time)
