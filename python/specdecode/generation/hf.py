"""Hugging Face integration: model / vocabulary compatibility checks and the ``custom_generate``
plug-in for ``model.generate``.

>>> out = target.generate(**inputs, custom_generate=specdecode.custom_generate, draft_model=draft,
...                       num_draft_tokens=5, rule="block", max_new_tokens=64)

``transformers`` is imported lazily, so importing specdecode stays cheap.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

# Vocabulary sizes may differ by at most this many rows (or this fraction of the smaller one)
# when no tokenizers are given to prove that the difference is padding.
_MAX_PADDING_ROWS = 256
_MAX_PADDING_FRACTION = 0.02


# ------------------------------------------------------------------------------ model facts


def input_device(model: torch.nn.Module) -> torch.device:
    """Where a model's input ids must go: the device of its input embeddings."""
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if emb is not None and hasattr(emb, "weight"):
        return emb.weight.device
    return next(model.parameters()).device


def sliding_window(model: torch.nn.Module) -> int | None:
    """The model's sliding attention window in tokens, or None."""
    config = getattr(model, "config", None)
    window = getattr(config, "sliding_window", None)
    if window is None or getattr(config, "use_sliding_window", True) is False:
        return None
    return int(window)


def vocab_rows(model: torch.nn.Module) -> int:
    """Width of the model's logits: rows of its output embedding (config.vocab_size otherwise)."""
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    weight = getattr(out, "weight", None)
    if isinstance(weight, Tensor):
        return int(weight.shape[0])
    return int(model.config.vocab_size)


def _id_set(value: Any) -> set[int]:
    if value is None:
        return set()
    if isinstance(value, Tensor):
        return set(value.flatten().tolist())
    if isinstance(value, (list, tuple, set)):
        return {int(v) for v in value}
    return {int(value)}


def _check_model(name: str, model: Any) -> None:
    if not isinstance(model, torch.nn.Module) or not hasattr(model, "config"):
        raise TypeError(
            f"{name}: expected a Hugging Face causal LM (a torch.nn.Module with .config), got {type(model).__name__}"
        )
    if getattr(model.config, "is_encoder_decoder", False):
        raise ValueError(
            f"{name}: {type(model).__name__} is an encoder-decoder model; only decoder-only models are supported"
        )
    if not hasattr(model, "get_input_embeddings") or model.get_input_embeddings() is None:
        raise ValueError(f"{name}: {type(model).__name__} has no input embeddings (get_input_embeddings() is None)")
    meta = [n for n, p in model.named_parameters() if p.device.type == "meta"]
    if meta:
        raise ValueError(
            f"{name}: {len(meta)} parameter(s) are on the meta device (e.g. {meta[0]!r}): the weights were never "
            "loaded; load the model with real weights (or call .to_empty() and load a state dict) before generating"
        )


def _tokenizer_vocab(name: str, tokenizer: Any) -> dict[str, int]:
    if not hasattr(tokenizer, "get_vocab"):
        raise TypeError(f"{name}: expected a Hugging Face tokenizer (with get_vocab()), got {type(tokenizer).__name__}")
    return tokenizer.get_vocab()


