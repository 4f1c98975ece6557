"""The speculative decoding loop: batched, left-padded, every row accepting its own count.

Layout
------
Both models keep a ``DynamicCache`` whose *columns* are shared by all rows of the batch. The
loop keeps three ``[b, capacity]`` buffers over those columns: token ids, an attention mask
(1 = real token, 0 = left padding or a *hole*) and per-row position ids. Each step

1. the draft feeds the columns it has not seen yet (its prefill at the first step; later the
   one or two tokens left over from the previous step) and then proposes ``gamma`` tokens one
   at a time, each sampled from exactly the processed distribution ``q`` that verification
   assumes (:func:`specdecode.reference.process_logits`), or its argmax at temperature 0;
2. the target scores ``[pending token, x_1 .. x_gamma]`` in one forward pass (gamma + 1 logits);
3. :func:`specdecode.verify_logits` decides per row (``tau_b`` accepted drafts + one token);
4. rejected columns become holes (mask 0) for the rows that rejected them, both caches are
   cropped to ``W + max_b tau_b + 1`` columns, and every row's new pending token is written
   to the next column with position ``previous position + 1``.

Holes are never attended (mask 0) and positions count only real tokens, so every row sees
exactly its own sequence. The price is the hole columns themselves; when they exceed a quarter
of the cache the rows are *re-packed* (each row's real columns right-aligned, one gather per
cache), so the waste stays bounded. Rows that finish (EOS, max_new_tokens, a stopping
criterion) are dropped from the batch and cost no further draft or target work. With batch
size 1 there are never holes and the attention mask is not passed at all.
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from specdecode.generation.hf import check_compatibility, input_device, sliding_window
from specdecode.generation.schedules import DraftSchedule, make_schedule
from specdecode.generation.stats import SpeculativeStats
from specdecode.reference import process_logits
from specdecode.rules import builtin_rule_params, get_rule
from specdecode.verify import _check_sampling, verify_logits

# Private test hook: deliberately broken variants of the loop, used only by the tests to show
# that the statistical test can fail. One of None, "no_rollback" (rejected drafts stay visible
# to their rows), "bonus_position" (the bonus token is drawn from p_gamma instead of
# p_{gamma+1}), "greedy_draft" (the draft proposes its argmax but claims q).
_DEBUG_BREAK: str | None = None
# Re-pack rows when at least this many cache columns (and this fraction of them) are holes.
_REPACK_MIN_WASTE = 32
_REPACK_MIN_FRACTION = 0.25


@dataclass
class SpeculativeOutput:
    """Result of :func:`specdecode.generate`.

    Shape:
        sequences: ``[B, prompt_len + new]`` int64 — prompt (with its left padding) then the
            new tokens, right-padded with ``pad_token_id`` where a row finished early.
    """

    sequences: Tensor
    stats: SpeculativeStats


@dataclass
class _Settings:
    rule: str
    rule_options: dict[str, Any]
    temperature: float  # 0 = greedy
    top_k: int
    top_p: float
    min_p: float
    max_new_tokens: int
    eos_ids: list[int]
    pad_id: int
    processors: Any  # a LogitsProcessorList or None
    stopping: Any  # a StoppingCriteriaList (without EOS / max-length criteria) or None
    streamer: Any
    generator: torch.Generator | None
    schedule: DraftSchedule
    vocab: int


class _Clock:
    """perf_counter, synchronising CUDA devices first so that phases are timed, not launched."""

    def __init__(self, *devices: torch.device) -> None:
        self.cuda = sorted({d for d in devices if d.type == "cuda"}, key=str)

    def __call__(self) -> float:
        for d in self.cuda:
            torch.cuda.synchronize(d)
        return time.perf_counter()


def _accepts_logits_to_keep(model: torch.nn.Module) -> bool:
    try:
        return "logits_to_keep" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def _new_cache() -> Any:
    from transformers import DynamicCache

    # No config: every layer is a full-attention DynamicLayer, which crops and re-packs exactly.
    return DynamicCache()


def _crop(cache: Any, length: int) -> None:
    current = cache.get_seq_length()
    if length < current:
        cache.crop(length - current)  # a negative argument removes that many columns (all 5.x versions)


def _plain_layers(cache: Any) -> list[Any] | None:
    """The cache's layers if all of them store plain ``keys`` / ``values`` ``[b, h, T, d]`` tensors."""
    layers = getattr(cache, "layers", None)
    if layers is None:
        return None
    for layer in layers:
        if getattr(layer, "is_sliding", False):
            return None
        keys = getattr(layer, "keys", None)
        if keys is None and not getattr(layer, "is_initialized", True):
            continue  # a layer that never ran (e.g. shared KV)
        if not isinstance(keys, Tensor):
            return None
    return list(layers)


