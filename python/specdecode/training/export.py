"""Half-precision copies of trained drafter folders, for shipping.

What a training run writes is float32 with a checkpoint, a progress file and (for a single
kind) a data cache beside it; what ships is only the drafter: ``model.safetensors`` in float16
(or bfloat16), its kind's JSON config and ``specdecode_drafter.json``. Loading casts the
weights back to the target's dtype, so a copy drafts like the trained drafter up to the
half-precision rounding of its weights.

Given the target, a copy of a ``draft`` drafter also leaves out every tensor that is the
target's own, unchanged (its frozen embedding and head: 28M of SmolLM2's parameters, 57 MB in
float16): the record lists them under ``"from_target"`` and loading
(:func:`specdecode.training.draft.load`) takes them from the target, after the fingerprint
check that makes sure it is the same model.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from specdecode.training.artifacts import RECORD_FILE, WEIGHTS_FILE, check_target, read_record, write_record
from specdecode.training.device import check_dtype

__all__ = ["FROM_TARGET", "export_drafter"]

#: The record's list of weights left out of the copy because they are the target's own.
FROM_TARGET = "from_target"
_SKIPPED = {"progress.json"}


def _shared_with_target(state: dict[str, torch.Tensor], target: torch.nn.Module) -> list[str]:
    """Names of ``state`` whose tensor equals the target's tensor of the same name."""
    own = target.state_dict()
    return sorted(name for name, value in state.items()
                  if name in own and own[name].shape == value.shape
                  and torch.equal(own[name].detach().to("cpu", value.dtype), value))


def export_drafter(src: str | Path, dst: str | Path, *, dtype: Any = "float16",
                   generation: dict[str, Any] | None = None, target: torch.nn.Module | None = None) -> int:
    """Write the half-precision copy of drafter folder ``src`` into ``dst``; returns the size of
    its weights file in bytes.

    Args:
        src: a folder written by a training run (``model.safetensors`` and the record).
        dst: the copy's folder (created; ``src`` is only read).
        dtype: ``"float16"`` or ``"bfloat16"`` (a ``torch.dtype`` too).
        generation: the record's ``"generation"`` entry (the settings measured best for the
            drafter, :func:`~specdecode.training.artifacts.with_generation_defaults`), or None.
        target: the target the drafter was trained for (checked against the record); with it, a
            ``draft`` drafter's weights that are the target's own are left out of the copy (see
            the module docstring).
    """
    from safetensors.torch import load_file, save_file

    source = Path(src)
    if not (source / WEIGHTS_FILE).is_file() or not (source / RECORD_FILE).is_file():
        raise ValueError(f"src: {str(source)!r} is not a drafter folder ({WEIGHTS_FILE} and {RECORD_FILE})")
    half = check_dtype(dtype)
    if half not in (torch.float16, torch.bfloat16):
        raise ValueError(f"dtype: expected float16 or bfloat16, got {dtype!r}")
    if generation is not None and not isinstance(generation, dict):
        raise TypeError(f"generation: expected a dict or None, got {type(generation).__name__}")
    record = read_record(source)
    state = load_file(str(source / WEIGHTS_FILE))
    shared: list[str] = []
    if target is not None:
        check_target(record, target, source)
        if record["kind"] == "draft":
            shared = _shared_with_target(state, target)
    out = Path(dst)
    out.mkdir(parents=True, exist_ok=True)
    kept = {k: (v.to(half) if v.is_floating_point() else v).contiguous() for k, v in state.items() if k not in shared}
    save_file(kept, str(out / WEIGHTS_FILE))
    for item in source.iterdir():
        if item.suffix == ".json" and item.name not in _SKIPPED and item.name != RECORD_FILE:
            shutil.copy2(item, out / item.name)
    record = {k: v for k, v in record.items() if k != "format"}
    if shared:
        record[FROM_TARGET] = shared
    if generation:
        record["generation"] = generation
    write_record(out, record)
    return (out / WEIGHTS_FILE).stat().st_size
