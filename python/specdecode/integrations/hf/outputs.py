"""What ``return_dict_in_generate=True`` returns, and the ``scores`` / ``logits`` that
``output_scores`` / ``output_logits`` ask for.

Speculative decoding scores several drafted tokens per target forward and rolls rejected ones
back, so there is no natural "one forward per token" to record. The scores are computed once
the sequences are known instead: one teacher-forced forward of the target over the whole
output (the cost of one prefill), then, for each generated position, the logits processors
applied to that position's context exactly as ``generate`` applies them at that step. That is
what ``generate`` documents: one ``[B, V]`` entry per generated token, ``logits`` raw and
``scores`` processed (warpers included when sampling), rows that already finished seeing the
padding ``generate`` would have fed them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from specdecode.engine.stats import SpeculativeStats

_OUTPUT_CLASS: type | None = None


def output_class() -> type:
    """``SpeculativeDecoderOnlyOutput``: HF's ``GenerateDecoderOnlyOutput`` plus ``stats``
    (built on first use so that importing specdecode does not import transformers)."""
    global _OUTPUT_CLASS
    if _OUTPUT_CLASS is None:
        from transformers.generation.utils import GenerateDecoderOnlyOutput

        @dataclass
        class SpeculativeDecoderOnlyOutput(GenerateDecoderOnlyOutput):
            """What ``model.generate(..., custom_generate=specdecode.custom_generate,
            return_dict_in_generate=True)`` returns: ``sequences`` as usual, ``scores`` /
            ``logits`` when ``output_scores`` / ``output_logits`` ask for them (one ``[B, V]``
            tensor per generated token), ``stats`` a :class:`SpeculativeStats`. Attentions and
            hidden states are not collected (asking for them is a ``ValueError``)."""

            stats: SpeculativeStats | None = None

        SpeculativeDecoderOnlyOutput.__module__ = "specdecode.integrations.hf.plugin"
        _OUTPUT_CLASS = SpeculativeDecoderOnlyOutput
    return _OUTPUT_CLASS


@torch.no_grad()
def scores_and_logits(target: torch.nn.Module, sequences: Tensor, attention_mask: Tensor | None, prompt_len: int,
                      processors: Any, *, want_scores: bool, want_logits: bool
                      ) -> tuple[tuple[Tensor, ...] | None, tuple[Tensor, ...] | None]:
    """``(scores, logits)`` for the generated tokens of ``sequences`` (each None unless asked).

    Shape:
        sequences: ``[B, L + new]`` int64 (prompt, then the generated tokens, right-padded);
        attention_mask: ``[B, L]`` 0/1 for the prompt, or None (no padding);
        returns: tuples of ``new`` float32 tensors ``[B, V]`` (V: the target's logit width).
    """
    if not (want_scores or want_logits):
        return None, None
    new = int(sequences.shape[1]) - int(prompt_len)
    if new <= 0:
        return (() if want_scores else None), (() if want_logits else None)
    batch = sequences.shape[0]
    prompt_mask = attention_mask if attention_mask is not None else torch.ones(
        (batch, prompt_len), dtype=torch.long, device=sequences.device)
    prompt_mask = prompt_mask.to(device=sequences.device, dtype=torch.long)
    mask = torch.cat([prompt_mask, prompt_mask.new_ones((batch, new))], dim=1)
    context = sequences[:, :-1]
    positions = (mask[:, :-1].cumsum(-1) - 1).clamp_min(0)
    out = target(input_ids=context, attention_mask=mask[:, :-1], position_ids=positions, use_cache=False)
    raw = out.logits[:, prompt_len - 1:].to(torch.float32)  # [B, new, V]
    logits = tuple(raw[:, i].clone() for i in range(new)) if want_logits else None
    scores = None
    if want_scores:
        steps = []
        for i in range(new):
            step = raw[:, i].clone()
            if processors is not None:
                step = processors(sequences[:, : prompt_len + i], step)
            steps.append(step)
        scores = tuple(steps)
    return scores, logits
