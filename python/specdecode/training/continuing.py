"""Training that continues: a run started from saved drafters (``init_from``) instead of new ones.

``init_from`` names, per kind, a drafter folder (a run's output or its half-precision copy, e.g.
a drafter shipped in ``specdecode/pair_drafters/``). Before anything is built the run checks
its record: the same kind, trained for this very target (the weights fingerprint), and options
that agree with the saved drafter's shape. The options that fix the shape (:func:`saved_options`
of the kind: EAGLE's feature layers, reduced head and whether it is frozen, the number of heads,
the exit layer, the draft model's layers, ...) are taken from the folder, so they need not be
given again; one given with another value is refused. Options that only steer training
(``unroll``, ``feature_weight``, ``head_decay``, ...) are free.

The drafter is then built with those options, its saved weights are loaded (a float16 copy is
cast to the training dtype) and it trains on this run's data. A continued run starts from
trained weights, so its default learning rate is a third of a fresh run's and its warmup a fifth
(an explicit ``loop_settings`` or ``lr`` wins). Its record keeps its own numbers and adds
``training.init_from`` (the folder), ``training.lineage`` (a short summary of every earlier run,
oldest first) and ``training.totals`` (runs, steps, tokens and training seconds over the whole
lineage). A continued run that is interrupted resumes from its checkpoint like any run (the
source's weights are part of the checkpoint's identity) and counts the earlier runs once.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from specdecode.training.artifacts import WEIGHTS_FILE, read_record
from specdecode.training.kinds import KINDS, list_kinds
from specdecode.training.loop import LoopSettings

__all__ = ["LR_SCALE", "SUMMARY_KEYS", "WARMUP_SCALE", "InitSource", "check_init_from", "continued_loop",
           "continued_options", "lineage_fields", "load_saved_weights", "parse_init_from", "read_sources"]

#: A continued run's default learning rate and warmup, as parts of a fresh run's.
LR_SCALE = 1 / 3
WARMUP_SCALE = 0.2
#: The fields of an earlier run's ``training`` record kept in a lineage entry.
SUMMARY_KEYS = ("steps", "tokens", "seconds", "examples", "sequences", "data", "device", "dtype", "seed",
                "loss_kind", "batch_size", "before", "after", "options", "init_from")


@dataclass(frozen=True)
class InitSource:
    """A saved drafter a kind continues from: its folder, its record and a hash of its weights
    file (part of the run's identity, so a checkpoint resumes only from the same start)."""

    kind: str
    folder: Path
    record: dict[str, Any]
    weights_hash: str


def parse_init_from(text: str) -> Path | dict[str, Path]:
    """The ``--init-from`` text: one folder (``DIR``, for a run of one kind) or ``KIND=DIR``
    pairs separated by commas (a text with ``=`` is always read as pairs). ``ValueError`` naming
    ``init_from`` for an unknown kind, a kind named twice, or an empty folder name."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("init_from: expected a drafter folder, or KIND=DIR pairs such as 'eagle=runs/eagle'")
    if "=" not in text:
        return Path(text)
    folders: dict[str, Path] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        kind, sep, folder = (s.strip() for s in part.partition("="))
        if not sep or not folder:
            raise ValueError(f"init_from: expected KIND=DIR pairs such as 'eagle=runs/eagle', got {part!r}")
        if kind not in KINDS:
            raise ValueError(f"init_from: expected kinds among {', '.join(list_kinds())}, got {kind!r}")
        if kind in folders:
            raise ValueError(f"init_from: {kind!r} is named twice")
        folders[kind] = Path(folder)
    return folders


def check_init_from(value: Any, kinds: Sequence[str]) -> dict[str, Path]:
    """``init_from`` as a dict of kind -> folder for a run of ``kinds``: None (no kind
    continues), one folder (a ``str`` or ``Path``; a run of one kind), ``KIND=DIR`` text
    (:func:`parse_init_from`) or a dict of kind -> folder. ``ValueError`` / ``TypeError`` naming
    ``init_from`` for a kind not in the run or a folder that is not one."""
    if value is None:
        return {}
    if isinstance(value, str):
        value = parse_init_from(value)
    if isinstance(value, Path):
        if len(kinds) != 1:
            raise ValueError(f"init_from: one folder for a run of {len(kinds)} kinds; name the kind of each folder "
                             "(eagle=DIR,medusa=DIR)")
        value = {kinds[0]: value}
    if not isinstance(value, Mapping):
        raise TypeError(f"init_from: expected a folder, KIND=DIR text or a dict of kind -> folder, got "
                        f"{type(value).__name__}")
    folders: dict[str, Path] = {}
    for kind, folder in value.items():
        if kind not in kinds:
            raise ValueError(f"init_from: {kind!r} is not a kind of this run ({', '.join(kinds)})")
        if not isinstance(folder, (str, Path)):
            raise TypeError(f"init_from: {kind}'s folder must be a path, got {type(folder).__name__}")
        folders[kind] = Path(folder)
    return folders


def _file_hash(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def read_sources(folders: Mapping[str, Path], fingerprint: str, target_name: str,
                 written: Sequence[Path]) -> dict[str, InitSource]:
    """Each kind's saved drafter, checked: a drafter folder (record and weights), of that kind,
    trained for the target whose fingerprint is ``fingerprint``, and none of the folders this
    run writes (``written``: continuing in place would train again on top of the result of an
    interrupted run). ``ValueError`` naming ``init_from`` otherwise."""
    writes = {folder.resolve() for folder in written}
    sources = {}
    for kind, folder in folders.items():
        if not folder.is_dir():
            raise ValueError(f"init_from: {str(folder)!r} is not a folder (the {kind} drafter to continue)")
        if folder.resolve() in writes:
            raise ValueError(f"init_from: {str(folder)!r} is a folder this run writes; write the continued {kind} "
                             "drafter to another --out")
        try:
            record = read_record(folder)
        except ValueError as exc:
            raise ValueError(f"init_from: {str(exc).removeprefix('path: ')}") from None
        if not (folder / WEIGHTS_FILE).is_file():
            raise ValueError(f"init_from: {str(folder)!r} has no {WEIGHTS_FILE}")
        if record.get("kind") != kind:
            raise ValueError(f"init_from: {str(folder)!r} holds a {record.get('kind')!r} drafter, not a {kind!r} one")
        want = record.get("target", {})
        if want.get("weights_hash") != fingerprint:
            raise ValueError(
                f"init_from: the {kind} drafter in {str(folder)!r} was trained for {want.get('name')!r} (weights "
                f"{str(want.get('weights_hash'))[:19]}...), not for this run's target {target_name!r} (weights "
                f"{fingerprint[:19]}...); continue a drafter of this target or train a new one")
        sources[kind] = InitSource(kind, folder, record, _file_hash(folder / WEIGHTS_FILE))
    return sources


def _same(a: Any, b: Any) -> bool:
    norm = (lambda v: list(v) if isinstance(v, (list, tuple)) else v)  # noqa: E731
    return norm(a) == norm(b)


def continued_options(source: InitSource, module: Any, options: Mapping[str, Any]) -> dict[str, Any]:
    """The build options of a kind continued from ``source``: ``options`` (the run's) with the
    ones the saved drafter fixes (its module's ``saved_options``) filled in; ``ValueError``
    naming ``init_from`` when the run gives one of those with another value."""
    saved = module.saved_options(source.folder, source.record)
    clashes = [f"{name}={options[name]!r}" for name in saved if name in options and not _same(options[name],
                                                                                                saved[name])]
    if clashes:
        shown = ", ".join(f"{name}={value!r}" for name, value in saved.items())
        raise ValueError(f"init_from: {str(source.folder)!r} holds a {source.kind} drafter with {shown}; this run "
                         f"asks for {', '.join(clashes)} (leave such options out to continue it as saved)")
    return {**dict(options), **saved}


def load_saved_weights(module: Any, built: Any, source: InitSource) -> None:
    """Put ``source``'s saved weights into ``built`` (its module's ``start_from``; half-precision
    weights are cast to the built drafter's dtype); ``ValueError`` naming ``init_from`` when they
    do not fit."""
    try:
        module.start_from(built, source.folder, source.record)
    except (RuntimeError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"init_from: the weights in {str(source.folder)!r} do not fit the {source.kind} drafter "
                         f"this run builds ({first[:160]})") from None


def continued_loop(settings: LoopSettings) -> LoopSettings:
    """A continued run's default loop settings: ``settings`` with the learning rate times
    :data:`LR_SCALE` and the warmup times :data:`WARMUP_SCALE` (at least one step)."""
    return replace(settings, lr=settings.lr * LR_SCALE,
                   warmup_steps=max(1, round(settings.warmup_steps * WARMUP_SCALE)))


def _own_totals(training: Mapping[str, Any]) -> dict[str, Any]:
    totals = training.get("totals")
    if isinstance(totals, Mapping):
        return dict(totals)
    return {"runs": 1, "steps": int(training.get("steps", 0)), "tokens": int(training.get("tokens", 0)),
            "seconds": float(training.get("seconds", 0.0))}


def lineage_fields(source: InitSource | None, training: Mapping[str, Any]) -> dict[str, Any]:
    """What a run's ``training`` record adds for its lineage: for a fresh run only ``totals``
    (this run's own); for a run continued from ``source``, also ``init_from`` and ``lineage``
    (the source's lineage and a summary of the source's own run, oldest first), with
    ``totals`` adding this run's steps, tokens and seconds to the source's totals (a source
    without totals counts as one run)."""
    own = _own_totals({key: training.get(key) for key in ("steps", "tokens", "seconds")})
    if source is None:
        return {"totals": {**own, "seconds": round(own["seconds"], 1)}}
    earlier = source.record.get("training", {})
    before = _own_totals(earlier)
    summary = {key: earlier[key] for key in SUMMARY_KEYS if key in earlier}
    if isinstance(summary.get("seconds"), (int, float)):
        summary["seconds"] = round(summary["seconds"], 1)
    totals = {"runs": before["runs"] + 1, "steps": before["steps"] + own["steps"],
              "tokens": before["tokens"] + own["tokens"], "seconds": round(before["seconds"] + own["seconds"], 1)}
    return {"init_from": str(source.folder), "lineage": [*earlier.get("lineage", []), summary], "totals": totals}

