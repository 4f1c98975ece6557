"""The ``hydra`` kind: Hydra heads trained on the target's own features, teacher-forced.

The drafter is :class:`specdecode.drafters.hydra.HydraHeads`: head ``i`` reads the target's last
hidden state ``f_t`` and the target's input embeddings of ``x_{t+1} .. x_{t+1+i}`` and predicts
``x_{t+2+i}`` through an MLP and the target's frozen LM head. In training those tokens are the
data's own (the target's generations: teacher forcing), so every head trains at every position
in one pass. Data: the kit's examples labelled with the target's top-k log-probabilities and its
features (``DataSettings.feature_layers = (-1,)``), so training never runs the target.

Losses, per position ``s`` of an example (the data's distribution at ``s`` is the target's for
``x_{s+1}``), as for the ``medusa`` kind (:mod:`specdecode.training.medusa`):

* head 0: its logits from ``f_{s-1}`` and ``e(x_s)`` are returned as the drafter's logits at
  ``s`` and scored by the loop against the data's top-k distribution at ``s`` (the loss and
  acceptance the loop reports are head 0's; position 0: uniform logits, no gradient);
* head ``i >= 1``: forward KL to the target's full distribution at ``t + 1 + i`` (its head on the
  stored feature ``f_{t+1+i}``: Hydra++'s teacher loss) from ``f_t`` and ``e(x_{t+1..t+1+i})``,
  weighted ``head_decay ** i`` and added to the training loss.

``head_tokens=N``: a reduced head over the ``N`` ids the data uses most, as for the ``medusa``
kind (:func:`~specdecode.training.medusa.prepare` chooses them).

The folder: ``model.safetensors`` (the heads' weights; a reduced head's ``head_token_ids``) and
``hydra_config.json`` (number of heads, MLP depth, hidden size, target vocabulary, ``head_tokens``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specdecode.drafters.hydra import HydraDrafter, HydraHeads
from specdecode.models import vocab_rows
from specdecode.training.artifacts import read_weights, write_weights
from specdecode.training.medusa import (
    Built,
    MedusaTraining,
    check_decay,
    check_features,
    head_config,
    heads_forward,
    load_heads,
    prepare,
    ranked_ids,
    training_head,
    vocab_record,
)
from specdecode.training.vocab import check_head_tokens, subset_head

__all__ = ["CONFIG_FILE", "DESCRIPTION", "NAME", "acceptance_by_step", "build", "drafter", "forward", "head_accuracies",
           "load", "prepare", "save", "saved_options", "start_from", "vocab_record"]

NAME = "hydra"
DESCRIPTION = ("Hydra heads: MLPs on the target's last hidden state and the embeddings of the tokens drafted "
               "before them, each a token further ahead")
CONFIG_FILE = "hydra_config.json"


def build(target: nn.Module, *, num_heads: int = 4, head_layers: int = 2, head_decay: float = 0.8,
          head_tokens: int | None = None) -> Built:
    """Untrained Hydra heads for ``target`` (only read): ``num_heads`` heads (head ``i``
    predicts the token ``i + 2`` positions after its feature's), ``head_layers`` the depth of
    each head's MLP, ``head_decay`` the weight ratio of successive heads' losses;
    ``head_tokens``: a reduced head of that many ids (None: the whole head)."""
    model = MedusaTraining(target, HydraHeads(target, num_heads, head_layers), check_decay(head_decay),
                           check_head_tokens(head_tokens))
    params = {name: p for name, p in model.named_parameters() if p.requires_grad}
    return Built(model, params, [-1], (-1,))


def _embeddings(target: nn.Module, input_ids: Tensor, dtype: torch.dtype) -> Tensor:
    """The target's input embeddings (frozen). Shape: ``[b, t]`` -> ``[b, t, H]``."""
    return F.embedding(input_ids, target.get_input_embeddings().weight.detach()).to(dtype)


def _head_inputs(embeds: Tensor, head: int, n: int) -> Tensor:
    """For positions ``t < n``: the embeddings of ``x_{t+1} .. x_{t+1+head}``.

    Shape: embeds ``[b, t, H]``; returns ``[b, n, head + 1, H]``.
    """
    return torch.stack([embeds[:, 1 + j: 1 + j + n] for j in range(head + 1)], -2)


def forward(model: MedusaTraining, input_ids: Tensor, attention_mask: Tensor, features: Tensor | None = None
            ) -> tuple[Tensor, Tensor | None]:
    """Teacher-forced: head ``i`` at position ``t`` reads ``f_t`` and the data's own tokens
    ``x_{t+1} .. x_{t+1+i}``; returns what :func:`~specdecode.training.medusa.heads_forward`
    does (head 0's logits at the data's positions, the other heads' weighted KL).

    Shape:
        input_ids, attention_mask: ``[b, t]`` right-padded; features: ``[b, t, H]``, the
        target's last hidden states. Returns ``([b, t, V], scalar or None)``.
    """
    check_features(features, NAME)
    heads, target = model.heads, model.target
    head_fn = training_head(model)
    feats = features.to(heads.dtype)
    embeds = _embeddings(target, input_ids, heads.dtype)
    return heads_forward(model, attention_mask, feats, lambda i, n: head_fn(
        heads(feats[:, :n], _head_inputs(embeds, i, n), i)))


@torch.no_grad()
def head_accuracies(heads: HydraHeads, target: nn.Module, sequences: list[Tensor], starts: list[int],
                    ranks: int = 8) -> Tensor:
    """How often head ``i``'s rank-``r`` token, given the true earlier tokens, is the next token
    of ``sequences`` (the target's greedy continuations), over every position ``t >= start - 1``
    (the prompt's last token onwards): for Hydra the rate at which a tree node of that rank is
    accepted once its path was, the table :func:`specdecode.drafters.medusa.sparse_tree` reads.

    Shape: sequences ``[T]`` each; returns ``[K, ranks]`` float64.
    """
    head_fn = subset_head(target, heads.head_token_ids, vocab_rows(target))
    hits = torch.zeros((heads.num_heads, ranks), dtype=torch.float64)
    counts = torch.zeros(heads.num_heads, dtype=torch.float64)
    for seq, start in zip(sequences, starts):
        seq = seq.to(heads.inputs[0].weight.device)
        feats = target(seq[None], output_hidden_states=True).hidden_states[-1].to(heads.dtype)
        embeds = _embeddings(target, seq[None], heads.dtype)
        n_all = seq.shape[0]
        for i in range(heads.num_heads):
            lo, n = max(start - 1, 0), n_all - 2 - i
            if n <= lo:
                continue
            top = ranked_ids(head_fn(heads(feats[:, :n], _head_inputs(embeds, i, n), i)), heads, ranks)[0].cpu()
            hits[i] += (top[lo:n] == seq[lo + 2 + i:, None].cpu()).double().sum(0)
            counts[i] += n - lo
    return hits / counts.clamp_min(1)[:, None]


@torch.no_grad()
def acceptance_by_step(model: MedusaTraining, examples: list[Any], batch_size: int = 8) -> list[float]:
    """Greedy acceptance by draft step on ``examples`` (the run's held-out validation examples):
    how often head ``i`` (draft step ``i + 1``) at position ``s``, reading the stored feature
    ``f_s`` and the examples' own tokens ``x_{s+1} .. x_{s+1+i}``, has on top the target's most
    likely token of its position (``top_ids[s + 1 + i, 0]``), over the positions the loss counts
    (``batch_size`` is unused: one example at a time).

    >>> acceptance_by_step(built.model, val_examples)  # doctest: +SKIP
    [0.58, 0.41, 0.33, 0.27]
    """
    if not examples or any(e.features is None for e in examples):
        raise ValueError("examples: need examples labelled with features (DataSettings(feature_layers=(-1,)))")
    heads, target = model.heads, model.target
    head_fn = training_head(model)
    device = heads.inputs[0].weight.device
    hits, counts = [0] * heads.num_heads, [0] * heads.num_heads
    for e in examples:
        feats = e.features.to(device=device, dtype=heads.dtype)[None]
        embeds = _embeddings(target, e.input_ids.to(device).long()[None], heads.dtype)
        want = e.top_ids[:, 0].long()  # the target's argmax of x_{s+1}, at position s
        total = len(e.input_ids)
        for i in range(heads.num_heads):
            shift = 1 + i
            n, lo = total - shift, max(e.start - shift, 0)  # positions s < n read x_{s+1+i}, the last token at most
            if n <= lo:
                continue
            top = ranked_ids(head_fn(heads(feats[:, :n], _head_inputs(embeds, i, n), i)), heads, 1)[0, :, 0].cpu()
            hits[i] += int((top[lo:] == want[lo + shift:]).sum())
            counts[i] += n - lo
    return [round(h / max(c, 1), 4) for h, c in zip(hits, counts)]


def save(model: MedusaTraining, out_dir: Path) -> None:
    """``model.safetensors`` (the heads' weights) and ``hydra_config.json``."""
    heads = model.heads
    write_weights(out_dir, heads, CONFIG_FILE, {"num_heads": heads.num_heads, "head_layers": heads.head_layers,
                                                **head_config(model)})


def saved_options(folder: Path, record: dict[str, Any]) -> dict[str, Any]:
    """The build options saved heads fix (continuing them, :mod:`.continuing`): their number,
    MLP depth and reduced head's size."""
    config, _ = read_weights(folder, CONFIG_FILE)
    return {"num_heads": int(config["num_heads"]), "head_layers": int(config["head_layers"]),
            "head_tokens": config.get("head_tokens")}


def start_from(built: Built, folder: Path, record: dict[str, Any]) -> None:
    """Continue the heads saved in ``folder``: their weights replace the new ones."""
    load_heads(built, folder)


def load(folder: Path, target: nn.Module, record: dict[str, Any]) -> HydraDrafter:
    """The saved heads as a :class:`HydraDrafter` (a chain) for ``target`` (already checked to
    be the model they were trained for)."""
    config, state = read_weights(folder, CONFIG_FILE)
    heads = HydraHeads(target, int(config["num_heads"]), int(config["head_layers"]))
    heads.load_weights(state)
    return HydraDrafter(target, heads.eval())


def drafter(model: MedusaTraining, target: nn.Module) -> HydraDrafter:
    """The trained heads as a chain drafter, ready to pass as ``draft``."""
    return HydraDrafter(target, model.heads.eval())
