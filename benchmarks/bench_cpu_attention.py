"""Benchmark of the CPU fast path's attention (specdecode.cpu_attention): PyTorch's
``scaled_dot_product_attention`` against ``torch.ops.specdecode.skinny_attention`` on the calls a
static KV cache makes, the same inputs for both.

Each case is one attention call of a decode or verification step: ``n`` queries per row against
a static cache of ``capacity`` columns, of which each row attends its prompt (left padding before
it, as the data stage's batches have) and the tokens made so far; the mask rules out the rest
(the lowest float), which the op skips. Every case keeps ``--layers`` layers' keys and
values (distinct tensors, as a model's layers are) and, before each call, writes a buffer of
``--evict-mb`` MB, so that the keys and values come from memory as they do between a model's
steps. The two paths are timed in turn within each repeat (interleaved, order rotating), outputs
checked equal to float rounding; medians and the ratio SDPA / ours of one run.

    python benchmarks/bench_cpu_attention.py                 # 2 threads if the machine has them
    python benchmarks/bench_cpu_attention.py --threads 1 --clock cpu
    python benchmarks/bench_cpu_attention.py --quick         # smoke run
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.nn.functional as F

import specdecode
from specdecode.bench.harness import CLOCKS, base_parser, environment, format_table, median, write_results

# name: (batch, heads, key/value heads, head size, queries per row, capacity, longest prompt)
CASES = {
    "demo target, data step": (32, 4, 4, 64, 1, 194, 96),
    "demo target, data step, batch 64": (64, 4, 4, 64, 1, 194, 96),
    "SmolLM2, data step": (32, 9, 3, 64, 1, 194, 96),
    "SmolLM2, verify 6 tokens": (1, 9, 3, 64, 6, 512, 256),
    "SmolLM2, verify 16 tokens": (1, 9, 3, 64, 16, 512, 256),
}
QUICK_CASES = ("demo target, data step", "SmolLM2, verify 6 tokens")


def step_mask(batch: int, n: int, capacity: int, longest: int, made: int, gen: torch.Generator) -> torch.Tensor:
    """The additive mask of a step after ``made`` new tokens: row b attends its columns from its
    prompt's first (left padding of up to 60% of the longest prompt before it) to each query's
    own column, causal among the n queries.

    Shape: returns ``[batch, 1, n, capacity]`` float32."""
    start = torch.randint(0, int(0.6 * longest) + 1, (batch,), generator=gen)
    first = longest + made
    keys = torch.arange(capacity)[None, None, :]
    query = (first + torch.arange(n))[None, :, None]
    allowed = (keys >= start[:, None, None]) & (keys <= query)
    mask = torch.zeros(batch, n, capacity).masked_fill_(~allowed, torch.finfo(torch.float32).min)
    return mask[:, None]


def bench_case(name: str, args: Any, clock: Any) -> dict[str, Any]:
    B, H, Hkv, D, n, capacity, longest = CASES[name]
    gen = torch.Generator().manual_seed(args.seed)
    keys = [torch.randn(B, Hkv, capacity, D, generator=gen) for _ in range(args.layers)]
    values = [torch.randn(B, Hkv, capacity, D, generator=gen) for _ in range(args.layers)]
    room = capacity - longest - n
    masks = [step_mask(B, n, capacity, longest, made, gen) for made in range(0, room, max(1, room // 6))]
    query = torch.randn(B, H, n, D, generator=gen)
    evict = torch.zeros(args.evict_mb * (1 << 18))
    scale = D ** -0.5

    def sdpa(k: torch.Tensor, v: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(query, k, v, attn_mask=m, scale=scale, enable_gqa=H != Hkv)

    def ours(k: torch.Tensor, v: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        return torch.ops.specdecode.skinny_attention(query, k, v, m, scale)

    paths = {"sdpa": sdpa, "ours": ours}
    for m in masks[:2]:
        torch.testing.assert_close(ours(keys[0], values[0], m), sdpa(keys[0], values[0], m), rtol=1e-4, atol=1e-5)
    times: dict[str, list[float]] = {p: [] for p in paths}
    names = list(paths)
    for i in range(1 + args.repeats):
        for path in names[i % 2:] + names[:i % 2]:
            total = 0.0
            for m in masks:
                for k, v in zip(keys, values):
                    if args.evict_mb:
                        evict.add_(1.0)
                    start = clock()
                    paths[path](k, v, m)
                    total += clock() - start
            if i > 0:
                times[path].append(total / (len(masks) * len(keys)))
    sdpa_us, ours_us = median(times["sdpa"]) * 1e6, median(times["ours"]) * 1e6
    attended = float((masks[len(masks) // 2] == 0).float().mean())
    return {"case": name, "B": B, "H/Hkv": f"{H}/{Hkv}", "n": n, "columns": capacity, "attended": attended,
            "sdpa_us": sdpa_us, "ours_us": ours_us, "sdpa/ours": sdpa_us / ours_us}


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=6, help="layers' keys and values per case (distinct tensors)")
    parser.add_argument("--evict-mb", type=int, default=64,
                        help="MB written before every call, so keys and values come from memory (0: none)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: 2, or fewer cores)")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="wall time, or this thread's CPU time (with --threads 1 on a busy machine)")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    elif torch.get_num_threads() > 2:
        torch.set_num_threads(2)
    clock = CLOCKS[args.clock]
    args.repeats = args.repeats or (2 if args.quick else 7)
    names = QUICK_CASES if args.quick else tuple(CASES)
    meta = {**environment(), "isa": specdecode.build_info().get("cpu_isa"), "clock": args.clock,
            "layers": args.layers, "evict_mb": args.evict_mb}
    print(f"torch {meta['torch']}, {torch.get_num_threads()} threads, {args.clock} clock, {meta['isa']} kernels")
    rows = []
    for name in names:
        rows.append(bench_case(name, args, clock))
        print(f"  {name}: {rows[-1]['sdpa/ours']:.2f}x", flush=True)
    print(format_table(rows, ["case", "B", "H/Hkv", "n", "columns", "attended", "sdpa_us", "ours_us", "sdpa/ours"],
                       title=f"one attention call of a step (µs, medians of {args.repeats}, "
                             f"{torch.get_num_threads()} threads, {args.clock} clock)"))
    csv_path, _ = write_results(args.out, "bench_cpu_attention", rows, meta)
    print(f"results: {csv_path}")


if __name__ == "__main__":
    main()