def _select_rows(cache: Any, index: Tensor) -> None:
    if hasattr(cache, "batch_select_indices"):
        cache.batch_select_indices(index)
        return
    layers = _plain_layers(cache)
    if layers is None:
        raise RuntimeError("this cache type cannot drop finished rows (no batch_select_indices)")
    for layer in layers:
        if isinstance(getattr(layer, "keys", None), Tensor) and layer.keys.numel():
            layer.keys = layer.keys.index_select(0, index)
            layer.values = layer.values.index_select(0, index)


def _gather_columns(layers: list[Any], order: Tensor) -> None:
    """Per-row column gather of every layer: ``keys[b, :, j] <- keys[b, :, order[b, j]]``."""
    for layer in layers:
        keys = getattr(layer, "keys", None)
        if not isinstance(keys, Tensor) or keys.numel() == 0:
            continue
        b, h, _, d = keys.shape
        index = order.to(keys.device)[:, None, :, None].expand(b, h, order.shape[1], d)
        layer.keys = keys.gather(2, index)
        layer.values = layer.values.gather(2, index)


def _forward(model: torch.nn.Module, ids: Tensor, mask: Tensor | None, positions: Tensor, cache: Any,
             last_only: bool, keep_ok: bool) -> Tensor:
    kwargs: dict[str, Any] = {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": positions,
        "past_key_values": cache,
        "use_cache": True,
    }
    if last_only and keep_ok:
        kwargs["logits_to_keep"] = 1
    logits = model(**kwargs).logits
    return logits[:, -1] if last_only else logits


def _inverse_cdf(probs: Tensor, u: Tensor) -> Tensor:
    """One sample per row of ``probs [b, V]`` (float64) from one uniform each; never returns a
    zero-probability token."""
    cdf = probs.cumsum(-1)
    threshold = u * cdf[:, -1]
    x = torch.searchsorted(cdf, threshold[:, None].contiguous(), right=True)[:, 0]
    x = x.clamp_max(probs.shape[-1] - 1)
    # Rounding can push the threshold to the total mass: fall back to the last positive token
    # (branch-free, so that drafting never waits for the device).
    bad = probs.gather(1, x[:, None])[:, 0] <= 0
    last_positive = ((probs > 0).long() * torch.arange(1, probs.shape[-1] + 1, device=probs.device)).argmax(-1)
    return torch.where(bad, last_positive, x)


