"""Drafters: who proposes the tokens the target verifies.

- :class:`Drafter` (protocol), :class:`Proposal`, :class:`CommitUpdate`, :class:`DraftState`:
  the contract between a drafter and the engine (:mod:`specdecode.drafters.base`);
  :class:`StaticDrafter` / :class:`StaticDraftState` the same for the static, graph-capturable
  decode path, and :class:`StaticTreeDrafter` / :class:`StaticTreeDraftState`
  (:mod:`specdecode.drafters.static_trees`) for token trees there.
- :class:`ModelDrafter`: a second Hugging Face causal LM with its own KV cache.
- :class:`NgramDrafter`: prompt lookup, no model (copies what followed an earlier occurrence
  of each row's last tokens).
- :class:`TokenizerBridgeDrafter`: a draft model with its own tokenizer (text is re-encoded
  both ways).
- :class:`LayerSkipDrafter`: self-speculation with some of the target's own decoder layers.
- :class:`LookaheadDrafter`: Lookahead decoding (Jacobi iteration in the target's own forward
  feeds an n-gram pool); :class:`JacobiDrafter`: plain Jacobi decoding, its baseline.
- :class:`EagleDrafter`: a feature drafter (EAGLE) reading the target's hidden states.
- :class:`ExitAdapterDrafter`: self-speculation through the target's first layers and a small
  trained exit adapter (``python -m specdecode train exit``).
- :class:`VerticalCascadeDrafter` / :class:`HorizontalCascadeDrafter`: cascades (a draft model
  drafting with prompt lookup inside; a model for the first positions, prompt lookup after).
- :class:`MedusaDrafter`: Medusa-1 heads on the target's last hidden state (chains and top-k trees).
- :class:`HydraDrafter`: Hydra heads, each reading the last hidden state and the embeddings of
  the tokens drafted before it (chains and top-k trees conditioned on each node's path).
- :class:`SuffixDrafter`: SuffixDecoding, no model (what most often followed each row's last
  tokens in earlier generations, a :class:`TokenCorpus` of documents and the row's own context).
- :class:`FallbackDrafter`: a model-free chain (SuffixDecoding, prompt lookup) where it is
  confident, a model's chain (EAGLE, a draft model) elsewhere.
- :class:`DFlashDrafter`: block drafting (DFlash): a small non-causal network reads the target's
  fused hidden states as keys/values and drafts a whole block of mask tokens in one forward
  (chains and top-k rank trees).
- :func:`load_dflash`: a :class:`DFlashDrafter` from a published DFlash checkpoint folder
  (``DFlashDraftModel``; :mod:`specdecode.drafters.dflash_checkpoint`).
- :class:`MTPDrafter`: the multi-token-prediction layers a model ships (DeepSeek-V3, GLM-4-MoE:
  ``num_mtp_layers``), as transformers loads them, reading the target's last hidden state
  (chains, rank trees; :mod:`specdecode.drafters.mtp`).
- :class:`Gemma4AssistantDrafter`: Gemma 4's assistant model (``Gemma4AssistantForCausalLM``),
  drafting from the target's last hidden state and the keys/values of the target layers it
  shares (chains, rank trees; :mod:`specdecode.drafters.gemma4_assistant`).
- :class:`PartialCacheDrafter`: the target over a partial KV cache (attention sinks plus a recent
  window), TriForce's middle drafter; under a :class:`VerticalCascadeDrafter`, the hierarchy.
"""

from specdecode.drafters.base import (
    CommitUpdate,
    Drafter,
    DrafterBase,
    DraftState,
    Proposal,
    SideTokens,
    StaticDrafter,
    StaticDraftState,
    point_mass_logits,
)
from specdecode.drafters.dflash import DFlashDrafter
from specdecode.drafters.dflash_checkpoint import load_dflash
from specdecode.drafters.eagle import EagleDrafter
from specdecode.drafters.jacobi import JacobiDrafter
from specdecode.drafters.cascade import HorizontalCascadeDrafter, VerticalCascadeDrafter
from specdecode.drafters.fallback import FallbackDrafter
from specdecode.drafters.gemma4_assistant import Gemma4AssistantDrafter
from specdecode.drafters.exit_adapter import ExitAdapter, ExitAdapterDrafter
from specdecode.drafters.hydra import HydraDrafter
from specdecode.drafters.layer_skip import LayerSkipDrafter
from specdecode.drafters.lookahead import LookaheadDrafter
from specdecode.drafters.medusa import MedusaDrafter
from specdecode.drafters.model import ModelDrafter
from specdecode.drafters.mtp import MTPDrafter
from specdecode.drafters.ngram import NgramDrafter
from specdecode.drafters.partial_cache import PartialCacheDrafter
from specdecode.drafters.suffix import SuffixDrafter, TokenCorpus
from specdecode.drafters.static_trees import StaticTreeDrafter, StaticTreeDraftState
from specdecode.drafters.tokenizer_bridge import TokenizerBridgeDrafter

__all__ = [
    "CommitUpdate",
    "DFlashDrafter",
    "MTPDrafter",
    "Gemma4AssistantDrafter",
    "DraftState",
    "Drafter",
    "DrafterBase",
    "EagleDrafter",
    "JacobiDrafter",
    "ExitAdapter",
    "ExitAdapterDrafter",
    "FallbackDrafter",
    "HorizontalCascadeDrafter",
    "HydraDrafter",
    "LayerSkipDrafter",
    "LookaheadDrafter",
    "MedusaDrafter",
    "ModelDrafter",
    "NgramDrafter",
    "PartialCacheDrafter",
    "Proposal",
    "SideTokens",
    "StaticDraftState",
    "StaticDrafter",
    "StaticTreeDraftState",
    "StaticTreeDrafter",
    "SuffixDrafter",
    "TokenCorpus",
    "TokenizerBridgeDrafter",
    "VerticalCascadeDrafter",
    "load_dflash",
    "point_mass_logits",
]
