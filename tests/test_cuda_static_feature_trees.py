"""Feature drafters (EAGLE, Medusa, Hydra) drafting token trees on the graphed static path on a
GPU (``decode_path="graphed"``); skipped without a CUDA device (checked when a test runs).

- greedy output (float32) equals the target's own greedy ``generate`` and the static path run
  eagerly, for each tree kind of tests/test_static_feature_trees.py, a left-padded batch of 3;
- graphs recorded once per layout and replayed by the next call, with other prompts, and no
  host synchronisation inside a replayed step (CUDA's sync debug mode raises on one);
- the exact whole-loop sampling test for an EAGLE tree (``rrs``) on the GPU.
"""

from __future__ import annotations

import pytest
import torch
from test_cuda_static import _needs_cuda_sampler, _on, cuda  # noqa: F401
from test_cuda_static_features import assert_recorded_once_and_replayed, gpu_target  # noqa: F401
from test_generate_models import PAD, _one_thread, left_padded  # noqa: F401
from test_generate_sampling import K, PROMPT, chi_square_p
from test_static_feature_trees import KINDS, SHAPE, random_eagle, tree_drafter
from test_static_features import target_model

from specdecode import generate

pytestmark = pytest.mark.cuda
MAX_NEW = 16


def _graphed(target, drafter, ids, mask=None, decode_path="graphed", **kwargs):
    kwargs.setdefault("max_new_tokens", MAX_NEW)
    return generate(target, drafter, ids, mask, pad_token_id=PAD, decode_path=decode_path, **kwargs)


def _greedy(target, ids, mask):
    return target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW, pad_token_id=PAD)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_graphed_feature_trees_equal_target_generate(cuda, arch, kind):
    target = target_model(arch).to(cuda)
    drafter = tree_drafter(kind, target)
    ids, mask = _on(cuda, *left_padded([5, 9, 2], vocab=111, seed=3))
    out = _graphed(target, drafter, ids, mask)
    assert out.stats.decode_path == "graphed" and torch.equal(out.sequences, _greedy(target, ids, mask)), kind
    static = _graphed(target, drafter, ids, mask, decode_path="static")
    assert torch.equal(static.sequences, out.sequences)
    assert static.stats.accepted_tokens == out.stats.accepted_tokens


@pytest.mark.parametrize("kind", KINDS)
def test_feature_trees_recorded_once_replayed_and_no_host_sync(cuda, kind, monkeypatch):
    target = target_model("llama").to(cuda)
    assert_recorded_once_and_replayed(target, tree_drafter(kind, target), _graphed, monkeypatch)


def test_graphed_eagle_tree_sampling_is_lossless(cuda, gpu_target):
    _needs_cuda_sampler()
    target, joint = gpu_target
    drafter = random_eagle(target).with_tree(SHAPE, tree_children="without_replacement")
    ids = torch.tensor([PROMPT], device="cuda").expand(20000, -1)
    out = generate(target, drafter, ids, rule="rrs", do_sample=True, max_new_tokens=K, eos_token_id=[],
                   pad_token_id=PAD, decode_path="graphed", generator=torch.Generator("cuda").manual_seed(0))
    assert out.stats.graph_captures == 1 and out.stats.accepted_tokens > 0
    assert chi_square_p(out.sequences[:, len(PROMPT):].cpu(), joint) > 1e-4
