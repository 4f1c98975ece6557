"""``JacobiDrafter``: plain Jacobi decoding, the baseline of Lookahead decoding.

Each row keeps a guess of its next ``window`` tokens and proposes it as a chain. The target
scores the chain in one forward; verification accepts a prefix and emits one more token. The
target's argmax after every guessed token that was not accepted becomes the new guess for the
positions after the emitted ones (one step of the fixed-point iteration ``y_i <- argmax p(y_i |
prefix, y_<i)``), so a guess that was right in its early tokens converges over later steps.

The guess is a function of the context and of earlier target logits, never of the
generation's coins, so it is verified as a point mass (lossless at any temperature).
"""

from __future__ import annotations

from typing import Any

import torch

from specdecode.drafters.base import CommitUpdate, DrafterBase, DraftState, Proposal


class JacobiDrafter(DrafterBase):
    """Jacobi decoding (see the module docstring).

    Args:
        window: tokens guessed per step (>= 1); the engine's ``num_draft_tokens`` may ask fewer.

    Example:
        >>> out = specdecode.generate(target, JacobiDrafter(window=4), input_ids, num_draft_tokens=4)
    """

    name = "jacobi"

    def __init__(self, window: int = 4) -> None:
        if isinstance(window, bool) or not isinstance(window, int):
            raise TypeError(f"window: expected an int >= 1, got {window!r}")
        if window < 1:
            raise ValueError(f"window: expected an int >= 1, got {window}")
        self.window = window
        self.reset()

    def reset(self) -> None:
        """Forget every row's guess (a new generation)."""
        self._guesses: dict[int, list[int]] = {}  # caller row -> guessed next tokens
        self._rows: list[int] = []

    def describe(self) -> dict[str, Any]:  # noqa: D102
        return {"drafter": self.name, "window": self.window}

    def propose(self, state: DraftState, num_tokens: int) -> Proposal:
        """Each row's current guess (the pending token repeated before the first update)."""
        k = min(self.window, num_tokens)
        self._rows = [int(r) for r in state.row_ids.tolist()]
        pending = state.tokens[:, state.num_columns - 1].tolist()
        drafts = []
        for row, last in zip(self._rows, pending):
            guess = self._guesses.get(row) or [last]
            drafts.append((guess + [guess[-1]] * k)[:k])
        return Proposal(torch.tensor(drafts, dtype=torch.long, device=state.device).view(len(drafts), k))

    def commit(self, update: CommitUpdate) -> None:
        """New guess: the target's argmax after each draft past the accepted ones."""
        if update.target_logits is None or not self._rows:
            return
        predicted = update.target_logits.argmax(-1).tolist()  # [b, k + 1]
        for row, accepted, after in zip(self._rows, update.accepted_len.tolist(), predicted):
            # after[i] follows draft i (after[0] the pending token); the emitted bonus token came
            # from after[accepted], so the guess resumes one further
            self._guesses[row] = after[accepted + 1:]
        self._rows = []
