"""One training run: one or more drafter kinds for a target, trained from one labelled-data cache.

The run loads (or takes) the target, places it on the device, builds every kind (so a bad
option fails before any data is made), makes the data once, labelled with the target features
that any of the kinds reads (each kind then sees only its own: none for ``draft`` and ``exit``),
and trains the kinds one after the other, each saved in its folder with its record.

Time budget (``minutes``, for the whole run): the data stage may use ``data_minutes`` (default
:data:`DATA_SHARE` of the budget); each kind then gets an equal part of what is left when it
starts, so a kind that ends early (``max_steps``) leaves its time to the ones after it.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from specdecode.models import vocab_rows
from specdecode.training.artifacts import target_fingerprint, write_record
from specdecode.training.data import DataSettings, Example, data_key, default_prompts, distill_examples, token_sequences
from specdecode.training.device import (
    check_device,
    check_dtype,
    data_batch_size,
    loop_batch_size,
    memory_errors,
    place_target,
)
from specdecode.training.kinds import TrainResult, check_kinds, check_number, kind_module
from specdecode.training.loop import LoopSettings, StepInfo, run_loop
from specdecode.training.losses import LOSSES

__all__ = ["DATA_SHARE", "DEFAULT_MAX_STEPS", "DEFAULT_NUM_PROMPTS", "RunSpec", "run_kinds"]

#: Share of a time budget (``minutes``) that the data stage may use; training gets the rest.
DATA_SHARE = 0.4
#: Prompts continued by the target when neither ``data`` nor ``num_prompts`` says otherwise.
DEFAULT_NUM_PROMPTS = 256
#: Steps when neither ``minutes`` nor ``max_steps`` bounds the run.
DEFAULT_MAX_STEPS = 300
_PROGRESS_FILE = "progress.json"


@dataclass(frozen=True)
class RunSpec:
    """Everything a run is asked for besides the kinds, the target and the folders (the
    arguments of :func:`specdecode.training.train_drafters`, checked there)."""

    tokenizer: Any = None
    minutes: float | None = None
    data_minutes: float | None = None
    data: Any = None
    seed: int = 0
    max_steps: int | None = None
    target_name: str | None = None
    num_prompts: int | None = None
    loss: str = "kl"
    data_settings: DataSettings | None = None
    loop_settings: LoopSettings | None = None
    callback: Callable[[StepInfo], None] | None = None
    progress: bool = True
    device: Any = None
    dtype: Any = None
    prompt_mix: Any = None
    prompts: Any = None
    export: Any = None


def _key(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _check(spec: RunSpec) -> None:
    check_number("minutes", spec.minutes, integer=False, minimum=1e-3)
    check_number("data_minutes", spec.data_minutes, integer=False, minimum=1e-3)
    if spec.data_minutes is not None and spec.minutes is not None and spec.data_minutes >= spec.minutes:
        raise ValueError(f"data_minutes: must be less than minutes ({spec.minutes}), got {spec.data_minutes}")
    check_number("seed", spec.seed, integer=True, minimum=0, allow_none=False)
    check_number("max_steps", spec.max_steps, integer=True, minimum=1)
    check_number("num_prompts", spec.num_prompts, integer=True, minimum=1)
    if spec.loss not in LOSSES:
        raise ValueError(f"loss: expected one of {', '.join(LOSSES)}, got {spec.loss!r}")
    for name, value, kind in (("data_settings", spec.data_settings, DataSettings),
                              ("loop_settings", spec.loop_settings, LoopSettings)):
        if value is not None and not isinstance(value, kind):
            raise TypeError(f"{name}: expected a {kind.__name__} or None, got {type(value).__name__}")
    if spec.prompts is not None:
        from specdecode.training.widen import check_prompts_option

        check_prompts_option(spec.prompts, spec.data, spec.prompt_mix)


def _target_name(target: Any, name: str | None) -> str:
    if name:
        return name
    return str(getattr(target.config, "_name_or_path", "") or type(target).__name__)


def _union_layers(builts: Mapping[str, Any]) -> tuple[int, ...] | None:
    """The feature layers the data is labelled with: every kind's, in order of first use."""
    layers: list[int] = []
    for built in builts.values():
        for layer in getattr(built, "feature_layers", None) or ():
            if layer not in layers:
                layers.append(layer)
    return tuple(layers) or None


def _kind_view(examples: list[Example], union: tuple[int, ...] | None, wanted: tuple[int, ...] | None
               ) -> list[Example]:
    """The examples as a kind sees them: no features, or its own feature layers' columns (new
    Example objects; the shared ones are not changed)."""
    if wanted == union:
        return examples
    if not wanted:
        return [replace(e, features=None) for e in examples]
    assert union is not None
    width = examples[0].features.shape[-1] // len(union)
    columns = torch.cat([torch.arange(union.index(layer) * width, (union.index(layer) + 1) * width)
                         for layer in wanted])
    return [replace(e, features=e.features[:, columns]) for e in examples]


