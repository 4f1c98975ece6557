"""Published DFlash checkpoints (the ``DFlashDraftModel`` Hugging Face folders) as a drafter.

What such a folder holds:

- ``config.json``: a Qwen3-style decoder config (``hidden_size``, ``num_hidden_layers`` = the
  drafter's own depth, heads, ``head_dim``, ``intermediate_size``, ``rms_norm_eps``, the rotary
  base as ``rope_theta`` or inside ``rope_parameters``, ``attention_bias``) with
  ``architectures: ["DFlashDraftModel"]``, plus the DFlash fields: ``dflash_config`` with
  ``mask_token_id`` (a token of the target's vocabulary whose embedding fills the masked block
  positions) and ``target_layer_ids`` (0-based decoder layers of the target whose outputs are
  fused; when absent, ``num_hidden_layers`` ids spread over ``num_target_layers``), and
  ``block_size`` (at the top level in older folders, inside ``dflash_config`` in newer ones).
- the weights, ``model.safetensors`` or shards listed by ``model.safetensors.index.json``, under
  the names :class:`~specdecode.drafters.dflash_model.DFlashModel` uses. There is no embedding
  and no LM head: the target's are used, so the target must be the model the drafter was trained
  for (its hidden size, its depth and the mask token are checked; the weights cannot be).

Draft layers with sliding-window attention (``layer_types`` naming ``sliding_attention``) and
other architectures (such as ``DFlash2DraftModel``) are refused rather than run wrong.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from torch import Tensor, nn

from specdecode.drafters.dflash import DFlashDrafter
from specdecode.drafters.dflash_model import DFlashConfig, DFlashModel, default_target_layer_ids, rope_base
from specdecode.models import decoder_layers

__all__ = ["is_dflash_checkpoint", "load_dflash", "read_dflash_config"]

ARCHITECTURE = "DFlashDraftModel"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
#: Keys a published folder may hold that carry no weights of the network (recomputed here).
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def _where(path: str | Path) -> str:
    return f"path: {str(path)!r}"


def _read_json(path: str | Path) -> dict[str, Any]:
    file = Path(path) / CONFIG_FILE
    if not file.is_file():
        raise ValueError(f"{_where(path)} holds no {CONFIG_FILE} (expected a DFlash checkpoint folder)")
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ValueError(f"{_where(path)}: {CONFIG_FILE} is not readable JSON ({err})") from err
    if not isinstance(raw, dict):
        raise ValueError(f"{_where(path)}: {CONFIG_FILE} is not a JSON object")
    return raw


def is_dflash_checkpoint(path: str | Path) -> bool:
    """Whether ``path`` is a folder whose ``config.json`` names the ``DFlashDraftModel`` architecture."""
    try:
        raw = _read_json(path)
    except (ValueError, TypeError):
        return False
    architectures = raw.get("architectures")
    return isinstance(architectures, list) and ARCHITECTURE in architectures


def _weight_files(path: str | Path) -> list[Path]:
    """The safetensors files of the folder (one file, or the shards its index lists)."""
    folder = Path(path)
    if (folder / WEIGHTS_FILE).is_file():
        return [folder / WEIGHTS_FILE]
    index = folder / INDEX_FILE
    if not index.is_file():
        raise ValueError(f"{_where(path)} holds neither {WEIGHTS_FILE} nor {INDEX_FILE}")
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        names = sorted(set(weight_map.values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"{_where(path)}: {INDEX_FILE} has no readable weight_map ({err!r})") from err
    missing = [name for name in names if not (folder / name).is_file()]
    if missing or not names:
        raise ValueError(f"{_where(path)}: {INDEX_FILE} lists missing shard files {missing or names}")
    return [folder / name for name in names]


def _weight_names(path: str | Path) -> set[str]:
    from safetensors import safe_open

    names: set[str] = set()
    for file in _weight_files(path):
        with safe_open(str(file), framework="pt") as f:
            names.update(f.keys())
    return names


def _required(raw: dict[str, Any], key: str, path: str | Path, where: str = "") -> Any:
    value = raw.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{_where(path)}: {CONFIG_FILE} needs {where}{key} as an int >= 1, got {value!r}")
    return value


def _check_not_sliding(raw: dict[str, Any], path: str | Path) -> None:
    types = raw.get("layer_types")
    if types is None and raw.get("use_sliding_window") and raw.get("sliding_window") is not None:
        first = int(raw.get("max_window_layers") or 0)  # Qwen3's rule: layers from this one slide
        types = ["sliding_attention" if i >= first else "full_attention"
                 for i in range(int(raw.get("num_hidden_layers") or 0))]
    if isinstance(types, list) and "sliding_attention" in types:
        raise ValueError(f"{_where(path)}: its draft layers use sliding-window attention (layer_types {types}, "
                         f"sliding_window {raw.get('sliding_window')!r}); sliding draft layers are not supported here")


def read_dflash_config(path: str | Path, target: nn.Module) -> DFlashConfig:
    """The :class:`DFlashConfig` of the checkpoint folder ``path``, checked against ``target``.

    ``ValueError`` naming ``path`` for a missing ``config.json``, a missing or malformed field,
    another architecture or sliding-window draft layers; naming ``target`` when ``target`` is not
    a model the checkpoint can draft for (another hidden size, fewer decoder layers than
    ``num_target_layers``, a layer id beyond its layers, a mask token outside its vocabulary).
    """
    raw = _read_json(path)
    architectures = raw.get("architectures")
    if not isinstance(architectures, list) or ARCHITECTURE not in architectures:
        raise ValueError(f"{_where(path)}: architectures {architectures!r} is not [{ARCHITECTURE!r}] "
                         "(only the DFlashDraftModel checkpoint format is supported)")
    _check_not_sliding(raw, path)
    dflash = raw.get("dflash_config")
    if not isinstance(dflash, dict):
        raise ValueError(f"{_where(path)}: {CONFIG_FILE} has no dflash_config object (got {dflash!r})")
    hidden = _required(raw, "hidden_size", path)
    num_layers = _required(raw, "num_hidden_layers", path)
    heads = _required(raw, "num_attention_heads", path)
    kv_heads = _required(raw, "num_key_value_heads", path) if "num_key_value_heads" in raw else heads
    head_dim = _required(raw, "head_dim", path) if raw.get("head_dim") is not None else hidden // heads
    ffn = _required(raw, "intermediate_size", path)
    block = dflash if "block_size" in dflash else raw
    block_size = _required(block, "block_size", path, "dflash_config." if block is dflash else "")
    mask_token = dflash.get("mask_token_id")
    if isinstance(mask_token, bool) or not isinstance(mask_token, int):
        raise ValueError(f"{_where(path)}: {CONFIG_FILE} needs dflash_config.mask_token_id as an int, "
                         f"got {mask_token!r}")
    try:
        theta = rope_base(SimpleNamespace(**raw))
    except ValueError as err:
        raise ValueError(f"{_where(path)}: {err}") from err

    total = len(decoder_layers(target))
    own_hidden = int(target.get_input_embeddings().weight.shape[1])
    if own_hidden != hidden:
        raise ValueError(f"target: hidden size {own_hidden}, but the checkpoint {str(path)!r} was trained for a "
                         f"target of hidden size {hidden}")
    wanted = raw.get("num_target_layers")
    if wanted is not None:
        wanted = _required(raw, "num_target_layers", path)
        if total < wanted:
            raise ValueError(f"target: {total} decoder layers, but the checkpoint {str(path)!r} was trained for a "
                             f"target of {wanted} (num_target_layers)")
    ids = dflash.get("target_layer_ids")
    if ids is None:
        ids = default_target_layer_ids(wanted or total, num_layers)
    if (not isinstance(ids, (list, tuple)) or not ids or len(set(ids)) != len(ids)
            or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids)):
        raise ValueError(f"{_where(path)}: dflash_config.target_layer_ids must be distinct layer indices >= 0, "
                         f"got {ids!r}")
    if max(ids) >= total:
        raise ValueError(f"target: {total} decoder layers, but the checkpoint {str(path)!r} reads layer "
                         f"{max(ids)} (target_layer_ids {list(ids)})")
    rows = int(target.get_input_embeddings().weight.shape[0])
    if not 0 <= mask_token < rows:
        raise ValueError(f"target: its embedding has {rows} rows, but the checkpoint {str(path)!r} uses mask "
                         f"token id {mask_token}")
    qk_norm = raw.get("model_type") == "qwen3" or any(k.endswith("self_attn.q_norm.weight")
                                                      for k in _weight_names(path))
    return DFlashConfig(hidden_size=hidden, num_layers=num_layers, num_heads=heads, num_kv_heads=kv_heads,
                        head_dim=head_dim, intermediate_size=ffn, block_size=block_size,
                        target_layer_ids=tuple(ids), mask_token_id=mask_token,
                        rms_norm_eps=float(raw.get("rms_norm_eps") or 1e-6), rope_theta=theta,
                        attention_bias=bool(raw.get("attention_bias", False)), qk_norm=qk_norm)


def _read_weights(path: str | Path, like: dict[str, Tensor]) -> dict[str, Tensor]:
    """The folder's tensors, each cast to the dtype and device of ``like``'s tensor of its name
    (names absent from ``like`` are kept as they are, to be reported). Shape: every tensor as stored."""
    from safetensors import safe_open

    state: dict[str, Tensor] = {}
    for file in _weight_files(path):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                if name.endswith(_IGNORED_SUFFIXES):
                    continue
                tensor = f.get_tensor(name)
                if name in like:
                    tensor = tensor.to(device=like[name].device, dtype=like[name].dtype)
                state[name] = tensor
    return state


def load_dflash(path: str | Path, target: nn.Module, *, tree: Any = None) -> DFlashDrafter:
    """A :class:`DFlashDrafter` for ``target`` from the published checkpoint folder ``path``
    (weights cast to the target's dtype, on its device; the network in eval mode). ``tree``: as
    :class:`DFlashDrafter`'s.

    ``ValueError`` as :func:`read_dflash_config`, and naming ``path`` when the weights do not
    match the config (missing, unexpected or misshapen tensors).

    Example:
        >>> drafter = load_dflash("Qwen3-8B-DFlash-b16", target)               # doctest: +SKIP
        >>> out = specdecode.generate(target, drafter, ids, max_new_tokens=64)  # doctest: +SKIP
    """
    if not isinstance(target, nn.Module):
        raise TypeError(f"target: expected the target model (a torch.nn.Module), got {type(target).__name__}")
    config = read_dflash_config(path, target)
    try:
        model = DFlashModel(target, config)
    except ValueError as err:
        raise ValueError(f"{_where(path)}: {err}") from err
    own = model.state_dict()
    state = _read_weights(path, own)
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    misshapen = sorted(f"{k} {tuple(state[k].shape)} (expected {tuple(own[k].shape)})"
                       for k in set(own) & set(state) if state[k].shape != own[k].shape)
    if missing or unexpected or misshapen:
        raise ValueError(f"{_where(path)}: the weights do not match its {CONFIG_FILE}: missing {missing}, "
                         f"unexpected {unexpected}, misshapen {misshapen}")
    model.load_state_dict(state, strict=True)
    return DFlashDrafter(target, model.eval(), tree=tree)
