"""The static decode path counts a generation as the eager path does (greedy, the demo pair, the
same drafts): accepted tokens, acceptance by position or depth, positions reached, tokens per
call and the per-step accepted lengths, for a fixed tree, a dynamic tree and a chain, at several
``max_new_tokens`` (the last step cut by the length or not) and with EOS inside an accepted block.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import specdecode
import specdecode.engine.static_loop as static_loop
from specdecode import generate
from specdecode.trees.builders import DynamicTree

SHAPE = [[0], [1], [0, 0], [0, 1], [1, 0]]
PROMPTS = ("def add(a, b):\n", "class Stack:\n    def push(self, x):\n")
COMPARED = ("steps", "new_tokens", "drafted_tokens", "accepted_tokens", "rejections", "position_drafted",
            "position_accepted", "position_reached", "accepted_lengths", "acceptance_rate", "block_efficiency",
            "mean_accepted_length", "acceptance_by_position")
TREES = {"tree": SHAPE, "dynamic": DynamicTree(8, 4, top_k=3, calibrated=False), "chain": None}


@pytest.fixture(scope="module")
def demo() -> tuple[Any, Any, Any]:
    torch.manual_seed(0)
    return specdecode.load_demo_pair()


@pytest.fixture(autouse=True)
def _fresh_sessions():
    static_loop.clear_static_sessions()
    yield
    static_loop.clear_static_sessions()


def counted(out: Any) -> dict[str, Any]:
    """The statistics both paths must agree on."""
    data = out.stats.to_dict()
    return {name: data[name] for name in COMPARED}


def both_paths(demo: tuple[Any, Any, Any], prompt: str, **kwargs: Any) -> tuple[Any, Any]:
    target, draft, tok = demo
    ids = tok(prompt, return_tensors="pt").input_ids
    return tuple(generate(target, draft, ids, decode_path=path, num_draft_tokens=4, draft_schedule="constant", **kwargs)
                 for path in ("eager", "static"))


@pytest.mark.parametrize("tree", TREES)
@pytest.mark.parametrize("max_new_tokens", [16, 17, 18, 40])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_static_counts_equal_eager_counts(demo, tree, max_new_tokens, prompt):
    eager, static = both_paths(demo, prompt, tree=TREES[tree], max_new_tokens=max_new_tokens, eos_token_id=[])
    assert torch.equal(eager.sequences, static.sequences)
    assert counted(static) == counted(eager)
    assert static.stats.accepted_lengths and static.stats.accepted_tokens > 0


@pytest.mark.parametrize("tree", [SHAPE, None], ids=["tree", "chain"])
@pytest.mark.parametrize("cut", [3, 6, 9])
def test_static_counts_equal_eager_counts_with_eos_inside_a_block(demo, tree, cut):
    free, _ = both_paths(demo, PROMPTS[0], tree=tree, max_new_tokens=24, eos_token_id=[])
    start = free.sequences.shape[1] - 24
    row = free.sequences[0, start:].tolist()
    eos = next(t for t in row[cut:] if t not in row[:cut])  # first seen after `cut` new tokens
    eager, static = both_paths(demo, PROMPTS[0], tree=tree, max_new_tokens=24, eos_token_id=eos)
    assert torch.equal(eager.sequences, static.sequences)
    assert counted(static) == counted(eager)


@pytest.mark.parametrize("tree", [SHAPE, None], ids=["tree", "chain"])
def test_static_accepted_lengths_per_row_of_a_batch(demo, tree):
    target, draft, tok = demo
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    batch = tok(list(PROMPTS), return_tensors="pt", padding=True)
    outs = [generate(target, draft, batch.input_ids, batch.attention_mask, decode_path=path, num_draft_tokens=4,
                     tree=tree, max_new_tokens=21, eos_token_id=[], draft_schedule="constant")
            for path in ("eager", "static")]
    assert torch.equal(outs[0].sequences, outs[1].sequences)
    assert counted(outs[1]) == counted(outs[0])
    lengths = outs[1].stats.accepted_lengths
    assert len(lengths[0]) == 2 and {len(step) for step in lengths} <= {1, 2}  # finished rows leave


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("tree", TREES)
def test_graphed_counts_equal_eager_counts(tree):
    """The counters and the accepted-length log written inside the replayed CUDA graphs."""
    target, draft, tok = specdecode.load_demo_pair(device="cuda")
    ids = tok(PROMPTS[1], return_tensors="pt").input_ids.cuda()
    eager, graphed = (generate(target, draft, ids, decode_path=path, num_draft_tokens=4, tree=TREES[tree],
                               max_new_tokens=17, eos_token_id=[], draft_schedule="constant")
                      for path in ("eager", "graphed"))
    assert torch.equal(eager.sequences, graphed.sequences)
    assert counted(graphed) == counted(eager)
