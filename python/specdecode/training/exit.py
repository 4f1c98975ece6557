"""The ``exit`` kind: an early-exit adapter for self-speculation
(:class:`~specdecode.drafters.exit_adapter.ExitAdapterDrafter`), trained by self-distillation.

The target's first ``k`` layers, its embedding and its LM head stay frozen; only the adapter
(one decoder layer started from the target's layer ``k`` and a final norm, or a residual
projection and a norm) learns to map the layer-``k`` feature to the target's next-token
distribution, with the kit's KL loss on the target's own generations. While training, the
frozen layers run without recording an autograd graph and the head's weight is read detached,
so no gradient is computed for (or stored on) any target parameter.

Training always uses the full head. With ``head_tokens=N`` the saved drafter drafts over the
``N`` tokens the training data uses most (the target's top-1 choices and the tokens of the
examples, counted over every example), a reduced head whose rows are the target's: greedy
drafts are unchanged whenever the target's choice is among them.

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

from specdecode.drafters.exit_adapter import ExitAdapter, ExitAdapterDrafter, exit_model
from specdecode.models import decoder_layers

__all__ = ["CONFIG_FILE", "DESCRIPTION", "NAME", "Built", "build", "default_exit_layer", "forward", "load",
           "prepare", "record_extras", "save"]

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


class _NoGrad(nn.Module):
    """Runs a frozen module without recording autograd (attributes read through to it)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with torch.no_grad():
            return self.inner(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["inner"], name)


class _DetachedHead(nn.Module):
    """The target's head with its weight read detached: gradients reach its input only.

    Shape:
        hidden: ``[..., H]``; returns ``[..., V]``.
    """

    def __init__(self, head: nn.Module) -> None:
        super().__init__()
        self.__dict__["head"] = head  # not a submodule: its parameters are not the adapter's

    def forward(self, hidden: Tensor) -> Tensor:
        bias = getattr(self.head, "bias", None)
        return nn.functional.linear(hidden, self.head.weight.detach(), None if bias is None else bias.detach())


class TrainingModel(nn.Module):
    """The adapter (its only registered submodule, so ``parameters()`` are the trainable ones)
    and the training view of the target that runs it."""

    def __init__(self, target: nn.Module, adapter: ExitAdapter) -> None:
        super().__init__()
        self.adapter = adapter
        view = exit_model(target, adapter)
        layers = decoder_layers(view)
        for i in range(adapter.exit_layer):
            layers[i] = _NoGrad(layers[i])
        head = target.get_output_embeddings()
        names = [name for name, module in view._modules.items() if module is head]
        if head is not None and names:
            view._modules[names[0]] = _DetachedHead(head)
        self.__dict__["view"] = view
        self.__dict__["target"] = target


def build(target: nn.Module, *, exit_layer: int | None = None, adapter: str = "layer",
          head_tokens: int | None = None) -> Built:
    """An untrained adapter for ``target``: at depth ``exit_layer`` (default
    :func:`default_exit_layer`), shaped ``adapter`` (``"layer"`` or ``"linear"``); with
    ``head_tokens`` the saved drafter uses a reduced head of that many tokens."""
    total = len(decoder_layers(target))
    if exit_layer is None:
        exit_layer = default_exit_layer(total)
    if head_tokens is not None and (isinstance(head_tokens, bool) or not isinstance(head_tokens, int)
                                    or head_tokens < 1):
        raise ValueError(f"head_tokens: expected an int >= 1 or None, got {head_tokens!r}")
    module = ExitAdapter.from_target(target, exit_layer, adapter)
    model = TrainingModel(target, module)
    model.__dict__["head_tokens"] = head_tokens
    model.eval()  # no dropout: distillation runs are short
    params = {name: p for name, p in model.named_parameters() if p.requires_grad}
    return Built(model, params, list(range(exit_layer)))


def prepare(model: TrainingModel, examples: list[Any]) -> None:
    """Choose the reduced head's tokens (when ``head_tokens`` was asked for) from the data: the
    most frequent among the examples' tokens and the target's top-1 choices."""
    wanted = model.__dict__.get("head_tokens")
    if wanted is None:
        return
    size = int(model.target.get_output_embeddings().weight.shape[0])
    counts = torch.zeros(size, dtype=torch.long)
    for example in examples:
        counts += torch.bincount(example.input_ids.long().clamp(0, size - 1), minlength=size)
        counts += torch.bincount(example.top_ids[:, 0].long().clamp(0, size - 1), minlength=size)
    keep = min(wanted, size)
    model.adapter.set_head_tokens(counts.topk(keep).indices.sort().values)


def forward(model: TrainingModel, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """The adapter's logits (full head) on a right-padded batch.

    Shape:
        input_ids, attention_mask: ``[b, t]``; returns ``[b, t, V]``.
    """
    # The view was built before prepare() chose any head tokens: it reads the full head.
    return model.view(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits


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
