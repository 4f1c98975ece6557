"""``custom_generate``: speculative decoding as a plug-in for ``model.generate``.

>>> out = target.generate(**inputs, custom_generate=specdecode.custom_generate, draft_model=draft,
...                       num_draft_tokens=5, rule="block", max_new_tokens=64)

``generate`` prepares the inputs, the logits processors, the stopping criteria and the
generation config, then calls :func:`custom_generate`; this module turns them into the engine's
settings. ``transformers`` is imported lazily, so importing specdecode stays cheap.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from specdecode.engine.loop import run_engine
from specdecode.engine.schedules import make_schedule
from specdecode.engine.settings import EngineSettings
from specdecode.engine.stats import SpeculativeStats
from specdecode.integrations.hf import arguments as args

_OUTPUT_CLASS: type | None = None

_KEYWORDS = (
    "draft_model", "num_draft_tokens", "rule", "rule_options", "tree", "num_nodes", "tree_depth", "tree_children", "draft_schedule", "max_num_draft_tokens",
    "generator", "speculative_streamer", "speculative_stats", "target_tokenizer", "draft_tokenizer",
)


def output_class() -> type:
    """``SpeculativeDecoderOnlyOutput``: HF's ``GenerateDecoderOnlyOutput`` plus ``stats``
    (built on first use so that importing specdecode does not import transformers)."""
    global _OUTPUT_CLASS
    if _OUTPUT_CLASS is None:
        from transformers.generation.utils import GenerateDecoderOnlyOutput

        @dataclass
        class SpeculativeDecoderOnlyOutput(GenerateDecoderOnlyOutput):
            """What ``model.generate(..., custom_generate=specdecode.custom_generate,
            return_dict_in_generate=True)`` returns: ``sequences`` as usual, ``stats`` a
            :class:`SpeculativeStats`. Scores, logits, attentions and hidden states are not
            collected (None)."""

            stats: SpeculativeStats | None = None

        SpeculativeDecoderOnlyOutput.__module__ = __name__
        _OUTPUT_CLASS = SpeculativeDecoderOnlyOutput
    return _OUTPUT_CLASS


def __getattr__(name: str) -> Any:
    if name == "SpeculativeDecoderOnlyOutput":
        return output_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def custom_generate(
    model: torch.nn.Module,
    input_ids: Tensor,
    logits_processor: Any = None,
    stopping_criteria: Any = None,
    generation_config: Any = None,
    draft_model: Any = None,
    num_draft_tokens: int = 5,
    rule: str | None = None,
    rule_options: dict[str, Any] | None = None,
    tree: Any = None,
    num_nodes: int = 16,
    tree_depth: int | None = None,
    tree_children: str | None = None,
    draft_schedule: Any = "constant",
    max_num_draft_tokens: int | None = None,
    generator: torch.Generator | None = None,
    speculative_streamer: Any = None,
    speculative_stats: Any = None,
    target_tokenizer: Any = None,
    draft_tokenizer: Any = None,
    **model_kwargs: Any,
) -> Any:
    """Speculative decoding as a ``custom_generate`` callable for ``model.generate``.

    Shape:
        input_ids: ``[B, prompt_len]`` (prepared by ``generate``, left-padded);
        returns ``[B, prompt_len + new]`` sequences, or with ``return_dict_in_generate=True`` an
        output object with ``.sequences`` and ``.stats``.

    It honours ``max_new_tokens`` / ``max_length``, ``do_sample``, ``temperature``, ``top_k``,
    ``top_p``, ``min_p``, EOS and pad ids, every other logits processor (applied to target and
    draft logits alike) and every stopping criterion (per row). Extra keyword arguments of
    ``generate`` understood here: ``draft_model`` (required: a draft model or any drafter),
    ``num_draft_tokens``, ``rule``, ``rule_options`` (a dict), ``tree``, ``num_nodes``,
    ``tree_depth``, ``tree_children`` (token trees, as :func:`specdecode.generate`), ``draft_schedule``,
    ``max_num_draft_tokens``, ``generator``, ``speculative_streamer``, ``speculative_stats`` (a
    :class:`SpeculativeStats` to fill in place), ``target_tokenizer``, ``draft_tokenizer``.
    ``generate`` does not forward its own ``streamer`` (nor ``tokenizer``) to a callable
    ``custom_generate``, hence the ``speculative_*`` / ``*_tokenizer`` names.
    """
    start = time.perf_counter()
    if draft_model is None:
        raise ValueError(
            "draft_model: pass the draft model, e.g. model.generate(**inputs, "
            "custom_generate=specdecode.custom_generate, draft_model=draft)"
        )
    if rule_options is not None and not isinstance(rule_options, dict):
        raise TypeError(f"rule_options: expected a dict or None, got {type(rule_options).__name__}")
    options = args.rule_options(rule, dict(rule_options or {}), "custom_generate", _KEYWORDS)
    draft_model, builder = args.tree_settings(draft_model, tree, num_nodes, tree_depth, tree_children)
    drafter, vocab, vocab_limit = args.as_drafter(model, draft_model, target_tokenizer=target_tokenizer,
                                                  draft_tokenizer=draft_tokenizer, tree=builder)
    config = generation_config if generation_config is not None else model.generation_config
    if getattr(config, "num_beams", 1) not in (None, 1):
        raise ValueError(f"num_beams: beam search is not supported by speculative decoding (got {config.num_beams})")
    if model_kwargs.get("inputs_embeds") is not None:
        raise ValueError("inputs_embeds: not supported; pass input_ids")
    cache = model_kwargs.get("past_key_values")
    if cache is not None and hasattr(cache, "get_seq_length") and cache.get_seq_length() > 0:
        raise ValueError("past_key_values: a pre-filled cache is not supported; both models' caches are built here")
    processors, sampling = args.split_sampling_warpers(logits_processor, bool(config.do_sample))
    stopping, max_length, eos_ids = args.split_stopping(stopping_criteria)
    eos_ids = sorted(set(eos_ids) | set(args.as_id_list("eos_token_id", getattr(config, "_eos_token_tensor", None))))
    pad = getattr(config, "_pad_token_tensor", None)
    pad_id = int(pad.flatten()[0]) if isinstance(pad, Tensor) else config.pad_token_id
    if max_length is None:
        max_length = config.max_length
    max_new_tokens = int(max_length) - int(input_ids.shape[1])
    if max_new_tokens < 1:
        raise ValueError(
            f"max_new_tokens: the prompt ({input_ids.shape[1]} tokens) leaves no room under max_length={max_length}"
        )
    mask = args.check_input_ids(input_ids, model_kwargs.get("attention_mask"), [], vocab_limit,
                                mask_required_for_pads=False)
    args.check_int("num_draft_tokens", num_draft_tokens, 1)
    if speculative_stats is not None and not isinstance(speculative_stats, SpeculativeStats):
        raise TypeError(f"speculative_stats: expected a SpeculativeStats or None, got {type(speculative_stats).__name__}")
    settings = EngineSettings(
        sampling=sampling, rule=rule, rule_options=options, max_new_tokens=max_new_tokens, eos_ids=eos_ids,
        pad_id=eos_ids[0] if pad_id is None and eos_ids else (pad_id or 0), processors=processors,
        stopping=stopping, streamer=speculative_streamer, generator=generator, vocab_size=vocab,
        schedule=make_schedule(draft_schedule, num_draft_tokens, max_num_draft_tokens),
    )
    with torch.no_grad():
        sequences, stats = run_engine(model, drafter, input_ids, mask, settings, speculative_stats, start_time=start)
    if getattr(config, "return_dict_in_generate", False):
        return output_class()(sequences=sequences, stats=stats)
    return sequences
