"""The compiled static decode path on a GPU (``decode_path="compiled"``): the step compiled by
``torch.compile`` (Inductor, Triton kernels) once per layout, then recorded as CUDA graphs and
replayed; the target's prefill compiled and recorded once per prompt bucket. Skipped without a
CUDA device (checked when a test runs).

- greedy output equals the target's own greedy ``generate`` (float32; Llama and GPT-2; the
  target alone, a draft model's chains, a token tree, EAGLE chains and Medusa trees; batch 1
  and left-padded batches) and the graphed path's;
- compiled and recorded once per layout: a second call and prompts of other lengths in the same
  bucket compile and record nothing; no host synchronisation inside the replayed loop;
- a compiled step launches at most a third of the CUDA kernels of the eager static step;
- the exact whole-loop sampling test (token rule) on the GPU, and a broken variant.

First, the graphed path's bucketed attention widths (:mod:`specdecode.engine.attention_widths`;
the compiled path attends over the whole capacity): prompts that cross the 64-column bucket edge
during the generation give the target's greedy output and the static path's, with one capture
per bucket reached and none in a second generation of the layout; the exact sampling test with
small buckets (three widths in three steps).
"""

from __future__ import annotations

import pytest
import torch
from test_cuda_static import _needs_cuda_sampler, _on, cuda, gpu_pair, strict_decode  # noqa: F401
from test_generate_models import PAD, _one_thread, left_padded, make_pair  # noqa: F401
from test_generate_sampling import K, PROMPT, chi_square_p
from test_static_features import eagle_drafter, medusa_heads, target_model
from torch._dynamo.utils import counters

import specdecode.engine.attention_widths as attention_widths
import specdecode.engine.graphs as graphs
import specdecode.engine.static_state as static_state
from specdecode import ModelDrafter, NgramDrafter, generate
from specdecode.drafters import MedusaDrafter
from specdecode.engine.launch_count import step_launches
from specdecode.engine.static_layouts import kept_layouts

pytestmark = pytest.mark.cuda
MAX_NEW = 16
SHAPE = [[0], [1], [0, 0], [0, 1], [1, 0]]


def run(target, draft, ids, mask=None, decode_path="compiled", **kwargs):
    kwargs.setdefault("max_new_tokens", MAX_NEW)
    return generate(target, draft, ids, mask, pad_token_id=PAD, decode_path=decode_path, **kwargs)


def hf_greedy(target, ids, mask=None):
    return target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW, pad_token_id=PAD)


def _recording_variants(monkeypatch) -> list:
    """The variant (attended width) every step program runs with, the prefill's left out."""
    variants, original = [], graphs.StepProgram.run

    def recording(self, variant=None):
        if "target prefill" not in self.seconds:
            variants.append(variant)
        return original(self, variant)

    monkeypatch.setattr(graphs.StepProgram, "run", recording)
    return variants


def test_graphed_chains_attend_over_buckets_recorded_once_each(cuda, monkeypatch):
    """Prompts of up to 47 tokens (a 49-column prompt block), 40 new tokens: the steps start in
    the 64-column bucket and end in the capacity's (96)."""
    target, draft = (m.to(cuda) for m in make_pair("llama", vocab=111))
    ids, mask = _on(cuda, *left_padded([40, 33, 47], vocab=111, seed=5))
    variants = _recording_variants(monkeypatch)
    common = dict(max_new_tokens=40, eos_token_id=[], decode_path="graphed")
    for batch_ids, batch_mask in ((ids[2:], None), (ids, mask)):
        want = target.generate(batch_ids, attention_mask=batch_mask, do_sample=False, max_new_tokens=40,
                               pad_token_id=PAD, eos_token_id=None)
        for source, kwargs in ((None, {}), (draft, dict(num_draft_tokens=4)),
                               (NgramDrafter(min_acceptance=0.0), dict(num_draft_tokens=3)),
                               (draft, dict(num_draft_tokens=4, phase_timing=True))):
            variants.clear()
            out = run(target, source, batch_ids, batch_mask, **common, **kwargs)
            reached = sorted(set(variants))
            assert torch.equal(out.sequences, want), kwargs
            assert reached == [64, 96] and out.stats.graph_captures == len(reached), (kwargs, reached)
            variants.clear()
            again = run(target, source, batch_ids, batch_mask, **common, **kwargs)
            assert torch.equal(again.sequences, want) and again.stats.graph_captures == 0, kwargs
            assert sorted(set(variants)) == reached
            static = run(target, source, batch_ids, batch_mask, **{**common, "decode_path": "static"}, **kwargs)
            assert torch.equal(static.sequences, want), kwargs


def test_a_graphed_host_drafter_reads_every_steps_accepted_lengths(cuda):
    """Between steps the host reads the last step's accepted lengths (``scratch.accepted``): after
    a recording, the warm-up step's; after a replay, the replayed bucket's; the same as on the
    static path, step by step."""
    target = make_pair("llama", vocab=111)[0].to(cuda)
    ids, mask = _on(cuda, *left_padded([40, 33, 47], vocab=111, seed=5))
    logs = []
    for path in ("graphed", "graphed", "static"):  # recorded, replayed, eager
        committed: list = []
        ngram = NgramDrafter(min_acceptance=0.0)

        def commit(update, ngram=ngram, committed=committed):
            committed.append(update.accepted_len.tolist())
            NgramDrafter.commit(ngram, update)

        ngram.commit = commit
        run(target, ngram, ids, mask, decode_path=path, num_draft_tokens=3, max_new_tokens=40, eos_token_id=[])
        logs.append(committed)
    assert logs[0] == logs[2] and logs[1] == logs[2] and len(logs[2]) > 10


