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
them (:mod:`specdecode.engine.graphs`). Graphs, caches and buffers are kept for the next
generation with the same shapes (the :data:`SESSION_CACHE_SIZE` most recent layouts per target,
freed with their models; :func:`clear_static_sessions` frees them all). With ``draft=None`` the same path decodes the target alone
(one target forward per token): the baseline the speculative gain is measured against.

Not supported here (``ValueError``, use the eager path): Hugging Face logits processors,
stopping criteria, streamers, adaptive draft schedules, token trees, Python rules, drafters
without :class:`~specdecode.drafters.StaticDrafter`, sharded or offloaded models, models that
ignore custom 4D attention masks, inputs with gaps in their attention mask (only left padding).
"""

from __future__ import annotations

import time
import weakref
from collections import OrderedDict
from typing import Any, Callable

import torch
from torch import Tensor

from specdecode._ops import ops
from specdecode.drafters.base import StaticDrafter
from specdecode.engine.graphs import StepProgram
from specdecode.engine.schedules import ConstantSchedule, DraftSchedule
from specdecode.engine.settings import EngineSettings
from specdecode.engine.stats import SpeculativeStats
from specdecode.engine.syncs import HostSyncs
from specdecode.models import facts
from specdecode.rules import get_rule, is_chain_rule
from specdecode.sampling import SamplingParams
from specdecode.verify import verify_logits

#: How many static layouts (caches, buffers, CUDA graphs) are kept for reuse, per target.
SESSION_CACHE_SIZE = 8
#: Cache capacities are rounded up to a multiple of this, so that prompts of similar lengths
#: share one layout (and its graphs).
CAPACITY_MULTIPLE = 16
DECODE_PATHS = ("eager", "static", "graphed")

# The static layouts kept for reuse, per target. The table holds each target weakly, and a layout
# holds no model between generations (its step functions reach the target through a weak
# reference, the drafter through ``_Session.drafter`` only while a generation runs), so deleting
# a model frees it and its layouts. A layout whose drafter's model is freed is dropped too.
_SESSIONS: "weakref.WeakKeyDictionary[torch.nn.Module, OrderedDict[tuple, _Session]]" = weakref.WeakKeyDictionary()


def clear_static_sessions() -> None:
    """Free every kept static layout (caches, buffers and CUDA graphs) of every model."""
    _SESSIONS.clear()


class TargetOnly:
    """The "drafter" of plain decoding on the static path: no drafts; each step is one target
    forward and one sampled token (``specdecode.generate(target, None, ...)``)."""

    name = "none"

    def static_key(self) -> tuple:
        return ("none",)

    def static_prefill(self, state: Any, num_tokens: int) -> None:
        return None

    def static_propose(self, state: Any, num_tokens: int) -> tuple[Tensor, Tensor]:  # pragma: no cover
        raise RuntimeError("TargetOnly proposes nothing")


# ---------------------------------------------------------------------- checks
def _has_cuda_kernel(op: str) -> bool:
    try:
        return bool(torch._C._dispatch_has_kernel_for_dispatch_key(f"specdecode::{op}", "CUDA"))
    except Exception:  # noqa: BLE001 - an unknown op or an old torch: no kernel
        return False


def _single_device(model: torch.nn.Module, name: str) -> torch.device:
    devices = set()
    for param in model.parameters():
        if type(param).__name__ == "DTensor" or hasattr(param, "to_local"):
            raise ValueError(f"{name}: tensor-parallel (DTensor) models are not supported on the static decode path; "
                             "use decode_path='eager'")
        devices.add(param.device)
    for module in model.modules():
        if getattr(module, "_hf_hook", None) is not None:
            raise ValueError(f"{name}: models dispatched by accelerate (device_map, offload) are not supported on "
                             "the static decode path; use decode_path='eager'")
    if len(devices) != 1:
        raise ValueError(f"{name}: the static decode path needs every parameter on one device, got "
                         f"{sorted(str(d) for d in devices)}; use decode_path='eager'")
    return devices.pop()


def check_static_path(target: torch.nn.Module, drafter: Any, settings: EngineSettings, decode_path: str) -> int:
    """Refuse what the static path cannot do, with a ``ValueError`` naming the argument;
    returns gamma (0 for the target alone)."""
    if decode_path not in ("static", "graphed"):
        raise ValueError(f"decode_path: expected one of {DECODE_PATHS}, got {decode_path!r}")
    where = f"decode_path={decode_path!r}"
    for name, value in (("logits_processor", settings.processors), ("stopping_criteria", settings.stopping),
                        ("streamer", settings.streamer)):
        if value is not None:
            raise ValueError(f"{name}: not supported with {where} (it needs the host at every token); "
                             "use decode_path='eager'")
    device = _single_device(target, "target")
    if isinstance(drafter, TargetOnly):
        gamma = 0
    else:
        if not isinstance(drafter, StaticDrafter):
            raise ValueError(
                f"draft: {type(drafter).__name__} cannot draft on the static decode path (it needs static_key, "
                "static_prefill and static_propose: ModelDrafter and LayerSkipDrafter have them); use "
                "decode_path='eager'"
            )
        if getattr(drafter, "tree", None) is not None:
            raise ValueError(f"tree: token trees are not supported with {where} yet; draft a chain (tree=None) or "
                             "use decode_path='eager'")
        if type(settings.schedule) not in (ConstantSchedule, DraftSchedule):
            raise ValueError(f"draft_schedule: only the constant schedule runs with {where} (every step has one "
                             f"shape), got {getattr(settings.schedule, 'name', type(settings.schedule).__name__)!r}")
        gamma = settings.schedule.initial
        model = getattr(drafter, "model", None)
        if isinstance(model, torch.nn.Module):
            draft_device = _single_device(model, "draft")
            if draft_device != device:
                raise ValueError(f"draft: the static decode path needs the draft on the target's device ({device}), "
                                 f"got {draft_device}")
            if not facts.accepts_custom_4d_mask(model):
                raise ValueError(_mask_message("draft", model))
    rule = settings.rule or "token"
    if not is_chain_rule(rule):
        raise ValueError(f"rule: {rule!r} is not a chain rule; {where} verifies chains")
    if not get_rule(rule).builtin:
        raise ValueError(f"rule: {rule!r} is a Python rule; {where} needs a compiled rule (its coins come from "
                         "Philox on the device)")
    if not facts.accepts_custom_4d_mask(target):
        raise ValueError(_mask_message("target", target))
    if decode_path == "graphed":
        if device.type != "cuda":
            raise ValueError(f"decode_path: 'graphed' records CUDA graphs and needs a CUDA device, but the target is "
                             f"on {device}; decode_path='static' runs the same steps without graphs")
        missing = [op for op in ("verify_logits_philox",) + (() if settings.sampling.is_greedy else
                                                             ("sample_logits_philox",)) if not _has_cuda_kernel(op)]
        if missing:
            raise ValueError(f"decode_path: 'graphed' needs the CUDA kernels of {', '.join(missing)}, which this "
                             "build of specdecode lacks (python -m specdecode info)")
    return gamma


def _mask_message(name: str, model: torch.nn.Module) -> str:
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
    return (f"{name}: {type(model).__name__} (attention implementation {impl!r}) does not honour a custom 4D attention "
            "mask with position ids, which static caches need; load it with attn_implementation='sdpa' or 'eager', "
            "or use decode_path='eager'")


class _Weights:
    """The parameters a layout was built for (its CUDA graphs read their addresses): each
    parameter object, held weakly, with its storage address, dtype and shape when the layout was
    built. It matches a model whose parameters are the same live objects, unchanged; a parameter
    replaced, reassigned (``param.data = ...``) or moved means a new layout. Nothing is looked up
    by an address: a dead parameter never matches."""

    def __init__(self, model: torch.nn.Module) -> None:
        self._params = [(weakref.ref(p), p.data_ptr(), p.dtype, tuple(p.shape)) for p in model.parameters()]

    def match(self, model: torch.nn.Module) -> bool:
        params = list(model.parameters())
        return len(params) == len(self._params) and all(
            ref() is p and p.data_ptr() == ptr and p.dtype == dtype and tuple(p.shape) == shape
            for (ref, ptr, dtype, shape), p in zip(self._params, params))


def _drop_when_freed(key: tuple, layouts: "OrderedDict[tuple, _Session]") -> None:
    """Forget the layout ``key`` of ``layouts`` when a model it names (a weak reference in the
    drafter's ``static_key``) is freed; ``layouts`` is held weakly too."""
    table = weakref.ref(layouts)

    def drop() -> None:
        held = table()
        if held is not None:
            held.pop(key, None)

    for part in _flatten(key):
        if isinstance(part, weakref.ref) and part() is not None:
            weakref.finalize(part(), drop)


def _flatten(key: Any) -> list[Any]:
    if isinstance(key, tuple):
        return [leaf for part in key for leaf in _flatten(part)]
    return [key]


def _is_dead(key: tuple) -> bool:
    return any(isinstance(part, weakref.ref) and part() is None for part in _flatten(key))


# ---------------------------------------------------------------------- state
class StaticState:
    """The persistent buffers of one static layout (the drafter's
    :class:`~specdecode.drafters.StaticDraftState`)."""

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
        if self._sampling.is_greedy:
            return logits.argmax(-1)
        tokens = ops.sample_logits_philox(logits, self.philox_seed, self.philox_offset, *self._sampling.op_args())
        self.philox_offset.add_(1)
        self._count_op_sync()
        return tokens.clamp_min(0)  # a bad row (only possible inside a graph) must not index out of range

    def _count_op_sync(self) -> None:
        # Outside graph capture the CUDA Philox ops copy their per-row statuses to the host.
        if self._device.type == "cuda" and not torch.cuda.is_current_stream_capturing():
            self.syncs.count()

    def buffer(self, name: str, factory: Callable[[], Any]) -> Any:
        if name not in self._store:
            self._store[name] = factory()
        return self._store[name]


class _Session:
    """One static layout: state, target cache, output buffers, counters and the step program."""

    def __init__(self, engine: "StaticEngine", batch: int, capacity: int) -> None:
        from specdecode.models.static_cache import ColumnCache

        s, device, gamma = engine.settings, engine.device, engine.gamma
        self.syncs = HostSyncs()
        self.state = StaticState(batch, capacity, s.vocab_size, s.sampling, device, self.syncs)
        self.cache = ColumnCache(capacity)
        self.width = s.max_new_tokens + gamma + 2  # output columns; the last one is a trash column
        self.out = torch.zeros((batch, self.width), dtype=torch.long, device=device)
        self.generated = torch.zeros(batch, dtype=torch.long, device=device)
        self.finished = torch.zeros(batch, dtype=torch.bool, device=device)
        self.all_finished = torch.zeros((), dtype=torch.bool, device=device)
        self.counters = torch.zeros(6 + 2 * gamma, dtype=torch.long, device=device)
        self.eos = torch.tensor(s.eos_ids, dtype=torch.long, device=device) if s.eos_ids else None
        self.arange = torch.arange(gamma + 1, device=device)
        self.flag_host = torch.zeros(2, dtype=torch.bool, pin_memory=device.type == "cuda")
        self.drafter: Any = None  # set only while a generation runs
        self.program: StepProgram | None = None
        self.target_weights: _Weights | None = None
        self.draft_weights: _Weights | None = None


# ---------------------------------------------------------------------- engine
class StaticEngine:
    """Generations of ``target`` with ``drafter`` (a :class:`~specdecode.drafters.StaticDrafter`,
    or :class:`TargetOnly`) on the static decode path; see the module docstring."""

    def __init__(self, target: torch.nn.Module, drafter: Any, settings: EngineSettings,
                 stats: SpeculativeStats | None = None, *, decode_path: str = "static", stop_check_every: int = 1,
                 phase_timing: bool = False) -> None:
        self.target, self.drafter, self.settings = target, drafter, settings
        self.stats = stats if stats is not None else SpeculativeStats()
        self.decode_path = decode_path
        self.gamma = check_static_path(target, drafter, settings, decode_path)
        if isinstance(stop_check_every, bool) or not isinstance(stop_check_every, int) or stop_check_every < 1:
            raise ValueError(f"stop_check_every: expected an int >= 1, got {stop_check_every!r}")
        self.stop_check_every = stop_check_every
        self.phase_timing = phase_timing
        self.device = facts.input_device(target)
        self.rule = get_rule(settings.rule or "token")
        self._logits_to_keep_ok = facts.accepts_logits_to_keep(target)
        self.window = facts.sliding_window(target)

    # ------------------------------------------------------------------ public
    @torch.no_grad()
    def generate(self, input_ids: Tensor, attention_mask: Tensor | None) -> Tensor:
        """Generate for a checked, left-padded batch; returns ``[B, L + new]`` sequences.

        Shape:
            input_ids: ``[B, L]`` int64; attention_mask: ``[B, L]`` 0/1 or None.
        """
        s = self.settings
        B, L = input_ids.shape
        prompt_width = L + 1  # one leading padding column: the first step re-feeds column prompt_width - 2
        needed = prompt_width + s.max_new_tokens + self.gamma  # > the last column any step writes
        if self.window is not None and needed > self.window:
            raise ValueError(f"max_new_tokens: prompt_len + max_new_tokens + num_draft_tokens + 1 = {needed} exceeds the "
                             f"sliding window ({self.window}); use decode_path='eager'")
        capacity = -(-needed // CAPACITY_MULTIPLE) * CAPACITY_MULTIPLE
        session = self._session(B, capacity)
        session.drafter = self.drafter
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
            host = syncs.fetch(torch.cat([session.counters, session.generated]))
            program.collect_timings()
            counters, generated = host[: session.counters.numel()], host[session.counters.numel():]
            new = int(generated.max()) if B else 0
            sequences = torch.cat([input_ids, session.out[:, :new]], 1)
            self._record(session, counters, steps, program.captures - captures)
            return sequences
        finally:
            session.drafter = None  # a kept layout holds no model between generations

    def _decode(self, session: _Session, program: StepProgram) -> int:
        """Run steps until every row has finished (checked every ``stop_check_every`` steps) or
        ``max_new_tokens`` steps ran (the most any row needs: each step emits >= 1 token per
        active row); returns the steps run."""
        syncs, every, max_steps = session.syncs, self.stop_check_every, self.settings.max_new_tokens
        steps = 0
        previous: tuple[Any, int] | None = None  # CUDA: the event and host slot of the last flag copy
        syncs.stepping = True
        try:
            while steps < max_steps:
                program.run()
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
        return steps

    # ------------------------------------------------------------------ setup
    def _session(self, batch: int, capacity: int) -> _Session:
        s = self.settings
        key = (self.drafter.static_key(), str(self.device), batch, capacity, self.gamma, s.sampling, self.rule.name,
               tuple(sorted(s.rule_options.items())), s.vocab_size, s.eos_ids, s.max_new_tokens, self.decode_path,
               self.phase_timing)
        layouts = _SESSIONS.get(self.target)
        if layouts is None:
            layouts = _SESSIONS[self.target] = OrderedDict()
        for dead in [k for k in layouts if _is_dead(k)]:
            del layouts[dead]
        draft_model = getattr(self.drafter, "model", None)
        session = layouts.get(key)
        if session is not None and not (session.target_weights.match(self.target) and (
                session.draft_weights is None or session.draft_weights.match(draft_model))):
            session = None  # the weights moved or were replaced: the old layout's graphs read stale addresses
        if session is None:
            session = _Session(self, batch, capacity)
            session.target_weights = _Weights(self.target)
            session.draft_weights = _Weights(draft_model) if isinstance(draft_model, torch.nn.Module) else None
            session.program = self._program(session)
            layouts[key] = session
            _drop_when_freed(key, layouts)
            while len(layouts) > SESSION_CACHE_SIZE:
                layouts.popitem(last=False)
        layouts.move_to_end(key)
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
        state.prompt_width = prompt_width
        state.tokens.zero_()
        state.tokens[:, 1: L + 1] = input_ids
        state.start.copy_(pads + 1)
        state.lengths.fill_(prompt_width - 1)
        session.out.fill_(s.pad_id)
        session.generated.zero_()
        session.finished.zero_()
        session.all_finished.zero_()
        session.counters.zero_()
        gen = s.generator
        seed = torch.randint(-(2 ** 62), 2 ** 62, (1,), generator=gen, device=gen.device if gen is not None else "cpu")
        if seed.device.type != "cpu":
            seed = syncs.fetch(seed)
        state.philox_seed.copy_(seed)
        state.philox_offset.zero_()

    def _prefill(self, session: _Session) -> None:
        from specdecode.models.static_cache import column_inputs

        state, stats = session.state, self.stats
        t0 = time.perf_counter()
        width = state.prompt_width - 1  # columns before the first pending token
        first = torch.zeros(state.batch_size, dtype=torch.long, device=self.device)
        columns, positions, mask = column_inputs(first, state.start, width, state.capacity, self._dtype(self.target))
        session.cache.columns = columns
        facts.forward(self.target, state.tokens[:, :width], mask, positions, session.cache, last_only=True,
                      logits_to_keep_ok=self._logits_to_keep_ok)
        dt = time.perf_counter() - t0
        stats.target_calls += 1
        stats.target_prefill_calls += 1
        stats.target_time += dt
        stats.target_prefill_time += dt
        t0 = time.perf_counter()
        self.drafter.static_prefill(state, self.gamma)
        stats.draft_prefill_time += time.perf_counter() - t0
        stats.draft_time += time.perf_counter() - t0

    @staticmethod
    def _dtype(model: torch.nn.Module) -> torch.dtype:
        return model.dtype if hasattr(model, "dtype") else torch.float32

    # ------------------------------------------------------------------ the step
    def _program(self, session: _Session) -> StepProgram:
        # The step functions outlive this engine (the layout is kept for the next generation):
        # they hold the target weakly and find the drafter in the session, so they keep no model alive.
        target_ref = weakref.ref(self.target)
        logits_to_keep_ok, rule_name = self._logits_to_keep_ok, self.rule.name
        state = session.state
        gamma = self.gamma
        s = self.settings
        dtype = self._dtype(self.target)
        needs_q = self.rule.needs_draft_probs
        scratch: dict[str, Tensor] = {}

        def draft() -> None:
            tokens, logits = session.drafter.static_propose(state, gamma)
            scratch["draft_tokens"], scratch["draft_logits"] = tokens, logits
            state.tokens.scatter_(1, state.lengths[:, None] + session.arange[None, 1:], tokens)

        def score() -> None:
            from specdecode.models.static_cache import column_inputs

            columns, positions, mask = column_inputs(state.lengths, state.start, gamma + 1, state.capacity, dtype)
            session.cache.columns = columns
            logits = facts.forward(target_ref(), state.tokens.gather(1, columns), mask, positions, session.cache,
                                   last_only=False, logits_to_keep_ok=logits_to_keep_ok)
            scratch["target_logits"] = logits[:, :, : s.vocab_size].float().contiguous()

        def verify() -> None:
            active = ~session.finished
            if gamma == 0:
                tokens = state.sample(scratch["target_logits"][:, 0])[:, None]
                accepted = torch.zeros_like(session.generated)
                verified = accepted
            else:
                remaining = s.max_new_tokens - session.generated
                verified = torch.where(active, (remaining - 1).clamp(0, gamma), 0)
                result = verify_logits(scratch["target_logits"], scratch["draft_logits"] if needs_q else None,
                                       scratch["draft_tokens"], sampling=s.sampling, rule=rule_name,
                                       num_draft_tokens=verified, philox_seed=state.philox_seed,
                                       philox_offset=state.philox_offset, **s.rule_options)
                state.philox_offset.add_(1)
                state._count_op_sync()
                tokens, accepted = result.tokens, result.accepted_len
            scratch["tokens"], scratch["accepted"], scratch["verified"] = tokens, accepted, verified

        def commit() -> None:
            tokens, accepted, verified = scratch["tokens"], scratch["accepted"], scratch["verified"]
            idx = session.arange
            active = ~session.finished
            remaining = s.max_new_tokens - session.generated
            keep = accepted + 1
            has_eos = torch.zeros_like(active)
            if session.eos is not None:
                is_eos = torch.isin(tokens, session.eos) & (idx[None, :] < keep[:, None])
                has_eos = is_eos.any(1)
                keep = torch.where(has_eos, is_eos.to(torch.int8).argmax(1) + 1, keep)
            keep = torch.where(active, torch.minimum(keep, remaining), 0)
            columns = torch.where(idx[None, :] < keep[:, None], session.generated[:, None] + idx[None, :],
                                  session.width - 1)
            session.out.scatter_(1, columns, tokens.clamp_min(0))
            session.generated.add_(keep)
            done = active & (has_eos | (session.generated >= s.max_new_tokens))
            continuing = active & ~done
            session.finished.logical_or_(done)
            torch.all(session.finished, out=session.all_finished)
            # roll back = move the length pointers past the committed columns only
            state.lengths.add_(torch.where(continuing, accepted + 1, 0))
            next_token = tokens.gather(1, accepted[:, None]).clamp_min(0)
            current = state.tokens.gather(1, state.lengths[:, None])
            state.tokens.scatter_(1, state.lengths[:, None], torch.where(continuing[:, None], next_token, current))
            # statistics, on the device
            acc = torch.where(active, accepted, 0)
            position = idx[None, :gamma]
            session.counters.add_(torch.cat([
                torch.stack([active.any().long(), active.sum(), keep.sum(), verified.sum(), acc.sum(),
                             (active & (acc < verified)).sum()]),
                (verified[:, None] > position).sum(0), (acc[:, None] > position).sum(0),
            ]))

        phases = ([("draft", draft)] if gamma > 0 else []) + [("target", score), ("verify", verify),
                                                              ("bookkeeping", commit)]
        return StepProgram(phases, self.device, graphed=self.decode_path == "graphed",
                           phase_timing=self.phase_timing, syncs=session.syncs)

    # ------------------------------------------------------------------ statistics
    def _record(self, session: _Session, counters: Tensor, steps_run: int, captures: int) -> None:
        stats, gamma, program = self.stats, self.gamma, session.program
        assert program is not None
        c = counters.tolist()
        steps = c[0]
        stats.rule = self.rule.name
        stats.drafter = getattr(self.drafter, "name", type(self.drafter).__name__)
        stats.batch_size = session.state.batch_size
        stats.draft_schedule = "constant"
        stats.decode_path = self.decode_path
        stats.steps += steps
        stats.row_steps += c[1]
        stats.new_tokens += c[2]
        stats.target_calls += steps
        stats.draft_calls += steps * gamma + (1 if gamma and session.state.prompt_columns > 1 else 0)
        if gamma:
            stats.drafted_tokens += c[3]
            stats.accepted_tokens += c[4]
            stats.rejections += c[5]
            stats.num_draft_tokens_history.extend([gamma] * steps)
            while len(stats.position_drafted) < gamma:
                stats.position_drafted.append(0)
                stats.position_accepted.append(0)
            for i in range(gamma):
                stats.position_drafted[i] += c[6 + i]
                stats.position_accepted[i] += c[6 + gamma + i]
        seconds = program.seconds
        stats.draft_time += seconds.get("draft", 0.0)
        stats.target_time += seconds.get("target", 0.0)
        stats.verify_time += seconds.get("verify", 0.0)
        stats.bookkeeping_time += seconds.get("bookkeeping", 0.0)
        stats.host_syncs += session.syncs.total
        stats.step_host_syncs += session.syncs.in_steps
        stats.graph_captures += captures
        stats.decode_steps_run += steps_run


def run_static_engine(target: torch.nn.Module, drafter: Any, input_ids: Tensor, attention_mask: Tensor | None,
                      settings: EngineSettings, stats: SpeculativeStats | None = None, *, decode_path: str = "static",
                      stop_check_every: int = 1, phase_timing: bool = False,
                      start_time: float | None = None) -> tuple[Tensor, SpeculativeStats]:
    """Generate with a :class:`StaticEngine`; returns ``(sequences, stats)``. ``stats.total_time``
    counts from ``start_time`` (``time.perf_counter()`` when the caller started), or from now."""
    if stats is not None and not isinstance(stats, SpeculativeStats):
        raise TypeError(f"stats: expected a SpeculativeStats or None, got {type(stats).__name__}")
    start = time.perf_counter() if start_time is None else start_time
    engine = StaticEngine(target, drafter, settings, stats, decode_path=decode_path,
                          stop_check_every=stop_check_every, phase_timing=phase_timing)
    total_before = engine.stats.total_time
    sequences = engine.generate(input_ids, attention_mask)
    engine.stats.total_time = total_before + (time.perf_counter() - start)
    return sequences, engine.stats
