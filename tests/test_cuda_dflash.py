"""DFlash on the GPU's decode paths (run by the device script's bench stage,
scripts/gpu_session.sh; skipped without a CUDA device): greedy output equals the target's own on
the eager, graphed and compiled paths, chains and rank trees, a left-padded batch."""

from __future__ import annotations

import pytest
import torch
from test_cuda_windows import cuda  # noqa: F401  (the fixture: skips without a CUDA device)
from test_drafter_dflash import random_dflash, target_model
from test_drafters import hf_greedy
from test_generate_models import PAD, left_padded

import specdecode.engine.static_loop as static_loop
from specdecode import generate
from specdecode.drafters import DFlashDrafter

pytestmark = pytest.mark.cuda


def test_graphed_compiled_and_eager_paths(cuda):
    target = target_model("llama", seed=2)
    ids, mask = left_padded([4, 9, 6], vocab=111, seed=6)
    want = hf_greedy(target, ids, mask, max_new_tokens=16)  # on the CPU, float32
    target = target.to(cuda)
    model = random_dflash(target, seed=5)
    try:
        for decode_path in ("eager", "graphed", "compiled"):
            for tree in (None, [(0,), (1,), (0, 0), (0, 1)]):
                out = generate(target, DFlashDrafter(target, model, tree=tree), ids.to(cuda), mask.to(cuda),
                               max_new_tokens=16, num_draft_tokens=3, pad_token_id=PAD, decode_path=decode_path)
                assert torch.equal(out.sequences.cpu(), want), (decode_path, tree)
    finally:
        static_loop.clear_static_sessions()
