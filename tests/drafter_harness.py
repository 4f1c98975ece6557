"""What the tests of model-backed drafters share (tests/test_drafter_mtp.py,
tests/test_drafter_gemma4_assistant.py): greedy output checked against the target's own
``generate``, proposals checked row by row against a from-scratch reference while the engine
re-packs the batch as often as it can, and the sampled-output p-value of the exact
chi-square test (on :func:`test_generate_sampling.sample_standalone`'s run: ``N`` copies of
``PROMPT``, ``K`` new tokens at T = 1).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from test_generate_sampling import N, PROMPT, chi_square_p, sample_standalone

import specdecode


def repack_often(monkeypatch) -> None:
    """Let the engine re-pack the batch at almost every step where rows accepted different
    lengths (holes), for the length of the test."""
    import specdecode.engine.batch as layout

    monkeypatch.setattr(layout, "REPACK_MIN_WASTE", 2)
    monkeypatch.setattr(layout, "REPACK_MIN_FRACTION", 0.05)


def greedy_equals_target(target, drafter, ids, mask=None, hf: dict | None = None, **ours):
    """``specdecode.generate`` greedy (``hf``: generation arguments both take, ``ours``: those
    only specdecode takes, e.g. ``num_draft_tokens``, ``decode_path``), asserting it emits
    exactly ``target.generate``'s tokens; returns specdecode's output.

    Shape: ids, mask ``[b, n]`` (mask None: every token real)."""
    hf = hf or {}
    mask = torch.ones_like(ids) if mask is None else mask
    out = specdecode.generate(target, drafter, ids, mask, **hf, **ours)
    want = target.generate(ids, attention_mask=mask, do_sample=False, **hf)
    assert torch.equal(out.sequences, want)
    return out


def checking(cls: type, check_row: Callable) -> type:
    """A subclass of the drafter class ``cls`` that, after each eager proposal, calls
    ``check_row(drafter, proposal, row, context)`` for every row (``context``: the row's real
    tokens, the pending one last; no autograd) and counts in ``drafter.checked`` the rows for
    which it returned True (False: a row it does not check)."""

    class Checking(cls):
        checked = 0

        def propose(self, state, num_tokens):
            proposal = super().propose(state, num_tokens)
            with torch.no_grad():
                for r, context in enumerate(state.contexts()):
                    self.checked += bool(check_row(self, proposal, r, context))
            return proposal

    Checking.__name__ = Checking.__qualname__ = f"Checking{cls.__name__}"
    return Checking


def sampled_p(target, drafter, joint, n: int = N, **kwargs):
    """Sample ``n`` rows of ``PROMPT`` at T = 1 with 2 drafts a step (``kwargs`` to
    ``generate``: e.g. ``decode_path``); returns the output and the chi-square p-value of its
    new tokens against ``joint``, their exact law (:func:`test_generate_sampling.exact_joint`)."""
    out = sample_standalone(target, drafter, None, seed=3, n=n, **kwargs)
    return out, chi_square_p(out.sequences[:, len(PROMPT):], joint)
