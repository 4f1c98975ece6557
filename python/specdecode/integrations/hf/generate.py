"""``specdecode.generate``: speculative decoding of a Hugging Face causal LM, standalone."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from specdecode.engine.loop import run_engine
from specdecode.engine.schedules import DraftSchedule, make_schedule
from specdecode.engine.settings import EngineSettings
from specdecode.engine.stats import SpeculativeStats
from specdecode.integrations.hf import arguments as args
from specdecode.sampling import SamplingParams


@dataclass
class SpeculativeOutput:
    """Result of :func:`specdecode.generate`.

    Shape:
        sequences: ``[B, prompt_len + new]`` int64 — prompt (with its left padding) then the
            new tokens, right-padded with ``pad_token_id`` where a row finished early.
    """

    sequences: Tensor
    stats: SpeculativeStats


_KEYWORDS = (
    "num_draft_tokens", "rule", "max_new_tokens", "tree", "num_nodes", "tree_depth", "tree_children", "do_sample", "temperature", "top_k", "top_p", "min_p",
    "eos_token_id", "pad_token_id", "logits_processor", "stopping_criteria", "streamer", "draft_schedule",
    "max_num_draft_tokens", "generator", "target_tokenizer", "draft_tokenizer", "stats", "decode_path",
    "stop_check_every", "phase_timing",
)


@torch.no_grad()
def generate(
    target: torch.nn.Module,
    draft: Any,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    *,
    num_draft_tokens: int = 5,
    rule: str | None = None,
    max_new_tokens: int = 128,
    tree: Any = None,
    num_nodes: int = 16,
    tree_depth: int | None = None,
    tree_children: str | None = None,
    do_sample: bool = False,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    eos_token_id: int | list[int] | None = None,
    pad_token_id: int | None = None,
    logits_processor: Any = None,
    stopping_criteria: Any = None,
    streamer: Any = None,
    draft_schedule: str | DraftSchedule = "constant",
    max_num_draft_tokens: int | None = None,
    generator: torch.Generator | None = None,
    target_tokenizer: Any = None,
    draft_tokenizer: Any = None,
    stats: SpeculativeStats | None = None,
    decode_path: str = "eager",
    stop_check_every: int = 1,
    phase_timing: bool = False,
    **rule_options: Any,
) -> SpeculativeOutput:
    """Speculative decoding of ``target`` with ``draft``: the same output distribution as
    sampling from ``target`` (lossless rules), or exactly its greedy output at
    ``do_sample=False``.

    Shape:
        input_ids: ``[B, prompt_len]`` int64, left-padded for B > 1.
        attention_mask: ``[B, prompt_len]`` 0/1 or None (no padding).
        returns: ``SpeculativeOutput(sequences [B, prompt_len + new], stats)``.

    ``draft`` is a Hugging Face causal LM sharing the target's tokenizer (wrapped in a
    :class:`~specdecode.drafters.ModelDrafter`) or any drafter: ``NgramDrafter``,
    ``LayerSkipDrafter``, ``TokenizerBridgeDrafter`` or your own
    :class:`~specdecode.drafters.Drafter`. Sampling settings (``temperature``, ``top_k``,
    ``top_p``, ``min_p``; ``do_sample=False`` is greedy) and the HF ``logits_processor`` apply
    identically to target and draft. ``rule`` is any name from :func:`specdecode.list_rules`
    (chains; default ``token``) or :func:`specdecode.trees.list_tree_rules` (trees; default: the
    lossless rule of the tree's children scheme); its options are extra keywords (an unknown
    keyword is a ``TypeError``). ``tree`` drafts a token tree instead of a chain:
    ``"dynamic"`` (EAGLE-2, deterministic children), ``"sequoia"`` (optimal shape for the
    acceptance measured as it runs, children drawn without replacement), ``"static"``, a
    :class:`~specdecode.trees.TreeShape`, rank paths or a tree builder; ``num_nodes`` (root
    included), ``tree_depth`` and ``tree_children`` (``"deterministic"``, ``"iid"``,
    ``"without_replacement"``) shape it. ``eos_token_id`` /
    ``pad_token_id`` default to the target's generation config; each row stops at EOS,
    ``max_new_tokens`` or a stopping criterion and is then right-padded. ``streamer`` (batch 1)
    receives the prompt, each step's tokens, then ``end()``. ``draft_schedule``: ``"constant"``,
    ``"heuristic"``, ``"optimal"`` or a :class:`DraftSchedule`. ``generator`` drives every
    random choice, so a seed fixes the output.

    ``decode_path`` picks the engine: ``"eager"`` (default; everything above), ``"static"``
    (static KV caches, every step decided on the device, at most one host synchronisation per
    step; any device) or ``"graphed"`` (the static steps recorded once as CUDA graphs and
    replayed; CUDA only). The static paths take chains with a constant ``num_draft_tokens``,
    compiled rules, left-padded batches and no processors, stopping criteria or streamer; see
    :mod:`specdecode.engine.static_loop`. There, ``draft=None`` decodes the target alone, and
    ``stop_check_every=k`` checks for the end of the generation every ``k`` steps (each check
    is one host synchronisation). ``phase_timing=True`` times the draft, target, verify and
    bookkeeping phases separately (with ``"graphed"``: one CUDA graph per phase instead of one per
    step, a little slower); without it the graphed path times only whole steps.

    Example:
        >>> target, draft, tok = specdecode.load_demo_pair()
        >>> ids = tok(["def add(a, b):\\n"], return_tensors="pt").input_ids
        >>> out = specdecode.generate(target, draft, ids, max_new_tokens=16)
        >>> out.sequences.shape[1] <= ids.shape[1] + 16
        True
    """
    start = time.perf_counter()
    rule_options = args.rule_options(rule, rule_options, "generate", _KEYWORDS)
    decode_path = args.check_decode_path(decode_path, draft)
    draft, builder = args.tree_settings(draft, tree, num_nodes, tree_depth, tree_children)
    drafter, vocab, vocab_limit = args.as_drafter(target, draft, target_tokenizer=target_tokenizer,
                                                  draft_tokenizer=draft_tokenizer, tree=builder)
    sampling = SamplingParams.from_generate_kwargs(do_sample, temperature, top_k, top_p, min_p)
    gen_config = getattr(target, "generation_config", None)
    if eos_token_id is None and gen_config is not None:
        eos_token_id = gen_config.eos_token_id
    eos_ids = args.as_id_list("eos_token_id", eos_token_id)
    if pad_token_id is None and gen_config is not None:
        pad_token_id = getattr(gen_config, "pad_token_id", None)
    if pad_token_id is None:
        pad_token_id = getattr(target.config, "pad_token_id", None)
    if pad_token_id is not None:
        pad_token_id = args.as_id_list("pad_token_id", pad_token_id)[0]
    mask = args.check_input_ids(input_ids, attention_mask, [pad_token_id] if pad_token_id is not None else [],
                                vocab_limit, mask_required_for_pads=True)
    processors = args.as_processor_list(logits_processor)
    stopping, max_length, criteria_eos = args.split_stopping(stopping_criteria)
    eos_ids = sorted(set(eos_ids) | set(criteria_eos))
    args.check_int("max_new_tokens", max_new_tokens, 1)
    if max_length is not None:
        max_new_tokens = min(max_new_tokens, max_length - input_ids.shape[1])
        if max_new_tokens < 1:
            raise ValueError(
                f"stopping_criteria: MaxLengthCriteria(max_length={max_length}) leaves no room after the prompt"
            )
    args.check_int("num_draft_tokens", num_draft_tokens, 1)
    settings = EngineSettings(
        sampling=sampling, rule=rule, rule_options=rule_options, max_new_tokens=max_new_tokens, eos_ids=eos_ids,
        pad_id=eos_ids[0] if pad_token_id is None and eos_ids else (pad_token_id or 0), processors=processors,
        stopping=stopping, streamer=streamer, generator=generator, vocab_size=vocab,
        schedule=make_schedule(draft_schedule, num_draft_tokens, max_num_draft_tokens),
    )
    if decode_path == "eager":
        sequences, stats = run_engine(target, drafter, input_ids, mask, settings, stats, start_time=start)
    else:
        from specdecode.engine.static_loop import run_static_engine

        args.check_int("stop_check_every", stop_check_every, 1)
        sequences, stats = run_static_engine(target, drafter, input_ids, mask, settings, stats,
                                             decode_path=decode_path, stop_check_every=stop_check_every,
                                             phase_timing=bool(phase_timing), start_time=start)
    return SpeculativeOutput(sequences, stats)