class _Loop:
    """State of one speculative generation (see the module docstring for the layout)."""

    def __init__(self, target: torch.nn.Module, draft: torch.nn.Module, input_ids: Tensor,
                 attention_mask: Tensor | None, settings: _Settings, stats: SpeculativeStats) -> None:
        self.target, self.draft, self.s, self.stats = target, draft, settings, stats
        self.dev = input_device(target)
        self.ddev = input_device(draft)
        self.clock = _Clock(self.dev, self.ddev)
        B, L = input_ids.shape
        self.B, self.L = B, L
        ids = input_ids.to(self.dev)
        if attention_mask is None:
            mask = torch.ones((B, L), dtype=torch.long, device=self.dev)
        else:
            mask = attention_mask.to(device=self.dev, dtype=torch.long)
        positions = (mask.cumsum(1) - 1).clamp_min(0)
        self.width = L + settings.max_new_tokens + 1  # the last column is a trash column for writes
        self.out = torch.full((B, self.width), settings.pad_id, dtype=torch.long, device=self.dev)
        self.out[:, :L] = ids
        self.gen = torch.zeros(B, dtype=torch.long, device=self.dev)
        self.eos = torch.tensor(settings.eos_ids, dtype=torch.long, device=self.dev) if settings.eos_ids else None

        self.rows = torch.arange(B, device=self.dev)
        self.cap = L + 2 * (settings.schedule.maximum + 2) + 8
        self.buf = torch.zeros((B, self.cap), dtype=torch.long, device=self.dev)
        self.amask = torch.zeros_like(self.buf)
        self.bpos = torch.zeros_like(self.buf)
        self.buf[:, :L] = ids
        self.amask[:, :L] = mask
        self.bpos[:, :L] = positions
        self.W = L - 1  # target cache columns; column W holds each row's pending token
        self.Wd = 0  # draft cache columns
        self.holes = not bool(mask.all())
        self.tcache = _new_cache()
        self.dcache = _new_cache()
        self.keep_t = _accepts_logits_to_keep(target)
        self.keep_d = _accepts_logits_to_keep(draft)
        windows = [w for w in (sliding_window(target), sliding_window(draft)) if w is not None]
        self.window = min(windows) if windows else None
        self.needs_q = True
        self.groups: list[tuple[int, Tensor | None]] = []

    # ----------------------------------------------------------------------- helpers
    def _mask(self, upto: int, device: torch.device) -> Tensor | None:
        if not self.holes:
            return None
        return self.amask[:, :upto].to(device).contiguous()

    def _rand(self, *shape: int) -> Tensor:
        gen = self.s.generator
        device = gen.device if gen is not None else self.dev
        return torch.rand(shape, dtype=torch.float64, device=device, generator=gen).to(self.dev)

    def _propose(self, logits: Tensor, greedy: bool = False) -> Tensor:
        """A token per row from the processed distribution of ``logits [b, V]`` (float32)."""
        if greedy or self.s.temperature == 0.0:
            return logits.argmax(-1)
        s = self.s
        probs = process_logits(logits, s.temperature, s.top_k, s.top_p, s.min_p)
        return _inverse_cdf(probs, self._rand(logits.shape[0]))

    def _set_groups(self, gen_active: Tensor) -> None:
        """Active rows grouped by their generated length, for HF logits processors."""
        values = gen_active.tolist()
        distinct = sorted(set(values))
        if len(distinct) == 1:
            self.groups = [(distinct[0], None)]
            return
        by_value: dict[int, list[int]] = {}
        for i, v in enumerate(values):
            by_value.setdefault(v, []).append(i)
        self.groups = [(v, torch.tensor(m, device=self.dev)) for v, m in sorted(by_value.items())]

    def _context(self, length: int, members: Tensor | None, extra: Tensor | None) -> tuple[Tensor, Tensor]:
        """HF processors and stopping criteria see the batch exactly as plain ``generate``
        would: every original row (some keep per-row state, e.g. ``prompt_ignore_length``),
        all of one length. Returns ``input_ids [B, L + length (+ extra)]`` built from the
        output buffer (the rows of ``members`` are the ones that count) and the original row
        index of each member."""
        active = self.rows if members is None else self.rows[members]
        ctx = self.out[:, : self.L + length]
        if extra is not None and extra.shape[1] > 0:
            tail = torch.zeros((self.B, extra.shape[1]), dtype=torch.long, device=self.dev)
            tail[active] = extra if members is None else extra[members]
            ctx = torch.cat([ctx, tail], dim=1)
        return ctx, active

    def _process(self, scores: Tensor, extra: Tensor | None) -> Tensor:
        """Apply the HF logits processors to ``scores [b, V]``; active row r's context is its
        output so far (prompt with padding + generated tokens) followed by ``extra[r]``."""
        identity = self.rows.numel() == self.B  # no row dropped yet: active order == batch order
        result = scores.clone() if len(self.groups) > 1 else scores
        for g, members in self.groups:
            ctx, active = self._context(g, members, extra)
            if identity and members is None:
                return self.s.processors(ctx, scores)
            full = torch.zeros((self.B, scores.shape[1]), dtype=scores.dtype, device=self.dev)
            full[active] = scores if members is None else scores[members]
            new = self.s.processors(ctx, full)[active].to(scores.dtype)
            if members is None:
                result = new
            else:
                result[members] = new
        return result

    def _grow(self, needed: int) -> None:
        if needed <= self.cap:
            return
        extra = max(needed, 2 * self.cap) - self.cap
        pad = torch.zeros((self.buf.shape[0], extra), dtype=torch.long, device=self.dev)
        self.buf = torch.cat([self.buf, pad], 1)
        self.amask = torch.cat([self.amask, pad], 1)
        self.bpos = torch.cat([self.bpos, pad], 1)
        self.cap += extra

    def _repack(self, force: bool = False) -> None:
        """Right-align every row's real columns (both caches and the buffers) when holes waste
        enough of the cache. Needs both caches to cover the same columns."""
        if not self.holes or self.Wd != self.W or self.W == 0:
            return
        W = self.W
        newW = int(self.amask[:, :W].sum(1).max())
        waste = W - newW
        if waste <= 0 or (not force and waste < max(_REPACK_MIN_WASTE, _REPACK_MIN_FRACTION * W)):
            return
        tl, dl = _plain_layers(self.tcache), _plain_layers(self.dcache)
        if tl is None or dl is None:
            return
        order = torch.sort(self.amask[:, :W], dim=1, stable=True).indices[:, W - newW:]
        _gather_columns(tl, order)
        _gather_columns(dl, order)
        for t in (self.buf, self.amask, self.bpos):
            gathered = t[:, :W].gather(1, order)
            pending = t[:, W].clone()
            t[:, :newW] = gathered
            t[:, newW] = pending
        self.W = self.Wd = newW
        self.holes = not bool(self.amask[:, : newW + 1].all())
        self.stats.repacks += 1

    def _fit_window(self, gamma: int) -> int:
        """Sliding-window models see the window in cache columns here: when a step would pass
        it, re-pack the rows, then draft fewer tokens; refuse only when not even the pending
        token fits (the prompt + max_new_tokens check up front makes that unlikely)."""
        if self.window is None or self.W + gamma + 1 <= self.window:
            return gamma
        self._repack(force=True)
        if self.W + 1 > self.window:
            raise RuntimeError(
                f"the batch needs {self.W + 1} cache columns, more than the model's sliding window "
                f"({self.window}); sliding-window attention is only supported within the window"
            )
        return min(gamma, self.window - self.W - 1)

    def _check_stopping(self, g_active: Tensor, keep: Tensor) -> tuple[Tensor, Tensor]:
        """HF stopping criteria after every emitted token of every row (tokens already written
        to ``out``). Returns the new kept counts and which rows stopped."""
        keep_l = keep.tolist()
        g_l = g_active.tolist()
        stopped = [False] * len(keep_l)
        new_keep = list(keep_l)
        for j in range(max(keep_l) if keep_l else 0):
            groups: dict[int, list[int]] = {}
            for r, k in enumerate(keep_l):
                if not stopped[r] and k > j:
                    groups.setdefault(g_l[r] + j + 1, []).append(r)
            for length, members in groups.items():
                ctx, active = self._context(length, torch.tensor(members, device=self.dev), None)
                done = self.s.stopping(ctx, None)
                if isinstance(done, Tensor) and done.numel() > 1:
                    done_l = done.reshape(-1)[active].tolist()
                else:
                    done_l = [bool(done)] * len(members)
                for r, d in zip(members, done_l):
                    if d:
                        stopped[r] = True
                        new_keep[r] = j + 1
        for r, (k_old, k_new) in enumerate(zip(keep_l, new_keep)):
            if k_new < k_old:
                row = int(self.rows[r])
                self.out[row, self.L + g_l[r] + k_new: self.L + g_l[r] + k_old] = self.s.pad_id
        return (torch.tensor(new_keep, dtype=torch.long, device=self.dev),
                torch.tensor(stopped, dtype=torch.bool, device=self.dev))

    # -------------------------------------------------------------------------- run
    def run(self) -> Tensor:
        s, stats, clock = self.s, self.stats, self.clock
        dev, ddev = self.dev, self.ddev
        info = get_rule(s.rule)
        if s.streamer is not None:
            s.streamer.put(self.out[:, : self.L].cpu())

        if self.W > 0:  # target prefill: every prompt column but the last (the first pending token)
            t0 = clock()
            _forward(self.target, self.buf[:, : self.W], self._mask(self.W, dev), self.bpos[:, : self.W],
                     self.tcache, True, self.keep_t)
            dt = clock() - t0
            stats.target_calls += 1
            stats.target_prefill_calls += 1
            stats.target_time += dt
            stats.target_prefill_time += dt

        draft_prefilled = False
        while self.rows.numel() > 0:
            b = self.rows.numel()
            W = self.W
            g_active = self.gen[self.rows]
            remaining = s.max_new_tokens - g_active
            remaining_min, remaining_max = (int(v) for v in torch.stack([remaining.min(), remaining.max()]).tolist())
            gamma = max(min(s.schedule.num_draft_tokens(), remaining_max - 1), 0)
            gamma = self._fit_window(gamma)
            W = self.W  # a forced re-pack may have moved it
            self._grow(W + gamma + 2)
            if s.processors is not None or s.stopping is not None:
                self._set_groups(g_active)

            # ---------------------------------------------------------------- draft
            draft_tokens = draft_logits = None
            if gamma > 0:
                t0 = clock()
                logits_list = []
                for i in range(gamma):
                    lo = self.Wd if i == 0 else W + i
                    hi = W + i + 1
                    tc = clock() if not draft_prefilled else 0.0
                    logits = _forward(self.draft, self.buf[:, lo:hi].to(ddev), self._mask(hi, ddev),
                                      self.bpos[:, lo:hi].to(ddev), self.dcache, True, self.keep_d)
                    stats.draft_calls += 1
                    if not draft_prefilled:
                        stats.draft_prefill_time += clock() - tc
                        draft_prefilled = True
                    lg = logits[:, : s.vocab].to(device=dev, dtype=torch.float32)
                    if s.processors is not None:
                        lg = self._process(lg, self.buf[:, W + 1: W + 1 + i])
                    x = self._propose(lg, greedy=_DEBUG_BREAK == "greedy_draft")
                    self.buf[:, W + 1 + i] = x
                    self.amask[:, W + 1 + i] = 1
                    self.bpos[:, W + 1 + i] = self.bpos[:, W] + (i + 1)
                    logits_list.append(lg)
                self.Wd = W + gamma
                draft_logits = torch.stack(logits_list, 1)
                draft_tokens = self.buf[:, W + 1: W + 1 + gamma].clone()
                stats.draft_time += clock() - t0

            # --------------------------------------------------------------- target
            t0 = clock()
            tl = _forward(self.target, self.buf[:, W: W + gamma + 1], self._mask(W + gamma + 1, dev),
                          self.bpos[:, W: W + gamma + 1], self.tcache, False, self.keep_t)
            tl = tl[:, :, : s.vocab].to(device=dev, dtype=torch.float32)
            if s.processors is not None:
                tl = torch.stack([self._process(tl[:, i], draft_tokens[:, :i] if gamma else None)
                                  for i in range(gamma + 1)], 1)
            stats.target_calls += 1
            stats.target_time += clock() - t0

            # --------------------------------------------------------------- verify
            t0 = clock()
            if gamma > 0:
                if _DEBUG_BREAK == "bonus_position":
                    tl = torch.cat([tl[:, :gamma], tl[:, gamma - 1: gamma]], 1)
                drafted = None
                if remaining_min <= gamma:
                    drafted = (remaining - 1).clamp(0, gamma)
                uniforms = self._rand(b, gamma + 1)
                result = verify_logits(
                    tl.contiguous(), draft_logits if info.needs_draft_probs or not info.builtin else None,
                    draft_tokens, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, min_p=s.min_p,
                    rule=s.rule, num_draft_tokens=drafted, uniforms=uniforms, **s.rule_options,
                )
                tokens, tau = result.tokens.to(dev), result.accepted_len.to(dev)
                if drafted is None:
                    drafted = torch.full((b,), gamma, dtype=torch.long, device=dev)
            else:  # one plain decoding step (only the last token of some row is missing)
                tokens = self._propose(tl[:, 0])[:, None]
                tau = torch.zeros(b, dtype=torch.long, device=dev)
                drafted = torch.zeros(b, dtype=torch.long, device=dev)
            stats.verify_time += clock() - t0

            # ----------------------------------------------------------- bookkeeping
            t0 = clock()
            idx = torch.arange(gamma + 1, device=dev)
            emit = tau + 1
            keep = emit
            finished = torch.zeros(b, dtype=torch.bool, device=dev)
            if self.eos is not None:
                is_eos = torch.isin(tokens, self.eos) & (idx[None, :] < emit[:, None])
                has_eos = is_eos.any(1)
                keep = torch.where(has_eos, is_eos.to(torch.int8).argmax(1) + 1, keep)
                finished = has_eos
            keep = torch.minimum(keep, remaining)
            cols = torch.where(idx[None, :] < keep[:, None], self.L + g_active[:, None] + idx[None, :],
                               self.width - 1)
            self.out[self.rows[:, None].expand_as(cols), cols] = tokens
            if s.stopping is not None:
                keep, stopped = self._check_stopping(g_active, keep)
                finished = finished | stopped
            g_new = g_active + keep
            self.gen[self.rows] = g_new
            finished = finished | (g_new >= s.max_new_tokens)

            host = torch.stack([tau, keep, finished.long(), drafted]).cpu()
            tau_h, keep_h, fin_h, drafted_h = host[0], host[1], host[2].bool(), host[3]
            stats.steps += 1
            stats.row_steps += b
            stats.new_tokens += int(keep_h.sum())
            stats.num_draft_tokens_history.append(gamma)
            if gamma > 0:
                stats.drafted_tokens += int(drafted_h.sum())
                stats.accepted_tokens += int(tau_h.sum())
                stats.rejections += int((tau_h < drafted_h).sum())
                while len(stats.position_drafted) < gamma:
                    stats.position_drafted.append(0)
                    stats.position_accepted.append(0)
                positions = torch.arange(gamma)
                for i, (d, a) in enumerate(zip((drafted_h[:, None] > positions).sum(0).tolist(),
                                               (tau_h[:, None] > positions).sum(0).tolist())):
                    stats.position_drafted[i] += d
                    stats.position_accepted[i] += a
            if s.streamer is not None:
                s.streamer.put(tokens[0, : int(keep_h[0])].cpu())

            continuing = ~fin_h
            if not bool(continuing.any()):
                stats.bookkeeping_time += clock() - t0
                break

            # ------------------------------------------- roll back and re-align the batch
            ta = clock()
            max_tau = int(tau_h[continuing].max())
            if gamma > 0 and _DEBUG_BREAK != "no_rollback":
                self.amask[:, W + 1: W + 1 + gamma] = (idx[None, :gamma] < tau[:, None]).long()
            Wn = W + max_tau + 1
            pending = tokens.gather(1, tau[:, None])[:, 0]
            self.buf[:, Wn] = pending
            self.amask[:, Wn] = 1
            self.bpos[:, Wn] = self.bpos[:, W] + tau + 1
            _crop(self.tcache, Wn)
            self.Wd = min(self.Wd, Wn)
            _crop(self.dcache, self.Wd)
            self.W = Wn
            if gamma > 0 and int(tau_h[continuing].min()) != max_tau:
                self.holes = True
            if bool(fin_h.any()):
                index = torch.nonzero(continuing).flatten().to(dev)
                self.rows = self.rows[index]
                self.buf, self.amask, self.bpos = self.buf[index], self.amask[index], self.bpos[index]
                _select_rows(self.tcache, index)
                _select_rows(self.dcache, index.to(ddev))
                self.holes = not bool(self.amask[:, : self.W + 1].all())
            self._repack()
            stats.alignment_time += clock() - ta

            if gamma > 0:
                s.schedule.update(num_draft_tokens=gamma, drafted=drafted_h,
                                  accepted=tau_h, stats=stats)
            stats.bookkeeping_time += clock() - t0

        if s.streamer is not None:
            s.streamer.end()
        new = int(self.gen.max()) if self.B else 0
        return self.out[:, : self.L + new]


