"""Facts about a Hugging Face causal LM, and one forward call with an explicit KV cache."""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import Tensor


def input_device(model: torch.nn.Module) -> torch.device:
    """Where a model's input ids must go: the device of its input embeddings (for a model
    sharded with ``device_map`` or tensor parallelism, the first shard's device)."""
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    weight = getattr(emb, "weight", None) if emb is not None else None
    if isinstance(weight, Tensor):
        local = getattr(weight, "to_local", None)  # a DTensor shard (tensor parallelism)
        return local().device if callable(local) else weight.device
    return next(model.parameters()).device


def sliding_window(model: torch.nn.Module) -> int | None:
    """The model's sliding attention window in tokens, or None."""
    config = getattr(model, "config", None)
    window = getattr(config, "sliding_window", None)
    if window is None or getattr(config, "use_sliding_window", True) is False:
        return None
    return int(window)


def vocab_rows(model: torch.nn.Module) -> int:
    """Width of the model's logits: rows of its output embedding (config.vocab_size otherwise)."""
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    weight = getattr(out, "weight", None)
    if isinstance(weight, Tensor):
        return int(weight.shape[0])
    return int(model.config.vocab_size)


def accepts_logits_to_keep(model: torch.nn.Module) -> bool:
    """Whether ``model.forward`` takes ``logits_to_keep`` (computing only the last logits)."""
    try:
        return "logits_to_keep" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The model's list of decoder layers (``model.model.layers``, ``transformer.h``, ...)."""
    for path in ("model.layers", "model.decoder.layers", "transformer.h", "gpt_neox.layers", "transformer.layers"):
        module: Any = model
        for name in path.split("."):
            module = getattr(module, name, None)
            if module is None:
                break
        if isinstance(module, torch.nn.ModuleList):
            return module
    raise ValueError(f"model: cannot find the decoder layers of {type(model).__name__}")


def forward(model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor | None, position_ids: Tensor,
            cache: Any, *, last_only: bool, logits_to_keep_ok: bool) -> Tensor:
    """One forward pass that appends ``input_ids``' columns to ``cache``.

    Shape:
        input_ids, position_ids: ``[b, n]`` int64.
        attention_mask: ``[b, cache_columns + n]`` 0/1, a 4D ``[b, 1, n, cache_columns + n]``
            mask, or None (no padding anywhere).
        returns: ``[b, V]`` logits of the last column when ``last_only``, else ``[b, n, V]``.
    """
    kwargs: dict[str, Any] = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "past_key_values": cache,
        "use_cache": True,
    }
    if last_only and logits_to_keep_ok:
        kwargs["logits_to_keep"] = 1
    logits = model(**kwargs).logits
    return logits[:, -1] if last_only else logits


_TREE_MASK_SUPPORT: dict[int, bool] = {}


def check_tree_attention(model: torch.nn.Module, name: str = "target") -> None:
    """Raise ``ValueError`` unless ``model`` honours a custom 4D attention mask together with
    explicit position ids, which token trees need. Probed once per model with two tiny
    forwards: a query that may not see its predecessor must give the same logits as the
    sequence without that predecessor."""
    key = id(model)
    if key not in _TREE_MASK_SUPPORT:
        _TREE_MASK_SUPPORT[key] = _probe_tree_attention(model)
    if not _TREE_MASK_SUPPORT[key]:
        impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
        raise ValueError(
            f"{name}: {type(model).__name__} (attention implementation {impl!r}) does not honour a custom 4D "
            "attention mask with position ids, which token trees need; load it with attn_implementation='sdpa' "
            "or 'eager', or draft a chain (tree=None)"
        )


@torch.no_grad()
def _probe_tree_attention(model: torch.nn.Module) -> bool:
    device = input_device(model)
    vocab = int(model.get_input_embeddings().weight.shape[0])
    ids = torch.tensor([[1 % vocab, 2 % vocab, 3 % vocab]], device=device)
    dtype = getattr(model, "dtype", torch.float32)
    allowed = torch.tensor([[[[True, False, False], [True, True, False], [True, False, True]]]], device=device)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, torch.finfo(dtype).min)
    try:
        from specdecode.models.kv_cache import new_cache

        tree = model(input_ids=ids, attention_mask=mask, position_ids=torch.tensor([[0, 1, 1]], device=device),
                     past_key_values=new_cache(), use_cache=True).logits[0, 2].float()
        plain = model(input_ids=ids[:, [0, 2]], position_ids=torch.tensor([[0, 1]], device=device),
                      past_key_values=new_cache(), use_cache=True).logits[0, 1].float()
    except Exception:  # noqa: BLE001 - any failure means "not supported"
        return False
    return bool(torch.allclose(tree, plain, atol=1e-3 if dtype == torch.float32 else 5e-2, rtol=1e-3))
