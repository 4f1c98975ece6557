"""The ``eagle`` kind: a feature drafter (EAGLE) trained on the target's own features.

The drafter is :class:`specdecode.drafters.eagle.EagleModel`: ``fc([f_{t-1}, e(x_t)])`` through
one decoder layer of the target's architecture predicts the target's feature ``f_t`` (its last
hidden state, after the final norm: what its LM head reads), and a head turns the prediction
into the next-token distribution. The target's embedding (and, by default, its head) are used
frozen and are not saved.

Data: the kit's examples (the target's own continuations of the prompts), labelled in the same
target forward with its top-k log-probabilities *and* its features
(``DataSettings.feature_layers``), so training never runs the target. Training is teacher-forced
(every position reads the target's true feature of the position before it) with the loss of
EAGLE: a feature regression (smooth L1 between the predicted and the target's feature, weight
``feature_weight``) plus the kit's token-distribution loss against the target's distribution.
With ``unroll=C`` the later draft steps are trained too (EAGLE-3's training-time test): step
``c`` reads the drafter's own features from the step before, attending to what a drafting cache
would hold (:func:`unrolled_steps`), with the KL against the target's distribution of the same
position; :func:`acceptance_by_step` measures each step's greedy agreement on held-out examples.
With several feature layers (EAGLE-3: ``feature_layers=(2, 15, -1)``, projected to the hidden
size for step 1) the later steps read the drafter's own outputs in their place, and the target's
distribution comes from the last layer's columns, so the last hidden state must be among them.

``draft_vocab_size=Vd`` gives a reduced head over the ``Vd`` token ids most frequent in the
training data (counted over the examples' tokens and the target's top-1 predictions), started
from the target head's rows of those ids (EAGLE-3 / FR-Spec): a draft step then costs a
``Vd / V`` part of a full head. The distribution loss leaves out the mass the reduced head
cannot express. With ``train_head=False`` the reduced head stays those rows (FR-Spec): it is
not trained and not saved (loading takes the rows from the target again), which keeps the
folder to the decoder's size.

The folder: ``model.safetensors`` (the drafter's own weights, the map ``draft_to_target``
included) and ``eagle_config.json`` (feature layers, draft vocabulary size, hidden size).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specdecode.drafters.eagle import EagleDrafter, EagleModel
from specdecode.models import check_feature_layers, decoder_layers, kv_cache, vocab_rows
from specdecode.training.artifacts import WEIGHTS_FILE
from specdecode.training.vocab import draft_vocabulary, subset_head

__all__ = ["CONFIG_FILE", "DESCRIPTION", "MAX_UNROLL", "MEASURED_STEPS", "NAME", "UNROLL_DECAY", "Built",
           "EagleTraining", "acceptance_by_step", "build", "drafter", "forward", "last_layer_slot", "load", "prepare",
           "save", "saved_options", "start_from", "unrolled_steps", "vocab_record"]

NAME = "eagle"
DESCRIPTION = "a feature drafter (EAGLE): one decoder layer on the target's hidden state and the next token"
CONFIG_FILE = "eagle_config.json"
_INIT_SEED = 0
#: Draft steps ``unroll`` can train (1: teacher forcing only).
MAX_UNROLL = 7
#: The weight of each further unrolled step's KL (step 2 weighs 1).
UNROLL_DECAY = 0.8
#: Draft steps whose greedy acceptance a run's record shows (:func:`acceptance_by_step`).
MEASURED_STEPS = 4


class EagleTraining(nn.Module):
    """What the loop trains: the :class:`EagleModel` (a submodule) beside the target, which is
    held outside the module tree (never trained, never saved)."""

    def __init__(self, target: nn.Module, eagle: EagleModel, feature_weight: float, unroll: int = 1) -> None:
        super().__init__()
        self.eagle = eagle
        self._target = (target,)
        self.feature_weight = feature_weight
        self.unroll = unroll

    @property
    def target(self) -> nn.Module:
        return self._target[0]


@dataclass
class Built:
    """A drafter ready to train: the module, the parameters to train (by name; ``prepare`` may
    replace them), the feature layers (recorded as ``layers``, and asked of the data)."""

    model: EagleTraining
    params: dict[str, nn.Parameter]
    layers: list[int]
    feature_layers: tuple[int, ...]
    draft_vocab_size: int | None = None
    options: dict[str, Any] = field(default_factory=dict)


def _new_model(target: nn.Module, layers: tuple[int, ...], draft_vocab: Tensor | None, init_from_target: bool,
               train_head: bool = True) -> EagleModel:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_INIT_SEED)
        model = EagleModel(target, layers, draft_vocab, init_from_target=init_from_target)
    model.decoder.get_input_embeddings().weight.requires_grad_(False)  # unused: inputs come as embeddings
    if model.lm_head is not None and not train_head:
        model.lm_head.weight.requires_grad_(False)  # the target head's rows, kept as they are
    return model


def _trainable(model: EagleTraining) -> dict[str, nn.Parameter]:
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def build(target: nn.Module, *, feature_layers: tuple[int, ...] | list[int] = (-1,), draft_vocab_size: int | None = None,
          feature_weight: float = 1.0, init_from_target: bool = False, unroll: int = 1,
          train_head: bool = True) -> Built:
    """An untrained EAGLE drafter for ``target`` (only read). ``feature_layers``: indices into
    the target's ``hidden_states`` (default the last); ``draft_vocab_size``: a reduced head
    (chosen from the data in :func:`prepare`), None for the target's own; ``feature_weight``:
    the weight of the feature regression (used when the feature is the last hidden state);
    ``init_from_target``: start from the target's first decoder layer (a one-layer layer-skip
    drafter before training) instead of a random layer; ``unroll``: ``C > 1`` also trains draft
    steps 2 to ``C`` (at most :data:`MAX_UNROLL`), which read the drafter's own predicted
    features (training-time test, :func:`unrolled_steps`; step ``c``'s KL weighs
    ``UNROLL_DECAY ** (c - 2)``; ``feature_layers`` must then hold ``-1``), 1 teacher forcing
    only; ``train_head``: train a reduced head (True) or keep it the target head's rows of its
    ids (False: not saved either).

    >>> built = build(target, draft_vocab_size=8192, unroll=4, train_head=False)  # doctest: +SKIP
    """
    layers = check_feature_layers(target, tuple(feature_layers) if isinstance(feature_layers, list)
                                  else feature_layers)
    vocab = vocab_rows(target)
    if draft_vocab_size is not None and (isinstance(draft_vocab_size, bool) or not isinstance(draft_vocab_size, int)
                                         or not 1 <= draft_vocab_size <= vocab):
        raise ValueError(f"draft_vocab_size: expected an int in [1, {vocab}] or None, got {draft_vocab_size!r}")
    if isinstance(feature_weight, bool) or not isinstance(feature_weight, (int, float)) or feature_weight < 0:
        raise ValueError(f"feature_weight: expected a number >= 0, got {feature_weight!r}")
    if isinstance(unroll, bool) or not isinstance(unroll, int) or not 1 <= unroll <= MAX_UNROLL:
        raise ValueError(f"unroll: expected an int in [1, {MAX_UNROLL}], got {unroll!r}")
    if unroll > 1 and last_layer_slot(target, layers) is None:
        raise ValueError("unroll: the later draft steps are trained against the target's distribution, read from "
                         f"its last hidden state: include -1 in feature_layers, got {layers}")
    if not isinstance(init_from_target, bool):
        raise ValueError(f"init_from_target: expected a bool, got {init_from_target!r}")
    if not isinstance(train_head, bool):
        raise ValueError(f"train_head: expected a bool, got {train_head!r}")
    model = EagleTraining(target, _new_model(target, layers, None, init_from_target), float(feature_weight), unroll)
    return Built(model, _trainable(model), list(layers), layers, draft_vocab_size,
                 {"init_from_target": init_from_target, "train_head": train_head})


def last_layer_slot(target: nn.Module, layers: tuple[int, ...]) -> int | None:
    """Where the target's last hidden state (what its head reads) sits among ``layers``
    (indices into ``hidden_states``: ``-1`` or its positive twin), or None.

    >>> [last_layer_slot(smollm2, layers) for layers in ((2, 15, -1), (30, 2), (2,))]  # doctest: +SKIP
    [2, 0, None]
    """
    count = len(decoder_layers(target)) + 1
    return next((slot for slot, layer in enumerate(layers) if layer % count == count - 1), None)


def prepare(built: Built, examples: list[Any]) -> None:
    """With a reduced head: choose its vocabulary from ``examples`` and rebuild the drafter
    with it (``built.params`` updated in place)."""
    if built.draft_vocab_size is None:
        return
    target = built.model.target
    ids = draft_vocabulary(examples, vocab_rows(target), built.draft_vocab_size)
    built.model.eagle = _new_model(target, built.feature_layers, ids, built.options["init_from_target"],
                                   built.options["train_head"])
    built.params.clear()
    built.params.update(_trainable(built.model))


def saved_options(folder: Path, record: dict[str, Any]) -> dict[str, Any]:
    """The build options a saved drafter fixes (continuing it, :mod:`.continuing`): its feature
    layers, its reduced head's size and, with one, whether that head is trained."""
    config = json.loads((Path(folder) / CONFIG_FILE).read_text(encoding="utf-8"))
    options: dict[str, Any] = {"feature_layers": list(config["feature_layers"]),
                               "draft_vocab_size": config["draft_vocab_size"]}
    if config["draft_vocab_size"] is not None:
        options["train_head"] = not config.get("head_from_target", False)
    return options


