"""Facts about a Hugging Face causal LM, and one forward call with an explicit KV cache."""

from __future__ import annotations

import inspect
import weakref
from typing import Any

import torch
from torch import Tensor

from specdecode.models import layer_masks
from specdecode.models.cache_io import cache_kwargs


def local_tensor(tensor: Tensor) -> Tensor:
    """This process's part of a tensor: the local shard of a ``DTensor`` (tensor parallelism),
    the tensor itself otherwise."""
    local = getattr(tensor, "to_local", None)
    return local() if callable(local) else tensor


def full_tensor(tensor: Tensor) -> Tensor:
    """A plain tensor with the whole value: a ``DTensor`` is gathered (a collective: every rank
    of its mesh must call this), a plain tensor is returned as it is."""
    full = getattr(tensor, "full_tensor", None)
    return full() if callable(full) else tensor


def input_device(model: torch.nn.Module) -> torch.device:
    """Where a model's input ids must go: the device of its input embeddings (for a model
    sharded with ``device_map`` or tensor parallelism, the first shard's device; for embeddings
    offloaded by an ``accelerate`` hook, the device the hook runs them on)."""
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    execution = getattr(getattr(emb, "_hf_hook", None), "execution_device", None)
    if execution is not None:
        device = torch.device("cuda", execution) if isinstance(execution, int) else torch.device(execution)
        if device.type != "meta":
            return device
    weight = getattr(emb, "weight", None) if emb is not None else None
    if isinstance(weight, Tensor):
        return local_tensor(weight).device
    return next(model.parameters()).device


def unloaded_parameters(model: torch.nn.Module) -> list[str]:
    """Names of parameters on the meta device that nothing will load: weights that were never
    loaded. Parameters an ``accelerate`` offload hook brings in for each forward (``device_map``
    with ``"cpu"`` / ``"disk"`` offload) are on the meta device too, but are loaded: not listed."""
    found: list[str] = []

    def visit(module: torch.nn.Module, prefix: str, offloaded: bool) -> None:
        hook = vars(module).get("_hf_hook")  # a plain attribute (getattr on a module costs an exception when absent)
        hooks = getattr(hook, "hooks", None) or ((hook,) if hook is not None else ())  # SequentialHook
        offloaded = offloaded or any(getattr(h, "offload", False) for h in hooks)
        for name, param in module._parameters.items():
            if param is not None and param.device.type == "meta" and not offloaded:
                found.append(prefix + name)
        for name, child in module._modules.items():
            if child is not None:
                visit(child, f"{prefix}{name}.", offloaded)

    visit(model, "", False)
    return found


def check_model(name: str, model: Any) -> None:
    """A decoder-only causal LM with real weights, or ``TypeError`` / ``ValueError`` naming ``name``."""
    if not isinstance(model, torch.nn.Module) or not hasattr(model, "config"):
        raise TypeError(
            f"{name}: expected a Hugging Face causal LM (a torch.nn.Module with .config), got {type(model).__name__}"
        )
    if getattr(model.config, "is_encoder_decoder", False):
        raise ValueError(
            f"{name}: {type(model).__name__} is an encoder-decoder model; only decoder-only models are supported"
        )
    if not hasattr(model, "get_input_embeddings") or model.get_input_embeddings() is None:
        raise ValueError(f"{name}: {type(model).__name__} has no input embeddings (get_input_embeddings() is None)")
    meta = unloaded_parameters(model)  # offloaded weights (accelerate hooks) are loaded at each forward
    if meta:
        raise ValueError(
            f"{name}: {len(meta)} parameter(s) are on the meta device (e.g. {meta[0]!r}): the weights were never "
            "loaded; load the model with real weights (or call .to_empty() and load a state dict) before generating"
        )


def vocab_rows(model: torch.nn.Module) -> int:
    """Width of the model's logits: rows of its output embedding (config.vocab_size otherwise).
    A tensor-parallel output embedding is a ``DTensor`` whose shape is the global one."""
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


# Where Hugging Face causal LMs keep their decoder layers, relative to the *ForCausalLM module.
DECODER_LAYER_PATHS = ("model.layers", "model.decoder.layers", "transformer.h", "gpt_neox.layers",
                       "transformer.layers")


def decoder_layers_path(model: torch.nn.Module) -> str:
    """The dotted attribute path of the model's decoder-layer list (``"model.layers"``,
    ``"transformer.h"``, ...), or ``ValueError`` when it is none of the known places."""
    for path in DECODER_LAYER_PATHS:
        module: Any = model
        for name in path.split("."):
            module = getattr(module, name, None)
            if module is None:
                break
        if isinstance(module, torch.nn.ModuleList) and len(module) > 0:
            return path
    raise ValueError(
        f"model: cannot find the decoder layers of {type(model).__name__} (looked for a non-empty ModuleList at "
        f"{', '.join(DECODER_LAYER_PATHS)})"
    )


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The model's list of decoder layers (``model.model.layers``, ``transformer.h``, ...)."""
    module: Any = model
    for name in decoder_layers_path(model).split("."):
        module = getattr(module, name)
    return module


