"""``FallbackDrafter``: a model-free drafter where it is confident, a model where it is not.

Retrieval drafts long chains, and costs nothing, where the text repeats what came before (an
earlier generation, the prompt); elsewhere it proposes little or nothing, and a trained drafter
(EAGLE, a draft model) does better. Each step this drafter asks the model-free one first
(:class:`~specdecode.drafters.SuffixDrafter` or :class:`~specdecode.drafters.NgramDrafter`) and
takes its chain when every row gets at least ``min_tokens`` drafts; otherwise the fallback drafts
the step (as SuffixDecoding's hybrid with a model drafter, and Arctic Inference's, do).

Which drafter drafts a step depends only on the context (and the corpus), never on the step's
randomness, and each proposal carries its own ``q`` (a point mass for the model-free chain, the
model's logits for its samples): verification stays exactly the target's law.
"""

from __future__ import annotations

from typing import Any

from specdecode.drafters.base import CommitUpdate, DrafterBase, DraftState, Proposal
from specdecode.drafters.ngram import NgramDrafter, _check_int
from specdecode.drafters.suffix import SuffixDrafter


class FallbackDrafter(DrafterBase):
    """``first``'s chain where every row gets at least ``min_tokens`` drafts, else ``fallback``'s.

    ``generate``'s ``num_draft_tokens`` (default 12) is the longest chain ``first`` may propose;
    the fallback drafts ``fallback_tokens`` (default: its own ``default_num_draft_tokens``, else
    the same number), at most that many. The fallback sees every step's commit (its caches and the target
    features it reads follow every committed column, whoever drafted them); ``first`` only the
    steps it drafted (it keeps no state across steps but what it proposed last). With a fallback
    that reads the target's features (EAGLE), the engine hands them over at every step.

    Both draft chains: a ``first`` drafting tries or a ``fallback`` drafting trees is refused.
    When sampling, ``generate`` uses the fallback's sampling variant (a trained drafter's record
    may choose a shorter chain at T > 0) behind the same ``first``.

    Args:
        first: a :class:`~specdecode.drafters.SuffixDrafter` or
            :class:`~specdecode.drafters.NgramDrafter` drafting chains.
        fallback: any drafter drafting chains (a draft model, EAGLE, Medusa, ...).
        min_tokens: the fewest drafts ``first`` must give every row for its chain to be used
            (an int >= 1; 3 was chosen on SmolLM2's tune inputs with EAGLE behind a
            ``SuffixDrafter``, ``benchmarks/bench_suffix.py``).
        fallback_tokens: the fallback's chain length, or None (its own default).

    Example:
        >>> target, eagle, tok = specdecode.load_pair("smollm2")  # doctest: +SKIP
        >>> drafter = FallbackDrafter(SuffixDrafter(), eagle)  # doctest: +SKIP
        >>> out = specdecode.generate(target, drafter, ids)  # doctest: +SKIP
    """

    name = "fallback"

    def __init__(self, first: SuffixDrafter | NgramDrafter, fallback: Any, min_tokens: int = 3,
                 fallback_tokens: int | None = None) -> None:
        if not isinstance(first, (SuffixDrafter, NgramDrafter)):
            raise TypeError(f"first: expected a SuffixDrafter or NgramDrafter drafting chains, got "
                            f"{type(first).__name__}")
        if first.num_nodes is not None:
            raise ValueError(f"first: expected a drafter drafting chains, got a {type(first).__name__} drafting tries "
                             f"(num_nodes={first.num_nodes})")
        if not callable(getattr(fallback, "propose", None)) or not callable(getattr(fallback, "commit", None)):
            raise TypeError(f"fallback: expected a drafter (propose / commit / reset), got {type(fallback).__name__}")
        if getattr(fallback, "tree", None) is not None or getattr(fallback, "num_nodes", None) is not None:
            raise ValueError(f"fallback: expected a drafter drafting chains; this {type(fallback).__name__} drafts "
                             "trees")
        _check_int("min_tokens", min_tokens, 1)
        if fallback_tokens is not None:
            _check_int("fallback_tokens", fallback_tokens, 1)
        self.first, self.fallback = first, fallback
        self.min_tokens, self.fallback_tokens = min_tokens, fallback_tokens
        # what the engine reads from the drafter that uses the target's columns and features
        self.feature_layers = getattr(fallback, "feature_layers", None)
        self.max_columns = getattr(fallback, "max_columns", None)
        self.model = getattr(fallback, "model", None)  # what the CPU fast path accelerates beside the target
        if getattr(fallback, "device", None) is not None:
            self.device = fallback.device
        self.default_num_draft_tokens = 12  # first's longest chain (bench_suffix.py's tune prompts)
        # steps drafted by `first` / by the fallback since this drafter was made (the copy that
        # for_sampling makes around a fallback's sampling variant counts its own)
        self.first_steps = 0
        self.fallback_steps = 0
        self._used_first = False

    @property
    def static_host_drafts(self) -> bool:  # type: ignore[override]
        """Whether both drafters propose on the host between steps on the static decode path
        (:mod:`specdecode.engine.host_drafts`): ``first`` always does, the fallback when it is a
        host drafter too (a :class:`~specdecode.drafters.TokenizerBridgeDrafter`, prompt lookup,
        suffix retrieval). A fallback that drafts on the device (EAGLE, a draft model) keeps this
        drafter on the eager path."""
        return bool(getattr(self.fallback, "static_host_drafts", False))

    def reset(self) -> None:
        self.first.reset()
        self.fallback.reset()
        self._used_first = False

    def for_sampling(self) -> FallbackDrafter:
        """This drafter, or one with the fallback's sampling variant behind the same ``first``."""
        sampling = self.fallback.for_sampling() if callable(getattr(self.fallback, "for_sampling", None)) else None
        if sampling is None or sampling is self.fallback:
            return self
        return FallbackDrafter(self.first, sampling, self.min_tokens, self.fallback_tokens)

    def describe(self) -> dict[str, Any]:
        describe = getattr(self.fallback, "describe", None)
        return {"drafter": self.name, "first": self.first.describe(),
                "fallback": describe() if callable(describe) else type(self.fallback).__name__,
                "min_tokens": self.min_tokens, "fallback_tokens": self.fallback_tokens}

    def propose(self, state: DraftState, num_tokens: int) -> Proposal:
        proposal = self.first.propose(state, num_tokens)
        counts = proposal.num_draft_tokens
        fewest = proposal.num_tokens if counts is None else int(counts.min()) if counts.numel() else 0
        self._used_first = proposal.num_tokens > 0 and fewest >= self.min_tokens
        if self._used_first:
            self.first_steps += 1
            return proposal
        self.fallback_steps += 1
        wanted = self.fallback_tokens or getattr(self.fallback, "default_num_draft_tokens", None) or num_tokens
        return self.fallback.propose(state, min(wanted, num_tokens))

    def commit(self, update: CommitUpdate) -> None:
        if self._used_first:
            self.first.commit(update)
        self._used_first = False
        self.fallback.commit(update)