def start_from(built: Built, folder: Path, record: dict[str, Any]) -> None:
    """Continue the saved drafter in ``folder`` (instead of :func:`prepare`): its reduced
    head keeps the saved vocabulary (the ``draft_to_target`` map), and its weights (float16 ones
    cast to the drafter's dtype) replace the new ones; ``built.params`` is updated in place."""
    from safetensors.torch import load_file

    state = load_file(str(Path(folder) / WEIGHTS_FILE))
    target = built.model.target
    ids = state["draft_to_target"] if built.draft_vocab_size is not None else None
    built.model.eagle = eagle = _new_model(target, built.feature_layers, ids, False, built.options["train_head"])
    missing, unexpected = eagle.load_state_dict(state, strict=False)
    allowed = ["lm_head.weight"] if not built.options["train_head"] else []  # a frozen head: the target's rows
    if unexpected or sorted(missing) != allowed:
        raise RuntimeError(f"missing {sorted(missing)}, unexpected {sorted(unexpected)}")
    built.params.clear()
    built.params.update(_trainable(built.model))


def forward(model: EagleTraining, input_ids: Tensor, attention_mask: Tensor, features: Tensor | None = None
            ) -> tuple[Tensor, Tensor | None]:
    """Teacher-forced logits on a right-padded batch and the weighted feature regression.

    Shape:
        input_ids, attention_mask: ``[b, t]``; features: ``[b, t, F]`` the target's features.
        Returns ``([b, t, V], scalar or None)``.
    """
    eagle, target = model.eagle, model.target
    cache = kv_cache.new_cache() if model.unroll > 1 else None  # step 1's entries, for the later steps
    feats, embeds, positions, hidden = _first_step(model, input_ids, attention_mask, features, cache)
    head_fn = subset_head(target, None, vocab_rows(target))
    logits = eagle.logits(hidden, head_fn, vocab_rows(target))
    terms = []
    mask = attention_mask.bool()
    if model.feature_weight > 0 and eagle.feature_layers == (-1,):
        terms.append(model.feature_weight * F.smooth_l1_loss(hidden[mask].float(), feats[mask].float()))
    if model.unroll > 1:
        terms.append(_unrolled_loss(model, embeds, hidden, feats, attention_mask, positions, head_fn, cache))
    return logits, (sum(terms) if terms else None)


