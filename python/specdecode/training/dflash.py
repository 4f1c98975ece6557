"""The ``dflash`` kind: a block drafter (DFlash) trained on the target's own features.

The network is :class:`specdecode.drafters.dflash_model.DFlashModel`. Training follows the
recipe of the DFlash paper, in the kit's terms:

- *Random anchors.* Each sequence gets blocks at random anchor positions among those the loss
  counts (about two blocks per block length of counted positions, ``num_anchors`` to fix it),
  all trained in one forward: a block is its anchor's token followed by mask tokens, and block
  position ``j`` is trained toward the target's distribution of token ``anchor + j``.
- *The attention of drafting.* A block's queries see the context columns before its anchor
  (their features projected to keys/values, as drafting caches them) and their own block in
  both directions; never another block.
- *Loss decaying with position.* Position ``j``'s distillation loss weighs
  ``exp(-(j - 1) / decay_gamma)``: the first drafts decide how much of a block is accepted.
- *Distillation.* The kit's loss against the target's top-k distributions (``kl`` or ``tvd``),
  from the kit's data cache, labelled with the target's features at the drafter's layers.

The draft layers start as copies of the target's last ``num_layers`` decoder layers where their
weights fit (``init_from_target``), the fusion ``fc`` as the mean of the feature layers, so the
untrained drafter already reads the context as the target's deep layers would.
``draft_vocab_size=N`` drafts over the ``N`` ids most frequent in the data (a reduced head: the
target head's rows, frozen). :func:`acceptance_by_step` measures, on the held-out examples, each
block position's greedy rate given that the positions before it were right, and the rate of
each rank (the record's ``rank_rates``, which :func:`~specdecode.drafters.medusa.sparse_tree`
turns into a tree).

The folder: ``model.safetensors`` (the network, ``draft_to_target`` included) and
``dflash_config.json`` (the :class:`~specdecode.drafters.dflash_model.DFlashConfig` and the
draft vocabulary's size).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from specdecode.drafters.dflash import DFlashDrafter
from specdecode.drafters.dflash_model import DFlashConfig, DFlashModel
from specdecode.models import decoder_layers, vocab_rows
from specdecode.training.artifacts import WEIGHTS_FILE
from specdecode.training.kinds import check_number
from specdecode.training.losses import PlacedLogits, SubsetLogits
from specdecode.training.vocab import column_map, draft_vocabulary, subset_head

__all__ = ["CONFIG_FILE", "DESCRIPTION", "NAME", "Built", "DFlashTraining", "acceptance_by_step", "build",
           "drafter", "forward", "load", "prepare", "record_extras", "save", "saved_options", "start_from",
           "vocab_record"]

NAME = "dflash"
DESCRIPTION = "a block drafter (DFlash): a small non-causal network drafts a whole block from the target's features"
CONFIG_FILE = "dflash_config.json"
_INIT_SEED = 0
#: Anchors per sequence at most (the default count is about two per block length).
MAX_ANCHORS = 128
#: Ranks per block position in the record's ``rank_rates``.
MEASURED_RANKS = 8
#: Blocks per forward when measuring (bounds the logits' memory).
_MEASURE_CHUNK = 32


class DFlashTraining(nn.Module):
    """What the loop trains: the :class:`DFlashModel` beside the target (held outside the module
    tree: never trained, never saved)."""

    def __init__(self, target: nn.Module, dflash: DFlashModel, decay_gamma: float, num_anchors: int | None) -> None:
        super().__init__()
        self.dflash = dflash
        self._target = (target,)
        self.decay_gamma = decay_gamma
        self.num_anchors = num_anchors
        self.rank_rates: list[list[float]] | None = None  # set by acceptance_by_step

    @property
    def target(self) -> nn.Module:
        return self._target[0]


@dataclass
class Built:
    """A drafter ready to train: the module, its trainable parameters (by name), the target
    layers it reads (recorded as ``layers``) and the feature layers the data is labelled with."""

    model: DFlashTraining
    params: dict[str, nn.Parameter]
    layers: list[int]
    feature_layers: tuple[int, ...]
    draft_vocab_size: int | None = None
    options: dict[str, Any] = field(default_factory=dict)


def _new_model(target: nn.Module, config: DFlashConfig, draft_vocab: Tensor | None, init_from_target: bool
               ) -> DFlashModel:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_INIT_SEED)
        model = DFlashModel(target, config, draft_vocab)
    if init_from_target:
        _start_from_target(model, target)
    return model


def _start_from_target(model: DFlashModel, target: nn.Module) -> None:
    """Draft layer ``i`` takes the weights of the target's ``i``-th of its last ``num_layers``
    decoder layers where names and shapes match, the final norm the target's; ``fc`` averages the
    feature layers."""
    layers = decoder_layers(target)
    first = len(layers) - len(model.layers)
    with torch.no_grad():
        for i, layer in enumerate(model.layers):
            source = layers[max(0, first + i)].state_dict()
            own = layer.state_dict()
            layer.load_state_dict({k: v for k, v in source.items() if k in own and own[k].shape == v.shape},
                                  strict=False)
        final = getattr(getattr(target, getattr(target, "base_model_prefix", "model"), None), "norm", None)
        weight = getattr(final, "weight", None)
        if isinstance(weight, Tensor) and weight.shape == model.norm.weight.shape:
            model.norm.weight.copy_(weight)
        count, hidden = len(model.config.target_layer_ids), model.config.hidden_size
        eye = torch.eye(hidden, dtype=model.fc.weight.dtype, device=model.fc.weight.device) / count
        model.fc.weight.copy_(eye.repeat(1, count))


def _trainable(model: DFlashTraining) -> dict[str, nn.Parameter]:
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def build(target: nn.Module, *, block_size: int = 16, num_layers: int = 1,
          target_layer_ids: tuple[int, ...] | list[int] | None = None, num_feature_layers: int | None = None,
          draft_vocab_size: int | None = None, decay_gamma: float | None = None, num_anchors: int | None = None,
          init_from_target: bool = True) -> Built:
    """An untrained DFlash drafter for ``target`` (only read): ``block_size`` positions per block
    (``block_size - 1`` drafts), ``num_layers`` draft layers, reading ``target_layer_ids``
    (0-based decoder layers; default ``num_feature_layers`` of them, as many as the draft layers,
    spread evenly), a reduced head of ``draft_vocab_size`` ids (None: the target's), the loss
    decay ``decay_gamma`` (default ``(block_size - 1) / 2``), ``num_anchors`` blocks per sequence
    (None: about two per block length of counted positions, at most 128).

    >>> built = build(target, block_size=16, num_layers=2, draft_vocab_size=8192)  # doctest: +SKIP
    """
    config = DFlashConfig.for_target(target, num_layers=num_layers, block_size=block_size,
                                     target_layer_ids=None if target_layer_ids is None else tuple(target_layer_ids),
                                     num_feature_layers=num_feature_layers)
    if _has_qk_norm(target) is False:
        config = replace(config, qk_norm=False)
    vocab = vocab_rows(target)
    if draft_vocab_size is not None and (isinstance(draft_vocab_size, bool) or not isinstance(draft_vocab_size, int)
                                         or not 1 <= draft_vocab_size <= vocab):
        raise ValueError(f"draft_vocab_size: expected an int in [1, {vocab}] or None, got {draft_vocab_size!r}")
    gamma = (block_size - 1) / 2 if decay_gamma is None else decay_gamma
    if isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or not gamma > 0:
        raise ValueError(f"decay_gamma: expected a number > 0, got {decay_gamma!r}")
    check_number("num_anchors", num_anchors, integer=True, minimum=1)
    if not isinstance(init_from_target, bool):
        raise ValueError(f"init_from_target: expected a bool, got {init_from_target!r}")
    model = DFlashTraining(target, _new_model(target, config, None, init_from_target), float(gamma), num_anchors)
    return Built(model, _trainable(model), list(config.target_layer_ids), model.dflash.feature_layers,
                 draft_vocab_size, {"init_from_target": init_from_target})


def _has_qk_norm(target: nn.Module) -> bool | None:
    """Whether the target's decoder layers norm queries and keys per head (Qwen3), None when unknown."""
    attention = getattr(decoder_layers(target)[0], "self_attn", None)
    return None if attention is None else hasattr(attention, "q_norm")


def prepare(built: Built, examples: list[Any]) -> None:
    """With a reduced head: choose its ids from ``examples`` and rebuild the network with them."""
    if built.draft_vocab_size is None:
        return
    target = built.model.target
    ids = draft_vocabulary(examples, vocab_rows(target), built.draft_vocab_size)
    built.model.dflash = _new_model(target, built.model.dflash.config, ids, built.options["init_from_target"])
    built.params.clear()
    built.params.update(_trainable(built.model))


def saved_options(folder: Path, record: dict[str, Any]) -> dict[str, Any]:
    """The build options a saved drafter fixes (continuing it): its shape and reduced head."""
    saved = json.loads((Path(folder) / CONFIG_FILE).read_text(encoding="utf-8"))
    config = saved["config"]
    return {"block_size": config["block_size"], "num_layers": config["num_layers"],
            "target_layer_ids": list(config["target_layer_ids"]), "draft_vocab_size": saved["draft_vocab_size"]}


def start_from(built: Built, folder: Path, record: dict[str, Any]) -> None:
    """Continue the saved drafter in ``folder``: its reduced head's ids and its weights (float16
    ones cast to the network's dtype) replace the new ones."""
    from safetensors.torch import load_file

    state = load_file(str(Path(folder) / WEIGHTS_FILE))
    target = built.model.target
    ids = state.get("draft_to_target")
    built.model.dflash = model = _new_model(target, built.model.dflash.config, ids, False)
    model.load_state_dict(state)
    built.params.clear()
    built.params.update(_trainable(built.model))


def _batch_seed(input_ids: Tensor) -> int:
    """A seed from the batch's tokens: the same batch draws the same anchors (resumed runs and
    uninterrupted ones agree), different batches different ones."""
    weights = torch.arange(1, input_ids.shape[1] + 1, device=input_ids.device)
    return int((input_ids.long() * weights).sum() % 2_147_483_647)


def _anchors(model: DFlashTraining, input_ids: Tensor, candidate: Tensor) -> tuple[Tensor, Tensor]:
    """Random anchors among the ``candidate`` positions, about two per block length of them per
    row (``num_anchors`` when set), distinct. Shape: returns anchors ``[b, A]`` and valid ``[b, A]``."""
    b, t = candidate.shape
    per_row = candidate.sum(1)
    if model.num_anchors is not None:
        want = torch.full_like(per_row, model.num_anchors)
    else:
        want = (2 * per_row + model.dflash.block_size - 2) // (model.dflash.block_size - 1)
    want = torch.minimum(want.clamp(1, MAX_ANCHORS), per_row)
    count = max(1, min(t, int(want.max())))
    generator = torch.Generator().manual_seed(_batch_seed(input_ids))
    score = torch.rand((b, t), generator=generator).to(candidate.device)
    top = torch.where(candidate, score, torch.full_like(score, -1.0)).topk(count, dim=1)
    ranks = torch.arange(count, device=candidate.device)[None]
    return top.indices, (top.values >= 0) & (ranks < want[:, None])


def _blocks(model: DFlashTraining, input_ids: Tensor, attention_mask: Tensor, features: Tensor, anchors: Tensor,
            valid: Tensor) -> tuple[Any, Tensor, Tensor]:
    """The draft logits of a block at every anchor, as drafting computes them.

    Shape:
        input_ids, attention_mask: ``[b, t]``; features: ``[b, t, F]``; anchors, valid: ``[b, A]``.
        Returns logits ``[b, A * (S - 1), V]`` (or :class:`SubsetLogits`), the source position
        of each row's label ``[b, A * (S - 1)]`` and whether it counts ``[b, A * (S - 1)]``
        (``S`` the block size).
    """
    dflash, target = model.dflash, model.target
    size = dflash.block_size
    b, t = input_ids.shape
    A = anchors.shape[1]
    device = input_ids.device
    real = attention_mask.bool()
    positions = (attention_mask.long().cumsum(1) - 1).clamp_min(0)
    context = dflash.context_keys_values(features, positions)
    offsets = torch.arange(size, device=device)
    tokens = input_ids.gather(1, anchors)[:, :, None].expand(b, A, size).reshape(b, A * size)
    is_mask = (offsets > 0)[None, None].expand(b, A, size).reshape(b, A * size)
    block_positions = (positions.gather(1, anchors)[:, :, None] + offsets).reshape(b, A * size)
    columns = torch.arange(t, device=device)
    sees = (columns[None, None] < anchors[:, :, None]) & real[:, None]  # [b, A, t]
    sees = sees[:, :, None].expand(b, A, size, t).reshape(b, A * size, t)
    own = torch.arange(A, device=device).repeat_interleave(size)
    mask = torch.cat([sees, (own[:, None] == own[None])[None].expand(b, -1, -1)], 2)[:, None]
    hidden = dflash(dflash.block_embeddings(target, tokens, is_mask), block_positions, context, mask)
    hidden = hidden.view(b, A, size, -1)[:, :, 1:].reshape(b, A * (size - 1), -1)
    ids = dflash.draft_to_target
    head = subset_head(target, ids, vocab_rows(target))
    logits: Any = head(hidden) if ids is None else SubsetLogits(head(hidden), ids, column_map(ids, vocab_rows(target)))
    source = anchors[:, :, None] + offsets[None, None, : size - 1]  # block position j predicts anchor + j: label at anchor + j - 1
    lengths = real.sum(1)
    counts = valid[:, :, None] & (source < lengths[:, None, None])
    return logits, source.reshape(b, -1).clamp_max(t - 1), counts.reshape(b, -1)


def forward(model: DFlashTraining, input_ids: Tensor, attention_mask: Tensor, features: Tensor | None = None,
            counted: Tensor | None = None) -> PlacedLogits:
    """Blocks at random anchors of a right-padded batch, their logits placed at the labels they
    are trained toward, weighed by block position.

    Shape:
        input_ids, attention_mask: ``[b, t]``; features: ``[b, t, F]``; counted: ``[b, t]`` bool
        (the positions the loss counts; default every real one).
    """
    if features is None:
        raise ValueError("features: the dflash kind trains on target features; label the data with "
                         "DataSettings(feature_layers=...)")
    real = attention_mask.bool()
    candidate = real if counted is None else counted & real
    anchors, valid = _anchors(model, input_ids, candidate)
    logits, source, counts = _blocks(model, input_ids, attention_mask, features, anchors, valid)
    size = model.dflash.block_size
    decay = torch.exp(-torch.arange(size - 1, device=input_ids.device, dtype=torch.float32) / model.decay_gamma)
    weights = decay.repeat(anchors.shape[1])[None].expand(input_ids.shape[0], -1)
    return PlacedLogits(logits, source, counts, weights)


def _ranked(logits: Any, ranks: int) -> Tensor:
    """The target ids of the ``ranks`` largest logits. Shape: ``[..., V or N]`` -> ``[..., ranks]``."""
    if isinstance(logits, SubsetLogits):
        return logits.token_ids[logits.logits.topk(ranks, -1).indices]
    return logits.topk(ranks, -1).indices


@torch.no_grad()
def acceptance_by_step(model: DFlashTraining, examples: list[Any], batch_size: int = 8) -> list[float]:
    """Each block position's greedy rate on ``examples`` (the run's validation examples) given
    that the positions before it were right, with a block at every counted position: with rates
    ``a_j``, a chain of ``k`` greedy drafts makes about ``1 + sum_{j <= k} prod_{i <= j} a_i``
    tokens per target call. Also sets ``model.rank_rates`` (per position, the rate of each of
    the first ranks given the earlier positions' labels were among those ranks).
    """
    from specdecode.training.loop import collate

    size = model.dflash.block_size
    ranks = min(MEASURED_RANKS, model.dflash.draft_vocab_size or vocab_rows(model.target))
    agree = torch.zeros(size - 1, dtype=torch.float64)
    seen = torch.zeros(size - 1, dtype=torch.float64)
    rank_hits = torch.zeros((size - 1, ranks), dtype=torch.float64)
    rank_seen = torch.zeros(size - 1, dtype=torch.float64)
    device = model.dflash.fc.weight.device
    for first in range(0, len(examples), batch_size):
        b = collate(examples[first: first + batch_size], device)
        if b.features is None:
            raise ValueError("examples: the dflash kind reads target features; label the data with "
                             "DataSettings(feature_layers=...)")
        candidate = b.counted & b.attention_mask.bool()
        positions = torch.arange(b.input_ids.shape[1], device=device)
        for lo in range(0, b.input_ids.shape[1], _MEASURE_CHUNK):
            anchors = positions[lo: lo + _MEASURE_CHUNK][None].expand(b.input_ids.shape[0], -1)
            valid = candidate.gather(1, anchors)
            if not bool(valid.any()):
                continue
            logits, source, counts = _blocks(model, b.input_ids, b.attention_mask, b.features, anchors, valid)
            counts = counts & b.counted.gather(1, source)
            label = b.top_ids[..., 0].long().gather(1, source)
            top = _ranked(logits, ranks)  # [b, m, ranks]
            shape = (*anchors.shape, size - 1)
            hit = (top == label[..., None]).view(*shape, ranks)
            counts = counts.view(shape)
            right = hit[..., 0] & counts
            within = hit.any(-1) & counts
            before = torch.cat([torch.ones_like(right[..., :1]), right[..., :-1].cumprod(-1)], -1).bool() & counts
            agree += (right & before).sum((0, 1)).double().cpu()
            seen += before.sum((0, 1)).double().cpu()
            inside = torch.cat([torch.ones_like(within[..., :1]), within[..., :-1].cumprod(-1)], -1).bool() & counts
            rank_hits += (hit & inside[..., None]).sum((0, 1)).double().cpu()
            rank_seen += inside.sum((0, 1)).double().cpu()
    model.rank_rates = (rank_hits / rank_seen.clamp_min(1)[:, None]).round(decimals=4).tolist()
    return [round(float(a / max(n, 1)), 4) for a, n in zip(agree, seen)]


def record_extras(model: DFlashTraining) -> dict[str, Any]:
    """The record's extra fields: the block size and the measured rank rates (None before any
    measurement), from which ``sparse_tree(rank_rates, N)`` builds a tree."""
    return {"block_size": model.dflash.block_size, "rank_rates": model.rank_rates}


def save(model: DFlashTraining, out_dir: Path) -> None:
    """``model.safetensors`` (the network) and ``dflash_config.json``."""
    from safetensors.torch import save_file

    dflash = model.dflash
    state = {k: v.detach().contiguous().cpu() for k, v in dflash.state_dict().items() if v is not None}
    save_file(state, str(Path(out_dir) / WEIGHTS_FILE))
    saved = {"config": dflash.config.as_dict(), "draft_vocab_size": dflash.draft_vocab_size,
             "target_vocab": dflash.target_vocab}
    (Path(out_dir) / CONFIG_FILE).write_text(json.dumps(saved, indent=2) + "\n", encoding="utf-8")


def load(folder: Path, target: nn.Module, record: dict[str, Any]) -> DFlashDrafter:
    """The saved drafter as a :class:`DFlashDrafter` for ``target`` (already checked to be the
    model it was trained for); its ``rank_rates`` are the record's."""
    from safetensors.torch import load_file

    saved = json.loads((Path(folder) / CONFIG_FILE).read_text(encoding="utf-8"))
    size = saved["draft_vocab_size"]
    model = DFlashModel(target, DFlashConfig.from_dict(saved["config"]), None if size is None else torch.arange(size))
    model.load_state_dict(load_file(str(Path(folder) / WEIGHTS_FILE)))
    out = DFlashDrafter(target, model.eval())
    out.rank_rates = record.get("rank_rates")
    return out


def drafter(model: DFlashTraining, target: nn.Module) -> DFlashDrafter:
    """The trained drafter, ready to pass as ``draft``."""
    out = DFlashDrafter(target, model.dflash.eval())
    out.rank_rates = model.rank_rates
    return out


def vocab_record(model: DFlashTraining) -> dict[str, Any]:
    """The record's ``vocab``: the draft vocabulary's size and where its map to target ids is."""
    dflash = model.dflash
    if dflash.draft_vocab_size is None:
        return {"size": dflash.target_vocab, "map": None}
    return {"size": dflash.draft_vocab_size, "map": "draft_to_target (model.safetensors)"}

