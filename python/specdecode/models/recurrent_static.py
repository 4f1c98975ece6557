"""Recurrent layers on a static cache: one state per row, kept at every fed position, so a
rejected draft is rolled back by choosing a state rather than by feeding tokens again.

Mamba / Mamba2 mixers, gated-delta linear attention and short convolutions (Hugging Face's
``LinearAttentionLayer`` caches) hold a convolution state and a recurrent state per row. The eager
path rolls them back by copying them before a verification forward and feeding the kept tokens
again (:mod:`specdecode.engine.replay`); the static path cannot: its step has fixed shapes and
each row keeps a different number of drafts. So here a verification forward over ``n`` columns
runs every recurrent mixer one position at a time (the mixer's own one-token path, the one its
model's ``generate`` decodes with), and after position ``i`` copies the layer's states into a
record ``[n, *state]``; the commit then gives row ``b`` the states recorded after its position
``accepted[b]`` (the pending token and the ``accepted[b]`` drafts it kept), one gather per state,
on the device. Attention layers run the whole forward at once, as before; only the mixers step.

This is what vLLM and SGLang do with per-position states from their fused kernels; with
Transformers' mixers it costs ``n`` one-token mixer calls per verification forward instead of one
``n``-token call (the attention layers and the head are unchanged).

A prompt's prefill runs each mixer over the whole prompt block at once (its states start empty),
with a 2D padding mask for the recurrent layers (:attr:`RecurrentLayers.padding`): left-padding
columns must not enter a state, which a 4D attention mask cannot say.

The mixers are found, not named: a module with a ``layer_idx`` whose direct children include a
``Conv1d`` is the mixer of that cache layer (every hybrid family of Transformers builds its
mixers so: Mamba, Mamba2, gated delta, short convolutions); a model where that finds another
count of mixers than of recurrent cache layers is refused (:func:`mixer_problem`).
"""

from __future__ import annotations

import inspect
import types
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

__all__ = ["RecurrentLayers", "attention_free", "find_mixers", "mixer_problem", "stepped_forward_problem"]


def _cache_layers(model: torch.nn.Module) -> list[Any]:
    """The cache layers ``model``'s config lays out (Hugging Face's ``DynamicCache``), or none."""
    from transformers import DynamicCache

    try:
        return list(DynamicCache(config=model.config).layers)
    except Exception:  # noqa: BLE001 - a config the cache cannot lay out has no recurrent layers it knows
        return []


def attention_free(model: torch.nn.Module) -> bool:
    """Whether every cache layer ``model``'s config lays out is recurrent and none also attends
    (Mamba, FalconMamba; not Falcon-H1, whose layers do both): its forward then takes the 2D
    padding mask of a prefill, or no mask, never a 4D one."""
    from transformers.cache_utils import CacheLayerMixin

    from specdecode.models.kv_cache import is_recurrent_layer

    layers = _cache_layers(model)
    return bool(layers) and all(is_recurrent_layer(layer) and not isinstance(layer, CacheLayerMixin)
                                for layer in layers)


def _recurrent_indices(model: torch.nn.Module) -> list[tuple[int, int]]:
    """``(layer index, number of states)`` of every recurrent cache layer of ``model``'s config."""
    from specdecode.models.kv_cache import is_recurrent_layer

    return [(i, int(getattr(layer, "number_of_states", 1))) for i, layer in enumerate(_cache_layers(model))
            if is_recurrent_layer(layer)]


def find_mixers(model: torch.nn.Module) -> dict[int, torch.nn.Module]:
    """Cache layer index -> the module that updates that layer's recurrent states (see the
    module docstring); only indices whose cache layer is recurrent."""
    wanted = {i for i, _ in _recurrent_indices(model)}
    found: dict[int, list[torch.nn.Module]] = {}
    for module in model.modules():
        index = getattr(module, "layer_idx", None)
        if isinstance(index, int) and index in wanted and any(
                isinstance(child, torch.nn.Conv1d) for child in module.children()):
            found.setdefault(index, []).append(module)
    return {i: modules[0] for i, modules in found.items() if len(modules) == 1}


def mixer_problem(model: torch.nn.Module) -> str | None:
    """Why the static path cannot step ``model``'s recurrent mixers (None: it can)."""
    wanted = [i for i, _ in _recurrent_indices(model)]
    mixers = find_mixers(model)
    missing = [i for i in wanted if i not in mixers]
    if missing:
        return (f"the mixers of its recurrent layers {missing} were not found (a module with layer_idx and a Conv1d "
                "child, one per layer)")
    for index, mixer in mixers.items():
        if "forward" in mixer.__dict__:
            return (f"the mixer of layer {index} has a forward of its own (a hook's), which the static path "
                    "would replace")
        if not {"cache", "cache_params", "past_key_values"} & set(inspect.signature(type(mixer).forward).parameters):
            return f"the mixer of layer {index} takes no cache argument to find its states in"
    return None


