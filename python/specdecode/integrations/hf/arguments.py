"""Argument normalisation shared by :func:`specdecode.generate` and the ``custom_generate``
plug-in: every user-facing check lives here, once, each raising ``TypeError`` / ``ValueError``
that names the argument."""

from __future__ import annotations

import difflib
from typing import Any, Iterable

import torch
from torch import Tensor

from specdecode.drafters.base import Drafter, TreeBuilderDrafter
from specdecode.drafters.model import ModelDrafter
from specdecode.engine.static_loop import DECODE_PATHS
from specdecode.integrations.hf.compat import check_compatibility
from specdecode.models.facts import check_model, vocab_rows
from specdecode.rules import builtin_rule_params, get_rule, is_chain_rule, list_rules, rule_option_names
from specdecode.trees.builders import make_tree_builder
from specdecode.trees.rules import get_tree_rule, is_tree_rule, list_tree_rules, tree_rule_params
from specdecode.sampling import SamplingParams


def check_int(name: str, value: Any, minimum: int) -> int:
    """``value`` as an int >= ``minimum``, or ``TypeError`` / ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int >= {minimum}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value}")
    return value


def as_id_list(name: str, value: Any) -> list[int]:
    """An int, a list of ints, a tensor of ids or None, as a list of ints."""
    if value is None:
        return []
    if isinstance(value, Tensor):
        value = value.flatten().tolist()
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return list(value)
    raise TypeError(f"{name}: expected an int, a list of ints or None, got {value!r}")


def unknown_keyword_error(function: str, name: str, valid: Iterable[str]) -> TypeError:
    """``TypeError`` for an unexpected keyword, suggesting the closest valid name."""
    close = difflib.get_close_matches(name, sorted(valid), n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return TypeError(f"{function}() got an unexpected keyword argument {name!r}{hint}")


def rule_options(rule: str | None, options: dict[str, Any], function: str, other_keywords: Iterable[str]
                 ) -> dict[str, Any]:
    """Check ``options`` against the names ``rule`` declares (a chain rule, a tree rule, or
    None: the default rule, which takes none). An unknown name is a ``TypeError`` from
    ``function``, suggesting the closest of the rule's options and ``other_keywords`` (the
    function's own keywords: most unknown names are typos of those)."""
    if rule is None:
        declared: frozenset[str] | None = frozenset()
    elif is_tree_rule(rule) and not is_chain_rule(rule):
        info = get_tree_rule(rule)
        declared = frozenset(info.options)
    else:
        info = get_rule(rule)
        declared = rule_option_names(info)
    if declared is not None:
        for name in options:
            if name not in declared:
                owners = rules_with_option(name)
                if owners:  # another rule's option: say what this rule takes, not a look-alike keyword
                    label = "the default rule 'token'" if rule is None else f"rule {rule!r}"
                    allowed = ", ".join(sorted(declared)) or "none"
                    raise TypeError(f"{function}(): {label} got unexpected option(s) {sorted(set(options) - declared)}; "
                                    f"its options: {allowed} ({name} is an option of {', '.join(owners)})")
                raise unknown_keyword_error(function, name, set(declared) | set(other_keywords))
    if rule is not None and is_tree_rule(rule) and not is_chain_rule(rule):
        tree_rule_params(get_tree_rule(rule), options)
    elif rule is not None and get_rule(rule).builtin:
        builtin_rule_params(get_rule(rule), options)  # value checks
    return dict(options)


def rules_with_option(name: str) -> list[str]:
    """The chain and tree rules that declare an option called ``name``, as ``"rule 'x'"`` /
    ``"tree rule 'x'"`` labels (empty when none does)."""
    owners = [f"rule {info.name!r}" for info in list_rules() if name in (rule_option_names(info) or ())]
    return owners + [f"tree rule {info.name!r}" for info in list_tree_rules() if name in info.options]


#: ``generate``'s default ``tree``: the drafter's own setting (a draft model drafts chains;
#: a drafter built with a tree, or a trained drafter whose record names one, drafts that tree).
DRAFTER_TREE = "auto"


def is_drafter_tree(tree: Any) -> bool:
    """Whether ``tree`` is :data:`DRAFTER_TREE` (no tree asked for by ``generate``'s caller)."""
    return isinstance(tree, str) and tree == DRAFTER_TREE


