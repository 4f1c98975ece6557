"""Benchmark of the verification step on the CPU (``--device cuda``: see cuda_verify_bench.py).

For each (B, gamma, V): specdecode.verify_logits (token and block) against
  * a vectorized pure-PyTorch implementation (batched tensor ops over all rows, as a PyTorch
    user would write it),
  * specdecode's row-by-row pure-PyTorch reference (the oracle of the tests),
  * transformers' own ``_speculative_sampling`` (B = 1 only: it supports nothing more).
Draft logits are the target's plus noise, so acceptance is realistic. Reports medians (µs),
ratios, and effective GB/s against the bytes of logits that must be read once.

    python benchmarks/bench_verify.py            # full table, results in bench_results/
    python benchmarks/bench_verify.py --quick    # smoke run
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import specdecode
sys.path.insert(0, str(Path(__file__).resolve().parent))
from torch_baselines import torch_block, torch_token  # noqa: E402
from specdecode.bench.harness import base_parser, environment, format_table, median, time_call, write_results
from specdecode.reference import verify_logits_reference

FULL_SHAPES = [(1, 5, 32000), (8, 8, 32000), (32, 8, 128256)]
QUICK_SHAPES = [(1, 5, 32000), (4, 4, 4096)]


def make_inputs(B: int, gamma: int, V: int, seed: int, noise: float = 1.0):
    g = torch.Generator().manual_seed(seed)
    target = torch.randn((B, gamma + 1, V), generator=g) * 3.0
    draft = target[:, :gamma] + noise * torch.randn((B, gamma, V), generator=g)
    q = torch.softmax(draft, -1)
    tokens = torch.multinomial(q.reshape(-1, V), 1, generator=g).reshape(B, gamma)
    return target, draft, tokens


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--no-reference", action="store_true", help="skip the (slow) row-by-row reference")
    args = parser.parse_args()
    if args.device == "cuda":
        from cuda_verify_bench import main as cuda_main

        cuda_main(args)
        return
    from transformers.generation.utils import _speculative_sampling

    shapes = QUICK_SHAPES if args.quick else FULL_SHAPES
    rows = []
    for B, gamma, V in shapes:
        target, draft, tokens = make_inputs(B, gamma, V, args.seed)
        gen = torch.Generator().manual_seed(args.seed)
        repeats = args.repeats or (5 if args.quick else (30 if B * V < 1_000_000 else 10))
        bytes_read = (target.numel() + draft.numel()) * target.element_size()
        cases = {
            "specdecode token": lambda: specdecode.verify_logits(target, draft, tokens, rule="token", generator=gen),
            "specdecode block": lambda: specdecode.verify_logits(target, draft, tokens, rule="block", generator=gen),
            "torch vectorized token": lambda: torch_token(
                target, draft, tokens, torch.rand((B, gamma + 1), dtype=torch.float64, generator=gen)),
            "torch vectorized block": lambda: torch_block(
                target, draft, tokens, torch.rand((B, gamma + 1), dtype=torch.float64, generator=gen)),
        }
        if not args.no_reference:
            u = torch.rand((B, gamma + 1), dtype=torch.float64, generator=gen)
            n = torch.full((B,), gamma)
            cases["reference token (row loop)"] = lambda: verify_logits_reference(
                target, draft, tokens, rule="token", num_draft_tokens=n, uniforms=u)
        if B == 1:
            prompt = torch.zeros((1, 7), dtype=torch.int64)
            candidate_ids = torch.cat([prompt, tokens], 1)
            cases["HF _speculative_sampling"] = lambda: _speculative_sampling(candidate_ids, draft, gamma, target)
        times = {}
        for name, fn in cases.items():
            reps = max(3, repeats // 5) if "reference" in name else repeats
            times[name] = median(time_call(fn, repeats=reps, warmup=1 if "reference" in name else 3))
        accepted = specdecode.verify_logits(target, draft, tokens, rule="token", generator=gen).accepted_len
        for name, seconds in times.items():
            rows.append({
                "B": B, "gamma": gamma, "V": V, "impl": name, "median_us": seconds * 1e6,
                "GB/s": bytes_read / seconds / 1e9,
                "x_vs_torch_token": times["torch vectorized token"] / seconds,
                "x_vs_hf": (times["HF _speculative_sampling"] / seconds) if "HF _speculative_sampling" in times else None,
                "mean_accepted": float(accepted.float().mean()),
            })
    columns = ["B", "gamma", "V", "impl", "median_us", "GB/s", "x_vs_torch_token", "x_vs_hf", "mean_accepted"]
    print(format_table(rows, columns))
    from specdecode._ops import build_info

    meta = {**environment(), "cpu_isa": build_info().get("cpu_isa"), "args": vars(args)}
    csv_path, json_path = write_results(args.out, "bench_verify_cpu", rows, meta)
    print(f"\nwrote {csv_path} and {json_path}")


if __name__ == "__main__":
    main()