def _first_step(model: EagleTraining, input_ids: Tensor, attention_mask: Tensor, features: Tensor | None,
                cache: Any) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Draft step 1, teacher-forced: position ``t`` reads the target's feature of ``t - 1`` and
    the token ``x_t`` (appending to ``cache`` when given). Returns the features in the
    drafter's dtype, the token embeddings, the positions and the step's outputs.

    Shape:
        input_ids, attention_mask: ``[b, t]``; features: ``[b, t, F]``. Returns ``[b, t, F]``,
        ``[b, t, hidden]``, ``[b, t]``, ``[b, t, hidden]``.
    """
    if features is None:
        raise ValueError("features: the eagle kind trains on target features; label the data with "
                         "DataSettings(feature_layers=...)")
    eagle = model.eagle
    feats = features.to(eagle.fc.weight.dtype)
    previous = torch.cat([torch.zeros_like(feats[:, :1]), feats[:, :-1]], 1)
    with torch.no_grad():
        embeds = model.target.get_input_embeddings()(input_ids)
    positions = (attention_mask.long().cumsum(1) - 1).clamp_min(0)
    hidden = eagle(eagle.input_features(previous), embeds, attention_mask, positions, cache)
    return feats, embeds, positions, hidden


@torch.no_grad()
def acceptance_by_step(model: EagleTraining, examples: list[Any], batch_size: int = 8,
                       steps: int = MEASURED_STEPS) -> list[float]:
    """Greedy agreement of draft steps ``1 .. steps`` with the target's top-1 token over
    ``examples`` (the run's validation examples): step ``c`` at position ``t`` reads the
    drafter's own features of the steps before it, as :func:`unrolled_steps` computes them (with
    the true tokens in between), counted where the loss counts and ``t >= c - 1``. Step 1 is the
    loop's greedy acceptance; with rates ``a_c``, a chain of ``k`` greedy drafts makes about
    ``1 + sum_{j <= k} prod_{c <= j} a_c`` tokens per target call.

    >>> acceptance_by_step(built.model, val_examples)  # doctest: +SKIP
    [0.63, 0.55, 0.51, 0.48]
    """
    from specdecode.training.loop import collate

    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_UNROLL:
        raise ValueError(f"steps: expected an int in [1, {MAX_UNROLL}], got {steps!r}")
    eagle, target = model.eagle, model.target
    vocab = vocab_rows(target)
    head_fn = subset_head(target, None, vocab)
    hits, counts = [0] * steps, [0] * steps
    for first in range(0, len(examples), batch_size):
        b = collate(examples[first: first + batch_size], eagle.fc.weight.device)
        if b.features is None:
            raise ValueError("examples: the eagle kind reads target features; label the data with "
                             "DataSettings(feature_layers=...)")
        cache = kv_cache.new_cache()
        _, embeds, positions, hidden = _first_step(model, b.input_ids, b.attention_mask, b.features, cache)
        outs = [hidden, *unrolled_steps(eagle, embeds, hidden, b.attention_mask, positions, steps, cache)]
        for step, out in enumerate(outs, start=1):
            counted = b.counted.clone()
            counted[:, : step - 1] = False
            agree = eagle.logits(out, head_fn, vocab).argmax(-1) == b.top_ids[..., 0].long()
            hits[step - 1] += int((agree & counted).sum())
            counts[step - 1] += int(counted.sum())
    return [round(h / max(n, 1), 4) for h, n in zip(hits, counts)]


def _log_probs(eagle: EagleModel, hidden: Tensor, head_fn: Any, vocab: int) -> Tensor:
    """The drafter's log-probabilities over the ids it can propose: its reduced head's columns,
    or the target's first ``vocab`` ids. Shape: hidden ``[b, t, H]``; returns ``[b, t, Vd or vocab]``."""
    logits = head_fn(hidden)[..., :vocab] if eagle.lm_head is None else eagle.lm_head(hidden)
    return torch.log_softmax(logits.float(), -1)