def asks_for_tree(tree: Any) -> bool:
    """Whether ``generate``'s ``tree`` names a tree (neither None nor :data:`DRAFTER_TREE`)."""
    return tree is not None and not is_drafter_tree(tree)


def draft_for_sampling(draft: Any, sampling: Any, tree: Any) -> Any:
    """The drafter a generation uses: when it samples and ``tree`` is the drafter's own
    (:data:`DRAFTER_TREE`), a drafter's own settings for sampling (``for_sampling()``, e.g. a
    trained drafter whose record drafts a chain at T > 0); otherwise ``draft`` as given."""
    if not sampling.is_greedy and is_drafter_tree(tree) and callable(getattr(draft, "for_sampling", None)):
        return draft.for_sampling()
    return draft


def tree_settings(draft: Any, tree: Any, num_nodes: int | None, tree_depth: int | None, tree_children: str | None
                  ) -> tuple[Any, Any]:
    """``(draft, builder)`` for ``generate``'s tree arguments. ``tree=None`` asks for a chain:
    a drafter that carries a tree is replaced by its chain-drafting copy (``with_tree(None)``),
    or refused when it has none. A tree name with a drafter that builds its own trees (one with a
    ``with_tree`` method, e.g. :class:`~specdecode.drafters.NgramDrafter`) gives its
    tree-drafting copy (builder None); with a draft model, :func:`tree_builder`. ``num_nodes``,
    ``tree_depth`` and ``tree_children`` shape a tree and are refused without one."""
    if not asks_for_tree(tree):
        given = [n for n, v in (("num_nodes", num_nodes), ("tree_depth", tree_depth), ("tree_children", tree_children))
                 if v is not None]
        if given:
            raise ValueError(f"tree: {' / '.join(given)} shape a token tree; pass tree=... ('dynamic', 'sequoia', "
                             "'static', ...) with them")
        return (chain_drafter(draft) if tree is None else draft), None
    num_nodes = DEFAULT_NUM_NODES if num_nodes is None else num_nodes
    if not isinstance(draft, torch.nn.Module) and callable(getattr(draft, "with_tree", None)):
        check_int("num_nodes", num_nodes, 2)
        if tree_depth is not None:
            check_int("tree_depth", tree_depth, 1)
        return draft.with_tree(tree, num_nodes=num_nodes, tree_depth=tree_depth, tree_children=tree_children), None
    return draft, tree_builder(draft, tree, num_nodes, tree_depth, tree_children)


#: Nodes of a tree (root included) when ``tree=`` is given without ``num_nodes``.
DEFAULT_NUM_NODES = 16


def chain_drafter(draft: Any) -> Any:
    """``draft`` drafting chains (``generate(..., tree=None)``): as it is when it drafts chains,
    its ``with_tree(None)`` copy when it carries a tree builder, else a ``ValueError`` saying
    how to get a chain."""
    if draft is None or isinstance(draft, torch.nn.Module):
        return draft
    if isinstance(draft, TreeBuilderDrafter):
        return draft if draft.tree is None else draft.with_tree(None)
    if getattr(draft, "choices", None) is not None or getattr(draft, "num_nodes", None) is not None:
        raise ValueError(f"tree: None asks for a chain, but this {type(draft).__name__} drafts the tree it was built "
                         f"with; build one without a tree (e.g. {type(draft).__name__}(...) without tree= / num_nodes=) "
                         "for chains")
    return draft


def tree_builder(draft: Any, tree: Any, num_nodes: int, tree_depth: int | None, tree_children: str | None) -> Any:
    """The ``TreeBuilder`` for ``generate``'s tree arguments; a tree goes with a draft *model*
    (a drafter instance carries its own tree settings)."""
    if not isinstance(draft, torch.nn.Module):
        if not hasattr(draft, "tree"):
            raise ValueError(
                f"tree: {type(draft).__name__} drafts chains only; trees come from a draft model (tree=... with a "
                "model, or ModelDrafter(model, tree=DynamicTree(16))) or NgramDrafter (tree='trie')"
            )
        raise ValueError(
            "tree: configure the tree on the drafter itself (e.g. ModelDrafter(model, tree=DynamicTree(16))); "
            "tree= applies when draft is a model"
        )
    check_int("num_nodes", num_nodes, 2)
    if tree_depth is not None:
        check_int("tree_depth", tree_depth, 1)
    return make_tree_builder(tree, num_nodes=num_nodes, max_depth=tree_depth, children=tree_children)


