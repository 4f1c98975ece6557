"""Benchmark of the static path's bounded attention: a chain step reads only the columns a row
can have reached, rounded up to a bucket of 64 columns
(:func:`specdecode.engine.attention_widths.attended_columns`, the widths the graphed path
records one graph each for) instead of the static cache's whole capacity.

The demo target continues a batch of its default data prompts (cut to ``--prompt-tokens``) on
the static path with the target alone, T = 0.7, EOS off (every row makes ``--max-new-tokens``
tokens), three ways: over the bucketed widths (the default), over the exact bound
(:func:`~specdecode.engine.attention_widths.visible_columns`, column by column, what the static
path did before the buckets) and over the whole capacity, each in turn within a repeat
(interleaved, order rotating) after one untimed warm-up each. Printed: median seconds of each
and the ratios whole / bucketed and bound / bucketed (above 1: the buckets are faster).

    python benchmarks/bench_visible_columns.py                        # 1 row and 8 rows, 440 new tokens
    python benchmarks/bench_visible_columns.py --batch-size 32 --max-new-tokens 96 --prompt-tokens 96
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

import specdecode.engine.attention_widths as attention_widths
import specdecode.engine.static_loop as static_loop
from specdecode.training.continuations import continue_prompts
from specdecode.training.data import DataSettings

sys.path.insert(0, str(Path(__file__).parent))
from bench_data_stage import batch_prompts, load  # noqa: E402


def bench(target: object, tokenizer: object, rows: int, args: argparse.Namespace) -> dict[str, float]:
    settings = DataSettings(max_new_tokens=args.max_new_tokens, temperature=0.7, batch_size=rows)
    prompts = [p[: args.prompt_tokens] for p in batch_prompts("demo", tokenizer, settings, rows, args.seed)]
    widths = {"bucketed": attention_widths.attended_columns, "bound": attention_widths.visible_columns,
              "whole": lambda width, step, gamma, capacity: capacity}  # whole: the recorded steps before
    names = list(widths)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    try:
        for i in range(1 + args.repeats):
            for name in names[i % 3:] + names[: i % 3]:
                static_loop.attended_columns = widths[name]
                start = time.perf_counter()
                continue_prompts(target, prompts, settings, args.seed + i, decode_path="static")
                if i:
                    seconds[name].append(time.perf_counter() - start)
    finally:
        static_loop.attended_columns = widths["bucketed"]
    return {name: statistics.median(values) for name, values in seconds.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-size", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--max-new-tokens", type=int, default=440)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load("demo", "cpu", "float32")
    assert loaded is not None
    target, tokenizer = loaded
    target.generation_config.eos_token_id = None  # every row makes max_new_tokens tokens
    print(f"demo target, CPU, {args.threads} threads, prompts of up to {args.prompt_tokens} tokens, "
          f"{args.max_new_tokens} new tokens, T = 0.7, median of {args.repeats}, interleaved")
    print(f"{'rows':>5} {'bucketed s':>11} {'bound s':>8} {'whole s':>8} {'whole/bucketed':>15} {'bound/bucketed':>15}")
    for rows in args.batch_size:
        t = bench(target, tokenizer, rows, args)
        print(f"{rows:>5} {t['bucketed']:>11.3f} {t['bound']:>8.3f} {t['whole']:>8.3f} "
              f"{t['whole'] / t['bucketed']:>15.3f} {t['bound'] / t['bucketed']:>15.3f}")


if __name__ == "__main__":
    main()