# ------------------------------------------------------------------------------- validation


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int >= {minimum}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value}")
    return value


def _as_id_list(name: str, value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, Tensor):
        value = value.flatten().tolist()
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return list(value)
    raise TypeError(f"{name}: expected an int, a list of ints or None, got {value!r}")


def _check_inputs(input_ids: Any, attention_mask: Any, pad_ids: list[int], vocab_limit: int,
                  mask_required_for_pads: bool) -> Tensor | None:
    if not isinstance(input_ids, Tensor):
        raise TypeError(f"input_ids: expected a torch.Tensor of shape [B, prompt_len], got {type(input_ids).__name__}")
    if input_ids.dim() != 2 or input_ids.shape[0] < 1 or input_ids.shape[1] < 1:
        raise ValueError(
            f"input_ids: expected shape [B, prompt_len] with B, prompt_len >= 1, got {tuple(input_ids.shape)}"
        )
    if input_ids.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
        raise TypeError(f"input_ids: expected an integer tensor (int64), got {input_ids.dtype}")
    if input_ids.device.type == "meta":
        raise ValueError("input_ids: is on the meta device; pass real token ids")
    lo, hi = int(input_ids.min()), int(input_ids.max())
    if attention_mask is None:
        if mask_required_for_pads and input_ids.shape[0] > 1 and pad_ids and bool(
            torch.isin(input_ids, torch.tensor(pad_ids, device=input_ids.device)).any()
        ):
            raise ValueError(
                "attention_mask: input_ids holds pad tokens (a padded batch) but no attention_mask was given; "
                "pass the tokenizer's attention_mask (left padding), or an all-ones mask if those ids are real tokens"
            )
        if lo < 0 or hi >= vocab_limit:
            raise ValueError(
                f"input_ids: every id must lie in [0, {vocab_limit}) (both models' vocabularies), got [{lo}, {hi}]"
            )
        return None
    if not isinstance(attention_mask, Tensor):
        raise TypeError(f"attention_mask: expected a torch.Tensor or None, got {type(attention_mask).__name__}")
    if tuple(attention_mask.shape) != tuple(input_ids.shape):
        raise ValueError(
            f"attention_mask: expected the shape of input_ids {tuple(input_ids.shape)}, "
            f"got {tuple(attention_mask.shape)}"
        )
    mask = attention_mask.to(torch.long)
    if bool(((mask != 0) & (mask != 1)).any()):
        raise ValueError("attention_mask: every entry must be 0 or 1")
    if not bool(mask[:, -1].all()):
        raise ValueError(
            "attention_mask: the last column must be all ones; pad batches on the left (padding_side='left')"
        )
    real = input_ids[mask.bool()]
    if real.numel() and (int(real.min()) < 0 or int(real.max()) >= vocab_limit):
        raise ValueError(
            f"input_ids: every unmasked id must lie in [0, {vocab_limit}) (both models' vocabularies), "
            f"got [{int(real.min())}, {int(real.max())}]"
        )
    if input_ids.shape[0] and (lo < 0 or hi >= vocab_limit):
        raise ValueError(f"input_ids: padding ids must lie in [0, {vocab_limit}) too, got [{lo}, {hi}]")
    return mask


