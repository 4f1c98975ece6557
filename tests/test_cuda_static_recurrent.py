"""Recurrent and hybrid models on the graphed path (a GPU): the verification step, its mixers
stepping one position at a time and each row's kept states chosen on the device
(specdecode.models.recurrent_static), recorded as a CUDA graph and replayed. Skipped without a
CUDA device (tests/test_static_recurrent.py runs the same on the CPU, static and compiled).

- greedy output equals the model's own ``generate`` (float32; LFM2 short convolutions, Qwen3-Next
  gated delta rule, Bamba Mamba2; an oracle drafter whose rows keep 0 .. k drafts, chains and
  tries; a left-padded batch), on the graphed path and, for LFM2, the compiled one;
- no host synchronisation inside the replayed loop; a second generation records nothing;
- the exact whole-loop sampling test (token rule, LFM2) on the GPU, and the broken variant that
  keeps the states after every fed column.
"""

from __future__ import annotations

import pytest
import torch
from test_cuda_static import _needs_cuda_sampler, cuda, strict_decode  # noqa: F401
from test_generate_models import PAD, left_padded
from test_generate_recurrent import FAIL_P, PASS_P, PROMPT, V, hybrid_model
from test_generate_sampling import K, chi_square_p, exact_joint
from test_generate_windows import alone, llama_draft
from test_static_recurrent import OracleDrafter, OracleTreeDrafter, _real_prompts

from specdecode import generate
from specdecode.models.static_cache import ColumnCache

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("kind", ["lfm2", "qwen3_next", "bamba"])
def test_graphed_greedy_equals_the_model_alone(cuda, strict_decode, kind):
    target = hybrid_model(kind).to(cuda)
    ids, mask = (t.to(cuda) for t in left_padded([13, 8, 11], vocab=V, seed=2))
    want = alone(target, ids, mask, 16)
    oracle = OracleDrafter(_real_prompts(ids, mask), want, V)
    paths = ["graphed", "compiled"] if kind == "lfm2" else ["graphed"]
    for path in paths:
        captures = []
        for _ in range(2):
            out = generate(target, oracle, ids, mask, max_new_tokens=16, num_draft_tokens=3, decode_path=path,
                           eos_token_id=[], pad_token_id=PAD)
            assert torch.equal(out.sequences[:, ids.shape[1]:], want), (kind, path)
            captures.append(out.stats.graph_captures)
        assert captures[1] == 0, captures  # the second generation replays the first one's graphs
    alone_out = generate(target, None, ids, mask, max_new_tokens=16, decode_path="graphed", eos_token_id=[],
                         pad_token_id=PAD)
    assert torch.equal(alone_out.sequences[:, ids.shape[1]:], want)
    trees = generate(target, OracleTreeDrafter(_real_prompts(ids, mask), want, V, depth=3), ids, mask,
                     max_new_tokens=16, decode_path="graphed", eos_token_id=[], pad_token_id=PAD)
    assert torch.equal(trees.sequences[:, ids.shape[1]:], want)  # each node stepped from its parent


@pytest.fixture(scope="module")
def recurrent_pair():
    """LFM2 and a draft of 8 tokens on the GPU, with the exact joint law (on the CPU, float64)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    target = hybrid_model("lfm2", vocab=8, seed=4, scale=0.3)
    joint = exact_joint(target, PROMPT)
    return target.to("cuda"), llama_draft(vocab=8, seed=5).to("cuda"), joint


def _sample(target, draft, n=20000):
    ids = torch.tensor([PROMPT], device="cuda").expand(n, -1)
    out = generate(target, draft, ids, num_draft_tokens=2, do_sample=True, max_new_tokens=K, decode_path="graphed",
                   eos_token_id=[], pad_token_id=PAD, generator=torch.Generator("cuda").manual_seed(0))
    return out.sequences[:, len(PROMPT):].cpu()


def test_graphed_sampling_is_exact(cuda, recurrent_pair):
    _needs_cuda_sampler()
    target, draft, joint = recurrent_pair
    assert chi_square_p(_sample(target, draft), joint) > PASS_P


def test_graphed_sampling_without_choosing_the_states_fails(cuda, recurrent_pair, monkeypatch):
    _needs_cuda_sampler()
    target, draft, joint = recurrent_pair
    monkeypatch.setattr(ColumnCache, "keep_states", lambda self, accepted: None)
    assert chi_square_p(_sample(target, draft), joint) < FAIL_P
