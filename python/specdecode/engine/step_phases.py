"""What the *score* and *verify* phases of a chain step do the same way on both decode paths.

Both loops run a step as propose -> score -> verify -> commit. They differ in how they lay the
batch out (columns with holes and re-packing, or fixed per-row caches), in where the coins come
from (uniforms drawn on the host, or Philox counters on the device) and in who decides when to
stop; the logits the target produces and the call to the verification rule are the same.
Stopping is :mod:`specdecode.engine.stopping`, the statistics :mod:`specdecode.engine.accounting`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from specdecode.drafters.base import point_mass_logits
from specdecode.engine.settings import EngineSettings
from specdecode.rules import RuleInfo
from specdecode.reference import VerifyOutput
from specdecode.trees.builder_base import LOSSLESS_RULE
from specdecode.trees.rules import is_tree_rule, list_tree_rules, lossless_children
from specdecode.verify import verify_logits


def scored_logits(logits: Tensor, vocab_size: int, device: torch.device) -> Tensor:
    """The target's raw output cut to the generation's vocabulary (models often pad their output
    rows), as contiguous float32 on ``device``: what processors and verification read.

    Shape:
        logits: ``[b, n, >= vocab_size]``; returns ``[b, n, vocab_size]`` float32.
    """
    return logits[:, :, :vocab_size].to(device=device, dtype=torch.float32).contiguous()


def verify_chain(target_logits: Tensor, draft_tokens: Tensor, draft_logits: Tensor | None, verified: Tensor,
                 rule: RuleInfo, settings: EngineSettings, **coins: Any) -> VerifyOutput:
    """Verify a chain of drafts with the generation's rule, sampling settings and rule options.

    A rule that reads the draft distribution gets ``draft_logits``, or a point mass at each
    draft when the drafter proposed deterministically (``draft_logits`` None). ``coins`` are the
    random numbers' source: ``uniforms=`` (the eager loop) or ``philox_seed=`` and
    ``philox_offset=`` (the static path).

    Shape:
        target_logits: ``[b, k + 1, V]`` float32; draft_tokens: ``[b, k]`` int64; draft_logits:
        ``[b, k, V]`` or None; verified: ``[b]`` int64, the drafts each row verifies.
    """
    q = None
    if rule.needs_draft_probs or not rule.builtin:
        q = draft_logits if draft_logits is not None else point_mass_logits(draft_tokens, settings.vocab_size)
    return verify_logits(target_logits, q, draft_tokens, sampling=settings.sampling, rule=rule.name,
                         num_draft_tokens=verified, **coins, **settings.rule_options)


def tree_rule_for(rule: str | None, children: str) -> str:
    """The tree rule that verifies a tree whose children were drafted by the scheme ``children``:
    ``rule`` when it is a tree rule lossless for (or indifferent to) that scheme, the scheme's own
    lossless rule for None; ``ValueError`` naming ``rule`` otherwise."""
    if rule is None:
        return LOSSLESS_RULE[children]
    if not is_tree_rule(rule):
        raise ValueError(f"rule: {rule!r} is a chain rule, but the drafter proposed a token tree; tree rules: "
                         f"{', '.join(r.name for r in list_tree_rules())} (or rule=None for the lossless one)")
    allowed = lossless_children(rule)
    if allowed is not None and children not in allowed:
        raise ValueError(f"rule: {rule!r} is lossless only for children drafted {' or '.join(allowed)}, but this "
                         f"tree's children are {children}; use rule={LOSSLESS_RULE[children]!r} (or rule=None)")
    return rule