# Per-model answers of the stepped probe, kept with the model itself (never under id()).
_STEPPED_PROBE: "weakref.WeakKeyDictionary[torch.nn.Module, dict[str, str | None]]" = weakref.WeakKeyDictionary()


def stepped_forward_problem(model: torch.nn.Module) -> str | None:
    """Why the static path's stepped verification cannot continue ``model``'s recurrent states
    (None: it can): a prompt of 3 tokens into a static cache, then 2 more tokens fed with the
    mixers stepping, must give the logits of one forward over the 5 without a cache. Probed once
    per model and dtype; for models whose mixers restart on a forward of several tokens from a
    cache (:data:`specdecode.models.facts.RESTARTS_STATE`), which stepping never asks of them."""
    condition = str(getattr(model, "dtype", None))
    answers = _STEPPED_PROBE.setdefault(model, {})
    if condition not in answers:
        answers[condition] = _probe_stepped(model)
    return answers[condition]


@torch.no_grad()
def _probe_stepped(model: torch.nn.Module) -> str | None:
    from specdecode.models import facts
    from specdecode.models.static_cache import ColumnCache, column_inputs, prefill_inputs

    problem = mixer_problem(model)
    if problem is not None:
        return problem
    device = facts.input_device(model)
    vocab = int(model.get_input_embeddings().weight.shape[0])
    ids = (torch.arange(5, device=device)[None] * 7 + 3) % vocab
    dtype = getattr(model, "dtype", torch.float32)
    tol = 1e-3 if dtype == torch.float32 else 5e-2
    cache = ColumnCache.for_model(model, 16, 2)
    start = torch.zeros(1, dtype=torch.long, device=device)
    cache.attach(model)
    try:
        plain = facts.full_tensor(model(input_ids=ids, position_ids=torch.arange(5, device=device)[None],
                                        use_cache=False).logits)[0].float()
        with prefill_inputs(cache, start, 3, dtype) as (_, positions, mask):
            facts.forward(model, ids[:, :3], mask, positions, cache, last_only=True, logits_to_keep_ok=False)
        columns, positions, mask = column_inputs(torch.full_like(start, 3), start, 2, 16, dtype)
        cache.columns = columns
        parts = facts.forward(model, ids[:, 3:], mask, positions, cache, last_only=False,
                              logits_to_keep_ok=False)[0].float()
    except Exception as exc:  # noqa: BLE001 - any failure is the reason
        return f"its stepped forward on a static cache fails ({type(exc).__name__}: {str(exc)[:160]})"
    finally:
        cache.detach()
    if not torch.allclose(parts, plain[3:], atol=tol, rtol=tol):
        return "its stepped forward on a static cache does not continue the prompt's states"
    return None


