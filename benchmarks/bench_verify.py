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
from specdecode.benchmarking import base_parser, environment, format_table, median, time_call, write_results
from specdecode.reference import verify_logits_reference

FULL_SHAPES = [(1, 5, 32000), (8, 8, 32000), (32, 8, 128256)]
QUICK_SHAPES = [(1, 5, 32000), (4, 4, 4096)]


def _probs_at_drafts(target_logits: torch.Tensor, draft_logits: torch.Tensor, draft_tokens: torch.Tensor):
    """Softmax of both, and p_i(x_i), q_i(x_i) for every draft position: [B, gamma] each."""
    gamma = draft_tokens.shape[1]
    p = torch.softmax(target_logits.float(), -1)
    q = torch.softmax(draft_logits.float(), -1)
    p_x = p[:, :gamma].gather(-1, draft_tokens[..., None])[..., 0]
    q_x = q.gather(-1, draft_tokens[..., None])[..., 0]
    return p, q, p_x, q_x


def _emit(p, q, draft_tokens, accepted_len, weight, generator):
    """y ~ norm((weight p_{tau+1} - q_{tau+1})_+), or p_{gamma+1} when all were accepted."""
    B, gamma = draft_tokens.shape
    rows = torch.arange(B)
    p_next = p[rows, accepted_len]
    q_next = q[rows, accepted_len.clamp(max=gamma - 1)]
    residual = (weight[:, None] * p_next - q_next).clamp_min(0)
    residual = torch.where((accepted_len < gamma)[:, None], residual, p_next)
    y = torch.multinomial(residual, 1, generator=generator)[:, 0]
    tokens = torch.where(torch.arange(gamma)[None] < accepted_len[:, None], draft_tokens, -1)
    tokens = torch.cat([tokens, torch.full((B, 1), -1)], 1)
    tokens[rows, accepted_len] = y
    return tokens, accepted_len


def torch_vectorized_token(target_logits: torch.Tensor, draft_logits: torch.Tensor, draft_tokens: torch.Tensor,
                           generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Token verification written with batched tensor ops, as a PyTorch user would."""
    B, gamma = draft_tokens.shape
    p, q, p_x, q_x = _probs_at_drafts(target_logits, draft_logits, draft_tokens)
    u = torch.rand((B, gamma), generator=generator)
    accepted_len = (u < p_x / q_x).int().cumprod(-1).sum(-1)
    return _emit(p, q, draft_tokens, accepted_len, torch.ones(B), generator)


def torch_vectorized_block(target_logits: torch.Tensor, draft_logits: torch.Tensor, draft_tokens: torch.Tensor,
                           generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Block verification written with batched tensor ops, as a PyTorch user would."""
    B, gamma = draft_tokens.shape
    p, q, p_x, q_x = _probs_at_drafts(target_logits, draft_logits, draft_tokens)
    weights = [torch.ones(B)]
    for i in range(gamma):  # w_i = min(1, w_{i-1} p_i(x_i) / q_i(x_i))
        weights.append(torch.clamp(weights[-1] * (p_x[:, i] / q_x[:, i]), max=1.0))
    w = torch.stack(weights, 1)  # [B, gamma+1], w[:, 0] = 1
    z = (w[:, 1:gamma, None] * p[:, 1:gamma] - q[:, 1:]).clamp_min(0).sum(-1)
    denom = z + 1 - w[:, 1:gamma]
    h = torch.cat([torch.where(denom > 0, z / denom, torch.ones_like(z)), w[:, -1:]], 1)
    u = torch.rand((B, gamma), generator=generator)
    accepted_len = ((u < h).int() * torch.arange(1, gamma + 1)).max(-1).values
    return _emit(p, q, draft_tokens, accepted_len, w[torch.arange(B), accepted_len], generator)


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
        sys.path.insert(0, str(Path(__file__).resolve().parent))
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
            "torch vectorized token": lambda: torch_vectorized_token(target, draft, tokens, gen),
            "torch vectorized block": lambda: torch_vectorized_block(target, draft, tokens, gen),
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
    csv_path, json_path = write_results(args.out, "bench_verify_cpu", rows, {**environment(), "args": vars(args)})
    print(f"\nwrote {csv_path} and {json_path}")


if __name__ == "__main__":
    main()
