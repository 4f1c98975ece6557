"""``LayerSkipDrafter``: self-speculation. The target drafts for itself with some of its own
decoder layers (the first ``k``, or a chosen subset), followed by its final norm and LM head.

No second model is loaded: the drafter runs a :func:`~specdecode.models.layer_subset_view` of
the target, whose parameters are the target's own tensors. The drafter keeps its own KV cache
for the layers it runs (the engine's target cache is the engine's); everything else (drafting,
sampling, cache roll-back) is :class:`~specdecode.drafters.ModelDrafter`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from specdecode.drafters.model import ModelDrafter
from specdecode.models import facts
from specdecode.models.layer_view import layer_subset_view


class LayerSkipDrafter(ModelDrafter):
    """Drafts with the target's first ``num_layers`` decoder layers, or with the decoder layers
    ``layers`` (strictly increasing indices), then the target's final norm and LM head.

    Exactly one of ``num_layers`` / ``layers`` is given; both must leave out at least one of
    the target's ``L`` layers (``1 <= num_layers < L``). ``target`` must be the model passed
    to :func:`specdecode.generate` as the target; its parameters are shared, never copied.
    Architectures whose decoder-layer list is not found
    (:func:`specdecode.models.facts.decoder_layers`) are refused with a ``ValueError``.

    Example:
        >>> drafter = LayerSkipDrafter(target, num_layers=2)
        >>> out = specdecode.generate(target, drafter, input_ids, max_new_tokens=32)
    """

    name = "layer_skip"

    def __init__(self, target: torch.nn.Module, num_layers: int | None = None, *,
                 layers: Sequence[int] | None = None) -> None:
        if not isinstance(target, torch.nn.Module) or not hasattr(target, "config"):
            raise TypeError(
                f"target: expected a Hugging Face causal LM (a torch.nn.Module with .config), got {type(target).__name__}"
            )
        try:
            total = len(facts.decoder_layers(target))
        except ValueError as error:
            raise ValueError(f"target: {error}; LayerSkipDrafter supports models whose decoder layers it can find") \
                from None
        self.layers = _choose_layers(num_layers, layers, total)
        self.target_num_layers = total
        super().__init__(layer_subset_view(target, self.layers))

    def describe(self) -> dict[str, Any]:
        return {"drafter": self.name, "draft_layers": list(self.layers), "target_layers": self.target_num_layers}


def _choose_layers(num_layers: Any, layers: Any, total: int) -> tuple[int, ...]:
    if (num_layers is None) == (layers is None):
        raise ValueError("num_layers: give exactly one of num_layers=k (the first k layers) or layers=[...]")
    if num_layers is not None:
        if isinstance(num_layers, bool) or not isinstance(num_layers, int):
            raise TypeError(f"num_layers: expected an int in [1, {total - 1}], got {num_layers!r}")
        if not 1 <= num_layers < total:
            raise ValueError(
                f"num_layers: expected an int in [1, {total - 1}] (the target has {total} decoder layers and the "
                f"draft must skip at least one), got {num_layers}"
            )
        return tuple(range(num_layers))
    if isinstance(layers, (str, bytes)) or not isinstance(layers, Sequence) or isinstance(layers, torch.Tensor):
        raise TypeError(f"layers: expected a list of layer indices, got {type(layers).__name__}")
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in layers):
        raise TypeError(f"layers: expected a list of int layer indices, got {list(layers)!r}")
    chosen = tuple(layers)
    if not chosen or len(chosen) >= total:
        raise ValueError(
            f"layers: expected 1 to {total - 1} layer indices (the target has {total} decoder layers and the draft "
            f"must skip at least one), got {len(chosen)}"
        )
    if any(i < 0 or i >= total for i in chosen):
        raise ValueError(f"layers: every index must lie in [0, {total - 1}], got {list(chosen)}")
    if any(a >= b for a, b in zip(chosen, chosen[1:])):
        raise ValueError(f"layers: indices must be strictly increasing (the layers run in order), got {list(chosen)}")
    return chosen