def check_compatibility(target: torch.nn.Module, draft: torch.nn.Module, *, target_tokenizer: Any = None,
                        draft_tokenizer: Any = None) -> int:
    """Check that ``draft`` can draft for ``target`` and return the shared vocabulary size.

    Both must be decoder-only causal LMs with real (not meta) weights. Their logit widths may
    differ only by padding rows (e.g. 151936 vs 152064): verification then runs over the shared
    ids ``[0, min V)`` and no id outside it is ever proposed or emitted. With tokenizers, they
    must have the same vocabulary and special tokens, and every real token must lie in the
    shared range. Without tokenizers, the sizes may differ by at most
    ``max(256, 2% of the smaller)`` rows and the configs' BOS ids must agree and EOS ids
    overlap. Anything else raises ``ValueError`` (cross-tokenizer drafting is not supported).
    """
    _check_model("target", target)
    _check_model("draft", draft)
    vt, vd = vocab_rows(target), vocab_rows(draft)
    shared = min(vt, vd)
    if draft is target:
        return shared
    given = [(n, t) for n, t in (("target_tokenizer", target_tokenizer), ("draft_tokenizer", draft_tokenizer))
             if t is not None]
    if len(given) == 2 and target_tokenizer is not draft_tokenizer:
        tv = _tokenizer_vocab("target_tokenizer", target_tokenizer)
        dv = _tokenizer_vocab("draft_tokenizer", draft_tokenizer)
        if tv != dv:
            only_t = sorted(set(tv.items()) - set(dv.items()), key=lambda kv: kv[1])[:3]
            only_d = sorted(set(dv.items()) - set(tv.items()), key=lambda kv: kv[1])[:3]
            raise ValueError(
                f"draft_tokenizer: the target and draft tokenizers differ ({len(tv)} vs {len(dv)} entries; e.g. "
                f"target has {only_t}, draft has {only_d}); speculative decoding needs one shared tokenizer "
                "(cross-tokenizer drafting is not supported)"
            )
        for attr in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id"):
            a, b = getattr(target_tokenizer, attr, None), getattr(draft_tokenizer, attr, None)
            if a != b:
                raise ValueError(f"draft_tokenizer: {attr} differs between the tokenizers (target {a}, draft {b})")
    for name, tok in given:
        size = len(tok) if hasattr(tok, "__len__") else len(_tokenizer_vocab(name, tok))
        if size > shared:
            raise ValueError(
                f"{name}: the tokenizer has {size} tokens but the models' logits share only {shared} ids "
                f"(target {vt}, draft {vd}); the smaller vocabulary must cover every real token"
            )
    if not given:
        limit = max(_MAX_PADDING_ROWS, int(_MAX_PADDING_FRACTION * shared))
        if abs(vt - vd) > limit:
            raise ValueError(
                f"draft: vocabulary sizes differ too much to be padding (target {vt}, draft {vd}; at most {limit} "
                "padding rows are accepted without tokenizers): these models do not share a tokenizer "
                "(pass target_tokenizer= and draft_tokenizer= if they really do)"
            )
        tc, dc = target.config, draft.config
        tb, db = getattr(tc, "bos_token_id", None), getattr(dc, "bos_token_id", None)
        if tb is not None and db is not None and _id_set(tb) != _id_set(db):
            raise ValueError(
                f"draft: bos_token_id differs (target {tb}, draft {db}): the models do not share a tokenizer"
            )
        te, de = _id_set(getattr(tc, "eos_token_id", None)), _id_set(getattr(dc, "eos_token_id", None))
        if te and de and not (te & de):
            raise ValueError(
                f"draft: eos_token_id differs (target {sorted(te)}, draft {sorted(de)}): the models do not share a "
                "tokenizer (pass target_tokenizer= and draft_tokenizer= if they really do)"
            )
    return shared


# ------------------------------------------------------------------------- generate plug-in

_OUTPUT_CLASS: type | None = None


