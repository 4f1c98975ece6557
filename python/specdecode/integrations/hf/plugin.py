"""``custom_generate``: speculative decoding as a plug-in for ``model.generate``.

>>> out = target.generate(**inputs, custom_generate=specdecode.custom_generate, draft_model=draft,
...                       num_draft_tokens=5, rule="block", max_new_tokens=64)

``generate`` prepares the inputs, the logits processors, the stopping criteria and the
generation config, then calls :func:`custom_generate`; this module turns them into the engine's
settings. ``transformers`` is imported lazily, so importing specdecode stays cheap.
"""

from __future__ import annotations

import inspect
import sys
import time
from typing import Any

import torch
from torch import Tensor

from specdecode import cpu
from specdecode.engine.loop import run_engine
from specdecode.engine.schedules import default_schedule, make_schedule
from specdecode.engine.settings import EngineSettings
from specdecode.engine.stats import SpeculativeStats
from specdecode.integrations.hf import arguments as args
from specdecode.integrations.hf import hf_config
from specdecode.integrations.hf.drafter_sources import resolve_draft
from specdecode.integrations.hf.outputs import output_class, scores_and_logits
from specdecode.models.cache_io import CACHE_KEYWORDS

_KEYWORDS = (
    "draft_model", "assistant_model", "tokenizer", "assistant_tokenizer", "num_draft_tokens", "rule", "rule_options",
    "tree", "num_nodes", "tree_depth", "tree_children", "draft_schedule", "max_num_draft_tokens", "generator",
    "speculative_streamer", "speculative_stats", "target_tokenizer", "draft_tokenizer", "cpu_fast_path",
)


def __getattr__(name: str) -> Any:
    if name == "SpeculativeDecoderOnlyOutput":
        return output_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _dropped_by_generate() -> dict[str, Any]:
    """``assistant_model`` and ``streamer`` as given to ``model.generate``, which calls this
    plug-in directly.

    transformers (5.x) drops both before it calls a callable ``custom_generate`` (it forwards
    only the callable's own keywords), yet they are arguments of ``generate`` itself: read them
    from ``GenerationMixin.generate``'s frame, and only when that is exactly the caller (an
    empty dict otherwise)."""
    try:
        from transformers.generation.utils import GenerationMixin
    except ImportError:  # pragma: no cover - custom_generate is only called by transformers
        return {}
    # generate is wrapped by decorators (no_grad, and deprecation shims in newer releases): its own code
    code = getattr(inspect.unwrap(GenerationMixin.generate), "__code__", None)
    try:
        frame = sys._getframe(2)  # 0: this function, 1: custom_generate, 2: its caller
    except ValueError:  # no caller frame
        return {}
    if code is None or frame.f_code is not code:
        return {}
    return {name: frame.f_locals.get(name) for name in ("assistant_model", "streamer")}


class _AfterPrompt:
    """``generate``'s streamer, which ``generate`` already gave the prompt: the engine's first
    ``put`` (the prompt again) is dropped, everything after it passed on."""

    def __init__(self, streamer: Any) -> None:
        self.streamer = streamer
        self.prompt_seen = False

    def put(self, value: Any) -> None:
        if self.prompt_seen:
            self.streamer.put(value)
        self.prompt_seen = True

    def end(self) -> None:
        self.streamer.end()