def _load(target: Any, spec: RunSpec) -> tuple[torch.nn.Module, Any, str]:
    """The target (placed on the run's device, in its dtype), its tokenizer and its name."""
    device, dtype = check_device(spec.device), check_dtype(spec.dtype)
    tokenizer, name = spec.tokenizer, spec.target_name
    owned = isinstance(target, str)
    if owned:
        from specdecode.training.targets import load_target

        name = name or target
        target, loaded_tokenizer = load_target(target)
        tokenizer = tokenizer if tokenizer is not None else loaded_tokenizer
    if not isinstance(target, torch.nn.Module):
        raise TypeError(f"target: expected a model or a target name, got {type(target).__name__}")
    with memory_errors(f"moving the target to {device}", "use a smaller target or dtype='bfloat16'"):
        target = place_target(target, device, dtype, owned=owned)
    return target, tokenizer, _target_name(target, name)


def _settings(target: torch.nn.Module, spec: RunSpec, layers: tuple[int, ...] | None
              ) -> tuple[DataSettings, LoopSettings]:
    device = next(target.parameters()).device
    data_cfg = spec.data_settings or DataSettings()
    if data_cfg.batch_size is None:
        data_cfg = replace(data_cfg, batch_size=data_batch_size(target, data_cfg.max_length))
    loop_cfg = spec.loop_settings
    if loop_cfg is None:
        loop_cfg = LoopSettings(batch_size=loop_batch_size(device),
                                warmup_steps=50 if device.type == "cuda" else LoopSettings().warmup_steps)
    return (replace(data_cfg, seed=spec.seed, feature_layers=layers),
            replace(loop_cfg, seed=spec.seed, loss=spec.loss))


def _default_data(target: torch.nn.Module, tokenizer: Any, name: str, spec: RunSpec, data_cfg: DataSettings,
                  cache_root: Path, data_deadline: float | None) -> list[Any]:
    """The default prompts: the kit's own, or mixed from ``spec.prompt_mix``'s sources (drawn
    from a prompt file, ``spec.prompts`` or the one shipped for the target, or else written by
    the target, which may take half of what is left of the data stage)."""
    if tokenizer is None:
        raise ValueError("tokenizer: the default prompts are text; pass the target's tokenizer (or data=)")
    count = spec.num_prompts or DEFAULT_NUM_PROMPTS
    if spec.prompt_mix is None:
        return default_prompts(name, count, spec.seed)
    from specdecode.training.widen import mixed_prompts

    now = time.monotonic()
    return mixed_prompts(target, tokenizer, name, count, spec.prompt_mix, data_cfg, cache_root, seed=spec.seed,
                         progress=spec.progress, prompts=spec.prompts,
                         deadline=None if data_deadline is None else now + 0.5 * (data_deadline - now))