def _sampling_settings(do_sample: bool, temperature: Any, top_k: Any, top_p: Any, min_p: Any
                       ) -> tuple[float, int, float, float]:
    if not isinstance(do_sample, bool):
        raise TypeError(f"do_sample: expected a bool, got {do_sample!r}")
    top_k = 0 if top_k is None else top_k
    top_p = 1.0 if top_p is None else top_p
    min_p = 0.0 if min_p is None else min_p
    temperature = 1.0 if temperature is None else temperature
    _check_sampling(temperature, top_k, top_p, min_p)
    if not do_sample:
        return 0.0, 0, 1.0, 0.0
    return float(temperature), int(top_k), float(top_p), float(min_p)


def _as_processor_list(logits_processor: Any) -> Any:
    if logits_processor is None:
        return None
    from transformers import LogitsProcessorList

    if isinstance(logits_processor, LogitsProcessorList):
        processors = logits_processor
    elif isinstance(logits_processor, (list, tuple)):
        processors = LogitsProcessorList(logits_processor)
    elif callable(logits_processor):
        processors = LogitsProcessorList([logits_processor])
    else:
        raise TypeError(
            f"logits_processor: expected a LogitsProcessorList, a list of processors or None, got {logits_processor!r}"
        )
    return processors if len(processors) else None


