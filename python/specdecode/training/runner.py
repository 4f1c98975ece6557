"""One training run: one or more drafter kinds for a target, trained from one labelled-data cache.

The run loads (or takes) the target, places it on the device, builds every kind (so a bad
option fails before any data is made), makes the data once, labelled with the target features
that any of the kinds reads (each kind then sees only its own: none for ``draft`` and ``exit``),
and trains the kinds one after the other, each saved in its folder with its record.

Time budget (``minutes``, for the whole run): the data stage may use ``data_minutes`` (default
:data:`DATA_SHARE` of the budget); each kind then gets its share (``shares``, default: EAGLE the
largest, :mod:`.planning`) of what is left when it starts, so a kind that ends early
(``max_steps``) leaves its time to the ones after it.

Memory (one process, one device): what the data stage held is released before training, each
kind's batch is sized from the memory then free (:mod:`.planning`; an explicit batch size wins),
and the record keeps each stage's peak. A kind may continue a saved drafter (``init_from``,
:mod:`.continuing`).
"""

from __future__ import annotations

import hashlib
import json
import time
import warnings
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from specdecode.models import vocab_rows
from specdecode.training.artifacts import target_fingerprint, write_record
from specdecode.training.continuing import (
    InitSource,
    check_init_from,
    continued_loop,
    continued_options,
    lineage_fields,
    load_saved_weights,
    read_sources,
)
from specdecode.training.continuations import data_decode_path
from specdecode.training.data import (DataSettings, DataStats, Example, data_key, default_prompts, distill_examples,
                                      is_text_data, token_sequences)
from specdecode.training.device import (
    check_device,
    check_dtype,
    data_batch_size,
    free_memory_bytes,
    loop_batch_size,
    memory_errors,
    peak_memory_mib,
    place_target,
    release_memory,
    reset_peak_memory,
)
from specdecode.training.kinds import TrainResult, check_kinds, check_number, kind_module
from specdecode.training.loop import LoopSettings, StepInfo, run_loop
from specdecode.training.losses import LOSSES
from specdecode.training.planning import check_shares, kind_seconds, measure_step, plan_kind_batch

__all__ = ["DATA_SHARE", "DEFAULT_MAX_STEPS", "DEFAULT_NUM_PROMPTS", "RunSpec", "run_kinds"]

#: Share of a time budget (``minutes``) that the data stage may use; training gets the rest.
DATA_SHARE = 0.4
#: Prompts continued by the target when neither ``data`` nor ``num_prompts`` says otherwise.
DEFAULT_NUM_PROMPTS = 256
#: Steps when neither ``minutes`` nor ``max_steps`` bounds the run.
DEFAULT_MAX_STEPS = 300
#: Warmup steps of a fresh run's schedule on a GPU (its batches are larger: 64 examples).
GPU_WARMUP_STEPS = 50
_PROGRESS_FILE = "progress.json"
_MIB = 2**20


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
    init_from: Any = None
    shares: Any = None
    batch_size: int | None = None
    lr: float | None = None


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
    check_number("batch_size", spec.batch_size, integer=True, minimum=1)
    if spec.lr is not None and (isinstance(spec.lr, bool) or not isinstance(spec.lr, (int, float))
                                or not spec.lr > 0):
        raise ValueError(f"lr: expected a number > 0, got {spec.lr!r}")
    for name in ("batch_size", "lr"):
        if getattr(spec, name) is not None and spec.loop_settings is not None:
            raise ValueError(f"{name}: give {name} or loop_settings (which has a {name}), not both")
    if spec.shares is not None and spec.minutes is None:
        raise ValueError("shares: they split a time budget; give minutes too")
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