def run_kinds(kinds: list[str], target: Any, folders: Mapping[str, Path], cache_root: Path, progress_dir: Path,
              spec: RunSpec, kind_options: Mapping[str, Mapping[str, Any]],
              export_folders: Mapping[str, Path] | None = None) -> dict[str, TrainResult]:
    """Train ``kinds`` for ``target`` as ``spec`` says, kind ``k`` saved in ``folders[k]`` (and
    its half-precision copy in ``export_folders[k]`` as soon as it is trained, when given), the
    labelled data cached under ``cache_root``, the data stage's progress in ``progress_dir``.
    Returns each kind's :class:`TrainResult`."""
    kinds = check_kinds(kinds)
    _check(spec)
    start = time.monotonic()
    deadline = None if spec.minutes is None else start + 60.0 * spec.minutes
    modules = {kind: kind_module(kind) for kind in kinds}
    target, tokenizer, name = _load(target, spec)
    for folder in [*folders.values(), progress_dir]:
        if folder.exists() and not folder.is_dir():
            raise ValueError(f"out_dir: {str(folder)!r} is a file")
    # built before any folder is made: a bad kind option fails at once and leaves nothing behind
    builts = {kind: modules[kind].build(target, **dict(kind_options.get(kind, {}))) for kind in kinds}
    for folder in [*folders.values(), progress_dir]:
        folder.mkdir(parents=True, exist_ok=True)
    union = _union_layers(builts)
    data_cfg, loop_cfg = _settings(target, spec, union)
    share = spec.data_minutes if spec.data_minutes is not None else (
        None if spec.minutes is None else DATA_SHARE * spec.minutes)
    data_deadline = None if share is None else start + 60.0 * share
    data = spec.data if spec.data is not None else _default_data(target, tokenizer, name, spec, data_cfg, cache_root,
                                                                 data_deadline)
    sequences, continue_them = token_sequences(data, tokenizer, data_cfg.max_length)
    fingerprint = target_fingerprint(target)
    dkey = data_key(sequences, continue_them, data_cfg)
    progress_file = progress_dir / _PROGRESS_FILE
    previous = json.loads(progress_file.read_text()) if progress_file.is_file() else {}
    data_run = _key(fingerprint, dkey)
    num_batches = previous.get("data_batches") if previous.get("run_key") == data_run else None
    with memory_errors(f"the data stage ({data_cfg.batch_size} prompts per batch)",
                       "lower data_batch_size (--data-batch-size)"):
        examples, num_batches = distill_examples(target, sequences, continue_them, data_cfg, cache_root, fingerprint,
                                                 deadline=data_deadline, num_batches=num_batches,
                                                 progress=spec.progress)
    progress_file.write_text(json.dumps({"run_key": data_run, "data_batches": num_batches}) + "\n")
    data_seconds = time.monotonic() - start
    n_val = min(len(examples) // 10, 32) if len(examples) >= 8 else 0
    train, val = (examples[: len(examples) - n_val], examples[-n_val:]) if n_val else (examples, examples)
    max_steps = spec.max_steps if spec.max_steps is not None or deadline is not None else DEFAULT_MAX_STEPS
    common = {"data": "target generations" if continue_them else "text", "sequences": len(sequences),
              "data_seconds": round(data_seconds, 1), "data_batch_size": data_cfg.batch_size,
              "device": str(next(target.parameters()).device), "dtype": str(next(target.parameters()).dtype),
              "kinds_in_run": kinds}
    results = {}
    for i, kind in enumerate(kinds):
        kind_start = time.monotonic()
        kind_deadline = None if deadline is None else kind_start + max(0.0, deadline - kind_start) / (len(kinds) - i)
        wanted = getattr(builts[kind], "feature_layers", None)
        with memory_errors(f"training {kind} ({loop_cfg.batch_size} examples per step)",
                           "lower the training batch size (--batch-size)"):
            results[kind] = _fit(kind, modules[kind], builts[kind], target, name, fingerprint, dkey, num_batches,
                                 _kind_view(train, union, wanted), _kind_view(val, union, wanted), n_val,
                                 folders[kind], spec, loop_cfg, dict(kind_options.get(kind, {})), max_steps,
                                 kind_deadline, common, start)
        if export_folders is not None:
            from specdecode.training.export import export_drafter

            export_drafter(folders[kind], export_folders[kind], target=target)
            results[kind].export = export_folders[kind]
    return results


def _fit(kind: str, module: Any, built: Any, target: torch.nn.Module, name: str, fingerprint: str, dkey: str,
         num_batches: int, train: list[Example], val: list[Example], n_val: int, out: Path, spec: RunSpec,
         loop_cfg: LoopSettings, options: dict[str, Any], max_steps: int | None, deadline: float | None,
         common: dict[str, Any], run_start: float) -> TrainResult:
    """Train one kind on its view of the data, save it and its record (``total_seconds``: since
    ``run_start``, the run's start)."""
    prepare = getattr(module, "prepare", None)
    if prepare is not None:
        prepare(built, train)
    run_key = f"{_key(kind, fingerprint, dkey, asdict(loop_cfg), sorted(options.items()))}-{num_batches}"
    result = run_loop(built.model, built.params, module.forward, train, val, out, loop_cfg, run_key=run_key,
                      max_steps=max_steps, deadline=deadline, progress=spec.progress, callback=spec.callback,
                      desc=f"train {kind}")
    module.save(built.model, out)
    vocab = vocab_rows(target)
    record = {
        "kind": kind,
        "target": {"name": name, "weights_hash": fingerprint, "class": type(target).__name__, "vocab_size": vocab},
        "vocab": module.vocab_record(built.model) if hasattr(module, "vocab_record") else {"size": vocab, "map": None},
        "layers": built.layers,
        "training": {**result.as_dict(), "examples": len(train), "val_examples": len(val) if n_val else 0,
                     "tokens": sum(len(e.input_ids) for e in train),
                     "counted_positions": sum(len(e.input_ids) - e.start for e in train), "seed": spec.seed,
                     "loss_kind": spec.loss, **common, "total_seconds": round(time.monotonic() - run_start, 1),
                     "options": options},
    }
    extras = getattr(module, "record_extras", None)
    if extras is not None:
        extra = dict(extras(built.model))
        vocab_map = extra.pop("vocab_map", None)
        if vocab_map is not None:
            record["vocab"]["map"] = vocab_map
        record.update(extra)
    write_record(out, record)
    if hasattr(module, "drafter"):
        drafter = module.drafter(built.model, target)
    elif getattr(module, "RETURNS_DRAFTER", False):
        drafter = module.load(out, target, record)
    else:
        drafter = built.model
    return TrainResult(out, drafter, record)
