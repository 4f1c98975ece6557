"""The graphed static decode path on a GPU (``decode_path="graphed"``): each step recorded once
as CUDA graphs and replayed. Skipped without a CUDA device (checked when a test runs).

- greedy output equals the target's own greedy ``generate`` (float32; Llama, GPT-2, GPT-NeoX,
  Qwen2; batch 1 and left-padded batches; the target alone too), and equals the static path
  run eagerly on the same GPU;
- the exact whole-loop sampling test (token and block) on the GPU, and a broken variant;
- no host synchronisation inside the replayed loop (CUDA's sync debug mode raises on one) when
  no stop check is asked for, and fewer than one per step with checks;
- graphs recorded once per layout and replayed by the next call; phase timings.
"""

from __future__ import annotations

import pytest
import torch
from test_generate_models import PAD, _one_thread, left_padded, make_pair  # noqa: F401
from test_generate_sampling import K, PROMPT, V, chi_square_p, exact_joint

import specdecode.engine.static_loop as static_loop
import specdecode.engine.static_state as static_state
from specdecode import generate

pytestmark = pytest.mark.cuda
MAX_NEW = 20


@pytest.fixture
def cuda() -> torch.device:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    for op in ("verify_logits_philox",):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"specdecode::{op}", "CUDA"), (
            f"a CUDA device is available but specdecode::{op} has no CUDA kernel (python -m specdecode.info)")
    static_loop.clear_static_sessions()
    yield torch.device("cuda")
    static_loop.clear_static_sessions()


def _needs_cuda_sampler() -> None:
    if not torch._C._dispatch_has_kernel_for_dispatch_key("specdecode::sample_logits_philox", "CUDA"):
        pytest.skip("this build has no CUDA sample_logits_philox kernel (sampling on the graphed path needs it)")


def _on(device, *tensors):
    return [t.to(device) for t in tensors]


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gpt_neox", "qwen2"])
def test_graphed_greedy_equals_target_generate(cuda, arch):
    target, draft = (m.to(cuda) for m in make_pair(arch))
    ids, mask = _on(cuda, *left_padded([5, 9, 2, 7], seed=1))
    common = dict(max_new_tokens=MAX_NEW, pad_token_id=PAD)
    for batch_ids, batch_mask in ((ids[1:2], None), (ids, mask)):
        ref = target.generate(batch_ids, attention_mask=batch_mask, do_sample=False, **common)
        for rule, gamma in (("token", 3), ("block", 5)):
            out = generate(target, draft, batch_ids, batch_mask, num_draft_tokens=gamma, rule=rule,
                           decode_path="graphed", **common)
            assert out.stats.decode_path == "graphed"
            assert torch.equal(out.sequences, ref), (arch, rule, gamma)
            static = generate(target, draft, batch_ids, batch_mask, num_draft_tokens=gamma, rule=rule,
                              decode_path="static", **common)
            assert torch.equal(static.sequences, out.sequences)
        alone = generate(target, None, batch_ids, batch_mask, decode_path="graphed", **common)
        assert torch.equal(alone.sequences, ref)


def test_graphs_are_recorded_once_and_replayed(cuda):
    target, draft = (m.to(cuda) for m in make_pair("llama"))
    ids, mask = _on(cuda, *left_padded([5, 8, 3], seed=2))
    kwargs = dict(num_draft_tokens=4, max_new_tokens=16, eos_token_id=[], pad_token_id=PAD, decode_path="graphed")
    first = generate(target, draft, ids, mask, **kwargs)
    again = generate(target, draft, ids, mask, **kwargs)
    assert first.stats.graph_captures == 1 and again.stats.graph_captures == 0
    assert torch.equal(first.sequences, again.sequences)
    ids2, mask2 = _on(cuda, *left_padded([7, 2, 6], seed=3))  # other prompts, same layout: replayed
    other = generate(target, draft, ids2, mask2, **kwargs)
    assert other.stats.graph_captures == 0
    assert torch.equal(other.sequences, target.generate(ids2, attention_mask=mask2, do_sample=False,
                                                        max_new_tokens=16, pad_token_id=PAD))
    timed = generate(target, draft, ids, mask, phase_timing=True, **kwargs)
    s = timed.stats
    assert s.graph_captures == 1 and torch.equal(timed.sequences, first.sequences)
    assert s.draft_time > 0 and s.target_time > 0 and s.verify_time > 0 and s.bookkeeping_time > 0