def _data_settings(target: torch.nn.Module, spec: RunSpec, layers: tuple[int, ...] | None) -> DataSettings:
    data_cfg = spec.data_settings or DataSettings()
    if data_cfg.batch_size is None:
        decode = data_cfg.labels == "decode" and not is_text_data(spec.data)  # text: labelled by a forward
        if decode:  # a target the static path refuses goes to HF generate and the labelling forward
            with warnings.catch_warnings():  # the data stage warns once, when it takes that path
                warnings.simplefilter("ignore")
                decode = data_decode_path(target, data_cfg) != "hf_generate"
        size = data_batch_size(target, data_cfg.max_length, decode_labels=decode,
                               num_feature_layers=len(layers or ()), top_k=data_cfg.top_k)
        data_cfg = replace(data_cfg, batch_size=size)
    return replace(data_cfg, seed=spec.seed, feature_layers=layers)


def _loop_settings(module: Any, built: Any, train: list[Example], spec: RunSpec, device: torch.device,
                   continued: bool, planned: int | None) -> tuple[LoopSettings, dict[str, Any]]:
    """A kind's loop settings and its batch plan (as the record shows it). Explicit settings win
    (``loop_settings``, then ``batch_size`` / ``lr``); the batch is otherwise the one an
    interrupted run planned (``planned``), the CPU's default, or sized on a GPU from the free
    memory and the kind's measured step. A continued kind starts gentler (:func:`continued_loop`)."""
    if spec.loop_settings is not None:
        cfg, plan = spec.loop_settings, {"from": "loop_settings"}
    else:
        if spec.batch_size is not None:
            batch, plan = spec.batch_size, {"from": "batch_size"}
        elif planned is not None:
            batch, plan = planned, {"from": "the plan of the interrupted run"}
        elif device.type != "cuda":
            batch, plan = loop_batch_size(device), {"from": "the device's default"}
        else:
            release_memory(device)
            fixed, per_example = measure_step(built.model, built.params, module.forward, train, device, spec.loss)
            cached = module.cached_bytes(built, train) if hasattr(module, "cached_bytes") else 0
            plan = plan_kind_batch(free_memory_bytes(device) or 0, fixed, per_example, built.params, cached)
            batch = plan["batch_size"]
        cfg = LoopSettings(batch_size=batch,
                           warmup_steps=GPU_WARMUP_STEPS if device.type == "cuda" else LoopSettings().warmup_steps)
        cfg = continued_loop(cfg) if continued else cfg
        cfg = cfg if spec.lr is None else replace(cfg, lr=float(spec.lr))
    return replace(cfg, seed=spec.seed, loss=spec.loss), {**plan, "batch_size": cfg.batch_size}


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


@dataclass
class _Run:
    """What every kind of a run shares once the data is made."""

    spec: RunSpec
    target: torch.nn.Module
    name: str
    fingerprint: str
    dkey: str
    num_batches: int
    common: dict[str, Any]
    start: float
    progress_file: Path
    progress: dict[str, Any]

    @property
    def device(self) -> torch.device:
        return next(self.target.parameters()).device

    def save_progress(self) -> None:
        self.progress_file.write_text(json.dumps(self.progress) + "\n")


