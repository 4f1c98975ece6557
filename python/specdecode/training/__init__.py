"""The training kit: drafters trained for a given target, on the target's own generations.

    python -m specdecode train draft --target demo --out runs/demo-draft --minutes 2

    python -m specdecode train eagle medusa hydra exit draft --target smollm2 --device cuda \\
        --minutes 8 --out runs/gpu --export runs/gpu-fp16

    >>> from specdecode.training import train_drafter        # doctest: +SKIP
    >>> result = train_drafter("draft", "demo", "runs/demo-draft", minutes=2)
    >>> draft = specdecode.load_drafter("runs/demo-draft", target)

A *kind* is one module with ``NAME``, ``DESCRIPTION``, ``build(target, **options)``,
``forward(model, input_ids, attention_mask)``, ``save(model, folder)`` and
``load(folder, target, record)``, and one entry in :data:`KINDS` (optional: ``Built.feature_layers``
to label the data with target features too, ``prepare(built, examples)`` once the data is
made, ``drafter(model, target)`` for the object to pass as ``draft``, ``vocab_record(model)``,
``record_extras(model)`` (a dict merged into the saved record), ``acceptance_by_step(model,
examples, batch_size)`` (greedy acceptance per draft step on the validation examples, before and
after training, in the record's ``before``/``after``: ``eagle`` and ``medusa`` have it),
``RETURNS_DRAFTER = True`` when
:class:`TrainResult` should hold the drafter loaded back from the folder, ``cached_bytes(built,
examples)`` for device memory the kind fills over a run; and, to be continued with
``init_from``, ``saved_options(folder, record)`` and ``start_from(built, folder, record)``);
everything else is shared:
the data (``data.py``: the target's own generations labelled with its distributions, cached),
the loop (``loop.py``), the losses (``losses.py``), the folder format and :func:`load_drafter`
(``artifacts.py``), the target names (``targets.py``), the run of one or more kinds from one
data cache (``runner.py``, :func:`train_drafters`), the device and its batch sizes
(``device.py``), the run's plan of time shares and memory (``planning.py``), training that
continues a saved drafter (``continuing.py``: a kind's ``saved_options(folder, record)`` and
``start_from(built, folder, record)``), prompts beyond the templates (``widen.py``), made
ahead into prompt files (``prompt_file.py``; the ``prompts`` command, ``prompt_command.py``),
and half-precision copies for shipping (``export.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from specdecode.training.artifacts import load_drafter
from specdecode.training.data import DataSettings
from specdecode.training.kinds import KINDS, TrainResult, check_kinds, kind_module, list_kinds
from specdecode.training.loop import LoopSettings, StepInfo
from specdecode.training.runner import DATA_SHARE, DEFAULT_MAX_STEPS, DEFAULT_NUM_PROMPTS, RunSpec, run_kinds

__all__ = ["DATA_SHARE", "DEFAULT_MAX_STEPS", "DEFAULT_NUM_PROMPTS", "KINDS", "StepInfo", "TrainResult",
           "kind_module", "list_kinds", "load_drafter", "train_drafter", "train_drafters"]


def _folder(name: str, value: Any) -> Path:
    if not isinstance(value, (str, Path)):
        raise TypeError(f"{name}: expected a folder path, got {type(value).__name__}")
    return Path(value)


def train_drafter(kind: str, target: Any, out_dir: str | Path, *, tokenizer: Any = None,
                  minutes: float | None = None, data: Any = None, seed: int = 0, max_steps: int | None = None,
                  target_name: str | None = None, num_prompts: int | None = None, loss: str = "kl",
                  data_settings: DataSettings | None = None, loop_settings: LoopSettings | None = None,
                  callback: Callable[[StepInfo], None] | None = None, progress: bool = True,
                  data_cache: str | Path | None = None, device: Any = None, dtype: Any = None,
                  data_minutes: float | None = None, prompt_mix: Any = None, prompts: str | Path | None = None,
                  export: str | Path | None = None, init_from: str | Path | None = None,
                  batch_size: int | None = None, lr: float | None = None, shares: Any = None,
                  **kind_options: Any) -> TrainResult:
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
            field of that name; default: batch sizes sized for the target's device,
            :mod:`specdecode.training.device`).
        loop_settings: batch size and optimiser settings of the training loop (``seed`` and
            ``loss`` above replace their fields of the same names; default: ``batch_size`` and
            ``lr`` below, the rest :class:`~specdecode.training.loop.LoopSettings`' defaults).
        callback: called with a :class:`StepInfo` after every step.
        progress: draw progress bars (on stderr).
        data_cache: the folder of the labelled-data cache (default ``out_dir/data``); runs of
            different kinds that label the same data the same way (e.g. ``eagle`` and
            ``medusa``, both on the last feature) can share one.
        device: where the target runs (``"cpu"``, ``"cuda"``); only for a target given by
            name (a model passed in must already be there).
        dtype: the target's precision there (``"bfloat16"``, ...); only for a target given by
            name.
        data_minutes: the data stage's part of ``minutes`` (default 40% of it).
        prompt_mix: a :class:`~specdecode.training.widen.PromptMix` (or its text,
            ``"templates=0.5,self-instruct=0.3,multi-turn=0.2"``): default prompts widened
            beyond the templates (:mod:`specdecode.training.widen`).
        prompts: a prompt file made ahead (``python -m specdecode prompts``,
            :mod:`specdecode.training.prompt_file`): the sources of ``prompt_mix`` it holds
            are drawn from it and the target is asked for none. Default: for SmolLM2 (by name
            or weights), the file the kit ships, when the mix names ``self-instruct`` or
            ``multi-turn``; for other targets the target writes them in the data stage.
        export: also write the drafter's half-precision copy (float16, the target's own
            weights left out: :mod:`specdecode.training.export`) into this folder.
        init_from: a saved drafter of this kind for this target (a run's folder or its
            half-precision copy) to continue instead of starting anew; the options that fix
            its shape come from the folder, and the record adds up the runs
            (:mod:`specdecode.training.continuing`).
        batch_size: examples per optimizer step (default: 8 on the CPU; on a GPU up to 64,
            as the free memory allows, :mod:`specdecode.training.planning`).
        lr: the peak learning rate (default 3e-3, a third of it when continuing).
        shares: as :func:`train_drafters`' (one kind has all the training time).
        **kind_options: options of the kind's ``build`` (for ``draft``: ``layers``,
            ``num_layers``, ``train_embeddings``; for ``eagle``: ``feature_layers``,
            ``draft_vocab_size``, ``feature_weight``, ``unroll``, ``train_head``; for ``exit``: ``exit_layer``, ``adapter``,
            ``head_tokens``; for ``medusa``: ``num_heads``, ``head_decay``; for ``hydra``: ``num_heads``,
            ``head_layers``, ``head_decay``).
    """
    kind_module(kind)
    out = _folder("out_dir", out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"out_dir: {str(out)!r} is a file")
    cache = out / "data" if data_cache is None else _folder("data_cache", data_cache)
    spec = RunSpec(tokenizer=tokenizer, minutes=minutes, data_minutes=data_minutes, data=data, seed=seed,
                   max_steps=max_steps, target_name=target_name, num_prompts=num_prompts, loss=loss,
                   data_settings=data_settings, loop_settings=loop_settings, callback=callback, progress=progress,
                   device=device, dtype=dtype, prompt_mix=prompt_mix, prompts=prompts, init_from=init_from, batch_size=batch_size,
                   lr=lr, shares=shares)
    exports = None if export is None else {kind: _folder("export", export)}
    return run_kinds([kind], target, {kind: out}, cache, out, spec, {kind: kind_options}, exports)[kind]


