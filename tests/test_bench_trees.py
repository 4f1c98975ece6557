"""The tree benchmark's prompt sets and configurations (the benchmark itself is run by hand)."""

from __future__ import annotations

import pytest

from specdecode.prompt_sets import PROMPT_SETS, prompt_set
from specdecode.bench.trees import _builder, _configs
from specdecode.trees.builders import DynamicTree, SequoiaTree


def test_tuning_and_reporting_prompts_are_disjoint_and_complete():
    for half in ("tune", "report"):
        code, prose = prompt_set(f"{half}-code"), prompt_set(f"{half}-prose")
        assert len(code) >= 8 and len(prose) >= 8 and prompt_set(half) == code + prose
    assert not set(PROMPT_SETS["tune"]) & set(PROMPT_SETS["report"])
    assert all(not p.lstrip().startswith(("def ", "class ")) for p in PROMPT_SETS["tune"] + PROMPT_SETS["report"])
    prompt_set("tune").append("x")  # a copy: the set itself is unchanged
    assert len(PROMPT_SETS["tune"]) == 16
    with pytest.raises(ValueError, match="name"):
        prompt_set("held-out")


def test_configs_hold_the_chain_with_the_trees_node_budget():
    methods = [c["method"] for c in _configs([8, 16])]
    assert methods[0] == "chain g=5" and "chain g=7" in methods and "chain g=15" in methods
    assert isinstance(_builder("dynamic-raw", 16), DynamicTree) and not _builder("dynamic-raw", 16).calibrated
    assert isinstance(_builder("sequoia-rank", 16), SequoiaTree) and not _builder("sequoia-rank", 16).by_depth
    assert _builder("sequoia", 16).by_depth and _builder("dynamic", 16).calibrated