def _masks_for(model: torch.nn.Module, attention_mask: Tensor | None, position_ids: Tensor, cache: Any) -> Any:
    """The attention masks of one forward: ``attention_mask`` itself, or one per layer type
    for a model with sliding-window or chunked layers (:func:`specdecode.models.layer_masks.layer_masks`)."""
    padding = getattr(cache, "recurrent_padding", None)  # a static cache's prefill of recurrent layers
    if getattr(cache, "attention_free", False):  # Mamba: no attention layer reads a 4D mask
        return padding
    info = layer_masks.layout(model)
    masks: Any = attention_mask
    if info is not None:
        if attention_mask is not None:
            num_columns = attention_mask.shape[-1]
        else:
            num_columns = int(cache.get_seq_length()) + position_ids.shape[1]
        masks = layer_masks.layer_masks(model, attention_mask, position_ids, num_columns)
        ring = getattr(cache, "ring_key_columns", None)
        key_columns = ring() if callable(ring) else None  # a static cache whose sliding layers keep a ring
        if key_columns is not None:
            masks = layer_masks.ring_masks(masks, key_columns.to(position_ids.device), info)
    return masks if padding is None else layer_masks.with_recurrent_padding(model, masks, padding)


def forward(model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor | None, position_ids: Tensor,
            cache: Any, *, last_only: bool, logits_to_keep_ok: bool, keep_last: int | None = None) -> Tensor:
    """One forward pass that appends ``input_ids``' columns to ``cache``.

    Shape:
        input_ids, position_ids: ``[b, n]`` int64.
        attention_mask: ``[b, cache_columns + n]`` 0/1, a 4D ``[b, 1, n, cache_columns + n]``
            mask, or None (no padding anywhere).
        returns: ``[b, V]`` logits of the last column when ``last_only``, else ``[b, n, V]``
            (``[b, keep_last, V]``, the last columns', with ``keep_last``); always a plain
            tensor holding every vocabulary entry (tensor-parallel logits that come back as a
            vocabulary-sharded ``DTensor`` are gathered here, on every rank).
    """
    kwargs: dict[str, Any] = {
        "input_ids": input_ids,
        "attention_mask": _masks_for(model, attention_mask, position_ids, cache),
        "position_ids": position_ids,
        **cache_kwargs(model, cache),
    }
    keep = 1 if last_only else keep_last
    if keep is not None and logits_to_keep_ok:
        kwargs["logits_to_keep"] = keep
    logits = full_tensor(model(**kwargs).logits)
    if last_only:
        return logits[:, -1]
    return logits if keep_last is None else logits[:, -keep_last:]


def check_feature_layers(model: torch.nn.Module, layers: Any, name: str = "feature_layers") -> tuple[int, ...]:
    """``layers`` as a tuple of indices into the model's ``hidden_states`` (Hugging Face's
    ``output_hidden_states``: 0 the embeddings, ``i`` the output of decoder layer ``i``, -1 the
    last, after the final norm in most models), or ``ValueError`` naming ``name``."""
    count = len(decoder_layers(model)) + 1
    if (not isinstance(layers, (tuple, list)) or not layers
            or not all(isinstance(i, int) and not isinstance(i, bool) for i in layers)):
        raise ValueError(f"{name}: expected a non-empty tuple of hidden-state indices, got {layers!r}")
    if any(not -count <= i < count for i in layers):
        raise ValueError(f"{name}: indices must lie in [-{count}, {count}) for a model with {count - 1} decoder "
                         f"layers, got {list(layers)}")
    return tuple(layers)


def forward_with_features(model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor | None,
                          position_ids: Tensor, cache: Any, *, layers: tuple[int, ...], last_only: bool,
                          logits_to_keep_ok: bool) -> tuple[Tensor, Tensor]:
    """:func:`forward` that also returns the hidden states at ``layers`` (indices into
    ``hidden_states``, :func:`check_feature_layers`), concatenated on the last axis: the same
    single forward pass, asked for its hidden states.

    Shape:
        as :func:`forward`; the features are ``[b, n, len(layers) * hidden]`` for every column
        of ``input_ids``, also when ``last_only``.
    """
    kwargs: dict[str, Any] = {
        "input_ids": input_ids,
        "attention_mask": _masks_for(model, attention_mask, position_ids, cache),
        "position_ids": position_ids,
        "output_hidden_states": True,
        **cache_kwargs(model, cache),
    }
    if last_only and logits_to_keep_ok:
        kwargs["logits_to_keep"] = 1
    out = model(**kwargs)
    logits = full_tensor(out.logits)
    hidden = out.hidden_states
    features = torch.cat([full_tensor(hidden[i]) for i in layers], -1) if len(layers) > 1 else \
        full_tensor(hidden[layers[0]])
    return (logits[:, -1] if last_only else logits), features