class RecurrentLayers:
    """The recurrent layers of a static cache (:class:`specdecode.models.static_cache.ColumnCache`):
    Hugging Face ``LinearAttentionLayer`` objects at their indices of ``cache.layers`` (whose
    states the mixers update in place, at fixed addresses), the per-position record of a
    verification forward, and the selection of each row's kept states.

    Shape:
        a state: ``[B, ...]`` (batch first, as every Transformers mixer keeps it); its record
            ``[n, B, ...]`` for a forward over ``n`` columns.
        padding: ``[B, width]`` int64 (1 = a real token) during a prefill, else None.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        from transformers.cache_utils import LinearAttentionLayer

        try:
            from transformers.cache_utils import DummyLayer
        except ImportError:  # transformers before its DummyLayer (5.17): a slot that holds nothing
            DummyLayer = _NoStates  # noqa: N806
        indices = _recurrent_indices(model)
        count = int(getattr(model.config.get_text_config() if hasattr(model.config, "get_text_config")
                            else model.config, "num_hidden_layers", 0) or 0)
        count = max(count, 1 + max((i for i, _ in indices), default=-1))
        self.indices = [i for i, _ in indices]
        #: every cache layer is recurrent: the model's forward takes a 2D padding mask, not a 4D one
        self.attention_free = attention_free(model)
        self.layers: list[Any] = [DummyLayer() for _ in range(count)]
        for i, states in indices:
            self.layers[i] = LinearAttentionLayer(number_of_states=states)
        self.padding: Tensor | None = None
        #: ``[B, n]`` int64 while a forward feeds a token tree (node ``i``'s parent among the fed
        #: positions, -1 for the root), else None: each node steps from its parent's states
        self.parents: Tensor | None = None
        self._record: dict[tuple[int, str, int], Tensor] = {}
        self._attached: list[torch.nn.Module] = []  # mixers stepping (attach): held during a generation only

    def reset(self) -> None:
        """Before a prefill: every state is empty again (the mixers' prefill path starts from none)."""
        for i in self.indices:
            layer = self.layers[i]
            for s in layer.has_previous_state:
                layer.has_previous_state[s] = False

    def _states(self, index: int) -> Iterator[tuple[str, int, Tensor]]:
        layer = self.layers[index]
        for kind, store in (("conv", layer.conv_states), ("recurrent", layer.recurrent_states)):
            for s, tensor in store.items():
                if isinstance(tensor, Tensor):
                    yield kind, s, tensor

    def keep_position(self, index: int, position: int, positions: int) -> None:
        """Copy layer ``index``'s states, as they are after fed position ``position`` of a forward
        over ``positions`` columns (-1: before it), into its record (slot ``position + 1``; made on
        first use: the first, eager step)."""
        for kind, s, tensor in self._states(index):
            key = (index, kind, s)
            record = self._record.get(key)
            if record is None or record.shape != (positions + 1, *tensor.shape) or record.device != tensor.device:
                record = self._record[key] = torch.empty((positions + 1, *tensor.shape), dtype=tensor.dtype,
                                                         device=tensor.device)
            record[position + 1].copy_(tensor)

    def load_parent(self, index: int, parents: Tensor) -> None:
        """A tree's next node: give each row of layer ``index`` the states recorded after its
        node's parent (``parents[b]``, -1: the states before the forward).

        Shape:
            parents: ``[B]`` int64.
        """
        for kind, s, tensor in self._states(index):
            record = self._record[(index, kind, s)]
            rows = torch.arange(tensor.shape[0], device=tensor.device)
            tensor.copy_(record[parents.to(tensor.device) + 1, rows])

    def attach(self, model: torch.nn.Module) -> None:
        """For one generation: every recurrent mixer of ``model`` steps through a forward of
        several columns one position at a time once its states have started (after the prefill),
        recording them for :meth:`keep` (:func:`_stepped_forward`). Undone by :meth:`detach`: the
        user's model is left as it was. Outside compiled code and graphs (the engine's host code)."""
        self.detach()
        for mixer in find_mixers(model).values():
            mixer.forward = types.MethodType(_stepped_forward, mixer)
            self._attached.append(mixer)

    def detach(self) -> None:
        """Undo :meth:`attach`."""
        for mixer in self._attached:
            mixer.__dict__.pop("forward", None)
        self._attached = []

    def started(self, index: int) -> bool:
        """Whether layer ``index``'s states hold a prefix (a prefill ran since :meth:`reset`)."""
        return all(self.layers[index].has_previous_state.values())

    def keep(self, accepted: Tensor) -> None:
        """After a stepped forward: row ``b`` keeps the states recorded after its position
        ``accepted[b]`` (a chain's accepted drafts, a tree's accepted path's last node; clamped
        into the forward's columns: a finished row's choice is never read).

        Shape:
            accepted: ``[B]`` int64.
        """
        for index in self.indices:
            for kind, s, tensor in self._states(index):
                record = self._record.get((index, kind, s))
                if record is None:  # no forward of several columns recorded (the target alone)
                    return
                position = accepted.clamp(0, record.shape[0] - 2) + 1
                rows = torch.arange(tensor.shape[0], device=tensor.device)
                tensor.copy_(record[position.to(tensor.device), rows])


class _NoStates:
    """The entry of ``cache.layers`` at a layer without recurrent states (its keys and values live
    in the :class:`~specdecode.models.static_cache.ColumnCache` itself), where transformers has no
    ``DummyLayer``."""

    is_compileable = True
    is_initialized = True
    keys = values = None


def _stepped_forward(mixer: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    """A recurrent mixer's forward while attached (:meth:`RecurrentLayers.attach`): its own
    forward, over one position at a time when it continues several columns from a started state,
    the layer's states recorded after each position (in its static cache's
    :class:`RecurrentLayers`). A module-level function bound to the mixer, so that compiled code
    sees the same function in every generation."""
    plain = type(mixer).forward
    cache = next((kwargs[k] for k in ("cache", "cache_params", "past_key_values") if k in kwargs), None)
    recurrent = getattr(cache, "recurrent", None)
    hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
    B, n = hidden.shape[:2]
    index = mixer.layer_idx
    if not isinstance(recurrent, RecurrentLayers) or n < 2 or not recurrent.started(index):
        return plain(mixer, *args, **kwargs)

    def cut(value: Any, i: int, name: str = "") -> Any:
        if isinstance(value, Tensor):
            if value.dim() >= 2 and value.shape[0] == B and value.shape[1] == n:
                return value[:, i: i + 1]
            if name == "cache_position" and value.dim() == 1 and value.shape[0] == n:
                return value[i: i + 1]
        if isinstance(value, tuple) and value and all(isinstance(v, Tensor) for v in value):
            return tuple(cut(v, i) for v in value)
        return value

    parents = recurrent.parents
    if parents is not None:
        recurrent.keep_position(index, -1, n)  # the states before the tree, its root's parent
    outputs = []
    for i in range(n):
        if parents is not None and i > 0:
            recurrent.load_parent(index, parents[:, i])
        outputs.append(plain(mixer, *(cut(a, i) for a in args), **{k: cut(v, i, k) for k, v in kwargs.items()}))
        recurrent.keep_position(index, i, n)
    if isinstance(outputs[0], tuple):
        return (torch.cat([o[0] for o in outputs], 1), *outputs[-1][1:])
    return torch.cat(outputs, 1)
