"""Feature drafters (EAGLE, Medusa, Hydra) on the graphed static path on a GPU
(``decode_path="graphed"``); skipped without a CUDA device (checked when a test runs).

- greedy output (float32) equals the target's own greedy ``generate`` and the static path run
  eagerly, for each drafter kind, batch 1 and a left-padded batch of 3;
- graphs recorded once per layout and replayed by the next call, with other prompts;
- no host synchronisation inside a replayed step (CUDA's sync debug mode raises on one);
- the exact whole-loop sampling test for EAGLE and Medusa on the GPU.
"""

from __future__ import annotations

import pytest
import torch
from test_cuda_static import _needs_cuda_sampler, _on, cuda  # noqa: F401
from test_generate_models import PAD, _one_thread, left_padded, make_pair  # noqa: F401
from test_generate_sampling import K, PROMPT, V, chi_square_p, exact_joint
from test_static_features import KINDS, make_drafter, sampling_drafter, target_model

import specdecode.engine.graphs as graphs
from specdecode import generate

pytestmark = pytest.mark.cuda
MAX_NEW = 16


def _graphed(target, drafter, ids, mask=None, decode_path="graphed", **kwargs):
    kwargs.setdefault("max_new_tokens", MAX_NEW)
    return generate(target, drafter, ids, mask, num_draft_tokens=3, pad_token_id=PAD, decode_path=decode_path,
                    **kwargs)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_graphed_greedy_equals_target_generate(cuda, arch, kind):
    target = target_model(arch).to(cuda)
    drafter = make_drafter(kind, target)
    ids, mask = _on(cuda, *left_padded([5, 9, 2], vocab=111, seed=3))
    for batch_ids, batch_mask in ((ids[1:2], None), (ids, mask)):
        ref = target.generate(batch_ids, attention_mask=batch_mask, do_sample=False, max_new_tokens=MAX_NEW,
                              pad_token_id=PAD)
        out = _graphed(target, drafter, batch_ids, batch_mask)
        assert out.stats.decode_path == "graphed" and torch.equal(out.sequences, ref), (arch, kind)
        static = _graphed(target, drafter, batch_ids, batch_mask, decode_path="static")
        assert torch.equal(static.sequences, out.sequences)
        assert static.stats.accepted_tokens == out.stats.accepted_tokens


def _raising_on_syncs(replay, program) -> None:
    """``replay(program)`` under CUDA's sync debug mode "error": a host sync inside raises."""
    torch.cuda.set_sync_debug_mode("error")
    try:
        replay(program)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("kind", KINDS)
def test_recorded_once_replayed_and_no_host_sync(cuda, kind, monkeypatch):
    target = target_model("llama").to(cuda)
    assert_recorded_once_and_replayed(target, make_drafter(kind, target), _graphed, monkeypatch)


def assert_recorded_once_and_replayed(target, drafter, graphed, monkeypatch) -> None:
    """``graphed(target, drafter, ids, mask, **kwargs)`` records its graphs once; a second call
    replays them with no host synchronisation inside a step, and other prompts of the same
    layout replay them too, giving the target's greedy output."""
    device = next(target.parameters()).device
    ids, mask = _on(device, *left_padded([5, 8, 3], vocab=111, seed=2))
    kwargs = dict(eos_token_id=[], stop_check_every=MAX_NEW)
    first = graphed(target, drafter, ids, mask, **kwargs)
    assert first.stats.graph_captures == 1
    replay = graphs.StepProgram._replay
    monkeypatch.setattr(graphs.StepProgram, "_replay", lambda program: _raising_on_syncs(replay, program))
    again = graphed(target, drafter, ids, mask, **kwargs)
    assert again.stats.graph_captures == 0 and again.stats.step_host_syncs == 0
    assert torch.equal(again.sequences, first.sequences)
    monkeypatch.undo()
    ids2, mask2 = _on(device, *left_padded([7, 2, 6], vocab=111, seed=3))  # other prompts, same layout
    other = graphed(target, drafter, ids2, mask2, eos_token_id=[])
    assert other.stats.graph_captures == 0
    assert torch.equal(other.sequences, target.generate(ids2, attention_mask=mask2, do_sample=False,
                                                        max_new_tokens=MAX_NEW, eos_token_id=[], pad_token_id=PAD))


@pytest.fixture(scope="module")
def gpu_target():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    target, _ = make_pair("llama", vocab=V, init=0.3, seed=1, num_key_value_heads=4)
    target.config.eos_token_id = None
    target.generation_config.eos_token_id = None
    joint = exact_joint(target, PROMPT)  # on the CPU, in float64
    return target.to("cuda"), joint


@pytest.mark.parametrize("kind, rule", [("eagle", "token"), ("eagle_reduced", "block"), ("medusa", "token"),
                                        ("medusa_reduced", "block")])
def test_graphed_sampling_is_lossless(cuda, gpu_target, kind, rule):
    _needs_cuda_sampler()
    target, joint = gpu_target
    ids = torch.tensor([PROMPT], device="cuda").expand(20000, -1)
    out = generate(target, sampling_drafter(kind, target), ids, num_draft_tokens=2, rule=rule, do_sample=True,
                   max_new_tokens=K, eos_token_id=[], pad_token_id=PAD, decode_path="graphed",
                   generator=torch.Generator("cuda").manual_seed(0))
    assert out.stats.graph_captures == 1 and 0.05 < out.stats.acceptance_rate < 0.95
    assert chi_square_p(out.sequences[:, len(PROMPT):].cpu(), joint) > 1e-4