def test_graphed_sampling_over_three_buckets_is_lossless(cuda, gpu_pair, monkeypatch):
    """Buckets of 4 columns: the three steps attend over 20, 24 and 28 of the layout's 32."""
    _needs_cuda_sampler()
    target, draft, joint = gpu_pair
    monkeypatch.setattr(attention_widths, "BUCKET_COLUMNS", 4)
    variants = _recording_variants(monkeypatch)
    ids = torch.tensor([PROMPT], device="cuda").expand(20000, -1)
    out = run(target, draft, ids, num_draft_tokens=2, rule="token", do_sample=True, max_new_tokens=K,
              eos_token_id=[], generator=torch.Generator("cuda").manual_seed(0), decode_path="graphed")
    assert variants == [20, 24, 28] and out.stats.graph_captures == 3
    assert chi_square_p(out.sequences[:, len(PROMPT):].cpu(), joint) > 1e-4


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_compiled_greedy_equals_target_and_graphed(cuda, arch):
    target, draft = (m.to(cuda) for m in make_pair(arch))
    ids, mask = _on(cuda, *left_padded([5, 9, 2, 7], seed=1))
    for batch_ids, batch_mask in ((ids[1:2], None), (ids, mask)):
        want = hf_greedy(target, batch_ids, batch_mask)
        for source, kwargs in ((None, {}), (draft, dict(num_draft_tokens=3)), (draft, dict(tree=SHAPE))):
            out = run(target, source, batch_ids, batch_mask, **kwargs)
            assert out.stats.decode_path == "compiled"
            assert torch.equal(out.sequences, want), (arch, kwargs)
            graphed = run(target, source, batch_ids, batch_mask, decode_path="graphed", **kwargs)
            assert torch.equal(graphed.sequences, out.sequences)


def test_feature_drafters_compiled(cuda):
    target = target_model("llama").to(cuda)
    ids, mask = _on(cuda, *left_padded([5, 9, 2], vocab=111, seed=3))
    want = hf_greedy(target, ids, mask)
    for drafter, kwargs in ((eagle_drafter(target), dict(num_draft_tokens=3)),
                            (MedusaDrafter(target, medusa_heads(target), tree=[(0,), (1,), (0, 0)]), {})):
        assert torch.equal(run(target, drafter, ids, mask, **kwargs).sequences, want), type(drafter).__name__


def test_compiled_and_recorded_once_and_no_sync_in_the_loop(cuda, monkeypatch):
    target, draft = (m.to(cuda) for m in make_pair("llama"))
    drafter = ModelDrafter(draft)
    first, other = (_on(cuda, *left_padded(lengths, seed=seed)) for lengths, seed in (([5, 8, 3], 2), ([7, 2, 6], 3)))
    kwargs = dict(num_draft_tokens=4, eos_token_id=[], stop_check_every=MAX_NEW)
    out = run(target, drafter, *first, **kwargs)
    graphs = counters["stats"]["unique_graphs"]
    assert out.stats.graph_captures == 1
    strict_decode(monkeypatch)
    for ids, mask in (first, other):
        again = run(target, drafter, ids, mask, **kwargs)
        assert again.stats.graph_captures == 0 and again.stats.step_host_syncs == 0
        assert torch.equal(again.sequences, hf_greedy(target, ids, mask))
    monkeypatch.undo()
    assert counters["stats"]["unique_graphs"] == graphs and len(kept_layouts(target)) == 1
    compiled = step_launches(kept_layouts(target)[0], drafter)  # the drafter's buffers are this layout's
    run(target, drafter, *first, decode_path="static", **kwargs)
    assert 0 < 3 * compiled <= step_launches(kept_layouts(target)[-1], drafter)


def _sample(target, draft, n=20000):
    """The second generation of the layout: every step replays the compiled step's graph."""
    ids = torch.tensor([PROMPT], device="cuda").expand(n, -1)
    for seed in (1, 0):
        out = run(target, draft, ids, num_draft_tokens=2, rule="token", do_sample=True, max_new_tokens=K,
                  eos_token_id=[], generator=torch.Generator("cuda").manual_seed(seed))
    return out.sequences[:, len(PROMPT):].cpu(), out.stats


def test_compiled_sampling_is_lossless(cuda, gpu_pair):
    _needs_cuda_sampler()
    target, draft, joint = gpu_pair
    samples, stats = _sample(target, draft)
    assert stats.decode_path == "compiled" and stats.graph_captures == 0 and 0.2 < stats.acceptance_rate < 0.9
    assert chi_square_p(samples, joint) > 1e-4


def test_broken_compiled_sampling_fails(cuda, gpu_pair, monkeypatch):
    """Broken: the draft sampler never advances the Philox offset (drafts and verification share coins)."""
    _needs_cuda_sampler()
    target, draft, joint = gpu_pair

    def sample(self, logits):
        return static_state.ops.sample_logits_philox(logits, self.philox_seed, self.philox_offset,
                                                     *self.sampling.op_args())

    monkeypatch.setattr(static_state.StaticState, "sample", sample)
    samples, _ = _sample(target, draft, n=8000)
    assert chi_square_p(samples, joint) < 1e-6