def custom_generate(
    model: torch.nn.Module,
    input_ids: Tensor,
    logits_processor: Any = None,
    stopping_criteria: Any = None,
    generation_config: Any = None,
    draft_model: Any = None,
    assistant_model: Any = None,
    tokenizer: Any = None,
    assistant_tokenizer: Any = None,
    num_draft_tokens: int | None = None,
    rule: str | None = None,
    rule_options: dict[str, Any] | None = None,
    tree: Any = "auto",
    num_nodes: int | None = None,
    tree_depth: int | None = None,
    tree_children: str | None = None,
    draft_schedule: Any = None,
    max_num_draft_tokens: int | None = None,
    generator: torch.Generator | None = None,
    speculative_streamer: Any = None,
    speculative_stats: Any = None,
    target_tokenizer: Any = None,
    draft_tokenizer: Any = None,
    cpu_fast_path: bool | None = None,
    **model_kwargs: Any,
) -> Any:
    """Speculative decoding as a ``custom_generate`` callable for ``model.generate``.

    Shape:
        input_ids: ``[B, prompt_len]`` (prepared by ``generate``, left-padded);
        returns ``[B, prompt_len + new]`` sequences, or with ``return_dict_in_generate=True`` an
        output object with ``.sequences``, ``.scores`` / ``.logits`` (``output_scores`` /
        ``output_logits``: one ``[B, V]`` tensor per generated token) and ``.stats``.

    ``generate`` prepares the generation config, logits processors and stopping criteria from
    its own arguments (``max_new_tokens`` / ``max_length``, ``min_new_tokens``,
    ``repetition_penalty``, ``no_repeat_ngram_size``, ``bad_words_ids``, ``max_time``, EOS and
    pad ids, ``do_sample``, ``temperature``, ``top_k``, ``top_p``, ``min_p``, ...); every
    processor applies to target and draft logits alike and every stopping criterion per row.
    Settings speculative decoding cannot honour (beam search, contrastive search, attentions or
    hidden states in the output, ...) are a ``ValueError`` naming them.

    The draft: ``assistant_model`` (Hugging Face's name) or ``draft_model`` (a draft model or any
    drafter), or ``prompt_lookup_num_tokens=k`` (an :class:`~specdecode.drafters.NgramDrafter`
    drafting ``k`` tokens), or ``assistant_early_exit=k`` (a
    :class:`~specdecode.drafters.LayerSkipDrafter`); exactly one. Other keywords:
    ``num_draft_tokens``, ``rule``, ``rule_options`` (a dict), ``tree``, ``num_nodes``,
    ``tree_depth``, ``tree_children`` (token trees, as :func:`specdecode.generate`),
    ``draft_schedule``, ``max_num_draft_tokens``, ``generator``, ``speculative_streamer``,
    ``speculative_stats`` (a :class:`SpeculativeStats` to fill in place), ``target_tokenizer``,
    ``draft_tokenizer``, ``cpu_fast_path`` (:mod:`specdecode.cpu` during the call: None, the
    default, where the models allow it; True; False).

    transformers' ``generate`` does not forward its ``assistant_model``, ``streamer``,
    ``tokenizer`` or ``assistant_tokenizer`` to a callable ``custom_generate``. The first two
    are read from ``generate``'s own call (``streamer``: ``generate`` gives it the prompt, the
    plug-in each step's tokens, then ``end()``; ``speculative_streamer=`` still works). The
    tokenizers are lost (and ``generate`` refuses ``stop_strings`` without one before calling
    the plug-in): stop on text with ``stopping_criteria=[StopStringCriteria(tok, [...])]``, draft
    with another tokenizer through ``draft_model=TokenizerBridgeDrafter(...)``, or call
    :func:`specdecode.generate`, which takes them all. ``tokenizer`` and ``assistant_tokenizer``
    are honoured when they do arrive (a direct call).
    """
    start = time.perf_counter()
    dropped = _dropped_by_generate()
    if assistant_model is None:
        assistant_model = dropped.get("assistant_model")
    if dropped.get("streamer") is not None:
        if speculative_streamer is not None:
            raise ValueError("streamer and speculative_streamer: both name a streamer; pass one")
        speculative_streamer = _AfterPrompt(dropped["streamer"])
    if rule_options is not None and not isinstance(rule_options, dict):
        raise TypeError(f"rule_options: expected a dict or None, got {type(rule_options).__name__}")
    options = args.rule_options(rule, dict(rule_options or {}), "custom_generate", _KEYWORDS)
    config = generation_config if generation_config is not None else model.generation_config
    hf_config.check_supported(config)
    prepared = hf_config.from_prepared(config, logits_processor, stopping_criteria, int(input_ids.shape[1]))
    draft_model = args.draft_for_sampling(draft_model, prepared.sampling, tree)
    draft, num_draft_tokens = resolve_draft(
        model, {"draft_model": draft_model, "assistant_model": assistant_model}, num_draft_tokens=num_draft_tokens,
        tokenizer=tokenizer, assistant_tokenizer=assistant_tokenizer,
        prompt_lookup_num_tokens=getattr(config, "prompt_lookup_num_tokens", None),
        max_matching_ngram_size=getattr(config, "max_matching_ngram_size", None),
        assistant_early_exit=getattr(config, "assistant_early_exit", None),
    )
    draft, builder = args.tree_settings(draft, tree, num_nodes, tree_depth, tree_children)
    drafter, vocab, vocab_limit = args.as_drafter(model, draft, target_tokenizer=target_tokenizer,
                                                  draft_tokenizer=draft_tokenizer, tree=builder)
    if model_kwargs.get("inputs_embeds") is not None:
        raise ValueError("inputs_embeds: not supported; pass input_ids")
    for keyword in CACHE_KEYWORDS:  # generate's model kwargs hold the cache under the installed release's name
        cache = model_kwargs.get(keyword)
        if cache is not None and hasattr(cache, "get_seq_length") and cache.get_seq_length() > 0:
            raise ValueError(f"{keyword}: a pre-filled cache is not supported; both models' caches are built here")
    hf_config.check_tree(drafter, prepared)
    mask = args.check_input_ids(input_ids, model_kwargs.get("attention_mask"), [], vocab_limit,
                                mask_required_for_pads=False)
    if speculative_stats is not None and not isinstance(speculative_stats, SpeculativeStats):
        raise TypeError(f"speculative_stats: expected a SpeculativeStats or None, got {type(speculative_stats).__name__}")
    settings = EngineSettings(
        sampling=prepared.sampling, rule=rule, rule_options=options, max_new_tokens=prepared.max_new_tokens,
        eos_ids=prepared.eos_ids, pad_id=prepared.pad_id, processors=prepared.processors,
        stopping=prepared.stopping, streamer=speculative_streamer, generator=generator, vocab_size=vocab,
        schedule=make_schedule(draft_schedule if draft_schedule is not None else default_schedule(
            "eager", prepared.sampling, generator), num_draft_tokens, max_num_draft_tokens),
    )
    enabled = args.check_optional_bool("cpu_fast_path", cpu_fast_path)
    with torch.no_grad(), cpu.accelerated(model, args.draft_model_of(drafter), enabled=enabled):
        sequences, stats = run_engine(model, drafter, input_ids, mask, settings, speculative_stats, start_time=start)
    if not getattr(config, "return_dict_in_generate", False):
        return sequences
    scores, logits = scores_and_logits(
        model, sequences, mask, int(input_ids.shape[1]), prepared.score_processors,
        want_scores=bool(getattr(config, "output_scores", False)),
        want_logits=bool(getattr(config, "output_logits", False)),
    )
    return output_class()(sequences=sequences, scores=scores, logits=logits, stats=stats)
