"""What a drafter calls to draft token trees on the static decode path: :func:`prepare_static_tree`
before a generation (a calibrated dynamic tree's counts loaded on the device) and
:func:`grow_static_tree` at each step (a plan of a fixed shape grown by
:mod:`~specdecode.trees.static_growth`, a dynamic one by :mod:`~specdecode.trees.static_dynamic`).
The modules below it import none of this one, so the static tree modules form no circle.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from specdecode.trees.static_calibration import device_calibration
from specdecode.trees.static_dynamic import grow_dynamic
from specdecode.trees.static_growth import (LevelInputs, StaticExpand, StaticTreeDraft, StaticTreePlan, grow_shape,
                                            plan_static_tree)

__all__ = ["grow_static_tree", "prepare_static_tree"]


def grow_static_tree(plan: StaticTreePlan, state: Any, root_tokens: Tensor, root_logits: Tensor,
                     expand: StaticExpand, mask_dtype: torch.dtype) -> StaticTreeDraft:
    """Draft one tree per row by ``plan``: tensor operations only, coins from ``state``
    (a :class:`~specdecode.drafters.StaticDraftState`), constants kept in its buffers; the
    draft forwards' masks of ``mask_dtype`` (the draft's dtype).

    Shape:
        root_tokens: ``[B]`` int64 (each row's pending token); root_logits: ``[B, V]`` float32
            (the draft's logits at the root).
        returns: :class:`StaticTreeDraft` with ``N = plan.num_nodes``.
    """
    inputs = LevelInputs(state, plan.span, plan.max_depth, mask_dtype)
    if plan.kind == "dynamic":
        return grow_dynamic(plan, state, root_tokens, root_logits, expand, inputs)
    return grow_shape(plan, state, root_tokens, root_logits, expand, inputs)


def prepare_static_tree(state: Any, builder: Any) -> None:
    """Before a generation (outside CUDA graphs): load ``builder``'s calibration into the
    layout's device counts when its plan is a calibrated dynamic tree. A drafter whose
    ``static_prefill`` runs before the steps calls it with its tree builder."""
    if builder is None:
        return
    plan = plan_static_tree(builder, state.sampling, state.vocab_size)
    device = device_calibration(state, plan)
    if device is not None:
        device.load(builder.calibration)