def check_input_ids(input_ids: Any, attention_mask: Any, pad_ids: list[int], vocab_limit: int,
                    mask_required_for_pads: bool) -> Tensor | None:
    """Check a left-padded prompt batch; returns the mask as int64 (None if none was given).

    Shape:
        input_ids: ``[B, L]`` integer ids; attention_mask: ``[B, L]`` 0/1 or None.
    """
    if not isinstance(input_ids, Tensor):
        raise TypeError(f"input_ids: expected a torch.Tensor of shape [B, prompt_len], got {type(input_ids).__name__}")
    if input_ids.dim() != 2 or input_ids.shape[0] < 1 or input_ids.shape[1] < 1:
        raise ValueError(
            f"input_ids: expected shape [B, prompt_len] with B, prompt_len >= 1, got {tuple(input_ids.shape)}"
        )
    if input_ids.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
        raise TypeError(f"input_ids: expected an integer tensor (int64), got {input_ids.dtype}")
    if input_ids.device.type == "meta":
        raise ValueError("input_ids: is on the meta device; pass real token ids")
    lo, hi = int(input_ids.min()), int(input_ids.max())
    if attention_mask is None:
        if mask_required_for_pads and input_ids.shape[0] > 1 and pad_ids and bool(
            torch.isin(input_ids, torch.tensor(pad_ids, device=input_ids.device)).any()
        ):
            raise ValueError(
                "attention_mask: input_ids holds pad tokens (a padded batch) but no attention_mask was given; "
                "pass the tokenizer's attention_mask (left padding), or an all-ones mask if those ids are real tokens"
            )
        if lo < 0 or hi >= vocab_limit:
            raise ValueError(
                f"input_ids: every id must lie in [0, {vocab_limit}) (both models' vocabularies), got [{lo}, {hi}]"
            )
        return None
    if not isinstance(attention_mask, Tensor):
        raise TypeError(f"attention_mask: expected a torch.Tensor or None, got {type(attention_mask).__name__}")
    if tuple(attention_mask.shape) != tuple(input_ids.shape):
        raise ValueError(
            f"attention_mask: expected the shape of input_ids {tuple(input_ids.shape)}, "
            f"got {tuple(attention_mask.shape)}"
        )
    mask = attention_mask.to(torch.long)
    if bool(((mask != 0) & (mask != 1)).any()):
        raise ValueError("attention_mask: every entry must be 0 or 1")
    if not bool(mask[:, -1].all()):
        raise ValueError(
            "attention_mask: the last column must be all ones; pad batches on the left (padding_side='left')"
        )
    real = input_ids[mask.bool()]
    if real.numel() and (int(real.min()) < 0 or int(real.max()) >= vocab_limit):
        raise ValueError(
            f"input_ids: every unmasked id must lie in [0, {vocab_limit}) (both models' vocabularies), "
            f"got [{int(real.min())}, {int(real.max())}]"
        )
    if lo < 0 or hi >= vocab_limit:
        raise ValueError(f"input_ids: padding ids must lie in [0, {vocab_limit}) too, got [{lo}, {hi}]")
    return mask


def as_processor_list(logits_processor: Any) -> Any:
    """A non-empty ``LogitsProcessorList`` or None."""
    if logits_processor is None:
        return None
    from transformers import LogitsProcessorList

    if isinstance(logits_processor, LogitsProcessorList):
        processors = logits_processor
    elif isinstance(logits_processor, (list, tuple)):
        processors = LogitsProcessorList(logits_processor)
    elif callable(logits_processor):
        processors = LogitsProcessorList([logits_processor])
    else:
        raise TypeError(
            f"logits_processor: expected a LogitsProcessorList, a list of processors or None, got {logits_processor!r}"
        )
    return processors if len(processors) else None