def _split_stopping(stopping_criteria: Any) -> tuple[Any, int | None, list[int]]:
    """Split HF stopping criteria into (the others, max_length, eos ids): max-length and EOS
    criteria are handled natively (vectorised), the rest after every emitted token."""
    if stopping_criteria is None:
        return None, None, []
    from transformers import StoppingCriteriaList
    from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria

    if isinstance(stopping_criteria, (list, tuple)):
        items = list(stopping_criteria)
    elif callable(stopping_criteria):
        items = [stopping_criteria]
    else:
        raise TypeError(
            f"stopping_criteria: expected a StoppingCriteriaList, a list of criteria or None, got {stopping_criteria!r}"
        )
    others, max_length, eos = [], None, []
    for c in items:
        if isinstance(c, MaxLengthCriteria):
            max_length = c.max_length if max_length is None else min(max_length, c.max_length)
        elif isinstance(c, EosTokenCriteria):
            eos.extend(_as_id_list("eos_token_id", c.eos_token_id))
        else:
            others.append(c)
    return (StoppingCriteriaList(others) if others else None), max_length, eos


def _run(target: torch.nn.Module, draft: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor | None, *,
         num_draft_tokens: int, rule: str, rule_options: dict[str, Any], max_new_tokens: int,
         temperature: float, top_k: int, top_p: float, min_p: float, eos_ids: list[int], pad_id: int | None,
         processors: Any, stopping: Any, streamer: Any, draft_schedule: str | DraftSchedule,
         max_num_draft_tokens: int | None, generator: torch.Generator | None, vocab: int,
         stats: SpeculativeStats | None, t_start: float) -> tuple[Tensor, SpeculativeStats]:
    """Shared core of :func:`generate` and the ``custom_generate`` plug-in (inputs checked)."""
    _check_int("max_new_tokens", max_new_tokens, 1)
    _check_int("num_draft_tokens", num_draft_tokens, 1)
    info = get_rule(rule)
    if info.builtin:
        builtin_rule_params(info, rule_options)
    schedule = make_schedule(draft_schedule, num_draft_tokens, max_num_draft_tokens)
    if streamer is not None and input_ids.shape[0] != 1:
        raise ValueError(
            f"streamer: streaming needs batch size 1 (as Hugging Face's streamers), got {input_ids.shape[0]}"
        )
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator: expected a torch.Generator or None, got {type(generator).__name__}")
    if pad_id is None:
        pad_id = eos_ids[0] if eos_ids else 0
    window = [w for w in (sliding_window(target), sliding_window(draft)) if w is not None]
    if window and input_ids.shape[1] + max_new_tokens > min(window):
        raise ValueError(
            f"max_new_tokens: prompt_len + max_new_tokens = {input_ids.shape[1] + max_new_tokens} exceeds the sliding "
            f"window ({min(window)}); sliding-window attention is only supported within the window"
        )
    if stats is None:
        stats = SpeculativeStats()
    stats.rule = rule
    stats.batch_size = int(input_ids.shape[0])
    stats.draft_schedule = getattr(schedule, "name", type(schedule).__name__)
    settings = _Settings(
        rule=rule, rule_options=dict(rule_options), temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
        max_new_tokens=max_new_tokens, eos_ids=eos_ids, pad_id=int(pad_id), processors=processors,
        stopping=stopping, streamer=streamer, generator=generator, schedule=schedule, vocab=vocab,
    )
    loop = _Loop(target, draft, input_ids, attention_mask, settings, stats)
    sequences = loop.run()
    stats.total_time = loop.clock() - t_start
    return sequences, stats


