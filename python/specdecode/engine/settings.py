"""``EngineSettings``: everything one generation needs besides the models and the inputs,
already validated (the integrations normalise user arguments into it, in one place)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import torch

from specdecode.engine.schedules import DraftSchedule
from specdecode.rules import get_rule, is_chain_rule
from specdecode.trees.rules import is_tree_rule
from specdecode.sampling import SamplingParams


@dataclass
class EngineSettings:
    """Settings of one speculative generation.

    - ``sampling``: applied identically to target and draft (``is_greedy`` at temperature 0).
    - ``rule`` / ``rule_options``: the verification rule and its checked options: a chain rule
      (:func:`specdecode.list_rules`) or a tree rule (:func:`specdecode.trees.list_tree_rules`);
      None picks ``token`` for chains and, for trees, the lossless rule of the drafter's
      children scheme.
    - ``max_new_tokens``: per row; ``eos_ids`` end a row (empty: never); ``pad_id`` fills a
      finished row.
    - ``processors`` / ``stopping``: Hugging Face logits processors and stopping criteria (the
      EOS and max-length criteria are handled natively), or None.
    - ``streamer``: batch 1 only: receives the prompt, each step's tokens, then ``end()``.
    - ``generator``: drives every coin (drafting and verification).
    - ``schedule``: how many tokens to draft per step.
    - ``vocab_size``: the ids both models share (verification runs over ``[0, vocab_size)``).
    """

    sampling: SamplingParams
    rule: str | None
    max_new_tokens: int
    pad_id: int
    schedule: DraftSchedule
    vocab_size: int
    rule_options: dict[str, Any] = field(default_factory=dict)
    eos_ids: tuple[int, ...] = ()
    processors: Any = None
    stopping: Any = None
    streamer: Any = None
    generator: torch.Generator | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.sampling, SamplingParams):
            raise TypeError(f"sampling: expected a SamplingParams, got {type(self.sampling).__name__}")
        if self.rule is not None and not (is_tree_rule(self.rule) or is_chain_rule(self.rule)):
            get_rule(self.rule)  # ValueError listing the known rules
        if self.rule == "greedy" and not self.sampling.is_greedy:
            warnings.warn(
                f"rule: 'greedy' is lossless only at temperature 0; sampling at temperature "
                f"{self.sampling.temperature:g} with it keeps drafts equal to the target's argmax and emits the "
                "argmax, so the output is not a sample of the target; use rule='token' or 'block' to sample",
                UserWarning, stacklevel=2)
        for name in ("max_new_tokens", "vocab_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name}: expected an int >= 1, got {value!r}")
            if value < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {value}")
        if not isinstance(self.schedule, DraftSchedule):
            raise TypeError(f"draft_schedule: expected a DraftSchedule, got {type(self.schedule).__name__}")
        if self.generator is not None and not isinstance(self.generator, torch.Generator):
            raise TypeError(f"generator: expected a torch.Generator or None, got {type(self.generator).__name__}")
        self.eos_ids = tuple(int(i) for i in self.eos_ids)
        self.pad_id = int(self.pad_id)
