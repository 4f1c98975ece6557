"""Host drafters (prompt lookup, SuffixDecoding) on the static decode path beside the eager one:
the same drafter, the target's step static (or compiled), the drafts proposed on the host
between steps (:mod:`specdecode.engine.host_drafts`). Batch 1, T = 0, the demo target.

    python benchmarks/bench_host_drafters.py --num-prompts 8 --repeats 3

Rows: the target alone on the CPU fast path, then each drafter on each decode path; every
method runs on every prompt in turn, interleaved over ``--repeats`` rounds (tok/s: the median),
greedy output checked equal to the eager path's. Prompts: the first held-out demo prompts.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from specdecode.bench.harness import base_parser, format_table, write_results


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    from specdecode.cli_args import int_at_least

    parser = base_parser("host drafters on the static and eager decode paths (demo target, batch 1, T = 0)")
    parser.add_argument("--num-prompts", type=int_at_least("num_prompts", 1), default=8)
    parser.add_argument("--max-new-tokens", type=int_at_least("max_new_tokens", 1), default=64)
    parser.add_argument("--num-draft-tokens", type=int_at_least("num_draft_tokens", 1), default=4)
    parser.add_argument("--paths", default="eager,static", help="decode paths, e.g. eager,static,compiled")
    args = parser.parse_args(argv)
    import specdecode
    from specdecode.demo import demo_prompts
    from specdecode.drafters import NgramDrafter, SuffixDrafter

    target, _, tok = specdecode.load_demo_pair()
    prompts = [tok(t, return_tensors="pt").input_ids[:, -96:] for t in demo_prompts(93)[: args.num_prompts]]
    paths = args.paths.split(",")
    methods: dict[str, Any] = {"target alone (fast path)": None}
    for name, make in (("prompt lookup", NgramDrafter), ("SuffixDecoding", SuffixDrafter)):
        for path in paths:
            methods[f"{name}, {path}"] = (make, path)
    outputs: dict[str, list[torch.Tensor]] = {}

    def run(name: str) -> tuple[float, int, list[Any]]:
        spec, outs, stats = methods[name], [], []
        start = time.perf_counter()
        for p in prompts:
            if spec is None:
                with specdecode.cpu.accelerated(target):
                    outs.append(target.generate(p, attention_mask=torch.ones_like(p), do_sample=False, pad_token_id=0,
                                                max_new_tokens=args.max_new_tokens))
                continue
            make, path = spec
            out = specdecode.generate(target, make(), p, num_draft_tokens=args.num_draft_tokens, eos_token_id=None,
                                      max_new_tokens=args.max_new_tokens, pad_token_id=0, decode_path=path)
            outs.append(out.sequences)
            stats.append(out.stats)
        seconds = time.perf_counter() - start
        if name in outputs and any(not torch.equal(a, b) for a, b in zip(outs, outputs[name])):
            raise SystemExit(f"{name}: output changed between rounds")
        outputs[name] = outs
        return seconds, sum(o.shape[1] - p.shape[1] for o, p in zip(outs, prompts)), stats

    for name in methods:
        run(name)  # warm-up (the static layouts, compilation)
    times: dict[str, list[float]] = {name: [] for name in methods}
    counts: dict[str, int] = {}
    pooled: dict[str, list[Any]] = {name: [] for name in methods}
    for _ in range(args.repeats or 3):
        for name in methods:
            seconds, counts[name], stats = run(name)
            times[name].append(seconds)
            pooled[name] += stats
    reference = outputs["target alone (fast path)"]
    rows = []
    base = counts["target alone (fast path)"] / statistics.median(times["target alone (fast path)"])
    for name in methods:
        if any(not torch.equal(a, b) for a, b in zip(outputs[name], reference)):
            raise SystemExit(f"{name}: greedy output differs from the target's")
        rate = counts[name] / statistics.median(times[name])
        stats = pooled[name]
        calls = sum(s.new_tokens for s in stats) / max(1, sum(s.row_steps for s in stats)) if stats else 1.0
        rows.append({"method": name, "tokens/call": calls, "tok/s": rate, "x target": rate / base})
    print(format_table(rows, ["method", "tokens/call", "tok/s", "x target"],
                       title=f"demo target, {len(prompts)} held-out prompts, batch 1, T=0, "
                             f"{args.max_new_tokens} new tokens, k={args.num_draft_tokens}, "
                             f"threads {torch.get_num_threads()}"))
    write_results(args.out, "host_drafters", rows, vars(args))
    return rows


if __name__ == "__main__":
    main()
