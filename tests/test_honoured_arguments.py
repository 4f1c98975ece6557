"""Every argument of ``specdecode.generate`` is honoured or refused, never silently ignored, and
every public callable shows its real signature (IDEs and ``help()`` read it)."""

from __future__ import annotations

import inspect
import logging
from typing import Any

import pytest
import torch

import specdecode
from specdecode.drafters import ModelDrafter
from specdecode.training.artifacts import with_generation_defaults
from specdecode.trees.builders import DynamicTree
from test_transformers_warnings import _Records

# The shipped SmolLM2 drafter's record (pair_drafters/smollm2-eagle/specdecode_drafter.json):
# a 6-node dynamic tree greedily, a chain of 2 when sampling.
SHIPPED_RECORD = {"num_draft_tokens": 2, "tree": "dynamic", "num_nodes": 6, "tree_depth": 3,
                  "sampling": {"tree": None, "num_draft_tokens": 2}}


@pytest.fixture(scope="module")
def pair() -> tuple[Any, Any, Any]:
    target, draft, tok = specdecode.load_demo_pair()
    ids = tok(["def parse(text):\n", "import os\n"], return_tensors="pt", padding=True, padding_side="left")
    return target, draft, ids


def _run(target: Any, drafter: Any, ids: Any, **kwargs: Any) -> Any:
    return specdecode.generate(target, drafter, ids.input_ids, ids.attention_mask, max_new_tokens=12, **kwargs)


def _is_chain_of(stats: Any, k: int) -> bool:
    history = stats.num_draft_tokens_history  # the last step may draft fewer, near max_new_tokens
    return stats.tree_rule == "" and history[0] == max(history) == k


@pytest.mark.parametrize("do_sample", [False, True])
def test_tree_none_drafts_the_chain_asked_for(pair: tuple[Any, Any, Any], do_sample: bool) -> None:
    target, draft, ids = pair
    recorded = with_generation_defaults(draft, SHIPPED_RECORD, "record")  # as load_pair("smollm2") loads it
    for drafter in (ModelDrafter(draft, tree=DynamicTree(8)), recorded):
        kept = drafter.tree
        out = _run(target, drafter, ids, tree=None, num_draft_tokens=4, do_sample=do_sample,
                   generator=torch.Generator().manual_seed(0))
        assert _is_chain_of(out.stats, 4), (type(drafter).__name__, out.stats.tree_rule,
                                            out.stats.num_draft_tokens_history)
        assert drafter.tree is kept  # the drafter passed in is left as it was
    # its own setting without tree=: the record's tree greedily, its chain of 2 when sampling
    assert _run(target, recorded, ids).stats.tree_rule == "deterministic"
    sampled = _run(target, recorded, ids, do_sample=True, generator=torch.Generator().manual_seed(0))
    assert _is_chain_of(sampled.stats, 2)


def test_greedy_tree_none_gives_the_targets_output(pair: tuple[Any, Any, Any]) -> None:
    target, draft, ids = pair
    want = target.generate(**ids, max_new_tokens=12, do_sample=False)
    out = _run(target, ModelDrafter(draft, tree=DynamicTree(8)), ids, tree=None, num_draft_tokens=3)
    assert torch.equal(out.sequences, want)


def test_tree_none_refuses_a_drafter_that_drafts_only_its_tree(pair: tuple[Any, Any, Any]) -> None:
    target, _, ids = pair
    with pytest.raises(ValueError, match=r"^tree: None asks for a chain, but this NgramDrafter"):
        _run(target, specdecode.NgramDrafter(num_nodes=8), ids, tree=None)


@pytest.mark.parametrize("keyword", [{"num_nodes": 16}, {"tree_depth": 3}, {"tree_children": "iid"},
                                     {"num_nodes": 8, "tree": None}])
def test_tree_shape_without_a_tree_is_refused(pair: tuple[Any, Any, Any], keyword: dict[str, Any]) -> None:
    target, draft, ids = pair
    name = next(k for k in keyword if k != "tree")
    with pytest.raises(ValueError, match=rf"^tree: {name} shape a token tree; pass tree="):
        _run(target, draft, ids, **keyword)


def test_num_nodes_with_a_tree_is_honoured(pair: tuple[Any, Any, Any]) -> None:
    target, draft, ids = pair
    small, large = (_run(target, draft, ids, tree="dynamic", num_nodes=n) for n in (3, 12))
    assert small.stats.tree_rule == large.stats.tree_rule == "deterministic"
    assert small.stats.drafted_tokens <= 2 * small.stats.row_steps  # at most 2 nodes below the root a step
    assert large.stats.drafted_tokens > 2 * large.stats.row_steps


