"""The training loop every drafter kind shares.

AdamW with a linear warmup and a cosine decay, a tqdm bar showing the loss and the greedy
acceptance estimate, a wall-time budget, a checkpoint in the out folder every few steps (and on
Ctrl-C) from which a second run with the same settings resumes, and the peak memory.

Deterministic: the batch of step ``s`` is a function of ``(seed, s)`` alone (a seeded
permutation per epoch), the drafter runs without dropout, and a resumed run restores the
parameters, the optimizer state and the step, so interrupted and uninterrupted runs end on the
same weights. With a time budget, the number of steps is measured, not chosen: after the first
steps the loop estimates how many fit (the schedule's horizon), stores that in the checkpoint
and stops there or when the budget is spent, whichever comes first.
"""

from __future__ import annotations

import inspect
import math
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from torch import Tensor
from tqdm.auto import tqdm

from specdecode.training.data import Example
from specdecode.training.device import peak_memory_mib
from specdecode.training.losses import DistillMetrics, PlacedLogits, distill_loss, placed_loss

__all__ = ["CHECKPOINT_FILE", "Batch", "LoopSettings", "StepInfo", "collate", "run_loop", "step_metrics"]

CHECKPOINT_FILE = "checkpoint.pt"
_PROBE_STEPS = 3  # steps timed (after an untimed first one) before a time-bounded run's horizon is fixed


@dataclass(frozen=True)
class LoopSettings:
    """Optimisation settings (every field goes into the run's identity, so a checkpoint is only
    resumed by a run with the same ones)."""

    batch_size: int = 8
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 10
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    checkpoint_every: int = 25
    loss: str = "kl"
    seed: int = 0
    tf32: bool = True  # on CUDA: the drafter's float32 matrix products on tensor cores (TF32), see _matmuls


@contextmanager
def _matmuls(device: torch.device, tf32: bool) -> Iterator[None]:
    """The training steps' float32 matrix products on CUDA in TF32 (tensor cores: several times
    the SIMT float32 rate, 10 mantissa bits per input, float32 accumulation) when ``tf32``; the
    global switch is restored afterwards, so the target's own forwards (the data stage, greedy
    checks, generation) never run in TF32. Nothing changes on the CPU."""
    if device.type != "cuda" or not tf32:
        yield
        return
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


@dataclass
class StepInfo:
    """What the loop reports after each optimizer step (to ``callback``)."""

    step: int
    horizon: int | None
    loss: float
    greedy_acceptance: float
    sampled_acceptance: float
    lr: float


@dataclass
class LoopResult:
    """The run's summary (written into the drafter's record)."""

    steps: int
    horizon: int | None
    seconds: float
    before: dict[str, float]
    after: dict[str, float] = field(default_factory=dict)
    losses: list[float] = field(default_factory=list)
    peak_memory_mib: float = 0.0
    resumed_from: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Batch:
    """A right-padded batch of examples.

    Shape:
        input_ids, attention_mask: ``[b, t]`` (the mask is 1 on tokens, 0 on padding).
        top_logp, top_ids: ``[b, t, k]``.
        counted: ``[b, t]`` bool, the positions the loss and the estimates count.
        features: ``[b, t, F]`` float16 or None, the target's features (feature drafters).
    """

    input_ids: Tensor
    attention_mask: Tensor
    top_logp: Tensor
    top_ids: Tensor
    counted: Tensor
    features: Tensor | None = None


def collate(examples: list[Example], device: torch.device) -> Batch:
    """The examples as one right-padded :class:`Batch` on ``device``."""
    width = max(len(e.input_ids) for e in examples)
    k = examples[0].top_ids.shape[-1]
    ids = torch.zeros((len(examples), width), dtype=torch.long)
    attention = torch.zeros((len(examples), width), dtype=torch.long)
    logp = torch.zeros((len(examples), width, k), dtype=torch.float16)
    top = torch.zeros((len(examples), width, k), dtype=torch.int32)
    counted = torch.zeros((len(examples), width), dtype=torch.bool)
    for row, e in enumerate(examples):
        n = len(e.input_ids)
        ids[row, :n], logp[row, :n], top[row, :n] = e.input_ids, e.top_logp, e.top_ids
        attention[row, :n] = 1
        counted[row, e.start:n] = True
    features = None
    if all(e.features is not None for e in examples):
        features = torch.zeros((len(examples), width, examples[0].features.shape[-1]), dtype=torch.float16)
        for row, e in enumerate(examples):
            features[row, : len(e.input_ids)] = e.features
        features = features.to(device)
    return Batch(*(x.to(device) for x in (ids, attention, logp, top, counted)), features=features)