def train_drafters(kinds: Sequence[str], target: Any, out_dir: str | Path, *,
                   kind_options: Mapping[str, Mapping[str, Any]] | None = None, **settings: Any
                   ) -> dict[str, TrainResult]:
    """Train several drafter kinds for ``target`` in one run, from one labelled-data cache:
    kind ``k`` is saved in ``out_dir/k``, the data in ``out_dir/data``.

    The data is made once (labelled with the target features any of the kinds reads) and every
    kind trains on it; with ``minutes``, the data stage gets ``data_minutes`` (default 40% of
    the budget) and each kind its share of what is left when it starts (``shares``, default:
    EAGLE the largest, :func:`~specdecode.training.planning.default_shares`). What the data
    stage held on the device is released before training and each kind's batch is sized from
    the free memory (:mod:`specdecode.training.planning`).

    >>> results = train_drafters(["eagle", "medusa"], "smollm2", "runs/gpu", device="cuda",
    ...                          minutes=8, kind_options={"eagle": {"draft_vocab_size": 8192}})  # doctest: +SKIP
    >>> more = train_drafters(["eagle", "medusa"], "smollm2", "runs/gpu2", device="cuda", minutes=8,
    ...                       init_from={"eagle": "runs/gpu/eagle", "medusa": "runs/gpu/medusa"},
    ...                       shares={"eagle": 0.7, "medusa": 0.3})  # doctest: +SKIP

    Args:
        kinds: kind names from :func:`list_kinds`, each once; trained in this order.
        target: as :func:`train_drafter`'s.
        out_dir: the run's folder: kind ``k`` in ``out_dir/k``, the data in ``out_dir/data``.
        kind_options: per kind, the options of its ``build`` (as ``train_drafter``'s
            ``**kind_options``); a kind not named gets its defaults.
        **settings: :func:`train_drafter`'s keywords (``minutes``, ``data_minutes``, ``device``,
            ``dtype``, ``data``, ``num_prompts``, ``prompt_mix``, ``prompts``, ``data_settings``,
            ``loop_settings``, ``batch_size``, ``lr``, ``seed``, ...; not ``data_cache``: the
            run's cache is ``out_dir/data``); ``export=DIR`` writes kind ``k``'s half-precision
            copy in ``DIR/k``; ``init_from`` continues saved drafters: a dict of kind -> folder
            or ``"eagle=DIR,medusa=DIR"`` (:mod:`specdecode.training.continuing`); ``shares``:
            each kind's share of the training time, a dict of kind -> share or
            ``"eagle=0.5,medusa=0.5"`` naming every kind (weights, normalized).
    """
    kinds = check_kinds(kinds)
    options = {} if kind_options is None else kind_options
    if not isinstance(options, Mapping) or any(not isinstance(v, Mapping) for v in options.values()):
        raise TypeError("kind_options: expected a dict of kind name -> dict of options")
    unknown = sorted(set(options) - set(kinds))
    if unknown:
        raise ValueError(f"kind_options: options for kinds not in this run: {', '.join(map(str, unknown))}")
    allowed = set(RunSpec.__dataclass_fields__)
    extra = sorted(set(settings) - allowed)
    if extra:
        raise TypeError(f"train_drafters: unexpected keyword {extra[0]!r}")
    out = _folder("out_dir", out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"out_dir: {str(out)!r} is a file")
    export = settings.pop("export", None)
    exports = None if export is None else {kind: _folder("export", export) / kind for kind in kinds}
    return run_kinds(kinds, target, {kind: out / kind for kind in kinds}, out / "data", out, RunSpec(**settings),
                     options, exports)
