"""The ``medusa`` kind: Medusa-1 heads trained on the target's own features.

The drafter is :class:`specdecode.drafters.medusa.MedusaHeads`: head ``i`` reads the target's
last hidden state ``f_t`` (after the final norm) and predicts ``x_{t+2+i}`` through a residual
block and the target's frozen LM head. Data: the kit's examples labelled with the target's
top-k log-probabilities and its features (``DataSettings.feature_layers = (-1,)``), so training
never runs the target.

Losses, per position ``s`` of an example (the data's distribution at ``s`` is the target's for
``x_{s+1}``):

* head 0: its logits from ``f_{s-1}`` are returned as the drafter's logits at ``s`` and scored
  by the loop against the data's top-k distribution at ``s`` (the loss and acceptance estimates
  the loop reports are head 0's; position 0 has no earlier feature: uniform logits, no gradient);
* head ``i >= 1``: forward KL to the target's full distribution at ``t + 1 + i`` from ``f_t``,
  computed exactly as the target's head on the stored feature ``f_{t+1+i}``, weighted
  ``head_decay ** i`` (Medusa's decaying weights) and added to the training loss.

With ``head_tokens=N`` the heads draft over a reduced head: the target head's rows for the
``N`` ids the run's data uses most (chosen by :func:`prepare`, saved as the buffer
``head_token_ids``). Their logits are then ``N`` columns (the loop scores head 0 as
:class:`~specdecode.training.losses.SubsetLogits`), and head ``i >= 1``'s KL runs over those ids
(the target's probabilities of the others are left out, as in the kit's loss): on SmolLM2
(``V = 49152``) with ``N = 8192`` a step computes a sixth of the head rows.

The folder: ``model.safetensors`` (the heads' ``weight`` and ``bias``, and ``head_token_ids`` for
a reduced head) and ``medusa_config.json`` (number of heads, hidden size, target vocabulary,
``head_tokens``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor, nn

from specdecode.drafters.medusa import MedusaDrafter, MedusaHeads
from specdecode.models import vocab_rows
from specdecode.training.artifacts import WEIGHTS_FILE, read_weights, write_weights
from specdecode.training.losses import SubsetLogits
from specdecode.training.vocab import check_head_tokens, column_map, draft_vocabulary, subset_head

__all__ = ["CONFIG_FILE", "DESCRIPTION", "NAME", "Built", "MedusaTraining", "acceptance_by_step", "build", "check_decay",
           "check_features", "drafter", "forward", "head_accuracies", "head_config", "heads_forward",
           "load", "load_heads", "prepare", "ranked_ids", "save", "saved_options", "shifted_kl", "start_from",
           "target_log_probs", "training_head", "vocab_record"]

NAME = "medusa"
DESCRIPTION = "Medusa-1 heads: residual blocks on the target's last hidden state, each a token further ahead"
CONFIG_FILE = "medusa_config.json"


class MedusaTraining(nn.Module):
    """What the loop trains: the heads (a submodule; Medusa's, or Hydra's for the ``hydra`` kind)
    beside the target, held outside the module tree (never trained, never saved);
    ``head_tokens``: the size of the reduced head :func:`prepare` chooses (None: the whole head)."""

    def __init__(self, target: nn.Module, heads: nn.Module, head_decay: float, head_tokens: int | None = None) -> None:
        super().__init__()
        self.heads = heads
        self._target = (target,)
        self.head_decay = head_decay
        self.head_tokens = head_tokens

    @property
    def target(self) -> nn.Module:
        return self._target[0]


@dataclass
class Built:
    """Heads ready to train: the module, its parameters by name, the feature layers the data
    is labelled with (recorded as ``layers``)."""

    model: MedusaTraining
    params: dict[str, nn.Parameter]
    layers: list[int]
    feature_layers: tuple[int, ...]


def build(target: nn.Module, *, num_heads: int = 4, head_decay: float = 0.8, head_tokens: int | None = None) -> Built:
    """Untrained Medusa heads for ``target`` (only read): ``num_heads`` heads (head ``i``
    predicts the token ``i + 2`` positions after its feature's), ``head_decay`` the weight
    ratio of successive heads' losses; ``head_tokens``: draft over a reduced head of that many
    ids (chosen from the data by :func:`prepare`; None: the whole head)."""
    model = MedusaTraining(target, MedusaHeads(target, num_heads), check_decay(head_decay),
                           check_head_tokens(head_tokens))
    params = {name: p for name, p in model.named_parameters() if p.requires_grad}
    return Built(model, params, [-1], (-1,))


def check_decay(head_decay: Any) -> float:
    """``head_decay`` as a float, or ``ValueError`` naming it unless it is a number in (0, 1]."""
    if isinstance(head_decay, bool) or not isinstance(head_decay, (int, float)) or not 0 < head_decay <= 1:
        raise ValueError(f"head_decay: expected a number in (0, 1], got {head_decay!r}")
    return float(head_decay)


def prepare(built: Built, examples: list[Any]) -> None:
    """With ``head_tokens``: give the heads (medusa's or hydra's) the reduced head of the ids
    ``examples`` use most (:func:`~specdecode.training.vocab.draft_vocabulary`)."""
    wanted = built.model.head_tokens
    if wanted is None:
        return
    vocab = vocab_rows(built.model.target)
    built.model.heads.set_head_tokens(draft_vocabulary(examples, vocab, min(wanted, vocab)))


def training_head(model: MedusaTraining) -> Callable[[Tensor], Tensor]:
    """The LM head the heads end in while training: the target's (first ``vocab_rows`` ids) or
    its rows for the reduced head's ids, detached (gradients reach the heads only).
    Shape: hidden ``[..., H]`` -> ``[..., V or N]``."""
    return subset_head(model.target, model.heads.head_token_ids, vocab_rows(model.target))


def ranked_ids(logits: Tensor, heads: nn.Module, ranks: int) -> Tensor:
    """The target ids of the ``ranks`` largest of :func:`training_head`'s logits (a reduced
    head's columns mapped to their ids). Shape: ``[..., V or N]`` -> ``[..., ranks]`` int64."""
    top = logits.topk(ranks, -1).indices
    ids = heads.head_token_ids
    return top if ids is None else ids.to(top.device)[top]


def forward(model: MedusaTraining, input_ids: Tensor, attention_mask: Tensor, features: Tensor | None = None
            ) -> tuple[Tensor, Tensor | None]:
    """Head 0's logits aligned with the data's positions and the weighted loss of the other heads.

    Shape:
        input_ids, attention_mask: ``[b, t]`` right-padded; features: ``[b, t, H]`` the target's
        last hidden states. Returns ``([b, t, V], scalar or None)``.
    """
    check_features(features, NAME)
    head_fn = training_head(model)
    feats = features.to(model.heads.weight.dtype)
    out = model.heads(feats)  # [b, t, K, H]
    return heads_forward(model, attention_mask, feats, lambda i, n: head_fn(out[:, :n, i]))


def heads_forward(model: MedusaTraining, attention_mask: Tensor, features: Tensor,
                  head_logits: Callable[[int, int], Tensor]) -> tuple[Tensor | SubsetLogits, Tensor | None]:
    """What the medusa and hydra kinds return: head 0's logits from position ``s - 1`` at ``s``
    (uniform at 0), and the sum over heads ``i >= 1`` of ``head_decay ** i`` times the KL from
    the target's distribution at ``t + 1 + i`` to head ``i``'s logits from ``t`` (over the
    reduced head's ids when the heads have one). ``head_logits(i, n)``: head ``i``'s logits
    (:func:`training_head`'s) from the positions ``t < n``.

    Shape:
        attention_mask: ``[b, t]``; features: ``[b, t, H]`` (the target's last hidden states, in
        the heads' dtype); ``head_logits(i, n)``: ``[b, n, V or N]``. Returns ``([b, t, V], scalar
        or None)``, or head 0's ``[b, t, N]`` as :class:`SubsetLogits`.
    """
    t = attention_mask.shape[1]
    vocab, ids = vocab_rows(model.target), model.heads.head_token_ids
    first = head_logits(0, t - 1)
    logits = torch.cat([torch.zeros_like(first[:, :1]), first], 1)  # s reads position s - 1; 0: uniform
    if ids is not None:
        ids = ids.to(logits.device)
        logits = SubsetLogits(logits, ids, column_map(ids, vocab))
    if model.heads.num_heads == 1 or t < 3:
        return logits, None
    log_p = target_log_probs(subset_head(model.target, None, vocab), features, vocab)
    if ids is not None:
        log_p = log_p[..., ids]  # the ids the heads can draft (the others' mass is left out)
    terms = [model.head_decay ** i * shifted_kl(log_p, head_logits(i, t - 1 - i), attention_mask, 1 + i)
             for i in range(1, min(model.heads.num_heads, t - 1))]
    return logits, (sum(terms) if terms else None)


def check_features(features: Tensor | None, kind: str) -> None:
    """``ValueError`` naming ``features`` when a heads kind gets data without target features."""
    if features is None:
        raise ValueError(f"features: the {kind} kind trains on target features; label the data with "
                         "DataSettings(feature_layers=(-1,))")


@torch.no_grad()
def target_log_probs(head_fn: Any, features: Tensor, vocab: int) -> Tensor:
    """The target's log-probabilities at every position, from its stored last hidden states.

    Shape: features ``[b, t, H]``; returns ``[b, t, vocab]`` float32.
    """
    return torch.log_softmax(head_fn(features).float()[..., :vocab], -1)


def shifted_kl(log_p: Tensor, q_logits: Tensor, attention_mask: Tensor, shift: int) -> Tensor:
    """Mean forward KL from the target's distribution at ``t + shift`` to a head's logits from
    position ``t``, over the real positions ``t + shift``.

    Shape: log_p ``[b, t, V]``; q_logits ``[b, t - shift, V]``; attention_mask ``[b, t]``; a scalar.
    """
    log_q = torch.log_softmax(q_logits.float(), -1)
    p_log = log_p[:, shift:]
    kl = (p_log.exp() * (p_log - log_q)).sum(-1)
    valid = attention_mask.bool()[:, shift:]
    return kl[valid].sum() / valid.sum().clamp_min(1)


@torch.no_grad()
def head_accuracies(heads: MedusaHeads, target: nn.Module, examples: list[Any], ranks: int = 8) -> Tensor:
    """How often head ``i``'s rank-``r`` token is the target's most likely token at its
    position, over the counted positions of ``examples`` (their ``features`` and ``top_ids``):
    the table :func:`specdecode.drafters.medusa.sparse_tree` reads.

    Shape: returns ``[K, ranks]`` float64 (row ``i`` sums to head ``i``'s top-``ranks`` accuracy).
    """
    if not examples or any(e.features is None for e in examples):
        raise ValueError("examples: need examples labelled with features (DataSettings(feature_layers=(-1,)))")
    head_fn = subset_head(target, heads.head_token_ids, vocab_rows(target))
    hits = torch.zeros((heads.num_heads, ranks), dtype=torch.float64)
    counts = torch.zeros(heads.num_heads, dtype=torch.float64)
    device = heads.weight.device
    for e in examples:
        feats = e.features.to(device=device, dtype=heads.weight.dtype)
        top = ranked_ids(head_fn(heads(feats)), heads, ranks).cpu()  # [t, K, ranks]
        want = e.top_ids[:, 0].long()  # the target's argmax of x_{s+1}, at position s
        n = len(e.input_ids)
        for i in range(heads.num_heads):
            shift = 1 + i
            lo = max(e.start - shift, 0)
            if n - shift <= lo:
                continue
            got = top[lo: n - shift, i]
            hits[i] += (got == want[lo + shift: n, None]).double().sum(0)
            counts[i] += n - shift - lo
    return hits / counts.clamp_min(1)[:, None]


def acceptance_by_step(model: MedusaTraining, examples: list[Any], batch_size: int = 8) -> list[float]:
    """Greedy acceptance by draft step on ``examples`` (the run's held-out validation examples):
    how often head ``i`` (draft step ``i + 1``) has the target's most likely token on top, the
    first column of :func:`head_accuracies` (``batch_size`` is unused: one example at a time)."""
    return [round(float(a), 4) for a in head_accuracies(model.heads, model.target, examples, ranks=1)[:, 0]]


def head_config(model: MedusaTraining) -> dict[str, Any]:
    """What the medusa and hydra configs share: hidden size, target vocabulary, feature layers,
    loss decay and the reduced head's size (None: the whole head)."""
    heads = model.heads
    ids = heads.head_token_ids
    return {"hidden_size": heads.hidden_size, "target_vocab": heads.target_vocab,
            "feature_layers": list(heads.feature_layers), "head_decay": model.head_decay,
            "head_tokens": None if ids is None else int(ids.numel())}


def save(model: MedusaTraining, out_dir: Path) -> None:
    """``model.safetensors`` (the heads' weights; a reduced head's ids) and ``medusa_config.json``."""
    write_weights(out_dir, model.heads, CONFIG_FILE, {"num_heads": model.heads.num_heads, **head_config(model)})


def vocab_record(model: MedusaTraining) -> dict[str, Any]:
    """The record's ``vocab`` (medusa's and hydra's): the ids the heads draft over."""
    ids = model.heads.head_token_ids
    if ids is None:
        return {"size": vocab_rows(model.target), "map": None}
    return {"size": int(ids.numel()), "map": "head_token_ids (model.safetensors)"}


def saved_options(folder: Path, record: dict[str, Any]) -> dict[str, Any]:
    """The build options saved heads fix (continuing them, :mod:`.continuing`): their number
    and the reduced head's size."""
    config, _ = read_weights(folder, CONFIG_FILE)
    return {"num_heads": int(config["num_heads"]), "head_tokens": config.get("head_tokens")}


def load_heads(built: Built, folder: Path) -> None:
    """Load saved heads' weights (medusa's or hydra's) into ``built``'s heads (float16 ones cast
    to their dtype), a reduced head's ids with them."""
    from safetensors.torch import load_file

    built.model.heads.load_weights(load_file(str(Path(folder) / WEIGHTS_FILE)))


def start_from(built: Built, folder: Path, record: dict[str, Any]) -> None:
    """Continue the heads saved in ``folder``: their weights replace the new ones."""
    load_heads(built, folder)


def load(folder: Path, target: nn.Module, record: dict[str, Any]) -> MedusaDrafter:
    """The saved heads as a :class:`MedusaDrafter` (a chain) for ``target`` (already checked to
    be the model they were trained for)."""
    config, state = read_weights(folder, CONFIG_FILE)
    heads = MedusaHeads(target, int(config["num_heads"]))
    heads.load_weights(state)
    return MedusaDrafter(target, heads.eval())


def drafter(model: MedusaTraining, target: nn.Module) -> MedusaDrafter:
    """The trained heads as a chain drafter, ready to pass as ``draft``."""
    return MedusaDrafter(target, model.heads.eval())