def split_stopping(stopping_criteria: Any) -> tuple[Any, int | None, list[int]]:
    """Split HF stopping criteria into (the others, max_length, eos ids): max-length and EOS
    criteria are handled natively (vectorised), the rest after every emitted token."""
    if stopping_criteria is None:
        return None, None, []
    from transformers import StoppingCriteriaList
    from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria

    if isinstance(stopping_criteria, (list, tuple)):
        items = list(stopping_criteria)
    elif callable(stopping_criteria):
        items = [stopping_criteria]
    else:
        raise TypeError(
            f"stopping_criteria: expected a StoppingCriteriaList, a list of criteria or None, got {stopping_criteria!r}"
        )
    others, max_length, eos = [], None, []
    for c in items:
        if isinstance(c, MaxLengthCriteria):
            max_length = c.max_length if max_length is None else min(max_length, c.max_length)
        elif isinstance(c, EosTokenCriteria):
            eos.extend(as_id_list("eos_token_id", c.eos_token_id))
        else:
            others.append(c)
    return (StoppingCriteriaList(others) if others else None), max_length, eos


def split_sampling_warpers(logits_processor: Any, do_sample: bool) -> tuple[Any, SamplingParams]:
    """Take ``generate``'s sampling warpers (temperature, top-k, top-p, min-p) out of its
    processor list: verification applies them itself, to target and draft alike. Returns the
    other processors (None if none) and the sampling settings (greedy unless ``do_sample``)."""
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
    sampling = SamplingParams(temperature, top_k, top_p, min_p) if do_sample else SamplingParams.greedy()
    return (LogitsProcessorList(others) if others else None), sampling


def check_decode_path(decode_path: Any, draft: Any) -> str:
    """``decode_path`` checked (one of :data:`~specdecode.engine.static_loop.DECODE_PATHS`);
    ``draft=None`` (the target alone) only runs on the static paths."""
    if not isinstance(decode_path, str) or decode_path not in DECODE_PATHS:
        raise ValueError(f"decode_path: expected one of {', '.join(repr(p) for p in DECODE_PATHS)}, got {decode_path!r}")
    if draft is None and decode_path == "eager":
        raise ValueError("draft: None (the target alone) runs only with decode_path='static', 'compiled' or 'graphed'; "
                         "pass a draft model or a drafter")
    return decode_path


def as_drafter(target: torch.nn.Module, draft: Any, *, target_tokenizer: Any = None,
               draft_tokenizer: Any = None, tree: Any = None) -> tuple[Drafter, int, int]:
    """``(drafter, shared vocabulary size, vocabulary limit for prompt ids)`` from a draft model
    (checked against the target and wrapped in a :class:`ModelDrafter`, drafting ``tree`` when
    given), a drafter, or None (the target alone, static paths only)."""
    if draft is None:
        from specdecode.engine.static_loop import TargetOnly

        if tree is not None:
            raise ValueError("tree: a tree needs a draft model")
        check_model("target", target)
        return TargetOnly(), vocab_rows(target), _embedding_rows(target)  # type: ignore[return-value]
    if isinstance(draft, torch.nn.Module):
        vocab = check_compatibility(target, draft, target_tokenizer=target_tokenizer, draft_tokenizer=draft_tokenizer)
        limit = min(_embedding_rows(target), _embedding_rows(draft))
        return ModelDrafter(draft, tree=tree), vocab, limit
    if isinstance(draft, Drafter):
        check_model("target", target)
        return draft, vocab_rows(target), _embedding_rows(target)
    raise TypeError(
        "draft: expected a Hugging Face causal LM or a specdecode drafter (with propose / commit / reset), "
        f"got {type(draft).__name__}"
    )


def _embedding_rows(model: torch.nn.Module) -> int:
    emb = model.get_input_embeddings()
    return int(emb.weight.shape[0]) if emb is not None else int(model.config.vocab_size)


def check_optional_bool(name: str, value: Any) -> bool | None:
    """``value`` if it is True, False or None, else ``TypeError`` naming ``name``."""
    if value is not None and not isinstance(value, bool):
        raise TypeError(f"{name}: expected True, False or None, got {value!r}")
    return value


def draft_model_of(drafter: Any) -> torch.nn.Module | None:
    """The model a drafter runs (``ModelDrafter``, ``LayerSkipDrafter``, ...), or None."""
    model = getattr(drafter, "model", None)
    return model if isinstance(model, torch.nn.Module) else None