def _transformers_warnings(call: Any) -> list[str]:
    """The warnings transformers logs during ``call()`` (its logger does not propagate)."""
    logger = logging.getLogger("transformers")
    handler = _Records()
    logger.addHandler(handler)
    logging.Logger.warning_once.cache_clear()  # transformers warns once per message and process
    try:
        call()
    finally:
        logger.removeHandler(handler)
    return handler.messages


@pytest.mark.parametrize("keyword", ["temperature", "top_p", "top_k"])
def test_sampling_settings_without_do_sample_warn_as_generate_does(pair: tuple[Any, Any, Any], keyword: str) -> None:
    """``model.generate(temperature=0.7)`` decodes greedily and transformers warns that the flag
    is ignored; ``specdecode.generate`` does the same, with transformers' own message."""
    target, draft, ids = pair
    value = {"temperature": 0.7, "top_p": 0.9, "top_k": 7}[keyword]
    results: dict[str, Any] = {}
    hf = _transformers_warnings(lambda: results.update(want=target.generate(**ids, max_new_tokens=12,
                                                                           **{keyword: value})))
    assert len(hf) == 1 and f"['{keyword}']" in hf[0]
    ours = _transformers_warnings(lambda: results.update(out=_run(target, draft, ids, **{keyword: value})))
    assert ours == hf
    assert torch.equal(results["out"].sequences, results["want"])  # greedy, as generate


def test_sampling_settings_with_do_sample_do_not_warn(pair: tuple[Any, Any, Any]) -> None:
    target, draft, ids = pair
    assert _transformers_warnings(lambda: _run(target, draft, ids, do_sample=True, temperature=0.7,
                                               generator=torch.Generator().manual_seed(0))) == []
    assert _transformers_warnings(lambda: _run(target, draft, ids)) == []


@pytest.mark.parametrize("rule, label", [("token", "rule 'token'"), (None, "the default rule 'token'"),
                                         ("block", "rule 'block'")])
def test_another_rules_option_says_the_rule_takes_none(pair: tuple[Any, Any, Any], rule: str | None,
                                                       label: str) -> None:
    target, draft, ids = pair
    with pytest.raises(TypeError, match=rf"^generate\(\): {label} got unexpected option\(s\) \['epsilon'\]; its "
                                        r"options: none \(epsilon is an option of rule 'typical'"):
        _run(target, draft, ids, rule=rule, epsilon=0.1)


def test_a_typo_of_a_keyword_is_still_suggested(pair: tuple[Any, Any, Any]) -> None:
    target, draft, ids = pair
    with pytest.raises(TypeError, match="did you mean 'num_draft_tokens'"):
        _run(target, draft, ids, num_draft_token=3)


def test_rule_options_through_the_plugin_say_the_same(pair: tuple[Any, Any, Any]) -> None:
    target, draft, ids = pair
    with pytest.raises(TypeError, match=r"^custom_generate\(\): rule 'token' got unexpected option\(s\) \['delta'\]"):
        target.generate(**ids, custom_generate=specdecode.custom_generate, assistant_model=draft, max_new_tokens=4,
                        rule="token", rule_options={"delta": 0.3})


def _public_callables() -> list[tuple[str, Any]]:
    found = []
    for name in specdecode.__all__:
        value = getattr(specdecode, name)
        if callable(value) and not getattr(value, "_is_protocol", False):  # a Protocol is never called
            found.append((name, value))
    return found


@pytest.mark.parametrize("name, value", _public_callables(), ids=[n for n, _ in _public_callables()])
def test_public_callables_show_their_parameters(name: str, value: Any) -> None:
    parameters = list(inspect.signature(value).parameters.values())
    kinds = [p.kind for p in parameters]
    assert kinds != [inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD], (
        f"specdecode.{name} shows a bare (*args, **kwargs) signature")


def test_pair_loaders_are_the_real_functions() -> None:
    from specdecode.demo import load_demo_pair
    from specdecode.pairs import load_pair

    assert inspect.signature(specdecode.load_pair) == inspect.signature(load_pair)
    assert list(inspect.signature(specdecode.load_pair).parameters) == ["name", "drafter"]
    assert list(inspect.signature(specdecode.load_demo_pair).parameters) == ["device", "dtype", "weights_dir"]
    assert specdecode.load_demo_pair is load_demo_pair
