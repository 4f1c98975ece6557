"""Drafters: who proposes the tokens the target verifies.

- :class:`Drafter` (protocol), :class:`Proposal`, :class:`CommitUpdate`, :class:`DraftState`:
  the contract between a drafter and the engine (:mod:`specdecode.drafters.base`).
- :class:`ModelDrafter`: a second Hugging Face causal LM with its own KV cache.
- :class:`NgramDrafter`: prompt lookup, no model (copies what followed an earlier occurrence
  of each row's last tokens).
- :class:`TokenizerBridgeDrafter`: a draft model with its own tokenizer (text is re-encoded
  both ways).
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
from specdecode.drafters.ngram import NgramDrafter
from specdecode.drafters.tokenizer_bridge import TokenizerBridgeDrafter

__all__ = [
    "CommitUpdate",
    "DraftState",
    "Drafter",
    "DrafterBase",
    "ModelDrafter",
    "NgramDrafter",
    "Proposal",
    "TokenizerBridgeDrafter",
    "point_mass_logits",
]
