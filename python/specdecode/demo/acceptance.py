"""Acceptance-rate estimates for a (target, draft) pair of Hugging Face causal LMs.

For speculative decoding the quantity that matters is the per-token acceptance
probability ``alpha`` of a draft token, *measured along the sequences the target
itself would produce* (that is the distribution speculative decoding follows):

* **greedy** (``temperature == 0``): a draft token is accepted iff it equals the
  target's argmax.  We let the target decode greedily from each prompt, then, at
  every position of that continuation, compare ``argmax draft`` with
  ``argmax target`` given the same (target-greedy) prefix.  ``alpha`` is the mean of
  that indicator over all positions of all prompts.
* **sampling** (``temperature > 0``): with the standard rejection rule a draft
  token ``x ~ q`` is accepted with probability ``min(1, p(x)/q(x))``, so the
  expected acceptance at one position is ``sum_x min(p(x), q(x)) = 1 - TV(p, q)``.
  We sample continuations from the target (seeded) and average that quantity, with
  ``p`` and ``q`` the temperature-scaled softmaxes of target and draft.

The draft never generates here, so the estimate does not depend on a speculation
length ``k``; with i.i.d. acceptance the expected number of tokens per target call
for length ``k`` is ``(1 - alpha**(k+1)) / (1 - alpha)``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import torch

from specdecode.models.cache_io import cache_kwargs, returned_cache

__all__ = ["AcceptanceEstimate", "estimate_acceptance"]


@dataclass
class AcceptanceEstimate:
    """Result of :func:`estimate_acceptance`."""

    alpha: float
    """Mean acceptance probability over all measured positions."""
    temperature: float
    n_prompts: int
    n_positions: int
    max_new_tokens: int
    per_prompt: list[float] = field(default_factory=list)
    """Mean acceptance of each prompt's continuation, in prompt order."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@torch.no_grad()
def _target_continuation(
    target: torch.nn.Module,
    prompt_ids: torch.Tensor,
    max_new_tokens: int,
    temperature: float,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """Decode ``max_new_tokens`` tokens from ``target`` (greedy or sampled), with a KV cache."""
    out = target(input_ids=prompt_ids, use_cache=True)
    past = returned_cache(out)
    logits = out.logits[:, -1, :].float()
    new_tokens = []
    for step in range(max_new_tokens):
        if temperature == 0.0:
            nxt = logits.argmax(dim=-1, keepdim=True)
        else:
            probs = torch.softmax(logits / temperature, dim=-1)
            nxt = torch.multinomial(probs.cpu(), 1, generator=generator).to(prompt_ids.device)
        new_tokens.append(nxt)
        if step + 1 == max_new_tokens:
            break
        out = target(input_ids=nxt, **cache_kwargs(target, past))
        past = returned_cache(out)
        logits = out.logits[:, -1, :].float()
    return torch.cat(new_tokens, dim=1)


@torch.no_grad()
def estimate_acceptance(
    target: torch.nn.Module,
    draft: torch.nn.Module,
    tokenizer: Any,
    prompts: Sequence[str],
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    seed: int = 0,
    max_context: int = 256,
) -> AcceptanceEstimate:
    """Estimate the per-token acceptance rate ``alpha`` of ``draft`` for ``target``.

    Args:
        target: causal LM (``model(input_ids=...)`` returning ``.logits``), eval mode.
        draft: causal LM over the same vocabulary, eval mode.
        tokenizer: tokenizer shared by both models (called as ``tokenizer(text)``).
        prompts: prompt strings; each is tokenized without special tokens.
        max_new_tokens: length of the target continuation measured per prompt.
        temperature: ``0`` for greedy (argmax agreement), ``> 0`` for sampling
            (mean of ``sum_x min(p, q)`` at that temperature).
        seed: seed of the sampling generator (ignored for greedy).
        max_context: prompts are left-truncated so that prompt plus continuation fit
            in this many positions (the demo models were trained on 256-token windows).

    Returns:
        An :class:`AcceptanceEstimate`; ``.alpha`` is the pooled mean over positions.

    Example:
        >>> from specdecode.demo import load_demo_pair, demo_prompts  # doctest: +SKIP
        >>> target, draft, tok = load_demo_pair()  # doctest: +SKIP
        >>> estimate_acceptance(target, draft, tok, demo_prompts(8)).alpha  # doctest: +SKIP
        0.7...
    """
    if temperature < 0:
        raise ValueError("temperature must be >= 0")
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be >= 1")
    if max_context <= max_new_tokens:
        raise ValueError("max_context must exceed max_new_tokens")
    device = next(target.parameters()).device
    generator = torch.Generator().manual_seed(seed) if temperature > 0 else None
    total = 0.0
    count = 0
    per_prompt: list[float] = []
    for prompt in prompts:
        ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
        ids = ids[:, -(max_context - max_new_tokens) :].to(device)
        if ids.shape[1] == 0:
            continue
        cont = _target_continuation(target, ids, max_new_tokens, temperature, generator)
        # Positions P-1 .. P+N-2 of the full sequence predict continuation tokens 0 .. N-1.
        seq = torch.cat([ids, cont[:, :-1]], dim=1)
        start = ids.shape[1] - 1
        t_logits = target(input_ids=seq).logits[0, start:, :].float()
        d_logits = draft(input_ids=seq).logits[0, start:, :].float()
        if temperature == 0.0:
            acc = (t_logits.argmax(-1) == d_logits.argmax(-1)).float()
        else:
            p = torch.softmax(t_logits / temperature, dim=-1)
            q = torch.softmax(d_logits / temperature, dim=-1)
            acc = torch.minimum(p, q).sum(-1)
        per_prompt.append(acc.mean().item())
        total += acc.sum().item()
        count += acc.numel()
    if count == 0:
        raise ValueError("no usable prompts")
    return AcceptanceEstimate(
        alpha=total / count,
        temperature=float(temperature),
        n_prompts=len(per_prompt),
        n_positions=count,
        max_new_tokens=max_new_tokens,
        per_prompt=per_prompt,
    )
