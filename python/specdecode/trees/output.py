"""The result type of tree verification, shared by the compiled op's wrapper and the pure-Python
rules (its own module so that the reference and the Python rules can return it without importing
the op wrapper)."""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor


class TreeVerifyOutput(NamedTuple):
    """Result of one tree verification call, trimmed to the deepest tree of the batch (D).

    Shape:
        tokens: ``[B, D+1]`` int64 — the accepted path's tokens (root excluded), then the one
            emitted token, then ``-1`` padding.
        accepted_len: ``[B]`` int64 — accepted draft nodes per row; each row emits
            ``accepted_len + 1`` tokens.
        accepted_nodes: ``[B, D+1]`` int64 — node indices of the path: the root 0, then the
            ``accepted_len`` accepted nodes, then ``-1`` (the cache columns to keep).
    """

    tokens: Tensor
    accepted_len: Tensor
    accepted_nodes: Tensor

    @property
    def emitted_len(self) -> Tensor:
        """Tokens emitted per row (``accepted_len + 1``). Shape: ``[B]``."""
        return self.accepted_len + 1
