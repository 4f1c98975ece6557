"""The words and number formats specdecode shows on screen, defined once.

Every screen (``str(stats)``, the HTML table of :class:`~specdecode.SpeculativeStats` in
Jupyter, ``python -m specdecode demo`` and ``bench``) takes its labels, one-line definitions
and number formats from here. The user guide (``docs/guide.md``, section "Vocabulary")
repeats each definition word for word; ``tests/test_docs.py`` keeps the two equal.

>>> ALPHA.name, rate(0.8333)
('alpha', '0.83')
>>> speedup(1.581), per_second(4.0)
('1.58x', '4.0')
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Term:
    """A quantity as shown on screen: its ``name``, a one-line ``definition`` (the user guide's
    words) and a ``short`` gloss for narrow tables."""

    name: str
    definition: str
    short: str


GAMMA = Term("gamma", "draft tokens proposed per step (num_draft_tokens)", "draft tokens per step")
ACCEPTANCE_RATE = Term(
    "acceptance rate", "accepted draft tokens / drafted draft tokens", "accepted / drafted"
)
ALPHA = Term(
    "alpha",
    "mean per-position acceptance probability: the chance that a draft token is accepted when "
    "every draft before it was; estimated as accepted / (accepted + rejected)",
    "P(draft accepted | earlier drafts accepted)",
)
ACCEPTANCE_BY_POSITION = Term(
    "acceptance by position",
    "for draft position i = 1, 2, ...: the share of steps in which position i was accepted "
    "(about alpha^i when positions are alike)",
    "share of steps accepting position i, ~alpha^i",
)
BLOCK_EFFICIENCY = Term(
    "block efficiency",
    "new tokens per target call, per row (accepted drafts + 1, on average)",
    "new tokens per target call",
)
COST_RATIO = Term(
    "cost ratio c", "time of one draft forward / time of one target forward", "draft forward / target forward time"
)
SPEEDUP = Term(
    "speedup",
    "tokens per second with speculation / tokens per second of the target alone",
    "measured, vs the target alone",
)
PREDICTED_SPEEDUP = Term(
    "predicted speedup",
    "Leviathan's (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)), from the measured alpha, "
    "gamma and c; it assumes a verify call costs one target decode step",
    "Leviathan's formula (verify call = 1 decode step)",
)
COST_AWARE_SPEEDUP = Term(
    "cost-aware prediction",
    "block efficiency x (target decode step time) / (gamma draft calls + one verify call), "
    "from measured times",
    "block efficiency at the measured call costs",
)

#: Every term, in the order the user guide lists them.
TERMS: tuple[Term, ...] = (
    GAMMA, ACCEPTANCE_RATE, ALPHA, ACCEPTANCE_BY_POSITION, BLOCK_EFFICIENCY, COST_RATIO, SPEEDUP,
    PREDICTED_SPEEDUP, COST_AWARE_SPEEDUP,
)


# ------------------------------------------------------------------------ number formats
def rate(value: float) -> str:
    """A probability or a share (acceptance rate, alpha, acceptance by position): ``0.83``."""
    return f"{value:.2f}"


def rates(values: list[float]) -> str:
    """A list of rates, space-separated: ``0.77 0.69 0.46``."""
    return " ".join(rate(v) for v in values) or "-"


def tokens(value: float) -> str:
    """Tokens per call (block efficiency, mean accepted length): ``3.43``."""
    return f"{value:.2f}"


def cost(value: float) -> str:
    """The cost ratio c: ``0.074``."""
    return f"{value:.3f}"


def speedup(value: float) -> str:
    """A speed ratio against a baseline: ``1.58x``."""
    return f"{value:.2f}x"


def per_second(value: float) -> str:
    """Tokens per second: ``25.6``, ``4.0``."""
    return f"{value:.1f}"


def milliseconds(seconds: float) -> str:
    """A duration given in seconds, shown in milliseconds: ``812.4 ms``."""
    return f"{seconds * 1000:.1f} ms"
