"""The drafter kinds the training kit knows, and what every training entry point shares: the
kind registry, the result type and the argument checks."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["KINDS", "TrainResult", "check_kinds", "check_number", "kind_module", "list_kinds"]

#: Drafter kinds: name -> the module that builds, runs, saves and loads one.
KINDS: dict[str, str] = {"dflash": "specdecode.training.dflash", "draft": "specdecode.training.draft",
                         "eagle": "specdecode.training.eagle",
                         "exit": "specdecode.training.exit", "hydra": "specdecode.training.hydra",
                         "medusa": "specdecode.training.medusa"}


def list_kinds() -> list[str]:
    """The names of the drafter kinds this kit trains."""
    return sorted(KINDS)


def kind_module(kind: str) -> ModuleType:
    """The module of drafter kind ``kind``, or ``ValueError`` naming ``kind``."""
    if not isinstance(kind, str) or kind not in KINDS:
        raise ValueError(f"kind: expected one of {', '.join(list_kinds())}, got {kind!r}")
    return importlib.import_module(KINDS[kind])


def check_kinds(kinds: Any) -> list[str]:
    """``kinds`` (a non-empty sequence of distinct kind names) as a new list, or ``ValueError`` /
    ``TypeError`` naming ``kinds``."""
    if isinstance(kinds, str) or not isinstance(kinds, (list, tuple)):
        raise TypeError(f"kinds: expected a list of kind names, got {type(kinds).__name__}")
    if not kinds:
        raise ValueError("kinds: expected at least one kind")
    for kind in kinds:
        if not isinstance(kind, str) or kind not in KINDS:
            raise ValueError(f"kinds: expected names among {', '.join(list_kinds())}, got {kind!r}")
    if len(set(kinds)) != len(kinds):
        raise ValueError(f"kinds: each kind once, got {list(kinds)}")
    return list(kinds)


def check_number(name: str, value: Any, *, integer: bool, minimum: float, allow_none: bool = True) -> None:
    """``ValueError`` naming ``name`` unless ``value`` is an int (``integer``) or a number, at
    least ``minimum`` (or None when ``allow_none``)."""
    if value is None and allow_none:
        return
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or value < minimum:
        what = "an int" if integer else "a number"
        raise ValueError(f"{name}: expected {what} >= {minimum}, got {value!r}")


@dataclass
class TrainResult:
    """What :func:`~specdecode.training.train_drafter` made: the folder, the trained drafter (the
    object to pass as ``draft``: the model for ``draft``, an ``ExitAdapterDrafter`` for ``exit``)
    and the record saved beside it (``specdecode_drafter.json``); ``export``: the folder of its
    half-precision copy when the run was asked for one (:mod:`specdecode.training.export`)."""

    path: Path
    drafter: Any
    record: dict[str, Any]
    export: Path | None = None
