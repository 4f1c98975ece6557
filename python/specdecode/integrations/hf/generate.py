"""``specdecode.generate``: speculative decoding of a Hugging Face causal LM, standalone."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from specdecode import cpu
from specdecode.engine.loop import run_engine
from specdecode.engine.schedules import DraftSchedule, default_schedule, make_schedule
from specdecode.engine.settings import EngineSettings
from specdecode.engine.stats import SpeculativeStats
from specdecode.integrations.hf import arguments as args
from specdecode.integrations.hf import hf_config
from specdecode.integrations.hf.drafter_sources import resolve_draft
from specdecode.integrations.hf.outputs import scores_and_logits
from specdecode.models.facts import input_device
from specdecode.sampling import SamplingParams


@dataclass
class SpeculativeOutput:
    """Result of :func:`specdecode.generate`.

    Shape:
        sequences: ``[B, prompt_len + new]`` int64 — prompt (with its left padding) then the
            new tokens, right-padded with ``pad_token_id`` where a row finished early.
        scores: with ``output_scores=True``, ``new`` float32 tensors ``[B, V]``: the processed
            target logits of each generated token (as ``generate``'s ``scores``); else None.
        logits: with ``output_logits=True``, the same for the raw target logits; else None.
    """

    sequences: Tensor
    stats: SpeculativeStats
    scores: tuple[Tensor, ...] | None = None
    logits: tuple[Tensor, ...] | None = None


_KEYWORDS = (
    "num_draft_tokens", "rule", "max_new_tokens", "tree", "num_nodes", "tree_depth", "tree_children", "do_sample",
    "temperature", "top_k", "top_p", "min_p", "eos_token_id", "pad_token_id", "logits_processor", "stopping_criteria",
    "streamer", "draft_schedule", "max_num_draft_tokens", "generator", "target_tokenizer", "draft_tokenizer", "stats",
    "decode_path", "stop_check_every", "phase_timing", "generation_config", "assistant_model", "assistant_tokenizer",
    "tokenizer", "cpu_fast_path",
)
# specdecode.generate's own sampling defaults: greedy, no filter (not the model's generation config)
_SAMPLING_OFF = {"do_sample": False, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": None}


@torch.no_grad()
def generate(
    target: torch.nn.Module,
    draft: Any = None,
    input_ids: Tensor | None = None,
    attention_mask: Tensor | None = None,
    *,
    num_draft_tokens: int | None = None,
    rule: str | None = None,
    max_new_tokens: int | None = None,
    tree: Any = "auto",
    num_nodes: int | None = None,
    tree_depth: int | None = None,
    tree_children: str | None = None,
    do_sample: bool | None = None,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    eos_token_id: int | list[int] | None = None,
    pad_token_id: int | None = None,
    logits_processor: Any = None,
    stopping_criteria: Any = None,
    streamer: Any = None,
    draft_schedule: str | DraftSchedule | None = None,
    max_num_draft_tokens: int | None = None,
    generator: torch.Generator | None = None,
    target_tokenizer: Any = None,
    draft_tokenizer: Any = None,
    stats: SpeculativeStats | None = None,
    decode_path: str = "eager",
    stop_check_every: int = 1,
    phase_timing: bool = False,
    generation_config: Any = None,
    assistant_model: Any = None,
    assistant_tokenizer: Any = None,
    tokenizer: Any = None,
    cpu_fast_path: bool | None = None,
    **kwargs: Any,
) -> SpeculativeOutput:
    """Speculative decoding of ``target`` with ``draft``: the same output distribution as
    sampling from ``target`` (lossless rules), or exactly its greedy output at
    ``do_sample=False``.

    Shape:
        input_ids: ``[B, prompt_len]`` int64, left-padded for B > 1.
        attention_mask: ``[B, prompt_len]`` 0/1 or None (no padding).
        returns: ``SpeculativeOutput(sequences [B, prompt_len + new], stats, scores, logits)``;
            ``scores`` / ``logits``: ``new`` tensors ``[B, V]`` with ``output_scores`` /
            ``output_logits``, else None.

    ``draft`` is a Hugging Face causal LM sharing the target's tokenizer (wrapped in a
    :class:`~specdecode.drafters.ModelDrafter`) or any drafter: ``NgramDrafter``,
    ``LayerSkipDrafter``, ``TokenizerBridgeDrafter`` or your own
    :class:`~specdecode.drafters.Drafter`. Hugging Face's names for the draft work too (give
    one source only; two is a ``ValueError`` naming both): ``assistant_model=`` (a draft model;
    with ``assistant_tokenizer=`` and ``tokenizer=``, a draft with another tokenizer through a
    ``TokenizerBridgeDrafter``), ``prompt_lookup_num_tokens=k`` (an ``NgramDrafter`` drafting
    ``k`` tokens, ``max_matching_ngram_size`` its longest n-gram) and
    ``assistant_early_exit=k`` (a ``LayerSkipDrafter`` of the target's first ``k`` layers).

    Every other keyword of ``model.generate`` means what it means there: ``generation_config``
    (never modified) and any of its fields (``repetition_penalty``, ``min_new_tokens``,
    ``no_repeat_ngram_size``, ``bad_words_ids``, ``stop_strings`` with ``tokenizer=``,
    ``max_length``, ``max_time``, ``num_return_sequences``, ``output_scores``, ``output_logits``,
    ...), ``logits_processor`` and ``stopping_criteria``: the target's own ``generate``
    preparation builds the processors and criteria, so ``specdecode.generate`` and the
    ``custom_generate`` plug-in share them; processors apply identically to target and draft
    logits, criteria per row after every emitted token. What speculative decoding cannot honour
    (``num_beams > 1``, contrastive search, ``output_attentions``, ...) is a ``ValueError``
    naming it. Two defaults are specdecode's own, not the model's generation config: greedy
    decoding with no sampling filter unless ``do_sample`` / ``temperature`` / ``top_k`` /
    ``top_p`` / ``min_p`` (keywords, or fields of a ``generation_config`` you pass) say
    otherwise, and ``max_new_tokens=128`` unless ``max_new_tokens`` or ``max_length`` is given.
    The output is always a :class:`SpeculativeOutput` (``return_dict_in_generate`` is implied).
    ``scores`` / ``logits`` are one teacher-forced target forward over the output, processed
    per position as ``generate`` does (see :mod:`specdecode.integrations.hf.outputs`).

    ``rule`` is any name from :func:`specdecode.list_rules` (chains; default ``token``) or
    :func:`specdecode.trees.list_tree_rules` (trees; default: the lossless rule of the tree's
    children scheme); its options are extra keywords (an unknown keyword is a ``TypeError``).
    ``tree`` drafts a token tree instead of a chain: ``"dynamic"`` (EAGLE-2, deterministic
    children), ``"sequoia"`` (optimal shape for the acceptance measured as it runs, children
    drawn without replacement), ``"static"``, a :class:`~specdecode.trees.TreeShape`, rank
    paths or a tree builder; ``num_nodes`` (root included, default 16), ``tree_depth`` and
    ``tree_children`` (``"deterministic"``, ``"iid"``, ``"without_replacement"``, ``"hub"``) shape
    it and are refused without a tree. ``tree=None`` drafts a chain of ``num_draft_tokens``,
    even with a drafter built with a tree (its ``with_tree(None)`` copy; a drafter that cannot
    draft chains is refused). The default, ``"auto"``, keeps the drafter's own setting: a draft
    model drafts chains, a drafter built with a tree (or a trained drafter whose record names
    one) drafts that tree, whatever ``num_draft_tokens`` says. As in ``model.generate``,
    ``temperature`` / ``top_k`` / ``top_p`` / ``min_p`` without ``do_sample=True`` decode greedily
    and transformers warns that they are ignored.
    ``eos_token_id`` / ``pad_token_id`` default to the target's generation config; each row
    stops at EOS, ``max_new_tokens`` or a stopping criterion and is then right-padded.
    ``streamer`` (batch 1) receives the prompt, each step's tokens, then ``end()``.
    ``draft_schedule``: ``"auto"``, ``"constant"``, ``"heuristic"``, ``"optimal"`` or a
    :class:`DraftSchedule`; None (default) is ``"auto"`` on the eager path (up to
    ``num_draft_tokens``, shorter or none where the measured costs say drafting does not pay:
    :class:`~specdecode.engine.schedules.AdaptiveSchedule`), except when sampling with a
    ``generator`` (its timed choices would change the draws, and a seed fixes the output) or
    under ``torch.distributed`` with several ranks (they must take the same steps), and
    ``"constant"`` on the static paths. ``num_draft_tokens`` (default 5) is the chain length.
    ``generator`` drives every random choice, so a seed fixes the output.

    ``decode_path`` picks the engine: ``"eager"`` (default; everything above), ``"static"``
    (static KV caches, every step decided on the device, at most one host synchronisation per
    step; any device), ``"graphed"`` (the static steps recorded once as CUDA graphs and
    replayed; CUDA only) or ``"compiled"`` (the static steps and the target's prefill compiled
    by ``torch.compile`` once per layout, then on CUDA recorded as CUDA graphs; any device with
    Inductor: a C++ compiler on the CPU). The static paths take chains with a constant ``num_draft_tokens``,
    compiled rules, left-padded batches and no processors, stopping criteria or streamer; see
    :mod:`specdecode.engine.static_loop`. There, ``draft=None`` decodes the target alone, and
    ``stop_check_every=k`` checks for the end of the generation every ``k`` steps (each check
    is one host synchronisation). ``phase_timing=True`` times the draft, target, verify and
    bookkeeping phases separately (with ``"graphed"``: one CUDA graph per phase instead of one per
    step, a little slower); without it the graphed path times only whole steps.

    ``cpu_fast_path``: the CPU fast path for multi-token forwards (:mod:`specdecode.cpu`: the
    target's and the draft's ``nn.Linear`` layers multiply up to 32 rows reading each weight
    once) for the duration of the call. ``None`` (default) turns it on for models that
    :func:`specdecode.cpu.can_accelerate` accepts (all parameters on the CPU, float32 linear
    layers), ``True`` forces it, ``False`` keeps torch's own layers. It changes outputs only by
    float rounding; the models are left as they were afterwards. ``decode_path="compiled"``
    compiles the linear layers itself: there the fast path is off (``True`` is a ``ValueError``).

    Example:
        >>> target, draft, tok = specdecode.load_demo_pair()
        >>> ids = tok(["def add(a, b):\\n"], return_tensors="pt").input_ids
        >>> out = specdecode.generate(target, draft, ids, max_new_tokens=16)
        >>> out.sequences.shape[1] <= ids.shape[1] + 16
        True
    """
    start = time.perf_counter()
    if input_ids is None:
        raise TypeError("input_ids: required (generate(target, draft, input_ids, ...) or input_ids=...)")
    fields = hf_config.generation_fields()
    hf_kwargs = {k: v for k, v in kwargs.items() if k in fields}
    rule_options = args.rule_options(rule, {k: v for k, v in kwargs.items() if k not in fields}, "generate",
                                     _KEYWORDS + tuple(sorted(fields)))

    def given(name: str, value: Any = None) -> Any:  # explicit keyword, else the user's generation_config
        if value is not None:
            return value
        return hf_kwargs.get(name, getattr(generation_config, name, None) if generation_config is not None else None)

    sampling_values = {n: given(n, v) for n, v in (("do_sample", do_sample), ("temperature", temperature),
                                                  ("top_k", top_k), ("top_p", top_p), ("min_p", min_p))}
    sampling_values = {n: (_SAMPLING_OFF[n] if v is None else v) for n, v in sampling_values.items()}
    sampling = SamplingParams.from_generate_kwargs(**sampling_values)  # checks them, with specdecode's messages
    args.as_id_list("eos_token_id", eos_token_id)  # type check
    draft = args.draft_for_sampling(draft, sampling, tree)
    draft, num_draft_tokens = resolve_draft(
        target, {"draft": draft, "assistant_model": assistant_model}, num_draft_tokens=num_draft_tokens,
        tokenizer=tokenizer, assistant_tokenizer=assistant_tokenizer,
        prompt_lookup_num_tokens=given("prompt_lookup_num_tokens"),
        max_matching_ngram_size=given("max_matching_ngram_size"),
        assistant_early_exit=given("assistant_early_exit"), allow_none=True,
    )
    decode_path = args.check_decode_path(decode_path, draft)
    fast_path = args.check_optional_bool("cpu_fast_path", cpu_fast_path)
    if decode_path == "compiled":
        if fast_path:
            raise ValueError("cpu_fast_path: decode_path='compiled' compiles the linear layers with the rest of the "
                             "step, where the CPU fast path cannot run; leave cpu_fast_path unset (or False)")
        fast_path = False
    draft, builder = args.tree_settings(draft, tree, num_nodes, tree_depth, tree_children)
    drafter, vocab, vocab_limit = args.as_drafter(target, draft, target_tokenizer=target_tokenizer,
                                                  draft_tokenizer=draft_tokenizer, tree=builder)
    pad_token_id = given("pad_token_id", pad_token_id)
    mask = args.check_input_ids(input_ids, attention_mask, _pad_ids(target, pad_token_id), vocab_limit,
                                mask_required_for_pads=True)
    if max_new_tokens is not None:
        args.check_int("max_new_tokens", max_new_tokens, 1)
    if max_new_tokens is None and given("max_new_tokens") is None and given("max_length") is None:
        max_new_tokens = 128  # specdecode.generate's own default
    has_default_max_length = (given("max_length") is None
                              and getattr(getattr(target, "generation_config", None), "max_length", None) is None)
    overrides = {**hf_kwargs, "return_dict_in_generate": True}
    for name, value in (("max_new_tokens", max_new_tokens), ("eos_token_id", eos_token_id),
                        ("pad_token_id", pad_token_id)):
        if value is not None:
            overrides[name] = value
    if sampling.is_greedy:
        overrides["do_sample"] = False
        if not sampling_values["do_sample"]:  # as model.generate: the config's validation warns they are ignored
            overrides.update({n: v for n, v in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p),
                                                ("min_p", min_p)) if v is not None})
    else:
        overrides.update(sampling_values)
    device = input_device(target)
    ids = input_ids.to(device)
    config, processors, criteria = hf_config.prepare(
        target, ids, None if mask is None else mask.to(device), generation_config, overrides,
        logits_processor=logits_processor, stopping_criteria=stopping_criteria, tokenizer=tokenizer,
        has_default_max_length=has_default_max_length,
    )
    copies = int(getattr(config, "num_return_sequences", None) or 1)
    if copies > 1:
        if sampling.is_greedy:
            raise ValueError(f"num_return_sequences: greedy decoding returns one sequence per prompt (got {copies}); "
                             "pass do_sample=True")
        input_ids = input_ids.repeat_interleave(copies, dim=0)
        mask = None if mask is None else mask.repeat_interleave(copies, dim=0)
    prepared = hf_config.from_prepared(config, processors, criteria, int(input_ids.shape[1]))
    hf_config.check_tree(drafter, prepared)
    settings = EngineSettings(
        sampling=prepared.sampling, rule=rule, rule_options=rule_options, max_new_tokens=prepared.max_new_tokens,
        eos_ids=prepared.eos_ids, pad_id=prepared.pad_id, processors=prepared.processors,
        stopping=prepared.stopping, streamer=streamer, generator=generator, vocab_size=vocab,
        schedule=make_schedule(draft_schedule if draft_schedule is not None else default_schedule(
            decode_path, prepared.sampling, generator), num_draft_tokens, max_num_draft_tokens),
    )
    if decode_path != "eager":
        args.check_int("stop_check_every", stop_check_every, 1)
    with cpu.accelerated(target, args.draft_model_of(drafter), enabled=fast_path):
        if decode_path == "eager":
            sequences, stats = run_engine(target, drafter, input_ids, mask, settings, stats, start_time=start)
        else:
            from specdecode.engine.static_loop import run_static_engine

            sequences, stats = run_static_engine(target, drafter, input_ids, mask, settings, stats,
                                                 decode_path=decode_path, stop_check_every=stop_check_every,
                                                 phase_timing=bool(phase_timing), start_time=start)
    scores, logits = scores_and_logits(target, sequences, mask, int(input_ids.shape[1]), prepared.score_processors,
                                       want_scores=bool(config.output_scores), want_logits=bool(config.output_logits))
    return SpeculativeOutput(sequences, stats, scores, logits)


def _pad_ids(target: torch.nn.Module, pad_token_id: Any) -> list[int]:
    """The pad id a prompt batch may hold (given, else the target's generation config or
    config), as a list of at most one id."""
    if pad_token_id is None:
        pad_token_id = getattr(getattr(target, "generation_config", None), "pad_token_id", None)
    if pad_token_id is None:
        pad_token_id = getattr(target.config, "pad_token_id", None)
    return args.as_id_list("pad_token_id", pad_token_id)[:1]