# Per-model answers of the mask probe, kept with the model itself: a weak-keyed table forgets a
# model's entry when the model is freed, so a later model can never inherit it (an ``id()`` can
# be reused as soon as its object dies). Within one model the answer is keyed by what it depends
# on: the attention implementation (``set_attn_implementation`` can change it) and the dtype.
_TREE_MASK_SUPPORT: "weakref.WeakKeyDictionary[torch.nn.Module, dict[tuple, bool]]" = weakref.WeakKeyDictionary()


def accepts_custom_4d_mask(model: torch.nn.Module) -> bool:
    """Whether ``model`` honours a custom 4D attention mask together with explicit position ids
    (token trees and static caches need both). Probed with two tiny forwards, once per model,
    attention implementation and dtype: a query that may not see its predecessor must give the
    same logits as the sequence without that predecessor."""
    config = getattr(model, "config", None)
    condition = (getattr(config, "_attn_implementation", None), str(getattr(model, "dtype", None)))
    answers = _TREE_MASK_SUPPORT.setdefault(model, {})
    if condition not in answers:
        from specdecode.models.kv_cache import has_recurrent_layers

        # a recurrent layer reads every earlier token, so no tree mask holds for it: its models are
        # probed with a left-padded chain (their only use of a custom 4D mask: static caches)
        probe = _probe_padded_chain if has_recurrent_layers(model) else _probe_tree_attention
        answers[condition] = probe(model)
    return answers[condition]


def check_tree_attention(model: torch.nn.Module, name: str = "target") -> None:
    """Raise ``ValueError`` unless ``model`` honours a custom 4D attention mask together with
    explicit position ids, which token trees need (:func:`accepts_custom_4d_mask`)."""
    if not accepts_custom_4d_mask(model):
        impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
        raise ValueError(
            f"{name}: {type(model).__name__} (attention implementation {impl!r}) does not honour a custom 4D "
            "attention mask with position ids, which token trees need; load it with attn_implementation='sdpa' "
            "or 'eager', or draft a chain (tree=None)"
        )


def _probe_tree_attention(model: torch.nn.Module) -> bool:
    """Query 2 may not see query 1 (a tree's sibling): its logits must be those of the sequence
    without it."""
    return _probe_mask(model, [[True, False, False], [True, True, False], [True, False, True]], [0, 1, 1],
                       lambda mask, positions: layer_masks.layer_masks(model, mask, positions, 3), [0, 2])


def _probe_padded_chain(model: torch.nn.Module) -> bool:
    """A model with recurrent layers: a chain behind a padding column, its 4D mask and the
    recurrent layers' 2D padding given (:func:`layer_masks.with_recurrent_padding`; the padding
    alone for a model without attention layers), must give the logits of the chain alone."""
    from specdecode.models.recurrent_static import attention_free

    def masks(mask: Tensor, positions: Tensor) -> Any:
        padding = torch.tensor([[0, 1, 1]], device=mask.device)
        return padding if attention_free(model) else layer_masks.with_recurrent_padding(model, mask, padding)

    return _probe_mask(model, [[True, False, False], [False, True, False], [False, True, True]], [0, 0, 1], masks,
                       [1, 2])


@torch.no_grad()
def _probe_mask(model: torch.nn.Module, allowed: list[list[bool]], positions: list[int],
                masks: Any, plain_columns: list[int]) -> bool:
    """Three tokens with the custom mask ``allowed`` (``masks(mask, positions)`` makes the model's
    argument of it) and ``positions``: the last token's logits must equal those of the tokens at
    ``plain_columns`` fed alone (positions from 0), the last of them."""
    from specdecode.models.kv_cache import new_cache

    device = input_device(model)
    vocab = int(model.get_input_embeddings().weight.shape[0])
    ids = torch.tensor([[1 % vocab, 2 % vocab, 3 % vocab]], device=device)
    dtype = getattr(model, "dtype", torch.float32)
    keep = torch.tensor([[allowed]], device=device)
    mask = torch.zeros(keep.shape, dtype=dtype, device=device).masked_fill(~keep, torch.finfo(dtype).min)
    where = torch.tensor([positions], device=device)
    try:
        custom = model(input_ids=ids, attention_mask=masks(mask, where), position_ids=where,
                       **cache_kwargs(model, new_cache(model))).logits[0, 2].float()
        plain_positions = torch.arange(len(plain_columns), device=device)[None]
        plain = model(input_ids=ids[:, plain_columns], position_ids=plain_positions,
                      **cache_kwargs(model, new_cache(model))).logits[0, -1].float()
    except Exception:  # noqa: BLE001 - any failure means "not supported"
        return False
    return bool(torch.allclose(custom, plain, atol=1e-3 if dtype == torch.float32 else 5e-2, rtol=1e-3))


