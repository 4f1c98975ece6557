"""What a training run leaves behind, and reading it back.

A drafter folder holds ``model.safetensors`` (the drafter's weights), ``specdecode_drafter.json``
(the record below) and whatever else its kind needs (for ``draft``: the Hugging Face
``config.json`` and ``generation_config.json``, so ``AutoModelForCausalLM.from_pretrained(DIR)``
reads it as a plain model). The record::

    {"format": 1, "kind": "draft",
     "target": {"name": "demo", "weights_hash": "sha256:...", "class": "LlamaForCausalLM",
                "vocab_size": 4096},
     "vocab": {"size": 4096, "map": null},          # the ids it drafts over; null: the target's own (a
                                                    # reduced head: its ids, or where they are saved)
     "layers": [0],                                 # the target layers the drafter started from
     "training": {...},                             # steps, losses, acceptance, time, peak memory
     "generation": {"num_draft_tokens": 2,          # optional: the settings measured best for it
                    "tree": "dynamic", "num_nodes": 6, "tree_depth": 3}}

:func:`load_drafter` checks the target's fingerprint against the record before building
anything, so a drafter is never silently used with a model it was not trained for.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch

__all__ = ["FORMAT_VERSION", "RECORD_FILE", "WEIGHTS_FILE", "load_drafter", "read_record", "read_weights",
           "target_fingerprint", "write_record", "write_weights"]

FORMAT_VERSION = 1
RECORD_FILE = "specdecode_drafter.json"
WEIGHTS_FILE = "model.safetensors"
_SAMPLES_PER_TENSOR = 4096


def target_fingerprint(model: torch.nn.Module) -> str:
    """``"sha256:<hex>"`` over the model's parameter names, shapes and up to 4096 evenly spaced
    values of each parameter, rounded to bfloat16 (so a float32 and a bfloat16 copy of the same
    weights agree). Deterministic, reads no file, and takes well under a second for a 1B model.
    A tied parameter is counted once, under its first name."""
    digest = hashlib.sha256()
    for name, param in sorted(model.named_parameters(), key=lambda item: item[0]):
        flat = param.detach().reshape(-1)
        if flat.numel() > _SAMPLES_PER_TENSOR:
            index = torch.arange(_SAMPLES_PER_TENSOR, device=flat.device) * (flat.numel() - 1) // (
                _SAMPLES_PER_TENSOR - 1)  # integer steps: float32 cannot hold every index of a big tensor
            flat = flat[index]
        values = flat.to(device="cpu", dtype=torch.bfloat16).float().numpy().tobytes()
        digest.update(f"{name}:{tuple(param.shape)}:".encode())
        digest.update(values)
    return "sha256:" + digest.hexdigest()


def write_record(out_dir: str | Path, record: dict[str, Any]) -> Path:
    """Write ``record`` (with the format version) as the folder's ``specdecode_drafter.json``."""
    path = Path(out_dir) / RECORD_FILE
    path.write_text(json.dumps({"format": FORMAT_VERSION, **record}, indent=2, sort_keys=True) + "\n",
                    encoding="utf-8")
    return path


def write_weights(out_dir: str | Path, module: torch.nn.Module, config_file: str, config: dict[str, Any]) -> None:
    """``module``'s weights as the folder's ``model.safetensors`` and ``config`` as ``config_file``."""
    from safetensors.torch import save_file

    state = {k: v.detach().contiguous().cpu() for k, v in module.state_dict().items()}
    save_file(state, str(Path(out_dir) / WEIGHTS_FILE))
    (Path(out_dir) / config_file).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def read_weights(folder: str | Path, config_file: str) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """What :func:`write_weights` wrote: the config and the weights (on the CPU)."""
    from safetensors.torch import load_file

    config = json.loads((Path(folder) / config_file).read_text(encoding="utf-8"))
    return config, load_file(str(Path(folder) / WEIGHTS_FILE))


def read_record(path: str | Path) -> dict[str, Any]:
    """The record of a drafter folder, or ``ValueError`` naming ``path`` when it has none or it
    is of another format version."""
    folder = Path(path)
    file = folder / RECORD_FILE
    if not file.is_file():
        raise ValueError(f"path: {str(folder)!r} holds no trained drafter (no {RECORD_FILE}); "
                         "train one with `python -m specdecode train`")
    record = json.loads(file.read_text(encoding="utf-8"))
    if record.get("format") != FORMAT_VERSION:
        raise ValueError(f"path: {file} is format {record.get('format')!r}; this specdecode reads format "
                         f"{FORMAT_VERSION}")
    return record


def check_target(record: dict[str, Any], target: torch.nn.Module, folder: str | Path) -> None:
    """``ValueError`` naming ``target`` unless ``target`` is the model the drafter was trained for."""
    want = record["target"]
    got = target_fingerprint(target)
    if got != want["weights_hash"]:
        raise ValueError(
            f"target: the drafter in {str(folder)!r} was trained for {want['name']!r} ({want['class']}, "
            f"weights {want['weights_hash'][:19]}...), but the given target ({type(target).__name__}, weights "
            f"{got[:19]}...) is another model; train a drafter for it with "
            "`python -m specdecode train KIND --target NAME_OR_PATH --out DIR`")


