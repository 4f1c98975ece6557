"""Can this draft model draft for this target? Vocabulary, tokenizer and model-kind checks.

``transformers`` is not imported here: the checks read configs, embeddings and tokenizers.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import Tensor

from specdecode.models.facts import check_model, vocab_rows

# Vocabulary sizes may differ by at most this many rows (or this fraction of the smaller one)
# when no tokenizers are given to prove that the difference is padding.
_MAX_PADDING_ROWS = 256
_MAX_PADDING_FRACTION = 0.02


def _id_set(value: Any) -> set[int]:
    if value is None:
        return set()
    if isinstance(value, Tensor):
        return set(value.flatten().tolist())
    if isinstance(value, (list, tuple, set)):
        return {int(v) for v in value}
    return {int(value)}


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
    overlap. Anything else raises ``ValueError``: a pair with different tokenizers drafts with
    :class:`specdecode.drafters.TokenizerBridgeDrafter`. A draft with more parameters than its
    target (the models passed in the wrong order?) gets a warning.
    """
    check_model("target", target)
    check_model("draft", draft)
    vt, vd = vocab_rows(target), vocab_rows(draft)
    shared = min(vt, vd)
    if draft is target:
        return shared
    target_params = sum(p.numel() for p in target.parameters())
    draft_params = sum(p.numel() for p in draft.parameters())
    if draft_params > target_params:
        warnings.warn(
            f"draft: the draft model has more parameters ({draft_params:,}) than the target ({target_params:,}); "
            "speculative decoding pays off with a much smaller draft (were target and draft swapped?)",
            UserWarning, stacklevel=3,
        )
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
                "(use specdecode.drafters.TokenizerBridgeDrafter for a draft with its own tokenizer)"
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
