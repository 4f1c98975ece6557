"""The ``exit`` kind: an early-exit adapter for self-speculation
(:class:`~specdecode.drafters.exit_adapter.ExitAdapterDrafter`), trained by self-distillation.

The target's first ``k`` layers, its embedding and its LM head stay frozen; only the adapter
(one decoder layer started from the target's layer ``k`` and a final norm, or a residual
projection and a norm) learns to map the layer-``k`` feature to the target's next-token
distribution, with the kit's KL loss on the target's own generations. While training, the
frozen layers run once per example without autograd (their layer-``k`` features are cached in
memory for the run, keyed by the example's tokens) and the head's weight is read detached, so
no gradient is computed for (or stored on) any target parameter, and a step costs only the
adapter and the head.

With ``head_tokens=N`` the drafter drafts over the ``N`` tokens the training data uses most (the
target's top-1 choices and the tokens of the examples, counted over every example): a reduced
head whose rows are the target's. Training then computes only those rows
(:class:`~specdecode.training.losses.SubsetLogits`): the loss is the KL against the reduced
head's distribution, with a detached floor for target tokens outside it.

Saved as ``model.safetensors`` (the adapter's weights and, for a reduced head, its token ids)
and ``exit_adapter.json`` (the exit layer, the adapter shape, the head size).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from specdecode.drafters.exit_adapter import ExitAdapter, ExitAdapterDrafter, exit_model, final_norm_name
from specdecode.models import decoder_layers, vocab_rows
from specdecode.models.layer_view import layer_subset_view
from specdecode.training.losses import SubsetLogits
from specdecode.training.vocab import check_head_tokens, column_map, draft_vocabulary

__all__ = ["CONFIG_FILE", "DESCRIPTION", "NAME", "Built", "build", "cached_bytes", "default_exit_layer", "forward",
           "load", "prepare", "record_extras", "save", "saved_options", "start_from"]

NAME = "exit"
DESCRIPTION = "an early-exit adapter: the target's first k layers, one trained layer and norm, its own LM head"
CONFIG_FILE = "exit_adapter.json"
#: ``train_drafter`` returns the loaded drafter (not the training model) as its result's drafter.
RETURNS_DRAFTER = True


@dataclass
class Built:
    """An adapter ready to train (``model``), its trainable parameters, and the target layers it
    reads (``0 .. k-1``)."""

    model: nn.Module
    params: dict[str, nn.Parameter]
    layers: list[int]


def default_exit_layer(num_target_layers: int) -> int:
    """``max(1, L // 4)``: a quarter of the target's depth."""
    return max(1, num_target_layers // 4)


class _Replay(nn.Module):
    """Stands for one of the frozen layers ``0 .. k-1`` in the training view: the first returns
    the batch's layer-``k`` features (computed once per example, then cached), the others pass
    their input through. Other attributes (``attention_type``, ...) are the replaced layer's."""

    def __init__(self, replaced: nn.Module, first: bool) -> None:
        super().__init__()
        self.__dict__["replaced"] = replaced  # not a submodule: its parameters are not trained
        self.first = first
        self.features: Tensor | None = None

    def forward(self, hidden: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        return self.features if self.first else hidden

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.__dict__["replaced"], name)


class _TrainingHead(nn.Module):
    """The target's head with its weight read detached (gradients reach its input only); with
    ``token_ids`` (a reduced head) only those rows, as :class:`SubsetLogits`.

    Shape:
        hidden: ``[..., H]``; returns ``[..., V]`` logits, or ``[..., N]`` as SubsetLogits.
    """

    def __init__(self, head: nn.Module) -> None:
        super().__init__()
        self.__dict__["head"] = head  # not a submodule: its parameters are not the adapter's
        self.token_ids: Tensor | None = None
        self.column_of: Tensor | None = None

    def set_tokens(self, token_ids: Tensor) -> None:
        weight = self.head.weight
        self.token_ids = token_ids.to(weight.device)
        self.column_of = column_map(self.token_ids, weight.shape[0])

    def forward(self, hidden: Tensor) -> Any:
        weight = self.head.weight.detach()
        bias = getattr(self.head, "bias", None)
        bias = None if bias is None else bias.detach()
        if self.token_ids is None:
            return nn.functional.linear(hidden, weight, bias)
        ids = self.token_ids
        kept = nn.functional.linear(hidden, weight[ids], None if bias is None else bias[ids])
        return SubsetLogits(kept, ids, self.column_of)


class TrainingModel(nn.Module):
    """The adapter (its only registered submodule, so ``parameters()`` are the trainable ones)
    and the views of the target that train it: ``capture`` computes the layer-``k`` features of
    new examples (without autograd), ``view`` runs the adapter and the head on cached features."""

    def __init__(self, target: nn.Module, adapter: ExitAdapter) -> None:
        super().__init__()
        self.adapter = adapter
        k = adapter.exit_layer
        capture = layer_subset_view(target, list(range(k)))
        norm_parent, norm_name = final_norm_name(capture).rsplit(".", 1)
        _module(capture, norm_parent)._modules[norm_name] = nn.Identity()
        view = exit_model(target, adapter)
        head = target.get_output_embeddings()
        for root in (capture, view):
            names = [name for name, module in root._modules.items() if module is head]
            if head is None or not names:
                raise ValueError("target: cannot find the LM head among the model's top-level modules")
            root._modules[names[0]] = nn.Identity() if root is capture else _TrainingHead(head)
        layers = decoder_layers(view)
        for i in range(k):
            layers[i] = _Replay(layers[i], first=i == 0)
        self.__dict__.update(target=target, capture=capture, view=view, features={})

    @torch.no_grad()
    def layer_features(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """The target's layer-``k`` features of a right-padded batch, each example computed once.

        Shape:
            input_ids, attention_mask: ``[b, t]``; returns ``[b, t, H]``.
        """
        lengths = attention_mask.sum(1).tolist()
        keys = [input_ids[row, :n].cpu().numpy().tobytes() for row, n in enumerate(lengths)]
        missing = [row for row, key in enumerate(keys) if key not in self.features]
        if missing:
            index = torch.tensor(missing, device=input_ids.device)
            fresh = self.capture(input_ids=input_ids[index], attention_mask=attention_mask[index],
                                 use_cache=False).logits
            for j, row in enumerate(missing):
                self.features[keys[row]] = fresh[j, : lengths[row]].clone()
        out = self.adapter.norm.weight.new_zeros((*input_ids.shape, self.features[keys[0]].shape[-1]))
        for row, key in enumerate(keys):
            out[row, : lengths[row]] = self.features[key]
        return out


def _module(root: nn.Module, path: str) -> nn.Module:
    for name in path.split("."):
        root = root._modules[name]
    return root


def build(target: nn.Module, *, exit_layer: int | None = None, adapter: str = "layer",
          head_tokens: int | None = None) -> Built:
    """An untrained adapter for ``target``: at depth ``exit_layer`` (default
    :func:`default_exit_layer`), shaped ``adapter`` (``"layer"`` or ``"linear"``); with
    ``head_tokens`` the saved drafter uses a reduced head of that many tokens."""
    total = len(decoder_layers(target))
    if exit_layer is None:
        exit_layer = default_exit_layer(total)
    check_head_tokens(head_tokens)
    module = ExitAdapter.from_target(target, exit_layer, adapter)
    model = TrainingModel(target, module)
    model.__dict__["head_tokens"] = head_tokens
    model.eval()  # no dropout: distillation runs are short
    params = {name: p for name, p in model.named_parameters() if p.requires_grad}
    return Built(model, params, list(range(exit_layer)))


def prepare(built: Built, examples: list[Any]) -> None:
    """Choose the reduced head's tokens (when ``head_tokens`` was asked for) from the data: the
    most frequent among the examples' tokens and the target's top-1 choices. Training then
    computes only those rows of the head. ``built``: the kind's build result (its ``model``)."""
    model = built.model
    wanted = model.__dict__.get("head_tokens")
    if wanted is None:
        return
    size = vocab_rows(model.target)
    _use_head_tokens(model, draft_vocabulary(examples, size, min(wanted, size)))


def _use_head_tokens(model: TrainingModel, token_ids: Tensor) -> None:
    """Draft (and train) over ``token_ids`` only: the adapter's reduced head and the training head."""
    model.adapter.set_head_tokens(token_ids)
    head = next(m for m in model.view._modules.values() if isinstance(m, _TrainingHead))
    head.set_tokens(model.adapter.head_token_ids)


def saved_options(folder: Path, record: dict[str, Any]) -> dict[str, Any]:
    """The build options a saved adapter fixes (continuing it, :mod:`.continuing`): its exit
    layer, its shape and the size of its reduced head (None: the whole head)."""
    config = json.loads((Path(folder) / CONFIG_FILE).read_text())
    return {"exit_layer": int(config["exit_layer"]), "adapter": config["adapter"],
            "head_tokens": config.get("head_tokens")}


def start_from(built: Built, folder: Path, record: dict[str, Any]) -> None:
    """Continue the adapter saved in ``folder`` (instead of :func:`prepare`): a reduced head
    keeps its saved tokens, and the saved weights (float16 ones cast to the adapter's dtype)
    replace the new ones."""
    from safetensors.torch import load_file

    state = load_file(str(Path(folder) / "model.safetensors"))
    head_ids = state.pop("head_token_ids", None)
    if head_ids is not None:
        _use_head_tokens(built.model, head_ids)
        state["head_token_ids"] = built.model.adapter.head_token_ids
    built.model.adapter.load_state_dict(state, strict=True)


def cached_bytes(built: Built, examples: list[Any]) -> int:
    """Bytes of the layer-``k`` features that training caches on the device, one per example
    (:meth:`TrainingModel.layer_features`): a share of device memory the batch plan leaves
    free (:mod:`.planning`)."""
    norm = built.model.adapter.norm.weight
    return sum(len(e.input_ids) for e in examples) * norm.shape[-1] * norm.element_size()


def forward(model: TrainingModel, input_ids: Tensor, attention_mask: Tensor) -> Tensor | SubsetLogits:
    """The adapter's logits on a right-padded batch (:class:`SubsetLogits` with a reduced head).

    Shape:
        input_ids, attention_mask: ``[b, t]``; returns ``[b, t, V]`` (or ``[b, t, N]`` subset logits).
    """
    features = model.layer_features(input_ids, attention_mask)
    first = decoder_layers(model.view)[0]
    first.features = features
    captured: list[Any] = []
    head = next(m for m in model.view._modules.values() if isinstance(m, _TrainingHead))
    handle = head.register_forward_hook(lambda module, args, output: captured.append(output))
    try:
        out = model.view(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    finally:
        first.features = None
        handle.remove()
    return captured[0] if isinstance(captured[0], SubsetLogits) else out.logits


def record_extras(model: TrainingModel) -> dict[str, Any]:
    """What the drafter's record says beyond the kit's fields: the exit and, for a reduced head,
    the vocabulary map (the kept target ids)."""
    adapter = model.adapter
    extras: dict[str, Any] = {"exit": adapter.config_dict()}
    if adapter.head_token_ids is not None:
        extras["vocab_map"] = adapter.head_token_ids.tolist()
    return extras


def save(model: TrainingModel, out_dir: Path) -> None:
    """``model.safetensors`` (the adapter) and ``exit_adapter.json``."""
    from safetensors.torch import save_file

    state = {name: value.detach().cpu().contiguous() for name, value in model.adapter.state_dict().items()}
    save_file(state, str(Path(out_dir) / "model.safetensors"))
    (Path(out_dir) / CONFIG_FILE).write_text(json.dumps(model.adapter.config_dict(), indent=2) + "\n")


def load(folder: Path, target: nn.Module, record: dict[str, Any]) -> ExitAdapterDrafter:
    """The saved adapter as an :class:`ExitAdapterDrafter` for ``target`` (in its dtype, on its
    device)."""
    from safetensors.torch import load_file

    config = json.loads((Path(folder) / CONFIG_FILE).read_text())
    adapter = ExitAdapter.from_target(target, int(config["exit_layer"]), config["adapter"])
    state = load_file(str(Path(folder) / "model.safetensors"))
    head_ids = state.pop("head_token_ids", None)
    adapter.set_head_tokens(head_ids)
    if head_ids is not None:
        state["head_token_ids"] = adapter.head_token_ids
    reference = next(target.parameters())
    adapter.load_state_dict(state, strict=True)
    adapter.to(device=reference.device, dtype=reference.dtype)  # integer buffers keep their dtype
    adapter.requires_grad_(False)
    return ExitAdapterDrafter(target, adapter.eval())