def load_drafter(path: str | Path, target: torch.nn.Module) -> Any:
    """The trained drafter in folder ``path``, ready to pass as ``draft`` to
    :func:`specdecode.generate` with ``target`` (for the ``draft`` kind: a plain Hugging Face
    causal LM in eval mode, on the target's device and in its dtype).

    A published DFlash checkpoint folder (``config.json`` naming ``DFlashDraftModel``, no
    ``specdecode_drafter.json``) loads too, through
    :func:`~specdecode.drafters.dflash_checkpoint.load_dflash`.

    Raises ``ValueError`` naming ``target`` when ``target`` is not the model the drafter was
    trained for (its weights fingerprint differs), and naming ``path`` when the folder holds no
    drafter."""
    from specdecode.drafters.dflash_checkpoint import is_dflash_checkpoint, load_dflash
    from specdecode.training import kind_module

    if not isinstance(target, torch.nn.Module):
        raise TypeError(f"target: expected the target model (a torch.nn.Module), got {type(target).__name__}")
    if is_dflash_checkpoint(path) and not (Path(path) / RECORD_FILE).is_file():
        return load_dflash(path, target)
    record = read_record(path)
    check_target(record, target, path)
    drafter = kind_module(record["kind"]).load(Path(path), target, record)
    return with_generation_defaults(drafter, record.get("generation"), path)


#: The keys of a record's optional ``"generation"`` entry (and of its ``"sampling"`` entry).
GENERATION_KEYS = ("num_draft_tokens", "tree", "num_nodes", "tree_depth")


def with_generation_defaults(drafter: Any, defaults: dict[str, Any] | None, path: str | Path) -> Any:
    """``drafter`` with the settings a record's ``"generation"`` entry names (None: as is):
    ``num_draft_tokens`` becomes its ``default_num_draft_tokens`` (what ``generate`` drafts per
    step when not told), ``tree`` / ``num_nodes`` / ``tree_depth`` make it draft that tree (as
    ``generate``'s arguments of those names). An optional ``"sampling"`` entry, with the same
    keys, changes them for sampled generation (``tree: null``: a chain): the result's
    ``sampling_drafter``. A draft model is wrapped in a ``ModelDrafter`` to carry them.
    ``ValueError`` naming ``path`` for an entry this version cannot apply."""
    if defaults is None:
        return drafter
    where = f"path: {str(path)!r}: the record's generation settings"
    if not isinstance(defaults, dict) or set(defaults) - {*GENERATION_KEYS, "sampling"}:
        raise ValueError(f"{where} must be a dict with keys among {', '.join(GENERATION_KEYS)}, sampling; "
                         f"got {defaults!r}")
    greedy = {key: value for key, value in defaults.items() if key != "sampling"}
    sampled = defaults.get("sampling")
    if sampled is not None and (not isinstance(sampled, dict) or set(sampled) - set(GENERATION_KEYS)):
        raise ValueError(f"{where}: sampling must be a dict with keys among {', '.join(GENERATION_KEYS)}, "
                         f"got {sampled!r}")
    main = _with_settings(drafter, greedy, where)
    if sampled is not None:
        merged = {**greedy, **sampled}
        if merged.get("tree") is None:
            merged = {key: value for key, value in merged.items() if key in ("num_draft_tokens", "tree")}
        main.sampling_drafter = _with_settings(drafter, merged, f"{where} (sampling)")
    return main


def _with_settings(drafter: Any, defaults: dict[str, Any], where: str) -> Any:
    """A drafter (a copy where settings apply) with one set of generation settings."""
    import copy

    for key, low in (("num_draft_tokens", 1), ("num_nodes", 2), ("tree_depth", 1)):
        value = defaults.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
            raise ValueError(f"{where}: {key} must be an int >= {low}, got {value!r}")
    if isinstance(drafter, torch.nn.Module):
        from specdecode.drafters import ModelDrafter

        drafter = ModelDrafter(drafter)
    tree = defaults.get("tree")
    if tree is not None:
        if not callable(getattr(drafter, "with_tree", None)):
            raise ValueError(f"{where}: tree={tree!r}, but a {type(drafter).__name__} drafts its own shapes only")
        drafter = drafter.with_tree(tree, num_nodes=defaults.get("num_nodes", 16), tree_depth=defaults.get("tree_depth"))
    elif "num_nodes" in defaults or "tree_depth" in defaults:
        raise ValueError(f"{where}: num_nodes and tree_depth go with tree")
    else:
        drafter = copy.copy(drafter)  # the loaded drafter itself is never changed
    drafter.default_num_draft_tokens = defaults.get("num_draft_tokens")
    return drafter
