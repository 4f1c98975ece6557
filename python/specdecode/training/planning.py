"""The plan of a run of several kinds in one process: how the training time is shared between
the kinds, and how many examples each kind's step takes on the device.

Time: after the data stage, kind ``k`` of the run gets the share ``w_k`` of the training time
(:func:`check_shares`; default :func:`default_shares`: EAGLE, the kind that drafts best per
unit of training, gets the largest). A kind starts with its share of what is *left*
(:func:`kind_seconds`), so a kind that stops early (``max_steps``) leaves its time to the later
ones, in their proportions.

Memory: the run releases what the data stage held before training (:func:`~.device.release_memory`)
and sizes each kind's batch from what is then free: one forward and backward on the kind's
longest examples at two batch sizes (:func:`measure_step`) gives the memory a step takes
(a fixed part and a part per example, :func:`step_memory_line`), the optimizer state and any
per-example cache the kind keeps on the device are added, and
:func:`~.device.plan_batch_size` picks the largest power of two up to 64 that fits in 80% of
the free memory. On the CPU, or with an explicit batch size, nothing is measured.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import torch

from specdecode.training.device import GPU_LOOP_BATCH, MEMORY_SHARE, plan_batch_size
from specdecode.training.kinds import KINDS, list_kinds

__all__ = ["EAGLE_SHARE", "check_shares", "default_shares", "kind_seconds", "measure_step", "parse_shares",
           "plan_kind_batch", "step_memory_line"]

#: EAGLE's default share of the training time (or twice each other kind's, when that is more).
EAGLE_SHARE = 0.4
_PROBE_SIZES = (1, 2)
_MIB = 2**20


def default_shares(kinds: Sequence[str]) -> dict[str, float]:
    """Each kind's default share of the training time: ``eagle`` gets ``max(0.4, 2 / (n + 1))``
    of it in a run of ``n`` kinds (40% with five kinds, half with three, two thirds with two:
    always the largest share) and the other kinds split the rest equally; without ``eagle``
    every kind gets an equal share."""
    kinds = list(kinds)
    if "eagle" not in kinds or len(kinds) == 1:
        return {kind: 1.0 / len(kinds) for kind in kinds}
    eagle = max(EAGLE_SHARE, 2.0 / (len(kinds) + 1))
    rest = (1.0 - eagle) / (len(kinds) - 1)
    return {kind: eagle if kind == "eagle" else rest for kind in kinds}


def parse_shares(text: str) -> dict[str, float]:
    """``"eagle=0.5,medusa=0.2,..."`` as a dict of kind -> share (each a number > 0, each kind
    a known one, once); ``ValueError`` naming ``shares`` otherwise. Which kinds of a run they
    must cover is checked by :func:`check_shares`."""
    if not isinstance(text, str):
        raise TypeError(f"shares: expected text such as 'eagle=0.5,medusa=0.5', got {type(text).__name__}")
    shares: dict[str, Any] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        kind, sep, value = part.partition("=")
        if not sep:
            raise ValueError(f"shares: expected KIND=SHARE pairs such as 'eagle=0.5,medusa=0.5', got {part!r}")
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"shares: {kind.strip()}'s share must be a number > 0, got {value!r}") from None
        if kind.strip() in shares:
            raise ValueError(f"shares: {kind.strip()!r} is named twice")
        shares[kind.strip()] = number
    return _checked_values(shares)


def _checked_values(shares: Mapping[Any, Any]) -> dict[str, float]:
    if not shares:
        raise ValueError("shares: expected at least one KIND=SHARE pair")
    out: dict[str, float] = {}
    for kind, value in shares.items():
        if not isinstance(kind, str) or kind not in KINDS:
            raise ValueError(f"shares: expected kinds among {', '.join(list_kinds())}, got {kind!r}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value == float("inf"):
            raise ValueError(f"shares: {kind}'s share must be a number > 0, got {value!r}")
        out[kind] = float(value)
    return out


def check_shares(shares: Any, kinds: Sequence[str]) -> dict[str, float]:
    """The run's shares, normalized to sum to 1, in the order of ``kinds``: ``shares`` is None
    (:func:`default_shares`), a dict of kind -> share or its text (:func:`parse_shares`),
    naming every kind of the run and no other (the shares are weights: ``eagle=2,medusa=1`` is
    ``eagle=0.67,medusa=0.33``). ``ValueError`` naming ``shares`` otherwise."""
    if shares is None:
        return default_shares(kinds)
    if isinstance(shares, str):
        given = parse_shares(shares)
    elif isinstance(shares, Mapping):
        given = _checked_values(shares)
    else:
        raise TypeError(f"shares: expected a dict of kind -> share or text such as 'eagle=0.5,medusa=0.5', "
                        f"got {type(shares).__name__}")
    extra = [kind for kind in given if kind not in kinds]
    if extra:
        raise ValueError(f"shares: {', '.join(extra)} not among this run's kinds ({', '.join(kinds)})")
    missing = [kind for kind in kinds if kind not in given]
    if missing:
        raise ValueError(f"shares: give a share for every kind of the run (missing: {', '.join(missing)})")
    total = sum(given.values())
    return {kind: given[kind] / total for kind in kinds}


def kind_seconds(shares: Sequence[float], index: int, seconds_left: float) -> float:
    """Seconds for kind ``index`` of a run whose kinds have ``shares`` (in training order), when
    ``seconds_left`` of the training time remain as it starts: its share of the shares not yet
    used (``shares[index] / sum(shares[index:])``). Equal shares give each kind an equal part of
    what is left, as a run did before shares existed."""
    later = sum(shares[index:])
    return max(0.0, seconds_left) * (shares[index] / later if later > 0 else 1.0)


def step_memory_line(sizes: Sequence[int], peaks: Sequence[float]) -> tuple[float, float]:
    """``(fixed, per_example)``: the line through the peak memory of steps measured at two batch
    sizes (bytes above what was allocated before each). ``per_example`` is at least 0; the fixed
    part is at least 0 too (memory does not shrink with the batch)."""
    if len(sizes) != 2 or len(peaks) != 2 or sizes[0] == sizes[1]:
        raise ValueError(f"sizes: expected two different batch sizes with a peak each, got {sizes}, {peaks}")
    per = max(0.0, (peaks[1] - peaks[0]) / (sizes[1] - sizes[0]))
    return max(0.0, peaks[0] - per * sizes[0]), per


def measure_step(model: torch.nn.Module, params: Mapping[str, torch.nn.Parameter], forward: Callable[..., Any],
                 examples: Sequence[Any], device: torch.device, loss: str = "kl") -> tuple[float, float]:
    """``(fixed, per_example)`` bytes of one training step (forward, ``loss``, backward) of
    ``model`` on a CUDA ``device``, measured on the longest of ``examples`` at batch sizes 1 and
    2 (:func:`step_memory_line`). Only measures: the gradients are dropped and no parameter
    changes."""
    from specdecode.training.loop import collate, step_metrics

    longest = sorted(examples, key=lambda e: -len(e.input_ids))[: max(_PROBE_SIZES)]
    sizes = [size for size in _PROBE_SIZES if size <= len(longest)]
    if len(sizes) < 2:
        sizes = [1, 1]
    peaks = []
    for size in sizes:
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        batch = collate(list(longest[:size]), device)
        step_metrics(forward, model, batch, loss)[1].backward()
        peaks.append(float(torch.cuda.max_memory_allocated(device) - before))
        for param in params.values():
            param.grad = None
        del batch
    if sizes[0] == sizes[1]:
        return 0.0, peaks[0]
    return step_memory_line(sizes, peaks)


def plan_kind_batch(free: float, fixed: float, per_example: float, params: Mapping[str, torch.nn.Parameter],
                    cached_bytes: float = 0.0, largest: int = GPU_LOOP_BATCH) -> dict[str, Any]:
    """A kind's batch size from the free memory and its measured step, with what the step does
    not show added: the optimizer's state (AdamW: two tensors per trained parameter) and the
    bytes the kind caches on the device over the run (``cached_bytes``). Returns the plan as
    the record shows it (sizes in MiB)."""
    optimizer = 2 * sum(p.numel() * p.element_size() for p in params.values())
    size = plan_batch_size(free, fixed + optimizer + cached_bytes, per_example, largest=largest)
    return {"batch_size": size, "from": "free memory", "free_mib": round(free / _MIB, 1),
            "step_fixed_mib": round(fixed / _MIB, 1), "step_per_example_mib": round(per_example / _MIB, 2),
            "optimizer_mib": round(optimizer / _MIB, 1), "cached_mib": round(cached_bytes / _MIB, 1),
            "share": MEMORY_SHARE}
