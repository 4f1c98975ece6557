"""Sliding-window layers on the GPU's graphed and compiled paths (run by the device script's bench
stage, scripts/gpu_session.sh; skipped without a CUDA device): each row's greedy output equals the
model's own alone past a window of 6, chains and trees, the sliding layers keeping a ring."""

from __future__ import annotations

import pytest
import torch
from test_generate_models import PAD, left_padded
from test_generate_windows import alone, family_model, llama_draft

import specdecode.engine.static_loop as static_loop
from specdecode import ModelDrafter, generate

pytestmark = pytest.mark.cuda


@pytest.fixture
def cuda() -> torch.device:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    return torch.device("cuda")


@pytest.mark.parametrize("kind", ["gemma3_text", "mistral", "gpt_oss"])
def test_graphed_and_compiled_past_the_window(cuda, kind):
    target, draft = family_model(kind), llama_draft()
    ids, mask = left_padded([20, 13, 17], vocab=96, seed=4)
    want = alone(target, ids, mask, 24)  # on the CPU, float32
    target, draft = target.to(cuda), draft.to(cuda)
    try:
        for decode_path in ("graphed", "compiled"):
            for tree in (None, [[0], [1], [0, 0], [0, 1], [1, 0]]):
                out = generate(target, ModelDrafter(draft), ids.to(cuda), mask.to(cuda), max_new_tokens=24,
                               num_draft_tokens=4, tree=tree, eos_token_id=[], pad_token_id=PAD,
                               decode_path=decode_path)
                assert torch.equal(out.sequences[:, ids.shape[1]:].cpu(), want), (decode_path, tree)
    finally:
        static_loop.clear_static_sessions()
