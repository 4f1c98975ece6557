"""Every code path of the CUDA verify / sample / tree ops on small inputs, for NVIDIA's
compute-sanitizer, which checks what the CPU emulator of tests/cuda_emu cannot: shared-memory
races between threads, out-of-bounds and misaligned accesses, barriers not reached by every
thread, reads of uninitialised device memory. On a machine with a GPU:

    for tool in memcheck racecheck synccheck initcheck; do
        compute-sanitizer --tool $tool --error-exitcode 1 python scripts/cuda_sanitizer_calls.py || echo "$tool FAILED"
    done

Covered: every rule of verify_probs and verify_logits (plain sampling; top-k + top-p + min-p;
top-p alone, including a top_p that needs the exact kept mass; min-p alone; flat rows that go
through the exact fallback), the Philox variants, sample_logits (greedy and sampled),
processed_probs, verify_tree / verify_tree_philox with every tree rule, bad rows that raise, an
empty batch, two vocabulary sizes (one and several chunks; aligned and
unaligned rows) and two dtypes. Results are not compared here (tests/test_cuda.py does that).
`--device cpu` runs the same calls on the CPU ops (a check of this script itself).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from cuda_agreement import (PATH_RULES, RULES, TREE_RULES, logit_inputs, paths_logit_inputs,  # noqa: E402
                            tree_logit_inputs, tree_needs_draft)

import specdecode  # noqa: E402,F401  (registers the ops)

OPS = torch.ops.specdecode
SAMPLINGS = [(1.0, 0, 1.0, 0.0), (0.8, 50, 0.9, 0.05), (0.8, 0, 0.9, 0.0), (1.0, 0, 1.0, 0.1), (0.0, 0, 1.0, 0.0)]


def run(device: str) -> int:
    calls = 0
    for V, dtype in [(1000, torch.float32), (20001, torch.bfloat16)]:
        target, draft, drafts, num, u = (t.to(device) for t in logit_inputs(3, 3, V, dtype, seed=V))
        probs, dprobs = torch.softmax(target.float(), -1).to(dtype), torch.softmax(draft.float(), -1).to(dtype)
        flat_t, flat_d = torch.zeros_like(target), torch.zeros_like(draft)
        seed = torch.tensor([3], device=device)
        offset = torch.tensor([1], device=device)
        for rule, params in RULES:
            d, dp = (draft, dprobs) if rule in ("token", "block") else (None, None)
            OPS.verify_probs(probs, dp, drafts, num, u, rule, params)
            OPS.verify_probs_philox(probs, dp, drafts, num, seed, offset, rule, params)
            calls += 2
            for sampling in SAMPLINGS:
                OPS.verify_logits(target, d, drafts, num, u, *sampling, rule, params)
                OPS.verify_logits_philox(target, d, drafts, num, seed, offset, *sampling, rule, params)
                calls += 2
            for sampling in [(1.0, 0, 0.9, 0.0), (1.0, 0, 1.0, 0.5), (1.0, 300, 0.5, 0.0)]:
                OPS.verify_logits(flat_t, None if d is None else flat_d, drafts, num, u, *sampling, rule, params)
                calls += 1
        # top-p alone with top_p right at a group boundary: the exact kept mass and a second merge
        row = target[0, 0].double()
        e = torch.exp(row - row.max())
        top = float(e.sort(descending=True).values[:10].sum())
        OPS.verify_logits(target, draft, drafts, num, u, 1.0, 0, top / float(e.sum()) * (1 + 1e-7), 0.0, "token", [])
        logits = target[:, 0].contiguous()
        for sampling in SAMPLINGS:
            OPS.sample_logits(logits, u[:, 0].contiguous(), *sampling)
            OPS.sample_logits_philox(logits, seed, offset, *sampling)
            calls += 2
        bad = target.clone()
        bad[1, 0, 5] = math.nan
        for rule, params in RULES:
            try:
                OPS.verify_logits(bad, draft if rule in ("token", "block") else None, drafts, num, u, 1.0, 0, 1.0, 0.0,
                                  rule, params)
            except ValueError:
                calls += 1
        empty = torch.empty(0, 4, V, device=device, dtype=dtype)
        OPS.verify_logits(empty, empty[:, :3], drafts[:0], num[:0], u[:0], 1.0, 0, 1.0, 0.0, "token", [])
        for sampling in SAMPLINGS:
            OPS.processed_probs(logits, *sampling)
            calls += 1
        # token trees: every rule, ragged rows, wide nodes with repeated rejections
        tree = [t.to(device) for t in tree_logit_inputs(3, 9, V, dtype, seed=V, max_children=4, related=False)]
        paths = [t.to(device) for t in paths_logit_inputs(3, V, dtype, seed=V)]  # gbv: K paths of one length
        for rule, params in TREE_RULES + PATH_RULES:
            inputs = paths if (rule, params) in PATH_RULES else tree
            t_args = [inputs[0], inputs[1] if tree_needs_draft(rule) else None, *inputs[2:5]]
            for sampling in SAMPLINGS:
                OPS.verify_tree(*t_args, inputs[5], *sampling, rule, params)
                OPS.verify_tree_philox(*t_args, seed, offset, *sampling, rule, params)
                calls += 2
        bad_tree = tree[0].clone()
        bad_tree[1, 0, 3] = math.nan
        try:
            OPS.verify_tree(bad_tree, tree[1], *tree[2:], 1.0, 0, 1.0, 0.0, "rrs", [])
        except ValueError:
            calls += 1
    if device == "cuda":
        torch.cuda.synchronize()
    print(f"cuda_sanitizer_calls: {calls} calls on {device} returned")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    sys.exit(run(parser.parse_args().device))
