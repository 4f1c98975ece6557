"""Token trees on the graphed static decode path (``decode_path="graphed"``): each tree step
recorded once as CUDA graphs and replayed. Skipped without a CUDA device (checked when a test
runs); tests/test_static_trees.py runs the same phases eagerly on the CPU.

- greedy output equals the target's own greedy ``generate`` (float32; Llama, GPT-2, Qwen2;
  batch 1 and a left-padded batch; fixed shapes and EAGLE-2 dynamic trees);
- graphs recorded once per layout and replayed; no host synchronisation inside the replayed
  loop (CUDA's sync debug mode raises on one);
- the exact whole-loop sampling test on the GPU for the children schemes that run in a graph
  (i.i.d., without replacement at temperature only, top-k);
- a dynamic tree whose depth follows its measured acceptance: a kept builder's second
  generation records a deeper tree (a new layout), its third replays it without host
  synchronisation, greedy output the target's throughout; the caches' layers are stacked.
"""

from __future__ import annotations

import pytest
import torch
from test_generate_models import PAD, _one_thread, left_padded, make_pair  # noqa: F401
from test_cuda_static import gpu_pair, strict_decode  # noqa: F401 (a fixture)
from test_generate_sampling import K, PROMPT, chi_square_p

import specdecode.engine.static_layouts as static_layouts
import specdecode.engine.static_loop as static_loop
from specdecode import ModelDrafter, generate
from specdecode.trees.builders import DynamicTree

pytestmark = pytest.mark.cuda
MAX_NEW = 20
SHAPE = [[0], [1], [0, 0], [0, 1], [1, 0]]


@pytest.fixture
def cuda() -> torch.device:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    for op in ("verify_tree_philox", "tree_attention_mask"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"specdecode::{op}", "CUDA"), (
            f"a CUDA device is available but specdecode::{op} has no CUDA kernel (python -m specdecode.info)")
    static_loop.clear_static_sessions()
    yield torch.device("cuda")
    static_loop.clear_static_sessions()


def _on(device, *tensors):
    return [t.to(device) for t in tensors]


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2"])
def test_graphed_greedy_trees_equal_target_generate(cuda, arch):
    target, draft = (m.to(cuda) for m in make_pair(arch))
    ids, mask = _on(cuda, *left_padded([5, 9, 2], seed=1))
    common = dict(max_new_tokens=MAX_NEW, pad_token_id=PAD, decode_path="graphed")
    for batch_ids, batch_mask in ((ids[1:2], None), (ids, mask)):
        ref = target.generate(batch_ids, attention_mask=batch_mask, do_sample=False, max_new_tokens=MAX_NEW,
                              pad_token_id=PAD)
        for tree in (SHAPE, DynamicTree(8, 3, top_k=3)):
            out = generate(target, draft, batch_ids, batch_mask, tree=tree, **common)
            assert out.stats.decode_path == "graphed" and out.stats.graph_captures == 1
            assert torch.equal(out.sequences, ref), (arch, tree)


def test_tree_graphs_are_recorded_once_and_replayed_without_host_syncs(cuda, monkeypatch):
    target, draft = (m.to(cuda) for m in make_pair("llama"))
    ids, mask = _on(cuda, *left_padded([5, 8, 3], seed=2))
    kwargs = dict(tree="dynamic", num_nodes=8, tree_depth=4, max_new_tokens=16, eos_token_id=[], pad_token_id=PAD,
                  decode_path="graphed", stop_check_every=16)
    first = generate(target, draft, ids, mask, **kwargs)
    assert first.stats.graph_captures == 1
    strict_decode(monkeypatch)
    again = generate(target, draft, ids, mask, **kwargs)
    assert again.stats.graph_captures == 0 and again.stats.step_host_syncs == 0
    assert torch.equal(again.sequences, first.sequences)


@pytest.mark.parametrize("children, rule", [("iid", "specinfer"), ("without_replacement", "rrs"),
                                            ("deterministic", "deterministic")])
def test_graphed_tree_sampling_is_lossless(cuda, gpu_pair, children, rule):
    if not torch._C._dispatch_has_kernel_for_dispatch_key("specdecode::sample_logits_philox", "CUDA"):
        pytest.skip("this build has no CUDA sample_logits_philox kernel (sampling on the graphed path needs it)")
    target, draft, joint = gpu_pair
    ids = torch.tensor([PROMPT], device="cuda").expand(20000, -1)
    out = generate(target, draft, ids, tree=SHAPE, tree_children=children, rule=rule, do_sample=True,
                   max_new_tokens=K, eos_token_id=[], pad_token_id=PAD,
                   generator=torch.Generator("cuda").manual_seed(0), decode_path="graphed")
    assert out.stats.graph_captures == 1 and out.stats.tree_rule == rule
    assert chi_square_p(out.sequences[:, len(PROMPT):].cpu(), joint) > 1e-4


def test_graphed_dynamic_depth_follows_acceptance(cuda, monkeypatch):
    target, _ = make_pair("llama")
    target.config.eos_token_id = target.generation_config.eos_token_id = None
    with torch.no_grad():  # a confident model: its own tree is a chain, accepted whole
        target.get_output_embeddings().weight.mul_(100)
    target = target.to(cuda)
    ids, mask = _on(cuda, *left_padded([5, 9, 2], seed=1))
    ref = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW, pad_token_id=PAD)
    builder = DynamicTree(10)
    drafter = ModelDrafter(target, tree=builder)
    kwargs = dict(max_new_tokens=MAX_NEW, pad_token_id=PAD, decode_path="graphed", stop_check_every=MAX_NEW)
    depths, captures = [], []
    for i in range(3):
        if i == 2:
            strict_decode(monkeypatch)
        out = generate(target, drafter, ids, mask, **kwargs)
        assert torch.equal(out.sequences, ref), i
        depths.append(builder.static_depths.depth)
        captures.append(out.stats.graph_captures)
    assert depths == [6, 9, 9] and captures == [1, 1, 0] and out.stats.step_host_syncs == 0
    session = static_layouts.kept_layouts(target)[-1]
    assert session.cache.stacked is not None and session.cache.stacked.is_cuda