@torch.no_grad()
def generate(
    target: torch.nn.Module,
    draft: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    *,
    num_draft_tokens: int = 5,
    rule: str = "token",
    max_new_tokens: int = 128,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    eos_token_id: int | list[int] | None = None,
    pad_token_id: int | None = None,
    logits_processor: Any = None,
    stopping_criteria: Any = None,
    streamer: Any = None,
    draft_schedule: str | DraftSchedule = "constant",
    max_num_draft_tokens: int | None = None,
    generator: torch.Generator | None = None,
    target_tokenizer: Any = None,
    draft_tokenizer: Any = None,
    stats: SpeculativeStats | None = None,
    **rule_options: Any,
) -> SpeculativeOutput:
    """Speculative decoding of ``target`` with ``draft``: same output distribution as sampling
    from ``target`` (lossless rules), or its greedy output at ``do_sample=False``.

    Shape:
        input_ids: ``[B, prompt_len]`` int64, left-padded for B > 1.
        attention_mask: ``[B, prompt_len]`` 0/1 or None (no padding).
        returns: ``SpeculativeOutput(sequences [B, prompt_len + new], stats)``.

    Sampling settings (``temperature``, ``top_k``, ``top_p``, ``min_p``) and the HF
    ``logits_processor`` are applied identically to target and draft logits ("standardized
    sampling"); ``do_sample=False`` is greedy decoding (every built-in rule is then exact).
    ``rule`` is any name from :func:`specdecode.list_rules`, ``rule_options`` its options.
    ``eos_token_id`` / ``pad_token_id`` default to the target's generation config. Each row
    stops at EOS, ``max_new_tokens`` or a stopping criterion and is then right-padded with
    ``pad_token_id``. ``streamer`` (batch 1) receives the prompt, then each step's new tokens,
    then ``end()``, as with ``model.generate``. ``draft_schedule``: ``"constant"``,
    ``"heuristic"``, ``"optimal"`` or a :class:`DraftSchedule`. ``generator`` drives every
    random choice (draft sampling and verification), so a seed fixes the output.
    ``target_tokenizer`` / ``draft_tokenizer``, when given, must be the same tokenizer.
    """
    t_start = time.perf_counter()
    vocab = check_compatibility(target, draft, target_tokenizer=target_tokenizer, draft_tokenizer=draft_tokenizer)
    temperature, top_k, top_p, min_p = _sampling_settings(do_sample, temperature, top_k, top_p, min_p)
    gen_config = getattr(target, "generation_config", None)
    if eos_token_id is None and gen_config is not None:
        eos_token_id = gen_config.eos_token_id
    eos_ids = _as_id_list("eos_token_id", eos_token_id)
    if pad_token_id is None:
        pad_token_id = getattr(gen_config, "pad_token_id", None) if gen_config is not None else None
    if pad_token_id is None:
        pad_token_id = getattr(target.config, "pad_token_id", None)
    if pad_token_id is not None:
        pad_token_id = _as_id_list("pad_token_id", pad_token_id)[0]
    mask = _check_inputs(input_ids, attention_mask, [pad_token_id] if pad_token_id is not None else [],
                         _vocab_limit(target, draft), mask_required_for_pads=True)
    processors = _as_processor_list(logits_processor)
    stopping, max_length, criteria_eos = _split_stopping(stopping_criteria)
    eos_ids = sorted(set(eos_ids) | set(criteria_eos))
    _check_int("max_new_tokens", max_new_tokens, 1)
    if max_length is not None:
        max_new_tokens = min(max_new_tokens, max_length - input_ids.shape[1])
        if max_new_tokens < 1:
            raise ValueError(
                f"stopping_criteria: MaxLengthCriteria(max_length={max_length}) leaves no room after the prompt"
            )
    sequences, stats = _run(
        target, draft, input_ids, mask, num_draft_tokens=num_draft_tokens, rule=rule, rule_options=rule_options,
        max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
        eos_ids=eos_ids, pad_id=pad_token_id, processors=processors, stopping=stopping, streamer=streamer,
        draft_schedule=draft_schedule, max_num_draft_tokens=max_num_draft_tokens, generator=generator, vocab=vocab,
        stats=stats, t_start=t_start,
    )
    return SpeculativeOutput(sequences, stats)


def _vocab_limit(target: torch.nn.Module, draft: torch.nn.Module) -> int:
    """Ids both models can embed (prompt ids must be below it)."""
    sizes = []
    for m in (target, draft):
        emb = m.get_input_embeddings()
        sizes.append(int(emb.weight.shape[0]) if emb is not None else int(m.config.vocab_size))
    return min(sizes)
