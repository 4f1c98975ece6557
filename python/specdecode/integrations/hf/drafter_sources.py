"""Where the draft comes from, under specdecode's names and Hugging Face's.

=============================================  ==============================================
argument                                       drafter
=============================================  ==============================================
``draft`` / ``draft_model``                    the model (a :class:`ModelDrafter`) or drafter
``assistant_model`` (HF)                       the same: a draft model sharing the tokenizer
``assistant_model`` + ``assistant_tokenizer``  :class:`TokenizerBridgeDrafter` (HF's universal
+ ``tokenizer`` (HF)                           assisted decoding: a draft of another tokenizer)
``prompt_lookup_num_tokens=k`` (HF)            :class:`NgramDrafter` drafting ``k`` tokens
                                               (``max_matching_ngram_size``: its longest n)
``assistant_early_exit=k`` (HF)                :class:`LayerSkipDrafter` with the first ``k``
                                               layers of the target
=============================================  ==============================================

Exactly one source: two at once is a ``ValueError`` naming both.
"""

from __future__ import annotations

from typing import Any

import torch

from specdecode.integrations.hf import arguments as args

DEFAULT_NUM_DRAFT_TOKENS = 5


def resolve_draft(target: torch.nn.Module, sources: dict[str, Any], *, num_draft_tokens: int | None,
                  tokenizer: Any = None, assistant_tokenizer: Any = None, prompt_lookup_num_tokens: Any = None,
                  max_matching_ngram_size: Any = None, assistant_early_exit: Any = None,
                  allow_none: bool = False) -> tuple[Any, int]:
    """``(draft, num_draft_tokens)``: the draft model or drafter that the arguments name, and
    the chain length (``num_draft_tokens``, or ``prompt_lookup_num_tokens``, or the drafter's
    ``default_num_draft_tokens``, or 5).

    ``sources`` maps the model/drafter arguments given under their own names (``draft``,
    ``draft_model``, ``assistant_model``) to their values; None values are ignored. With no
    source at all the draft is None (the target alone) when ``allow_none``, else a
    ``ValueError``."""
    given = {name: value for name, value in sources.items() if value is not None}
    if prompt_lookup_num_tokens is not None:
        given["prompt_lookup_num_tokens"] = prompt_lookup_num_tokens
    if assistant_early_exit is not None:
        given["assistant_early_exit"] = assistant_early_exit
    if len(given) > 1:
        names = list(given)
        raise ValueError(
            f"{', '.join(names[:-1])} and {names[-1]}: each names a draft; pass only one of them"
        )
    if assistant_tokenizer is not None and "assistant_model" not in given:
        raise ValueError("assistant_tokenizer: is the tokenizer of assistant_model (a draft with another tokenizer); "
                         "pass assistant_model= too")
    if num_draft_tokens is not None:
        args.check_int("num_draft_tokens", num_draft_tokens, 1)
    if not given:
        if allow_none:
            return None, num_draft_tokens or DEFAULT_NUM_DRAFT_TOKENS
        raise ValueError(
            "draft_model: no draft given; pass the draft model, e.g. model.generate(**inputs, "
            "custom_generate=specdecode.custom_generate, assistant_model=draft) (or draft_model=draft), "
            "or prompt_lookup_num_tokens=k for prompt lookup. Note: transformers' generate() does not forward "
            "tokenizer / assistant_tokenizer to a callable custom_generate"
        )
    (name, value), = given.items()
    if name == "prompt_lookup_num_tokens":
        from specdecode.drafters.ngram import NgramDrafter

        k = args.check_int("prompt_lookup_num_tokens", value, 1)
        if num_draft_tokens is not None and num_draft_tokens != k:
            raise ValueError(f"num_draft_tokens and prompt_lookup_num_tokens: both set the draft length "
                             f"({num_draft_tokens} vs {k}); pass one")
        if max_matching_ngram_size is None:
            return NgramDrafter(), k
        n = args.check_int("max_matching_ngram_size", max_matching_ngram_size, 1)
        return NgramDrafter(max_ngram=n, min_ngram=1), k
    if name == "assistant_early_exit":
        from specdecode.drafters.layer_skip import LayerSkipDrafter

        layers = args.check_int("assistant_early_exit", value, 1)
        return LayerSkipDrafter(target, num_layers=layers), num_draft_tokens or DEFAULT_NUM_DRAFT_TOKENS
    k = num_draft_tokens or getattr(value, "default_num_draft_tokens", None) or DEFAULT_NUM_DRAFT_TOKENS
    if name == "assistant_model":
        if not isinstance(value, torch.nn.Module):
            raise TypeError(f"assistant_model: expected a Hugging Face causal LM, got {type(value).__name__} "
                            "(a specdecode drafter goes to draft= / draft_model=)")
        if assistant_tokenizer is not None:
            from specdecode.drafters.tokenizer_bridge import TokenizerBridgeDrafter

            if tokenizer is None:
                raise ValueError("tokenizer: assistant_tokenizer (a draft with another tokenizer) needs the target's "
                                 "tokenizer too; pass tokenizer=")
            return TokenizerBridgeDrafter(value, assistant_tokenizer, tokenizer), k
    return value, k