# Per-model answers of the forward probe, kept with the model itself (as the mask probe's).
_FORWARD_PROBE: "weakref.WeakKeyDictionary[torch.nn.Module, dict[tuple, str | None]]" = weakref.WeakKeyDictionary()


#: :func:`forward_problem`'s reason for recurrent mixers that take a forward of several tokens from a
#: cache for a prompt: the static path, which steps them one token at a time, may still run them.
RESTARTS_STATE = ("it has recurrent layers that restart their state on a forward of several tokens from a cache "
                  "(they take it for a prompt)")


def forward_problem(model: torch.nn.Module) -> str | None:
    """Why speculative decoding cannot verify drafts with ``model``, or None when it can: a
    forward of several tokens with an explicit KV cache and position ids (what every
    verification does) must run, give the logits of a forward without a cache, be causal (the
    first tokens' logits do not change when later
    tokens are added: an encoder loaded as a causal LM without ``is_decoder=True`` is not) and
    continue from what the cache holds (some models ignore the cache, and some recurrent mixers
    restart their state on a multi-token forward). Probed with five tiny forwards once per model
    and dtype (its inputs carry no mask: the attention implementation does not change the answer)."""
    condition = (str(getattr(model, "dtype", None)),)
    answers = _FORWARD_PROBE.setdefault(model, {})
    if condition not in answers:
        answers[condition] = _probe_forward(model)
    return answers[condition]


@torch.no_grad()
def _probe_forward(model: torch.nn.Module) -> str | None:
    from specdecode.models.kv_cache import has_recurrent_layers, new_cache

    device = input_device(model)
    vocab = int(model.get_input_embeddings().weight.shape[0])
    ids = (torch.arange(5, device=device)[None] * 7 + 3) % vocab
    positions = torch.arange(5, device=device)[None]
    keep = accepts_logits_to_keep(model)
    dtype = getattr(model, "dtype", torch.float32)
    tol = 1e-3 if dtype == torch.float32 else 5e-2

    def run(lo: int, hi: int, cache: Any) -> Tensor:
        return forward(model, ids[:, lo:hi], None, positions[:, lo:hi], cache, last_only=False,
                       logits_to_keep_ok=keep)[0].float()

    try:
        whole = run(0, 5, new_cache(model))
        plain = full_tensor(model(input_ids=ids, position_ids=positions, use_cache=False).logits)[0].float()
        first = run(0, 2, new_cache(model))
        cache = new_cache(model)
        run(0, 3, cache)
        parts = run(3, 5, cache)
    except Exception as exc:  # noqa: BLE001 - any failure is the reason
        return (f"its forward with an explicit KV cache and position ids fails ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0][:160] if str(exc) else 'no message'})")
    if not torch.allclose(whole, plain, atol=tol, rtol=tol):
        return "its forward with an explicit KV cache gives other logits than without a cache"
    if not torch.allclose(whole[:2], first, atol=tol, rtol=tol):
        return ("it is not causal: the logits of a token change when later tokens are added (an encoder "
                "loaded as a causal LM attends both ways; BERT-like models need is_decoder=True)")
    if not torch.allclose(whole[3:], parts, atol=tol, rtol=tol):
        if has_recurrent_layers(model):
            return RESTARTS_STATE
        return "a forward of several tokens does not continue from its KV cache (it ignores or restarts the cache)"
    return None


def check_decoder_forward(model: torch.nn.Module, name: str = "target", *, stepped: bool = False) -> None:
    """``ValueError`` naming ``name`` and the model type when :func:`forward_problem` finds a
    reason that drafts cannot be verified with ``model``. ``stepped``: the caller (the static
    path) steps recurrent mixers one token at a time through a verification forward, so mixers
    that restart on a forward of several tokens are probed that way instead
    (:func:`specdecode.models.recurrent_static.stepped_forward_problem`)."""
    from specdecode.models.recurrent_static import stepped_forward_problem

    problem = forward_problem(model)
    where = "no speculative decoding path supports this model"
    if problem == RESTARTS_STATE:
        steps = stepped_forward_problem(model)
        if steps is None and stepped:
            return
        if steps is None:
            where = "decode_path='static' runs it (its recurrent layers stepped one token at a time)"
    if problem is not None:
        model_type = getattr(getattr(model, "config", None), "model_type", "?")
        raise ValueError(f"{name}: {type(model).__name__} ({model_type}) cannot verify drafts: {problem}; {where}")