def _unrolled_loss(model: EagleTraining, embeds: Tensor, hidden: Tensor, feats: Tensor, attention_mask: Tensor,
                   positions: Tensor, head_fn: Any, cache: Any) -> Tensor:
    """The KL of draft steps ``2 .. model.unroll`` against the target's distribution of the same
    positions (step ``c`` at position ``t`` still predicts token ``t + 1``), step ``c`` weighed
    ``UNROLL_DECAY ** (c - 2)``. A reduced head's KL runs over its own ids (the ids it cannot
    propose are left out, as in the kit's loss), so no ``[b, t, V]`` tensor is kept per step.

    Shape:
        embeds, hidden, feats: ``[b, t, hidden]``; attention_mask, positions: ``[b, t]``.
    """
    eagle = model.eagle
    vocab = vocab_rows(model.target)
    slot, width = last_layer_slot(model.target, eagle.feature_layers), eagle.hidden_size
    last = feats[..., slot * width: (slot + 1) * width]  # several layers (EAGLE-3): the last one's columns
    with torch.no_grad():
        log_p = torch.log_softmax(head_fn(last).float()[..., :vocab], -1)
        if eagle.lm_head is not None:
            log_p = log_p[..., eagle.draft_to_target]
        p = log_p.exp()
    total = hidden.new_zeros((), dtype=torch.float32)
    mask = attention_mask.bool()
    for step, out in enumerate(unrolled_steps(eagle, embeds, hidden, attention_mask, positions, model.unroll,
                                              cache), start=2):
        kl = (p * (log_p - _log_probs(eagle, out, head_fn, vocab))).sum(-1)
        counted = mask.clone()
        counted[:, : step - 1] = False  # step c reads a prediction made at t - 1 by step c - 1: t >= c - 1
        if bool(counted.any()):
            total = total + UNROLL_DECAY ** (step - 2) * kl[counted].mean()
    return total


