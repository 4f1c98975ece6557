"""Drafters: who proposes the tokens the target verifies.

- :class:`Drafter` (protocol), :class:`Proposal`, :class:`CommitUpdate`, :class:`DraftState`:
  the contract between a drafter and the engine (:mod:`specdecode.drafters.base`);
  :class:`StaticDrafter` / :class:`StaticDraftState` the same for the static, graph-capturable
  decode path.
- :class:`ModelDrafter`: a second Hugging Face causal LM with its own KV cache.
- :class:`LayerSkipDrafter`: self-speculation with some of the target's own decoder layers.
"""

from specdecode.drafters.base import (
    CommitUpdate,
    Drafter,
    DrafterBase,
    DraftState,
    Proposal,
    StaticDrafter,
    StaticDraftState,
    point_mass_logits,
)
from specdecode.drafters.layer_skip import LayerSkipDrafter
from specdecode.drafters.model import ModelDrafter

__all__ = [
    "CommitUpdate",
    "DraftState",
    "Drafter",
    "DrafterBase",
    "LayerSkipDrafter",
    "ModelDrafter",
    "Proposal",
    "StaticDraftState",
    "StaticDrafter",
    "point_mass_logits",
]
