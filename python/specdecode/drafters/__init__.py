"""Drafters: who proposes the tokens the target verifies.

- :class:`Drafter` (protocol), :class:`Proposal`, :class:`CommitUpdate`, :class:`DraftState`:
  the contract between a drafter and the engine (:mod:`specdecode.drafters.base`).
- :class:`ModelDrafter`: a second Hugging Face causal LM with its own KV cache.
"""

from specdecode.drafters.base import (
    CommitUpdate,
    Drafter,
    DrafterBase,
    DraftState,
    Proposal,
    point_mass_logits,
)
from specdecode.drafters.model import ModelDrafter

__all__ = [
    "CommitUpdate",
    "DraftState",
    "Drafter",
    "DrafterBase",
    "ModelDrafter",
    "Proposal",
    "point_mass_logits",
]