def _output_class() -> type:
    """``SpeculativeDecoderOnlyOutput``: HF's ``GenerateDecoderOnlyOutput`` plus ``stats``
    (built on first use so that importing specdecode does not import transformers)."""
    global _OUTPUT_CLASS
    if _OUTPUT_CLASS is None:
        from transformers.generation.utils import GenerateDecoderOnlyOutput

        from specdecode.generation.stats import SpeculativeStats

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
        return _output_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _split_processors(logits_processor: Any, do_sample: bool) -> tuple[Any, float, int, float, float]:
    """Take generate's sampling warpers (temperature, top-k, top-p, min-p) out of its processor
    list: verification applies them itself, to target and draft alike. Returns the remaining
    processors (None if there are none) and the sampling settings (temperature 0 = greedy)."""
    from transformers import LogitsProcessorList
    from transformers.generation.logits_process import (
        MinPLogitsWarper,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    temperature, top_k, top_p, min_p = 1.0, 0, 1.0, 0.0
    others = []
    for p in logits_processor or []:
        if isinstance(p, TemperatureLogitsWarper):
            temperature *= float(p.temperature)
        elif isinstance(p, TopKLogitsWarper):
            top_k = int(p.top_k) if top_k == 0 else min(top_k, int(p.top_k))
        elif isinstance(p, TopPLogitsWarper):
            top_p = min(top_p, float(p.top_p))
        elif isinstance(p, MinPLogitsWarper):
            min_p = max(min_p, float(p.min_p))
        else:
            others.append(p)
    if not do_sample:
        temperature, top_k, top_p, min_p = 0.0, 0, 1.0, 0.0
    return (LogitsProcessorList(others) if others else None), temperature, top_k, top_p, min_p


def custom_generate(
    model: torch.nn.Module,
    input_ids: Tensor,
    logits_processor: Any = None,
    stopping_criteria: Any = None,
    generation_config: Any = None,
    draft_model: torch.nn.Module | None = None,
    num_draft_tokens: int = 5,
    rule: str = "token",
    rule_options: dict[str, Any] | None = None,
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

    ``generate`` prepares the inputs, the logits processors, the stopping criteria and the
    generation config, then calls this function; it honours ``max_new_tokens`` /
    ``max_length``, ``do_sample``, ``temperature``, ``top_k``, ``top_p``, ``min_p``, EOS and
    pad ids, every other logits processor (applied to target and draft logits alike) and every
    stopping criterion (per row). It returns what ``generate`` returns: the sequences tensor,
    or with ``return_dict_in_generate=True`` an output object with ``.sequences`` and
    ``.stats``. Extra keyword arguments of ``generate`` understood here: ``draft_model``
    (required), ``num_draft_tokens``, ``rule``, ``rule_options`` (a dict), ``draft_schedule``,
    ``max_num_draft_tokens``, ``generator``, ``speculative_streamer``, ``speculative_stats``
    (a :class:`SpeculativeStats` to fill in place), ``target_tokenizer``, ``draft_tokenizer``.

    ``generate`` does not forward its own ``streamer`` (nor ``tokenizer``) to a callable
    ``custom_generate``, hence the ``speculative_streamer`` / ``*_tokenizer`` names.
    """
    from specdecode.generation.loop import _as_id_list, _check_inputs, _run, _split_stopping, _vocab_limit

    t_start = time.perf_counter()
    if draft_model is None:
        raise ValueError(
            "draft_model: pass the draft model, e.g. model.generate(**inputs, "
            "custom_generate=specdecode.custom_generate, draft_model=draft)"
        )
    vocab = check_compatibility(model, draft_model, target_tokenizer=target_tokenizer, draft_tokenizer=draft_tokenizer)
    config = generation_config if generation_config is not None else model.generation_config
    if getattr(config, "num_beams", 1) not in (None, 1):
        raise ValueError(f"num_beams: beam search is not supported by speculative decoding (got {config.num_beams})")
    if model_kwargs.get("inputs_embeds") is not None:
        raise ValueError("inputs_embeds: not supported; pass input_ids")
    cache = model_kwargs.get("past_key_values")
    if cache is not None and hasattr(cache, "get_seq_length") and cache.get_seq_length() > 0:
        raise ValueError("past_key_values: a pre-filled cache is not supported; both models' caches are built here")
    processors, temperature, top_k, top_p, min_p = _split_processors(logits_processor, bool(config.do_sample))
    stopping, max_length, eos_ids = _split_stopping(stopping_criteria)
    eos_ids = sorted(set(eos_ids) | set(_as_id_list("eos_token_id", getattr(config, "_eos_token_tensor", None))))
    pad = getattr(config, "_pad_token_tensor", None)
    pad_id = int(pad.flatten()[0]) if isinstance(pad, Tensor) else config.pad_token_id
    if max_length is None:
        max_length = config.max_length
    max_new_tokens = int(max_length) - int(input_ids.shape[1])
    if max_new_tokens < 1:
        raise ValueError(
            f"max_new_tokens: the prompt ({input_ids.shape[1]} tokens) leaves no room under max_length={max_length}"
        )
    mask = _check_inputs(input_ids, model_kwargs.get("attention_mask"), [], _vocab_limit(model, draft_model),
                         mask_required_for_pads=False)
    sequences, stats = _run(
        model, draft_model, input_ids, mask, num_draft_tokens=num_draft_tokens, rule=rule,
        rule_options=dict(rule_options or {}), max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
        top_p=top_p, min_p=min_p, eos_ids=eos_ids, pad_id=pad_id, processors=processors, stopping=stopping,
        streamer=speculative_streamer, draft_schedule=draft_schedule, max_num_draft_tokens=max_num_draft_tokens,
        generator=generator, vocab=vocab, stats=speculative_stats, t_start=t_start,
    )
    if getattr(config, "return_dict_in_generate", False):
        return _output_class()(sequences=sequences, stats=stats)
    return sequences