def unrolled_steps(eagle: EagleModel, embeds: Tensor, hidden: Tensor, attention_mask: Tensor, positions: Tensor,
                   steps: int, cache: Any) -> list[Tensor]:
    """The drafter's outputs at draft steps ``2 .. steps`` (training-time test), as drafting a
    chain computes them. Step ``c`` at position ``t`` reads step ``c - 1``'s output at ``t - 1``
    and the true token ``x_t``, and attends to what drafting's cache holds then: positions
    ``<= t - c + 1`` as fed with the target's features (step 1, teacher-forced), step ``m``'s
    entry at ``t - c + m`` for ``2 <= m < c``, and itself. ``cache``: the KV cache step 1's
    forward filled (its ``t`` columns); each step appends its own with one forward and a 4D mask
    over the steps before it.

    Shape:
        embeds, hidden: ``[b, t, hidden]`` (``hidden``: step 1's outputs); attention_mask,
        positions: ``[b, t]``. Returns ``steps - 1`` tensors ``[b, t, hidden]``.
    """
    t = embeds.shape[1]
    dtype = eagle.fc.weight.dtype
    i = torch.arange(t, device=embeds.device)
    real = attention_mask.bool()[:, None, :]
    previous, outs = hidden, []
    for step in range(2, steps + 1):
        blocks = [(i[None, :] <= i[:, None] - (step - 1))[None] & real]  # step 1's entries
        blocks += [(i[None, :] == i[:, None] - (step - m))[None] & real for m in range(2, step + 1)]
        allowed = torch.cat(blocks, 2)  # [b, t, step * t]
        additive = torch.zeros(allowed.shape, dtype=dtype, device=embeds.device).masked_fill(
            ~allowed, torch.finfo(dtype).min)[:, None]
        own = torch.cat([torch.zeros_like(previous[:, :1]), previous[:, :-1]], 1)
        previous = eagle(own, embeds, additive, positions, cache)
        outs.append(previous)
    return outs


def save(model: EagleTraining, out_dir: Path) -> None:
    """``model.safetensors`` (the drafter's weights) and ``eagle_config.json``."""
    from safetensors.torch import save_file

    eagle = model.eagle
    head_from_target = eagle.lm_head is not None and not eagle.lm_head.weight.requires_grad
    state = {k: v.detach().contiguous().cpu() for k, v in eagle.state_dict().items()
             if not (head_from_target and k == "lm_head.weight")}
    save_file(state, str(Path(out_dir) / WEIGHTS_FILE))
    config = {"feature_layers": list(eagle.feature_layers), "draft_vocab_size": eagle.draft_vocab_size,
              "hidden_size": eagle.hidden_size, "target_vocab": eagle.target_vocab,
              "head_from_target": head_from_target}
    (Path(out_dir) / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def load(folder: Path, target: nn.Module, record: dict[str, Any]) -> EagleDrafter:
    """The saved drafter as an :class:`EagleDrafter` for ``target`` (already checked to be
    the model it was trained for)."""
    from safetensors.torch import load_file

    config = json.loads((Path(folder) / CONFIG_FILE).read_text(encoding="utf-8"))
    size = config["draft_vocab_size"]
    placeholder = None if size is None else torch.arange(size)
    eagle = EagleModel(target, tuple(config["feature_layers"]), placeholder)
    if config.get("head_from_target"):
        missing, unexpected = eagle.load_state_dict(load_file(str(Path(folder) / WEIGHTS_FILE)), strict=False)
        if missing != ["lm_head.weight"] or unexpected:
            raise ValueError(f"path: {str(folder)!r} does not hold the weights its config names "
                             f"(missing {missing}, unexpected {unexpected})")
        with torch.no_grad():  # the reduced head is the target head's rows of the saved map
            eagle.lm_head.weight.copy_(target.get_output_embeddings().weight[eagle.draft_to_target])
    else:
        eagle.load_state_dict(load_file(str(Path(folder) / WEIGHTS_FILE)))
    return EagleDrafter(target, eagle.eval())


def drafter(model: EagleTraining, target: nn.Module) -> EagleDrafter:
    """The trained drafter, ready to pass as ``draft``."""
    return EagleDrafter(target, model.eagle.eval())


def vocab_record(model: EagleTraining) -> dict[str, Any]:
    """The record's ``vocab``: the draft vocabulary's size and where its map to target ids is."""
    eagle = model.eagle
    if eagle.draft_vocab_size is None:
        return {"size": eagle.target_vocab, "map": None}
    return {"size": eagle.draft_vocab_size, "map": "draft_to_target (model.safetensors)"}
