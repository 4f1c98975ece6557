"""The ``draft`` kind: a small draft model distilled from the target (DistillSpec).

The drafter is the target's own architecture with fewer decoder layers: its configuration is
the target's with ``num_hidden_layers`` (and per-layer lists such as ``layer_types``) cut to the
chosen layers, and it starts from the target's weights: embedding, the chosen decoder layers
(by default the first ``max(1, L // 8)``), final norm and LM head. So before any training it is
a layer-skip drafter that already agrees with the target often; distillation then trains its
decoder layers and final norm (the embedding and head too with ``train_embeddings=True``) to
match the target's distributions on the target's own generations.

It shares the target's tokenizer and vocabulary, and is saved with ``save_pretrained``: the
result is a plain Hugging Face model (``AutoModelForCausalLM.from_pretrained(DIR)``) that works
as ``draft`` anywhere, in specdecode or in ``model.generate(assistant_model=...)``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from specdecode.models import decoder_layers, decoder_layers_path

__all__ = ["DESCRIPTION", "NAME", "Built", "build", "default_layers", "forward", "load", "save", "saved_options",
           "start_from"]

NAME = "draft"
DESCRIPTION = "a small draft model: the target's architecture with fewer layers, distilled from the target"


@dataclass
class Built:
    """A drafter ready to train: the model, the parameters to train (by name), and the target
    layers it started from."""

    model: torch.nn.Module
    params: dict[str, torch.nn.Parameter]
    layers: list[int]


def default_layers(num_target_layers: int) -> list[int]:
    """The first ``max(1, L // 8)`` layers of an ``L``-layer target."""
    return list(range(max(1, num_target_layers // 8)))


def _check_layers(layers: Any, num_target_layers: int) -> list[int]:
    if not isinstance(layers, (list, tuple)) or not layers or not all(isinstance(i, int) for i in layers):
        raise TypeError(f"layers: expected a non-empty list of target layer indices, got {layers!r}")
    if any(i < 0 or i >= num_target_layers for i in layers) or len(set(layers)) != len(layers):
        raise ValueError(f"layers: expected distinct indices in [0, {num_target_layers}), got {list(layers)}")
    return sorted(layers)


def draft_config(target: torch.nn.Module, layers: list[int]) -> Any:
    """The target's configuration cut to ``layers`` (a copy; the target's is not touched)."""
    config = copy.deepcopy(target.config)
    total = len(decoder_layers(target))
    config.num_hidden_layers = len(layers)
    for key, value in list(vars(config).items()):
        if "layer" in key and isinstance(value, list) and len(value) == total:  # layer_types, ...
            setattr(config, key, [value[i] for i in layers])
    return config


def build(target: torch.nn.Module, *, layers: list[int] | None = None, num_layers: int | None = None,
          train_embeddings: bool = False) -> Built:
    """A drafter initialised from ``target`` (see the module docstring). ``layers``: the target
    layer indices to start from; ``num_layers``: the first that many (default
    :func:`default_layers`). The target is only read."""
    from transformers import AutoModelForCausalLM

    total = len(decoder_layers(target))
    if layers is None:
        if num_layers is not None and (not isinstance(num_layers, int) or not 1 <= num_layers <= total):
            raise ValueError(f"num_layers: expected an int in [1, {total}], got {num_layers!r}")
        layers = list(range(num_layers)) if num_layers is not None else default_layers(total)
    layers = _check_layers(layers, total)
    config = draft_config(target, layers)
    dtype = next(target.parameters()).dtype
    model = AutoModelForCausalLM.from_config(config, dtype=dtype,
                                             attn_implementation=target.config._attn_implementation)
    model.generation_config = copy.deepcopy(target.generation_config)
    path = decoder_layers_path(target) + "."
    source = target.state_dict()
    state = {}
    for key in model.state_dict():
        name = key
        if key.startswith(path):
            index, rest = key[len(path):].split(".", 1)
            name = f"{path}{layers[int(index)]}.{rest}"
        if name not in source:
            raise ValueError(f"target: cannot initialise the drafter's {key!r} (no {name!r} in the target)")
        state[key] = source[name].detach().clone()
    model.load_state_dict(state)
    model.to(next(target.parameters()).device).eval()  # no dropout: distillation runs are short
    frozen: list[torch.nn.Parameter] = []
    if not train_embeddings:
        head = model.get_output_embeddings()
        frozen += list(model.get_input_embeddings().parameters()) + ([] if head is None else list(head.parameters()))
    params = {}
    for name, param in model.named_parameters():
        param.requires_grad_(not any(param is p for p in frozen))
        if param.requires_grad:
            params[name] = param
    return Built(model, params, layers)


def forward(model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """The drafter's logits on a right-padded batch.

    Shape:
        input_ids, attention_mask: ``[b, t]``; returns ``[b, t, V]``.
    """
    return model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits


def save(model: torch.nn.Module, out_dir: Path) -> None:
    """``model.safetensors``, ``config.json`` and ``generation_config.json`` in ``out_dir``."""
    from specdecode.models.loading import quiet_loading

    for param in model.parameters():
        param.requires_grad_(True)
    with quiet_loading():
        model.save_pretrained(out_dir, safe_serialization=True)


def saved_options(folder: Path, record: dict[str, Any]) -> dict[str, Any]:
    """The build options a saved draft model fixes (continuing it, :mod:`.continuing`): the
    target layers it was made of (``num_layers`` too, when they are the first ones, so
    ``num_layers=N`` continues a model of the first ``N``)."""
    layers = [int(i) for i in record["layers"]]
    first = layers == list(range(len(layers)))
    return {"layers": layers, "num_layers": len(layers) if first else None}


def start_from(built: Built, folder: Path, record: dict[str, Any]) -> None:
    """Continue the draft model saved in ``folder``: its weights (float16 ones cast to the
    model's dtype) replace the ones taken from the target, except those a shipped copy left
    out as the target's own (``"from_target"``: the built model has them from the target)."""
    from safetensors.torch import load_file

    file = Path(folder) / "model.safetensors"
    state = load_file(str(file))
    missing, unexpected = built.model.load_state_dict(state, strict=False)
    model = built.model
    present = set(state) | set(record.get("from_target") or [])  # saved, or the target's own
    tied = {name for name, param in model.named_parameters(remove_duplicate=False)
            if any(param is p for n, p in model.named_parameters(remove_duplicate=False) if n in present)}
    absent = set(missing) - present - tied
    if unexpected or absent:
        raise RuntimeError(f"missing {sorted(absent)}, unexpected {sorted(unexpected)}")


def load(folder: Path, target: torch.nn.Module, record: dict[str, Any]) -> torch.nn.Module:
    """The saved draft model, in eval mode, on the target's device and in its dtype. A
    shipped copy whose record lists weights under ``"from_target"`` (left out as the target's
    own, :mod:`specdecode.training.export`) gets them from ``target``."""
    from transformers import AutoModelForCausalLM

    from specdecode.models.loading import quiet_loading

    reference = next(target.parameters())
    shared = record.get("from_target") or []
    if not shared:
        with quiet_loading():
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=reference.dtype)
        return model.to(reference.device).eval()
    return _load_slim(Path(folder), target, shared)


def _load_slim(folder: Path, target: torch.nn.Module, shared: list[str]) -> torch.nn.Module:
    """A copy without the target's own weights: the model built from its config, its saved
    weights, and the ``shared`` ones read from ``target``."""
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    from specdecode.models.loading import quiet_loading

    reference = next(target.parameters())
    own = target.state_dict()
    absent = [name for name in shared if name not in own]
    if absent:
        raise ValueError(f"path: {str(folder)!r} takes {absent[0]!r} from the target, which has no such weight")
    with quiet_loading():
        config = AutoConfig.from_pretrained(folder)
        model = AutoModelForCausalLM.from_config(config, dtype=reference.dtype,
                                                 attn_implementation=target.config._attn_implementation)
        if (folder / "generation_config.json").is_file():
            model.generation_config = GenerationConfig.from_pretrained(folder)
    state = {**load_file(str(folder / "model.safetensors")), **{name: own[name].detach().cpu() for name in shared}}
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {name for name, param in model.named_parameters(remove_duplicate=False)
            if any(param is p for n, p in model.named_parameters() if n in state)}
    if unexpected or set(missing) - tied:
        raise ValueError(f"path: {str(folder)!r} does not hold the weights its config names "
                         f"(missing {sorted(set(missing) - tied)}, unexpected {unexpected})")
    return model.to(reference.device).eval()
