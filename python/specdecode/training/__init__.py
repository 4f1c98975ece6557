"""The training kit: drafters trained for a given target, on the target's own generations.

    python -m specdecode train draft --target demo --out runs/demo-draft --minutes 2

    >>> from specdecode.training import train_drafter        # doctest: +SKIP
    >>> result = train_drafter("draft", "demo", "runs/demo-draft", minutes=2)
    >>> draft = specdecode.load_drafter("runs/demo-draft", target)

A *kind* is one module with ``NAME``, ``DESCRIPTION``, ``build(target, **options)``,
``forward(model, input_ids, attention_mask)``, ``save(model, folder)`` and
``load(folder, target, record)``, and one entry in :data:`KINDS` (optional: ``Built.feature_layers``
to label the data with target features too, ``prepare(built, examples)`` once the data is
made, ``drafter(model, target)`` for the object to pass as ``draft``, ``vocab_record(model)``,
``record_extras(model)`` (a dict merged into the saved record), ``RETURNS_DRAFTER = True`` when
:class:`TrainResult` should hold the drafter loaded back from the folder);
everything else is shared:
the data (``data.py``: the target's own generations labelled with its distributions, cached),
the loop (``loop.py``), the losses (``losses.py``), the folder format and :func:`load_drafter`
(``artifacts.py``), the target names (``targets.py``).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import torch

from specdecode.models import vocab_rows
from specdecode.training.artifacts import load_drafter, target_fingerprint, write_record
from specdecode.training.data import DataSettings, data_key, default_prompts, distill_examples, token_sequences
from specdecode.training.loop import LoopSettings, StepInfo, run_loop
from specdecode.training.losses import LOSSES

__all__ = ["DATA_SHARE", "KINDS", "StepInfo", "TrainResult", "kind_module", "list_kinds", "load_drafter",
           "train_drafter"]

#: Drafter kinds: name -> the module that builds, runs, saves and loads one.
KINDS: dict[str, str] = {"draft": "specdecode.training.draft", "eagle": "specdecode.training.eagle",
                         "exit": "specdecode.training.exit", "hydra": "specdecode.training.hydra",
                         "medusa": "specdecode.training.medusa"}
#: Share of a time budget (``minutes``) that the data stage may use; training gets the rest.
DATA_SHARE = 0.4
#: Prompts continued by the target when neither ``data`` nor ``num_prompts`` says otherwise.
DEFAULT_NUM_PROMPTS = 256
#: Steps when neither ``minutes`` nor ``max_steps`` bounds the run.
DEFAULT_MAX_STEPS = 300
_PROGRESS_FILE = "progress.json"


def list_kinds() -> list[str]:
    """The names of the drafter kinds this kit trains."""
    return sorted(KINDS)


def kind_module(kind: str) -> ModuleType:
    """The module of drafter kind ``kind``, or ``ValueError`` naming ``kind``."""
    if kind not in KINDS:
        raise ValueError(f"kind: expected one of {', '.join(list_kinds())}, got {kind!r}")
    return importlib.import_module(KINDS[kind])


@dataclass
class TrainResult:
    """What :func:`train_drafter` made: the folder, the trained drafter (the object to pass as
    ``draft``: the model for ``draft``, an ``ExitAdapterDrafter`` for ``exit``) and the record saved beside it (``specdecode_drafter.json``)."""

    path: Path
    drafter: Any
    record: dict[str, Any]


def _check_number(name: str, value: Any, *, integer: bool, minimum: float, allow_none: bool = True) -> None:
    if value is None and allow_none:
        return
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or value < minimum:
        what = "an int" if integer else "a number"
        raise ValueError(f"{name}: expected {what} >= {minimum}, got {value!r}")


def _target_name(target: Any, name: str | None) -> str:
    if name:
        return name
    return str(getattr(target.config, "_name_or_path", "") or type(target).__name__)


def _key(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def train_drafter(kind: str, target: Any, out_dir: str | Path, *, tokenizer: Any = None,
                  minutes: float | None = None, data: Any = None, seed: int = 0, max_steps: int | None = None,
                  target_name: str | None = None, num_prompts: int | None = None, loss: str = "kl",
                  data_settings: DataSettings | None = None, loop_settings: LoopSettings | None = None,
                  callback: Callable[[StepInfo], None] | None = None, progress: bool = True,
                  data_cache: str | Path | None = None, **kind_options: Any) -> TrainResult:
    """Train a drafter of kind ``kind`` for ``target`` and save it in ``out_dir``.

    Args:
        kind: a name from :func:`list_kinds` (``"draft"``, ``"eagle"``, ``"exit"``, ``"hydra"``,
            ``"medusa"``).
        target: the target model, or a name: ``"demo"``, ``"smollm2"`` or a model folder
            (loaded with its tokenizer, :mod:`specdecode.training.targets`). Only read.
        out_dir: where the drafter, the data cache and the checkpoint go; a run with the same
            settings resumes from what is there.
        tokenizer: the target's tokenizer (needed for text prompts and data files).
        minutes: wall-time budget of the whole run (data and training).
        data: ``None`` (the default prompts of :mod:`specdecode.training.data`), a file path
            (``.jsonl`` prompts or plain text), or a sequence of prompts (strings, token-id
            lists or 1-D tensors).
        seed: seeds the data order and the target's sampled continuations.
        max_steps: optimizer steps (default: as many as ``minutes`` allows, else 300).
        target_name: the name recorded for the target (default: the name given, or the
            model's ``name_or_path``).
        num_prompts: default prompts to use (default 256).
        loss: ``"kl"`` (forward KL) or ``"tvd"`` (total variation), :mod:`.losses`.
        data_settings: lengths and batch sizes of the data stage (``seed`` above replaces its
            field of that name).
        loop_settings: batch size and optimiser settings of the training loop (``seed`` and
            ``loss`` above replace their fields of the same names).
        callback: called with a :class:`StepInfo` after every step.
        progress: draw progress bars (on stderr).
        data_cache: the folder of the labelled-data cache (default ``out_dir/data``); runs of
            different kinds that label the same data the same way (e.g. ``eagle`` and
            ``medusa``, both on the last feature) can share one.
        **kind_options: options of the kind's ``build`` (for ``draft``: ``layers``,
            ``num_layers``, ``train_embeddings``; for ``eagle``: ``feature_layers``,
            ``draft_vocab_size``, ``feature_weight``, ``unroll``, ``train_head``; for ``exit``: ``exit_layer``, ``adapter``,
            ``head_tokens``; for ``medusa``: ``num_heads``, ``head_decay``; for ``hydra``: ``num_heads``,
            ``head_layers``, ``head_decay``).
    """
    module = kind_module(kind)
    _check_number("minutes", minutes, integer=False, minimum=1e-3)
    _check_number("seed", seed, integer=True, minimum=0, allow_none=False)
    _check_number("max_steps", max_steps, integer=True, minimum=1)
    _check_number("num_prompts", num_prompts, integer=True, minimum=1)
    if loss not in LOSSES:
        raise ValueError(f"loss: expected one of {', '.join(LOSSES)}, got {loss!r}")
    start = time.monotonic()
    deadline = None if minutes is None else start + 60.0 * minutes
    if isinstance(target, str):
        from specdecode.training.targets import load_target

        target_name = target_name or target
        target, loaded_tokenizer = load_target(target)
        tokenizer = tokenizer if tokenizer is not None else loaded_tokenizer
    if not isinstance(target, torch.nn.Module):
        raise TypeError(f"target: expected a model or a target name, got {type(target).__name__}")
    name = _target_name(target, target_name)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"out_dir: {str(out)!r} is a file")
    built = module.build(target, **kind_options)  # before the folder and the data: a bad option fails at once
    out.mkdir(parents=True, exist_ok=True)
    data_cfg = replace(data_settings or DataSettings(), seed=seed,
                       feature_layers=getattr(built, "feature_layers", None))
    loop_cfg = replace(loop_settings or LoopSettings(), seed=seed, loss=loss)
    if data is None:
        if tokenizer is None:
            raise ValueError("tokenizer: the default prompts are text; pass the target's tokenizer (or data=)")
        data = default_prompts(name, num_prompts or DEFAULT_NUM_PROMPTS, seed)
    sequences, continue_them = token_sequences(data, tokenizer, data_cfg.max_length)
    fingerprint = target_fingerprint(target)
    base_key = _key(kind, fingerprint, data_key(sequences, continue_them, data_cfg), asdict(loop_cfg),
                    sorted(kind_options.items()))
    progress_file = out / _PROGRESS_FILE
    previous = json.loads(progress_file.read_text()) if progress_file.is_file() else {}
    num_batches = previous.get("data_batches") if previous.get("run_key") == base_key else None
    data_deadline = None if deadline is None else start + DATA_SHARE * 60.0 * minutes
    if data_cache is not None and not isinstance(data_cache, (str, Path)):
        raise TypeError(f"data_cache: expected a folder path or None, got {type(data_cache).__name__}")
    cache_root = out / "data" if data_cache is None else Path(data_cache)
    examples, num_batches = distill_examples(target, sequences, continue_them, data_cfg, cache_root, fingerprint,
                                             deadline=data_deadline, num_batches=num_batches, progress=progress)
    progress_file.write_text(json.dumps({"run_key": base_key, "data_batches": num_batches}) + "\n")
    data_seconds = time.monotonic() - start
    n_val = min(len(examples) // 10, 32) if len(examples) >= 8 else 0
    train, val = (examples[: len(examples) - n_val], examples[-n_val:]) if n_val else (examples, examples)

    prepare = getattr(module, "prepare", None)
    if prepare is not None:
        prepare(built, train)
    if max_steps is None and deadline is None:
        max_steps = DEFAULT_MAX_STEPS
    result = run_loop(built.model, built.params, module.forward, train, val, out, loop_cfg,
                      run_key=f"{base_key}-{num_batches}", max_steps=max_steps, deadline=deadline,
                      progress=progress, callback=callback, desc=f"train {kind}")
    module.save(built.model, out)
    vocab = vocab_rows(target)
    record = {
        "kind": kind,
        "target": {"name": name, "weights_hash": fingerprint, "class": type(target).__name__, "vocab_size": vocab},
        "vocab": module.vocab_record(built.model) if hasattr(module, "vocab_record") else {"size": vocab, "map": None},
        "layers": built.layers,
        "training": {**result.as_dict(), "examples": len(train), "val_examples": len(val) if n_val else 0,
                     "tokens": sum(len(e.input_ids) for e in train),
                     "counted_positions": sum(len(e.input_ids) - e.start for e in train), "seed": seed, "loss_kind": loss,
                     "data": "target generations" if continue_them else "text", "sequences": len(sequences),
                     "data_seconds": round(data_seconds, 1), "total_seconds":
                     round(time.monotonic() - start, 1), "options": dict(kind_options)},
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