def _batch_indices(step: int, batch_size: int, n: int, seed: int,
                   orders: dict[int, list[int]] | None = None) -> list[int]:
    """The examples of step ``step``: positions ``[step * b, (step + 1) * b)`` of the stream of
    seeded per-epoch permutations of ``range(n)``. ``orders`` keeps the permutations of the
    epochs in use from one call to the next (a dict the caller owns; each permutation is drawn
    once instead of once per example)."""
    orders = {} if orders is None else orders
    out = []
    for pos in range(step * batch_size, (step + 1) * batch_size):
        epoch, offset = divmod(pos, n)
        if epoch not in orders:
            for old in [e for e in orders if e < epoch]:
                del orders[old]  # the stream only moves forward
            generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
            orders[epoch] = torch.randperm(n, generator=generator).tolist()
        out.append(orders[epoch][offset])
    return out


def _lr(step: int, horizon: int | None, settings: LoopSettings) -> float:
    warm = min(1.0, (step + 1) / max(1, settings.warmup_steps))
    progress = 0.0 if not horizon else min(1.0, step / horizon)
    cosine = settings.min_lr_ratio + (1 - settings.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    return settings.lr * warm * cosine


# (model, input_ids, attention_mask[, features=]) -> logits, or (logits, an extra loss term)
Forward = Callable[..., Any]


def _run_forward(forward: Forward, model: torch.nn.Module, b: Batch) -> tuple[Any, Tensor | None]:
    """The drafter's logits on a batch and the extra loss its kind adds (None when none);
    ``features=`` is passed only when the batch has them, ``counted=`` only to a forward that
    takes it (a block drafter places its blocks where the loss counts)."""
    extra: dict[str, Any] = {} if b.features is None else {"features": b.features}
    if "counted" in inspect.signature(forward).parameters:
        extra["counted"] = b.counted
    out = forward(model, b.input_ids, b.attention_mask, **extra)
    return out if isinstance(out, tuple) else (out, None)


def _metrics(logits: Any, b: Batch, loss: str) -> DistillMetrics:
    """The distillation loss and estimates of a forward's logits (``[b, t, V]`` predicting each
    position's next token, or :class:`~specdecode.training.losses.PlacedLogits`)."""
    if isinstance(logits, PlacedLogits):
        return placed_loss(logits, b.top_logp, b.top_ids, b.counted, loss)
    return distill_loss(logits, b.top_logp, b.top_ids, b.counted, loss)


def step_metrics(forward: Forward, model: torch.nn.Module, b: Batch, loss: str) -> tuple[Any, Tensor]:
    """One training step's metrics on batch ``b`` (the distillation loss and the acceptance
    estimates) and the loss to minimize (the distillation loss plus the kind's extra term)."""
    logits, extra = _run_forward(forward, model, b)
    metrics = _metrics(logits, b, loss)
    return metrics, (metrics.loss if extra is None else metrics.loss + extra)


@torch.no_grad()
def evaluate(model: torch.nn.Module, forward: Forward, examples: list[Example], settings: LoopSettings
             ) -> dict[str, float]:
    """Mean loss, greedy and sampled acceptance of ``model`` over ``examples``."""
    device = next(model.parameters()).device
    sums = {"loss": 0.0, "greedy_acceptance": 0.0, "sampled_acceptance": 0.0}
    total = 0
    for start in range(0, len(examples), settings.batch_size):
        b = collate(examples[start: start + settings.batch_size], device)
        m = _metrics(_run_forward(forward, model, b)[0], b, settings.loss)
        sums["loss"] += m.loss.item() * m.positions
        sums["greedy_acceptance"] += m.greedy_acceptance * m.positions
        sums["sampled_acceptance"] += m.sampled_acceptance * m.positions
        total += m.positions
    return {k: v / max(total, 1) for k, v in sums.items()}


def _save(path: Path, state: dict[str, Any]) -> None:
    torch.save(state, path.with_suffix(".tmp"))
    path.with_suffix(".tmp").replace(path)


def run_loop(model: torch.nn.Module, params: dict[str, torch.nn.Parameter], forward: Forward,
             train: list[Example], val: list[Example], out_dir: Path, settings: LoopSettings, *,
             run_key: str, max_steps: int | None, deadline: float | None, progress: bool = True,
             callback: Callable[[StepInfo], None] | None = None, desc: str = "train") -> LoopResult:
    """Train ``params``; see :func:`_run_loop` (the same arguments), run with the matrix
    products of ``settings.tf32`` (:func:`_matmuls`)."""
    with _matmuls(next(model.parameters()).device, settings.tf32):
        return _run_loop(model, params, forward, train, val, out_dir, settings, run_key=run_key, max_steps=max_steps,
                         deadline=deadline, progress=progress, callback=callback, desc=desc)


def _run_loop(model: torch.nn.Module, params: dict[str, torch.nn.Parameter], forward: Forward,
              train: list[Example], val: list[Example], out_dir: Path, settings: LoopSettings, *,
              run_key: str, max_steps: int | None, deadline: float | None, progress: bool = True,
              callback: Callable[[StepInfo], None] | None = None, desc: str = "train") -> LoopResult:
    """Train ``params`` (parameters of ``model``, by name) to match the target's distributions
    in ``train``. ``forward(model, input_ids, attention_mask)`` gives the drafter's logits ``[b, t, V]``
    (with ``features=`` when the examples carry target features; it may return ``(logits,
    extra_loss)``: the extra term is added to the training loss, not to the reported one). Stops
    after ``max_steps`` steps or at ``deadline`` (``time.monotonic()``; at least one step is
    made); at least one of them must be given. Resumes from ``out_dir/checkpoint.pt`` when its ``run_key`` matches.
    ``callback`` is called after every step (it may raise ``KeyboardInterrupt`` to stop the run
    with a checkpoint, as Ctrl-C does)."""
    if max_steps is None and deadline is None:
        raise ValueError("max_steps: give max_steps or a time budget")
    device = next(model.parameters()).device
    opt = torch.optim.AdamW(list(params.values()), lr=settings.lr, weight_decay=settings.weight_decay)
    path = Path(out_dir) / CHECKPOINT_FILE
    state = torch.load(path, weights_only=False) if path.is_file() else None
    if state is not None and state["run_key"] == run_key:
        with torch.no_grad():
            for name, value in state["params"].items():
                params[name].copy_(value)
        opt.load_state_dict(state["optimizer"])
        result = LoopResult(**state["result"])
        result.resumed_from = result.steps
    else:
        result = LoopResult(steps=0, horizon=max_steps if deadline is None else None, seconds=0.0,
                            before=evaluate(model, forward, val, settings))
    start_time = time.monotonic()
    seconds_before = result.seconds

    def checkpoint() -> None:
        result.seconds = seconds_before + time.monotonic() - start_time
        _save(path, {"run_key": run_key, "params": {k: v.detach().cpu() for k, v in params.items()},
                     "optimizer": opt.state_dict(), "result": result.as_dict()})

    bar = tqdm(total=result.horizon, initial=result.steps, desc=desc, unit="step", disable=not progress)
    probe_start, probe_steps = time.monotonic(), 0
    greedy_ema = None
    orders: dict[int, list[int]] = {}  # the example order of the epochs in use
    try:
        while not ((result.horizon is not None and result.steps >= result.horizon)
                   or (max_steps is not None and result.steps >= max_steps)):
            if deadline is not None and probe_steps > 0 and time.monotonic() > deadline:
                break  # (a run makes at least one step, as the data stage makes at least one batch)
            step = result.steps
            lr = _lr(step, result.horizon, settings)
            for group in opt.param_groups:
                group["lr"] = lr
            rows = _batch_indices(step, settings.batch_size, len(train), settings.seed, orders)
            b = collate([train[i] for i in rows], device)
            metrics, total = step_metrics(forward, model, b, settings.loss)
            opt.zero_grad(set_to_none=True)
            total.backward()
            if settings.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(list(params.values()), settings.grad_clip)
            opt.step()
            result.steps += 1
            result.losses.append(round(metrics.loss.item(), 5))
            probe_steps += 1
            if probe_steps == 1:  # the first step pays one-time costs (allocations): not timed
                probe_start = time.monotonic()
            if result.horizon is None and probe_steps == 1 + _PROBE_STEPS and deadline is not None:
                per_step = (time.monotonic() - probe_start) / _PROBE_STEPS
                fit = int(max(0.0, deadline - time.monotonic()) / per_step)
                result.horizon = result.steps + fit if max_steps is None else min(max_steps, result.steps + fit)
                bar.total = result.horizon
            greedy_ema = metrics.greedy_acceptance if greedy_ema is None else (
                0.8 * greedy_ema + 0.2 * metrics.greedy_acceptance)
            bar.set_postfix(loss=f"{metrics.loss.item():.3f}", acc=f"{greedy_ema:.2f}", refresh=False)
            bar.update(1)
            if callback is not None:
                callback(StepInfo(result.steps, result.horizon, metrics.loss.item(), metrics.greedy_acceptance,
                                  metrics.sampled_acceptance, lr))
            if result.steps % settings.checkpoint_every == 0:
                checkpoint()
    except KeyboardInterrupt:
        checkpoint()
        bar.close()
        raise
    bar.close()
    result.after = evaluate(model, forward, val, settings)
    result.peak_memory_mib = round(peak_memory_mib(device), 1)
    checkpoint()
    return result