def run_kinds(kinds: list[str], target: Any, folders: Mapping[str, Path], cache_root: Path, progress_dir: Path,
              spec: RunSpec, kind_options: Mapping[str, Mapping[str, Any]],
              export_folders: Mapping[str, Path] | None = None) -> dict[str, TrainResult]:
    """Train ``kinds`` for ``target`` as ``spec`` says, kind ``k`` saved in ``folders[k]`` (and
    its half-precision copy in ``export_folders[k]`` as soon as it is trained, when given), the
    labelled data cached under ``cache_root``, the data stage's progress in ``progress_dir``.
    Returns each kind's :class:`TrainResult`."""
    kinds = check_kinds(kinds)
    _check(spec)
    shares = check_shares(spec.shares, kinds)
    init_dirs = check_init_from(spec.init_from, kinds)
    start = time.monotonic()
    deadline = None if spec.minutes is None else start + 60.0 * spec.minutes
    modules = {kind: kind_module(kind) for kind in kinds}
    target, tokenizer, name = _load(target, spec)
    written = [*folders.values(), *(export_folders or {}).values(), progress_dir]
    for folder in written:
        if folder.exists() and not folder.is_dir():
            raise ValueError(f"out_dir: {str(folder)!r} is a file")
    fingerprint = target_fingerprint(target)
    sources = read_sources(init_dirs, fingerprint, name, written)
    options = {kind: dict(kind_options.get(kind, {})) for kind in kinds}
    for kind, source in sources.items():
        options[kind] = continued_options(source, modules[kind], options[kind])
    # built before any folder is made: a bad kind option fails at once and leaves nothing behind
    builts = {kind: modules[kind].build(target, **options[kind]) for kind in kinds}
    for folder in [*folders.values(), progress_dir]:
        folder.mkdir(parents=True, exist_ok=True)
    union = _union_layers(builts)
    device = next(target.parameters()).device
    data_cfg = _data_settings(target, spec, union)
    share = spec.data_minutes if spec.data_minutes is not None else (
        None if spec.minutes is None else DATA_SHARE * spec.minutes)
    data_deadline = None if share is None else start + 60.0 * share
    reset_peak_memory(device)
    data = spec.data if spec.data is not None else _default_data(target, tokenizer, name, spec, data_cfg, cache_root,
                                                                 data_deadline)
    sequences, continue_them = token_sequences(data, tokenizer, data_cfg.max_length)
    dkey = data_key(sequences, continue_them, data_cfg)
    progress_file = progress_dir / _PROGRESS_FILE
    previous = json.loads(progress_file.read_text()) if progress_file.is_file() else {}
    data_run = _key(fingerprint, dkey)
    resumed = previous.get("run_key") == data_run
    num_batches = previous.get("data_batches") if resumed else None
    with memory_errors(f"the data stage ({data_cfg.batch_size} prompts per batch)",
                       "lower data_batch_size (--data-batch-size)"):
        data_stats = DataStats()
        examples, num_batches = distill_examples(target, sequences, continue_them, data_cfg, cache_root, fingerprint,
                                                 deadline=data_deadline, num_batches=num_batches,
                                                 progress=spec.progress, stats=data_stats)
    data_seconds = time.monotonic() - start
    data_peak = peak_memory_mib(device)
    release_memory(device)  # the data stage's caches and blocks: training plans with them free
    free = free_memory_bytes(device)
    run = _Run(spec, target, name, fingerprint, dkey, num_batches, {}, start, progress_file,
               {"run_key": data_run, "data_batches": num_batches,
                "loop_batches": previous.get("loop_batches", {}) if resumed else {}})
    run.save_progress()
    n_val = min(len(examples) // 10, 32) if len(examples) >= 8 else 0
    train, val = (examples[: len(examples) - n_val], examples[-n_val:]) if n_val else (examples, examples)
    max_steps = spec.max_steps if spec.max_steps is not None or deadline is not None else DEFAULT_MAX_STEPS
    param = next(target.parameters())
    run.common = {"data": "target generations" if continue_them else "text", "sequences": len(sequences),
                  "data_seconds": round(data_seconds, 1), "data_batch_size": data_cfg.batch_size,
                  "data_tokens_per_second": round(data_stats.tokens_per_second),
                  "data_decode_path": data_stats.decode_path,
                  "device": str(param.device), "dtype": str(param.dtype), "kinds_in_run": kinds,
                  "time_shares": {kind: round(value, 4) for kind, value in shares.items()}}
    run_memory = {"target_mib": round(sum(p.numel() * p.element_size() for p in target.parameters()) / _MIB, 1),
                  "data_peak_mib": round(data_peak, 1),
                  "free_after_data_mib": None if free is None else round(free / _MIB, 1)}
    share_list = [shares[kind] for kind in kinds]
    results = {}
    for i, kind in enumerate(kinds):
        kind_start = time.monotonic()
        kind_deadline = None if deadline is None else kind_start + kind_seconds(share_list, i, deadline - kind_start)
        built = builts.pop(kind)  # dropped once trained: what it holds on the device (exit's feature cache) is
        # released before the next kind plans its batch
        wanted = getattr(built, "feature_layers", None)
        release_memory(device)
        reset_peak_memory(device)
        results[kind] = _fit(run, kind, modules[kind], built, sources.get(kind),
                             _kind_view(train, union, wanted), _kind_view(val, union, wanted), n_val,
                             folders[kind], options[kind], max_steps, kind_deadline, run_memory)
        del built
        if export_folders is not None:
            from specdecode.training.export import export_drafter

            export_drafter(folders[kind], export_folders[kind], target=target)
            results[kind].export = export_folders[kind]
    return results


def _fit(run: _Run, kind: str, module: Any, built: Any, source: InitSource | None, train: list[Example],
         val: list[Example], n_val: int, out: Path, options: dict[str, Any], max_steps: int | None,
         deadline: float | None, run_memory: dict[str, Any]) -> TrainResult:
    """Train one kind on its view of the data (from ``source``'s weights when it continues a
    saved drafter), save it and its record (``total_seconds``: since the run's start)."""
    spec, target = run.spec, run.target
    if source is not None:
        load_saved_weights(module, built, source)
    elif getattr(module, "prepare", None) is not None:
        module.prepare(built, train)
    with memory_errors(f"measuring a {kind} step (2 examples)", "lower the training batch size (--batch-size)"):
        loop_cfg, plan = _loop_settings(module, built, train, spec, run.device, source is not None,
                                        run.progress["loop_batches"].get(kind))
    run.progress["loop_batches"][kind] = loop_cfg.batch_size
    run.save_progress()
    identity = [kind, run.fingerprint, run.dkey, asdict(loop_cfg), sorted(options.items())]
    if source is not None:  # a continued kind resumes only from the same saved weights
        identity.append(source.weights_hash)
    run_key = f"{_key(*identity)}-{run.num_batches}"
    by_step = getattr(module, "acceptance_by_step", None) if n_val else None  # held-out examples only
    steps = {}
    with memory_errors(f"training {kind} ({loop_cfg.batch_size} examples per step)",
                       "lower the training batch size (--batch-size)"):
        if by_step is not None:
            steps["before"] = by_step(built.model, val, loop_cfg.batch_size)
        result = run_loop(built.model, built.params, module.forward, train, val, out, loop_cfg, run_key=run_key,
                          max_steps=max_steps, deadline=deadline, progress=spec.progress, callback=spec.callback,
                          desc=f"train {kind}")
        if by_step is not None:
            steps["after"] = by_step(built.model, val, loop_cfg.batch_size)
    module.save(built.model, out)
    vocab = vocab_rows(target)
    training = {**result.as_dict(), "examples": len(train), "val_examples": len(val) if n_val else 0,
                "tokens": sum(len(e.input_ids) for e in train),
                "counted_positions": sum(len(e.input_ids) - e.start for e in train), "seed": spec.seed,
                "loss_kind": spec.loss, "batch_size": loop_cfg.batch_size, "lr": loop_cfg.lr,
                "warmup_steps": loop_cfg.warmup_steps, **run.common,
                "total_seconds": round(time.monotonic() - run.start, 1), "options": options,
                "memory": {**run_memory, "train_peak_mib": result.peak_memory_mib, "batch_plan": plan}}
    for when, rates in steps.items():  # greedy acceptance by draft step (validation)
        training[when]["greedy_acceptance_by_step"] = rates
    training.update(lineage_fields(source, training))
    record = {
        "kind": kind,
        "target": {"name": run.name, "weights_hash": run.fingerprint, "class": type(target).__name__,
                   "vocab_size": vocab},
        "vocab": module.vocab_record(built.model) if hasattr(module, "vocab_record") else {"size": vocab, "map": None},
        "layers": built.layers,
        "training": training,
    }
    extras = getattr(module, "record_extras", None)
    if extras is not None:
        extra = dict(extras(built.model))
        vocab_map = extra.pop("vocab_map", None)
        if vocab_map is not None:
            record["vocab"] = {"size": len(vocab_map), "map": vocab_map}
        record.update(extra)
    write_record(out, record)
    if hasattr(module, "drafter"):
        drafter = module.drafter(built.model, target)
    elif getattr(module, "RETURNS_DRAFTER", False):
        drafter = module.load(out, target, record)
    else:
        drafter = built.model
    return TrainResult(out, drafter, record)
