"""One argument layer for both entry points: Hugging Face's own ``GenerationConfig``,
``LogitsProcessorList`` and ``StoppingCriteriaList`` turned into the engine's settings.

``model.generate(..., custom_generate=specdecode.custom_generate)`` hands :func:`from_prepared`
the config, processors and criteria it prepared; :func:`specdecode.generate` builds the same
three with :func:`prepare` (the target's own preparation methods), then calls
:func:`from_prepared`. So every generation argument (``repetition_penalty``,
``min_new_tokens``, ``no_repeat_ngram_size``, ``bad_words_ids``, ``stop_strings``,
``max_time``, ...) means the same through both. ``transformers`` is imported lazily.
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch
from torch import Tensor

from specdecode.integrations.hf import arguments as args
from specdecode.sampling import SamplingParams


@lru_cache(maxsize=1)
def generation_fields() -> frozenset[str]:
    """The public attribute names of ``transformers.GenerationConfig`` (the keywords that
    ``model.generate`` reads into its generation config)."""
    from transformers import GenerationConfig

    config = GenerationConfig()
    names = set(config.to_dict()) | set(vars(config)) | set(config._get_default_generation_params())
    return frozenset(n for n in names if not n.startswith("_") and n != "transformers_version")


# Generation fields checked here, so a bad value is refused naming it (None: unset).
_INT_FIELDS = {"max_length": 1, "min_length": 0, "min_new_tokens": 0, "no_repeat_ngram_size": 0,
               "num_return_sequences": 1}
_POSITIVE_FLOAT_FIELDS = ("repetition_penalty", "max_time", "typical_p")


def check_values(config: Any) -> None:
    """``TypeError`` / ``ValueError`` naming a generation field with a bad value."""
    for name, minimum in _INT_FIELDS.items():
        value = getattr(config, name, None)
        if value is not None:
            args.check_int(name, value, minimum)
    for name in _POSITIVE_FLOAT_FIELDS:
        value = getattr(config, name, None)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{name}: expected a float > 0, got {value!r}")
        if not value > 0 or value == float("inf") or (name == "typical_p" and value > 1):
            bound = "in (0, 1]" if name == "typical_p" else "> 0 and finite"
            raise ValueError(f"{name}: expected a float {bound}, got {value}")


def check_supported(config: Any) -> None:
    """``ValueError`` naming each generation setting speculative decoding cannot honour, and why.

    ``config`` is a prepared ``GenerationConfig`` (defaults filled in)."""
    def value(name: str) -> Any:
        return getattr(config, name, None)

    check_values(config)

    if value("num_beams") not in (None, 1):
        raise ValueError(f"num_beams: beam search is not supported by speculative decoding (got {value('num_beams')}); "
                         "it verifies one sequence per row")
    if value("num_beam_groups") not in (None, 1) or value("diversity_penalty") not in (None, 0.0):
        raise ValueError("num_beam_groups / diversity_penalty: group beam search is not supported by speculative "
                         "decoding")
    if value("constraints") is not None or value("force_words_ids") is not None:
        raise ValueError("force_words_ids / constraints: constrained beam search is not supported by speculative "
                         "decoding")
    if value("penalty_alpha") not in (None, 0) and (value("top_k") or 0) > 1 and not value("do_sample"):
        raise ValueError("penalty_alpha: contrastive search is not supported by speculative decoding (it reranks "
                         "candidates with hidden states, not by the target's distribution)")
    if value("dola_layers") is not None:
        raise ValueError("dola_layers: DoLa decoding contrasts the target's own layers at every token; not "
                         "supported by speculative decoding")
    if value("guidance_scale") not in (None, 1, 1.0):
        raise ValueError("guidance_scale: classifier-free guidance runs the model a second time inside its logits "
                         "processor; not supported by speculative decoding")
    if value("use_mtp"):
        raise ValueError("use_mtp: multi-token-prediction drafting is Hugging Face's own; pass a drafter instead")
    if value("token_healing"):
        raise ValueError("token_healing: not supported by speculative decoding (it rewrites the prompt)")
    if value("return_dict_in_generate"):
        for name in ("output_attentions", "output_hidden_states"):
            if value(name):
                raise ValueError(
                    f"{name}: not collected by speculative decoding (the target attends over several drafted "
                    "tokens per forward, so there is no per-token tensor as generate returns); output_scores and "
                    "output_logits are supported"
                )


def prepare(model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor | None, generation_config: Any,
            overrides: dict[str, Any], *, logits_processor: Any = None, stopping_criteria: Any = None,
            tokenizer: Any = None, has_default_max_length: bool = False) -> tuple[Any, Any, Any]:
    """``(config, processors, criteria)`` as ``model.generate`` would prepare them for these
    inputs: a copy of ``generation_config`` (or the model's) updated with ``overrides`` (the
    user's ``generate`` keywords; the user's config is never modified), then the model's own
    logits processors and stopping criteria, ``logits_processor`` / ``stopping_criteria``
    merged in. ``tokenizer`` is what ``stop_strings`` needs.

    Shape:
        input_ids: ``[B, L]`` int64; attention_mask: ``[B, L]`` 0/1 or None.
    """
    from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

    if generation_config is not None and not isinstance(generation_config, GenerationConfig):
        raise TypeError(f"generation_config: expected a transformers.GenerationConfig or None, "
                        f"got {type(generation_config).__name__}")
    if generation_config is None:
        config, unused = model._prepare_generation_config(None, **overrides)  # a new config
    else:  # apply the overrides to a copy first (HF warns when a config comes with keywords)
        config = copy.deepcopy(generation_config)
        unused = config.update(**overrides)
        config, more = model._prepare_generation_config(config)
        unused.update(more)
    unused = {k: v for k, v in unused.items() if k not in ("output_attentions", "output_hidden_states")}
    if unused:
        raise TypeError(f"generate() got unexpected keyword arguments {sorted(unused)}")
    check_supported(config)
    length = int(input_ids.shape[1])
    device = input_ids.device
    _call_private(model._prepare_special_tokens, config, attention_mask is not None, device=device,
                  batch_size=input_ids.shape[0])
    config = model._prepare_generated_length(
        generation_config=config, has_default_max_length=has_default_max_length,
        has_default_min_length=config.min_length in (None, 0) and config.min_new_tokens is None,
        model_input_name="input_ids", inputs_tensor=input_ids, input_ids_length=length,
    )
    model_kwargs = {"attention_mask": attention_mask if attention_mask is not None else torch.ones_like(input_ids),
                    "use_cache": True}
    processors = model._get_logits_processor(
        generation_config=config, input_ids_seq_length=length, encoder_input_ids=input_ids,
        logits_processor=args.as_processor_list(logits_processor) or LogitsProcessorList(), device=device,
        model_kwargs=model_kwargs,
    )
    criteria = model._get_stopping_criteria(
        generation_config=config, stopping_criteria=_as_criteria_list(stopping_criteria) or StoppingCriteriaList(),
        tokenizer=tokenizer,
    )
    return config, processors, criteria


def _call_private(method: Any, *args: Any, **kwargs: Any) -> Any:
    """Call one of ``generate``'s private preparation steps with the keywords its installed
    release takes: their signatures grow between 5.x releases (``_prepare_special_tokens`` took no
    ``batch_size`` in 5.0), so a keyword the method does not name is left out."""
    try:
        params = inspect.signature(method).parameters
    except (TypeError, ValueError):
        return method(*args, **kwargs)
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        kwargs = {k: v for k, v in kwargs.items() if k in params}
    return method(*args, **kwargs)


def _as_criteria_list(stopping_criteria: Any) -> Any:
    if stopping_criteria is None:
        return None
    from transformers import StoppingCriteriaList

    if isinstance(stopping_criteria, StoppingCriteriaList):
        return stopping_criteria
    if isinstance(stopping_criteria, (list, tuple)):
        return StoppingCriteriaList(stopping_criteria)
    if callable(stopping_criteria):
        return StoppingCriteriaList([stopping_criteria])
    raise TypeError(
        f"stopping_criteria: expected a StoppingCriteriaList, a list of criteria or None, got {stopping_criteria!r}"
    )


@dataclass
class Prepared:
    """The engine's view of one prepared generation.

    - ``sampling``: from the processors' sampling warpers (greedy unless ``do_sample``);
    - ``processors``: the other logits processors (None if none), applied to target and draft;
    - ``stopping``: the stopping criteria besides EOS and max length (None if none);
    - ``eos_ids``, ``pad_id``, ``max_new_tokens``: the rest of the engine's settings;
    - ``score_processors``: the whole processor list, warpers included (what ``generate``'s
      ``scores`` are processed with).
    """

    sampling: SamplingParams
    processors: Any
    stopping: Any
    eos_ids: list[int]
    pad_id: int
    max_new_tokens: int
    score_processors: Any


def from_prepared(config: Any, processors: Any, criteria: Any, prompt_len: int) -> Prepared:
    """The engine's settings from ``generate``'s prepared config, processors and criteria:
    the sampling warpers become the engine's sampling (verification applies them to target and
    draft alike), EOS and max-length criteria its native stops."""
    others, sampling = args.split_sampling_warpers(processors, bool(getattr(config, "do_sample", False)))
    score_processors = args.as_processor_list(processors)
    stopping, max_length, eos_ids = args.split_stopping(criteria)
    eos_ids = sorted(set(eos_ids) | set(args.as_id_list("eos_token_id", getattr(config, "_eos_token_tensor", None))))
    pad = getattr(config, "_pad_token_tensor", None)
    pad_id = int(pad.flatten()[0]) if isinstance(pad, Tensor) else getattr(config, "pad_token_id", None)
    if max_length is None:
        max_length = config.max_length
    max_new_tokens = int(max_length) - int(prompt_len)
    if max_new_tokens < 1:
        raise ValueError(
            f"max_new_tokens: the prompt ({prompt_len} tokens) leaves no room under max_length={max_length}"
        )
    pad_id = eos_ids[0] if pad_id is None and eos_ids else (pad_id or 0)
    return Prepared(sampling, others, stopping, eos_ids, int(pad_id), max_new_tokens, score_processors)


def check_tree(drafter: Any, prepared: Prepared) -> None:
    """Token trees take no logits processors (each node has its own context): a ``ValueError``
    naming the processors, whether ``logits_processor=`` or generation arguments such as
    ``repetition_penalty`` made them, when ``drafter`` drafts trees (a tree builder, rank paths
    or tries)."""
    drafts_trees = any(getattr(drafter, name, None) is not None for name in ("tree", "choices", "num_nodes"))
    if drafts_trees and prepared.processors is not None and len(prepared.processors):
        names = ", ".join(type(p).__name__ for p in prepared.processors)
        raise ValueError(
            f"tree: logits processors ({names}, from logits_processor= or generation arguments such as "
            "repetition_penalty) are not supported with token trees; draft a chain (tree=None) to use them"
        )