def strict_decode(monkeypatch) -> None:
    """Run the decoding loop (not the setup before it or the read of the results after) under
    CUDA's sync debug mode "error": a host synchronisation inside it raises."""
    original = static_loop.StaticEngine._decode

    def strict(self, session, program):
        torch.cuda.set_sync_debug_mode("error")
        try:
            return original(self, session, program)
        finally:
            torch.cuda.set_sync_debug_mode("default")

    monkeypatch.setattr(static_loop.StaticEngine, "_decode", strict)


def test_no_host_sync_inside_the_replayed_loop(cuda, monkeypatch):
    target, draft = (m.to(cuda) for m in make_pair("llama"))
    ids, mask = _on(cuda, *left_padded([5, 8, 3], seed=4))
    kwargs = dict(num_draft_tokens=4, max_new_tokens=16, eos_token_id=[], pad_token_id=PAD, decode_path="graphed")
    generate(target, draft, ids, mask, stop_check_every=16, **kwargs)  # records the graphs
    strict_decode(monkeypatch)
    out = generate(target, draft, ids, mask, stop_check_every=16, **kwargs)
    assert out.stats.step_host_syncs == 0 and out.stats.decode_steps_run == 16
    monkeypatch.undo()
    checked = generate(target, draft, ids, mask, stop_check_every=2, **kwargs)
    assert torch.equal(checked.sequences, out.sequences)
    s = checked.stats
    assert s.steps > 2 and s.step_host_syncs <= s.steps / 2 + 1 and s.host_syncs_per_step < 1.0
    assert s.decode_steps_run <= s.steps + 2 * 2  # at most two check periods of masked extra steps


@pytest.fixture(scope="module")
def gpu_pair():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    target, draft = make_pair("llama", vocab=V, init=0.3, seed=1, num_key_value_heads=4)
    for model in (target, draft):
        model.config.eos_token_id = None
        model.generation_config.eos_token_id = None
    joint = exact_joint(target, PROMPT)  # on the CPU, in float64
    return target.to("cuda"), draft.to("cuda"), joint


def _sample(target, draft, rule, n=20000, seed=0):
    ids = torch.tensor([PROMPT], device="cuda").expand(n, -1)
    out = generate(target, draft, ids, num_draft_tokens=2, rule=rule, do_sample=True, max_new_tokens=K,
                   eos_token_id=[], pad_token_id=PAD, generator=torch.Generator("cuda").manual_seed(seed),
                   decode_path="graphed")
    return out.sequences[:, len(PROMPT):].cpu(), out.stats


@pytest.mark.parametrize("rule", ["token", "block"])
def test_graphed_sampling_is_lossless(cuda, gpu_pair, rule):
    _needs_cuda_sampler()
    target, draft, joint = gpu_pair
    samples, stats = _sample(target, draft, rule)
    assert stats.graph_captures == 1 and 0.2 < stats.acceptance_rate < 0.9
    assert chi_square_p(samples, joint) > 1e-4


def test_broken_graphed_sampling_fails(cuda, gpu_pair, monkeypatch):
    """Broken: the draft sampler never advances the Philox offset (drafts and verification share coins)."""
    _needs_cuda_sampler()
    target, draft, joint = gpu_pair

    def sample(self, logits):
        return static_state.ops.sample_logits_philox(logits, self.philox_seed, self.philox_offset,
                                                     *self.sampling.op_args())

    monkeypatch.setattr(static_state.StaticState, "sample", sample)
    samples, _ = _sample(target, draft, "token", n=8000)
    assert chi_square_p(samples, joint) < 1e-6


def test_graphed_bfloat16_runs(cuda):
    target, draft = (m.to(device=cuda, dtype=torch.bfloat16) for m in make_pair("llama"))
    ids, mask = _on(cuda, *left_padded([5, 8, 3, 6], seed=5))
    out = generate(target, draft, ids, mask, num_draft_tokens=4, max_new_tokens=16, eos_token_id=[],
                   pad_token_id=PAD, decode_path="graphed")
    assert out.sequences.shape == (4, 8 + 16) and out.stats.new_tokens == 4 * 16
