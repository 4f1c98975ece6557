"""``python -m specdecode``: the demo, the end-to-end benchmark and the build report.

    python -m specdecode demo                       # embedded pair, streamed text + statistics
    python -m specdecode demo --rule block --gamma 6 --temperature 1 --prompt "def parse("
    python -m specdecode demo --target PATH --draft PATH   # any local Hugging Face pair
    python -m specdecode bench [--quick] [--plot]   # see specdecode.bench_generate
    python -m specdecode bench --trees [--quick]    # token trees vs chains, see specdecode.bench_trees
    python -m specdecode bench --device cuda        # decode paths (eager / graphed), see specdecode.bench_gpu
    python -m specdecode info                       # what was built
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch

DEFAULT_PROMPT = "def binary_search(items, target):\n    \"\"\"Return the index of target in the sorted list items.\"\"\"\n"


def _params(model: Any) -> str:
    n = sum(p.numel() for p in model.parameters())
    return f"{n / 1e6:.2f}M params"


def demo(args: argparse.Namespace) -> dict[str, Any]:
    """Stream a speculative generation, then compare with the target alone. Returns the table."""
    from transformers import TextStreamer

    import specdecode
    from specdecode.benchmarking import format_table

    from specdecode.bench_generate import load_pair

    target, draft, tokenizer, name = load_pair(args.pair, args.target, args.draft)
    print(f"pair: {name}\n  target {_params(target)}, draft {_params(draft)}")
    input_ids = tokenizer(args.prompt, return_tensors="pt").input_ids
    sampling = dict(do_sample=True, temperature=args.temperature) if args.temperature > 0 else dict(do_sample=False)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    print(f"rule={args.rule}  gamma={args.gamma}  temperature={args.temperature}  "
          f"max_new_tokens={args.max_new_tokens}\n" + "-" * 72)
    streamer = TextStreamer(tokenizer)
    gen = torch.Generator().manual_seed(args.seed)
    out = specdecode.generate(target, draft, input_ids, num_draft_tokens=args.gamma, rule=args.rule,
                              max_new_tokens=args.max_new_tokens, streamer=streamer, generator=gen,
                              pad_token_id=pad_id, **sampling)
    print("-" * 72)
    stats = out.stats
    new_tokens = out.sequences.shape[1] - input_ids.shape[1]

    # The target alone, same prompt and number of new tokens (EOS off so the counts match).
    torch.manual_seed(args.seed)
    start = time.perf_counter()
    plain = target.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=new_tokens,
                            min_new_tokens=new_tokens, pad_token_id=pad_id, **sampling)
    plain_seconds = time.perf_counter() - start
    plain_tps = (plain.shape[1] - input_ids.shape[1]) / plain_seconds
    greedy_match = None
    if args.temperature == 0:
        greedy_match = bool(torch.equal(plain[0, : out.sequences.shape[1]], out.sequences[0, : plain.shape[1]]))
    row = {
        "rule": args.rule,
        "gamma": args.gamma,
        "acceptance": stats.alpha,
        "block_eff": stats.block_efficiency,
        "tok/s spec": stats.tokens_per_second,
        "tok/s target": plain_tps,
        "speedup": stats.tokens_per_second / plain_tps,
        "predicted": stats.predicted_speedup,
    }
    print(format_table([row], list(row)))
    print("acceptance by draft position: " + " ".join(f"{a:.2f}" for a in stats.acceptance_rate_per_position))
    print(f"cost ratio c (draft / target per call): {stats.cost_ratio:.3f}; "
          f"time: draft {stats.draft_time:.2f}s, target {stats.target_time:.2f}s, verify {stats.verify_time:.3f}s, "
          f"bookkeeping {stats.bookkeeping_time:.3f}s")
    if greedy_match is not None:
        print(f"greedy output identical to the target's own greedy generate: {greedy_match}")
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m specdecode", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="speculative generation on the embedded pair, with statistics")
    d.add_argument("--rule", default="token", help="verification rule (see specdecode.list_rules())")
    d.add_argument("--gamma", "--num-draft-tokens", type=int, default=5, dest="gamma", help="draft tokens per step")
    d.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    d.add_argument("--prompt", default=DEFAULT_PROMPT)
    d.add_argument("--max-new-tokens", type=int, default=96)
    d.add_argument("--pair", choices=["benchmark", "demo"], default="benchmark",
                   help="benchmark: the trained target enlarged to a realistic cost (default); demo: as trained")
    d.add_argument("--target", help="path of a local Hugging Face target model (with --draft)")
    d.add_argument("--draft", help="path of a local Hugging Face draft model (with --target)")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: torch's choice; 1 avoids stalls on a busy machine)")
    sub.add_parser("bench", help="end-to-end benchmark (python -m specdecode bench --help)", add_help=False)
    sub.add_parser("info", help="what was built")
    args, rest = parser.parse_known_args(argv)
    if args.command == "bench":
        if any(a == "--device" or a.startswith("--device=") for a in rest):
            from specdecode.bench_gpu import main as gpu_main

            gpu_main(rest, prog="python -m specdecode bench --device")
            return
        if "--trees" in rest:
            from specdecode.bench_trees import main as trees_main

            trees_main([a for a in rest if a != "--trees"], prog="python -m specdecode bench --trees")
            return
        from specdecode.bench_generate import main as bench_main

        bench_main(rest, prog="python -m specdecode bench")
    elif args.command == "info":
        from specdecode.info import main as info_main

        info_main()
    else:
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        if args.threads:
            torch.set_num_threads(args.threads)
        try:
            demo(args)
        except (ValueError, TypeError) as exc:  # bad option values: a message, not a traceback
            parser.exit(2, f"specdecode demo: error: {exc}\n")
