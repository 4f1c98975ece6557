"""``ExitAdapterDrafter``: self-speculation through a small trained *exit adapter*.

A model that was never trained to exit early does not decode its layer-``k`` feature through
its final norm and LM head (:class:`~specdecode.drafters.LayerSkipDrafter` on SmolLM2-135M at
k = 10 of 30 is accepted 0.7% of the time). An exit adapter is a few trainable modules between
the target's first ``k`` decoder layers and its (frozen) LM head:

- ``"layer"``: one decoder layer of the target's own class, started as a copy of the target's
  layer ``k`` (so before training the drafter is the layer-skip drafter of ``k + 1`` layers),
  then a final norm started as a copy of the target's;
- ``"linear"``: a residual projection ``h + W h`` (``W`` starts at zero) and the norm copy
  (a "tuned lens" exit: before training the layer-skip drafter of ``k`` layers).

The head is the target's own, or a *reduced head*: the rows of the target's head for the
``N`` most frequent tokens; every other token gets the logit ``-inf``, so the proposal
distribution ``q`` is zero there, which any lossless rule accepts (verification only needs
``q > 0`` on drafted tokens). The head's rows are sliced from the target when the drafter is
built: the saved adapter holds only the token ids.

The drafter runs a :func:`~specdecode.models.layer_subset_view` of the target whose layer ``k``
(``"layer"``), final norm and (reduced) head are the adapter's modules, so drafting, sampling
and the draft's own KV cache (one entry per layer it runs, the adapter layer included) are
:class:`~specdecode.drafters.ModelDrafter`'s. The first ``k`` layers and the embedding are the
target's own tensors (nothing is copied). Training lives in :mod:`specdecode.training.exit`.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import Tensor, nn

from specdecode.drafters.model import ModelDrafter
from specdecode.models import facts
from specdecode.models.layer_view import layer_subset_view
from specdecode.models.reduced_head import check_head_token_ids, output_head

__all__ = ["ADAPTER_KINDS", "ExitAdapter", "ExitAdapterDrafter", "exit_model"]

#: The adapter shapes: one decoder layer, or a residual projection; both end with a final norm.
ADAPTER_KINDS: tuple[str, ...] = ("layer", "linear")
# Where the final norm sits, as a child of the module that holds the decoder-layer list.
_FINAL_NORM_NAMES = ("norm", "ln_f", "final_layer_norm", "final_layernorm")


def final_norm_name(model: nn.Module) -> str:
    """The dotted path of the model's final norm (the child of the decoder-layer list's parent
    named ``norm``, ``ln_f``, ``final_layer_norm`` or ``final_layernorm``); ``ValueError``
    naming ``target`` when there is none."""
    parent_path = facts.decoder_layers_path(model).rsplit(".", 1)[0]
    parent: Any = model
    for name in parent_path.split("."):
        parent = getattr(parent, name)
    for name in _FINAL_NORM_NAMES:
        if isinstance(parent._modules.get(name), nn.Module):
            return f"{parent_path}.{name}"
    raise ValueError(f"target: cannot find the final norm of {type(model).__name__} (looked for "
                     f"{', '.join(parent_path + '.' + n for n in _FINAL_NORM_NAMES)})")


def _get(model: nn.Module, path: str) -> nn.Module:
    module: Any = model
    for name in path.split("."):
        module = module._modules[name]
    return module


class ResidualProjection(nn.Module):
    """``h + W h + b``, with ``W`` and ``b`` starting at zero (the identity).

    Shape:
        hidden: ``[..., H]``; returns ``[..., H]``.
    """

    def __init__(self, hidden_size: int, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.proj = nn.Linear(hidden_size, hidden_size, bias=True, dtype=dtype, device=device)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def forward(self, hidden: Tensor) -> Tensor:
        return hidden + self.proj(hidden)


class ExitAdapter(nn.Module):
    """The trainable part of an exit: ``layer`` (a decoder layer, or None), ``proj`` (a
    :class:`ResidualProjection`, or None) and ``norm`` (a final norm); plus the exit depth
    ``exit_layer`` (= ``k``, the target layers run before it) and, for a reduced head, the
    buffer ``head_token_ids`` (the kept token ids, increasing).

    Build one with :meth:`from_target`; its ``state_dict`` is what a saved drafter holds.
    """

    def __init__(self, exit_layer: int, kind: str, layer: nn.Module | None, proj: nn.Module | None,
                 norm: nn.Module, head_token_ids: Tensor | None = None) -> None:
        super().__init__()
        self.exit_layer = exit_layer
        self.kind = kind
        self.layer = layer
        self.proj = proj
        self.norm = norm
        self.register_buffer("head_token_ids", head_token_ids)

    @classmethod
    def from_target(cls, target: nn.Module, exit_layer: int, kind: str = "layer") -> ExitAdapter:
        """An untrained adapter for ``target`` at depth ``exit_layer`` (copies of the target's
        layer ``exit_layer`` and final norm; nothing of the target is modified).
        ``exit_layer`` must lie in ``[1, L - 1]``."""
        if not isinstance(target, nn.Module) or not hasattr(target, "config"):
            raise TypeError(f"target: expected a Hugging Face causal LM, got {type(target).__name__}")
        if kind not in ADAPTER_KINDS:
            raise ValueError(f"adapter: expected one of {', '.join(ADAPTER_KINDS)}, got {kind!r}")
        layers = facts.decoder_layers(target)
        total = len(layers)
        if isinstance(exit_layer, bool) or not isinstance(exit_layer, int) or not 1 <= exit_layer < total:
            raise ValueError(f"exit_layer: expected an int in [1, {total - 1}] (the target has {total} decoder "
                             f"layers), got {exit_layer!r}")
        norm = copy.deepcopy(_get(target, final_norm_name(target)))
        layer = proj = None
        if kind == "layer":
            layer = copy.deepcopy(layers[exit_layer])
        else:
            reference = next(target.parameters())
            proj = ResidualProjection(target.config.hidden_size, reference.dtype, reference.device)
        adapter = cls(exit_layer, kind, layer, proj, norm)
        for param in adapter.parameters():
            param.requires_grad_(True)
        return adapter

    def set_head_tokens(self, token_ids: Tensor | None) -> None:
        """Use a reduced head over ``token_ids`` (distinct ids; None: the full head).

        Shape:
            token_ids: ``[N]`` int64.
        """
        self.head_token_ids = check_head_token_ids(token_ids)

    def config_dict(self) -> dict[str, Any]:
        """What :func:`exit_model` needs besides the weights (saved as JSON)."""
        return {"exit_layer": self.exit_layer, "adapter": self.kind,
                "head_tokens": None if self.head_token_ids is None else int(self.head_token_ids.numel())}


def exit_model(target: nn.Module, adapter: ExitAdapter) -> nn.Module:
    """The drafter's model: a view of ``target`` running its first ``k`` decoder layers, then
    the adapter's layer (``"layer"``), projection and norm, then the target's head (or the
    reduced head). Shares every target tensor it uses; ``target`` is not modified."""
    if not isinstance(adapter, ExitAdapter):
        raise TypeError(f"adapter: expected an ExitAdapter, got {type(adapter).__name__}")
    total = len(facts.decoder_layers(target))
    k = adapter.exit_layer
    if not 1 <= k < total:
        raise ValueError(f"adapter: exit layer {k} does not fit a target of {total} decoder layers")
    count = k + 1 if adapter.layer is not None else k
    view = layer_subset_view(target, list(range(count)))
    if adapter.layer is not None:
        facts.decoder_layers(view)[k] = adapter.layer  # the view's own ModuleList
    norm_path = final_norm_name(view)
    parent_path, norm_name = norm_path.rsplit(".", 1)
    exit_norm: nn.Module = adapter.norm if adapter.proj is None else nn.Sequential(adapter.proj, adapter.norm)
    _get(view, parent_path)._modules[norm_name] = exit_norm  # a shallow clone: the target keeps its norm
    if adapter.head_token_ids is not None:
        head = target.get_output_embeddings()
        reduced = output_head(target, adapter.head_token_ids, facts.vocab_rows(target))
        names = [name for name, module in view._modules.items() if module is head]
        if not names:
            raise ValueError("target: cannot find the LM head among the model's top-level modules")
        view._modules[names[0]] = reduced
    return view


class ExitAdapterDrafter(ModelDrafter):
    """Drafts with the target's first ``k`` layers and a trained :class:`ExitAdapter` (see the
    module docstring); load a trained one with ``specdecode.load_drafter(DIR, target)``.

    ``target`` must be the model passed to :func:`specdecode.generate` as the target.

    Example:
        >>> drafter = specdecode.load_drafter("runs/smol-exit8", target)
        >>> out = specdecode.generate(target, drafter, input_ids, num_draft_tokens=4)
    """

    name = "exit_adapter"

    def __init__(self, target: nn.Module, adapter: ExitAdapter) -> None:
        if not isinstance(target, nn.Module) or not hasattr(target, "config"):
            raise TypeError(f"target: expected a Hugging Face causal LM, got {type(target).__name__}")
        try:
            model = exit_model(target, adapter)
        except ValueError as error:
            if "decoder layers" in str(error) and "target:" not in str(error):
                raise ValueError(f"target: {error}") from None
            raise
        self.adapter = adapter
        self.target_num_layers = len(facts.decoder_layers(target))
        super().__init__(model)

    def describe(self) -> dict[str, Any]:
        trained = sum(p.numel() for p in self.adapter.parameters())
        return {"drafter": self.name, **self.adapter.config_dict(), "adapter_params": trained,
                "target_layers": self.target_num_layers}
