"""Cascades against the single drafters they are made of, on the demo pair (CPU, batch 1, T = 0).

    python benchmarks/bench_cascades.py --threads 1 --clock cpu            # report set
    python benchmarks/bench_cascades.py --prompts tune                     # the set used to tune

Rows: the target alone (Hugging Face ``generate``), the draft model (``ModelDrafter``), prompt
lookup (``NgramDrafter``), the vertical cascade (the draft model drafting with prompt lookup
inside) and horizontal cascades (the draft model for the first 1 or 2 positions, prompt lookup
after). Each row generates ``--max-new-tokens`` tokens greedily for every prompt, one prompt
at a time; the time of a row is the sum over prompts, its median over ``--repeats`` runs.
``--clock cpu`` times this thread's CPU time (steadier on a shared machine), ``wall`` the wall
clock. Every speculative row's output is checked token for token against the target's own
greedy output.

Prompts: the demo's held-out prompts (``specdecode.demo.demo_prompts()``, Python files never
trained on), split in two: the first half (``--prompts tune``) was used to choose gamma and the
cascade settings, the second half (``--prompts report``, the default) only to report.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch

import specdecode
from specdecode.bench.harness import Column, base_parser, environment, format_table, median, write_results
from specdecode.bench.real_pair import speculative_row
from specdecode.drafters import HorizontalCascadeDrafter, NgramDrafter, VerticalCascadeDrafter


def prompt_sets(n: int) -> dict[str, list[str]]:
    """``tune``: the first ``n`` held-out demo prompts; ``report``: the next ``n``."""
    from specdecode.demo import demo_prompts

    prompts = demo_prompts(2 * n)
    return {"tune": prompts[:n], "report": prompts[n: 2 * n]}


def drafters(draft: torch.nn.Module) -> dict[str, Callable[[], Any]]:
    return {
        "draft model": lambda: draft,
        "prompt lookup": lambda: NgramDrafter(),
        "vertical: draft + lookup inside": lambda: VerticalCascadeDrafter(draft, NgramDrafter(), inner_tokens=4),
        "horizontal: draft x1, then lookup": lambda: HorizontalCascadeDrafter(draft, NgramDrafter(), first_tokens=1),
        "horizontal: draft x2, then lookup": lambda: HorizontalCascadeDrafter(draft, NgramDrafter(), first_tokens=2),
    }


def main() -> None:
    parser = base_parser(__doc__.split("\n\n")[0], prog="bench_cascades.py")
    parser.add_argument("--prompts", choices=("tune", "report"), default="report")
    parser.add_argument("--num-prompts", type=int, default=12, help="prompts per set")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--gamma", type=int, default=5, help="num_draft_tokens")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    parser.add_argument("--pair", choices=("demo", "benchmark"), default="demo",
                        help="the embedded demo pair, or its cost-realistic widened target")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    repeats = args.repeats or (1 if args.quick else 3)
    num_prompts = 2 if args.quick else args.num_prompts
    if args.pair == "demo":
        target, draft, tok = specdecode.load_demo_pair()
    else:
        from specdecode.demo import load_benchmark_pair

        target, draft, tok = load_benchmark_pair()
    prompts = [tok(p, return_tensors="pt").input_ids[:, -96:] for p in prompt_sets(num_prompts)[args.prompts]]
    pad = tok.pad_token_id
    want = []

    def alone() -> tuple[int, dict]:
        total = 0
        want.clear()
        for ids in prompts:
            out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.max_new_tokens,
                                  do_sample=False, pad_token_id=pad)
            want.append(out)
            total += out.shape[1] - ids.shape[1]
        return total, {}

    def speculative(make: Callable[[], Any]) -> Callable[[], tuple[int, dict]]:
        def run() -> tuple[int, dict]:
            total, calls, accepted, drafted, forwards = 0, 0, 0, 0, 0
            runs: list[Any] = []
            for ids, reference in zip(prompts, want):
                out = specdecode.generate(target, make(), ids, num_draft_tokens=args.gamma,
                                          max_new_tokens=args.max_new_tokens, pad_token_id=pad)
                if not torch.equal(out.sequences, reference[:, : out.sequences.shape[1]]):
                    raise AssertionError("greedy output differs from the target's own")
                s = out.stats
                total += out.sequences.shape[1] - ids.shape[1]
                calls += s.target_calls
                accepted += s.accepted_tokens
                drafted += s.drafted_tokens
                forwards += s.draft_calls
                runs.append(s)
            per_position = speculative_row(runs)["acceptance_by_position"][:4]  # pooled over the prompts
            return total, {"tokens_per_call": total / max(calls, 1), "acceptance": accepted / max(drafted, 1),
                           "draft_forwards_per_call": forwards / max(calls, 1),
                           "acceptance_by_position": " ".join(f"{a:.2f}" for a in per_position)}
        return run

    cases: dict[str, Callable[[], tuple[int, dict]]] = {"target alone": alone}
    cases.update({name: speculative(make) for name, make in drafters(draft).items()})
    cases["target alone"]()  # the reference outputs (and a warm-up)
    rows = []
    for name, fn in cases.items():
        times = []
        for _ in range(repeats):
            start = clock()
            tokens, info = fn()
            times.append(clock() - start)
        seconds = median(times)
        rows.append({"drafter": name, "tokens": tokens, "seconds": seconds, "tok_per_s": tokens / seconds, **info})
    base = rows[0]["tok_per_s"]
    best_single = max(r["tok_per_s"] for r in rows if r["drafter"] in ("draft model", "prompt lookup"))
    for r in rows:
        r["vs_target"] = r["tok_per_s"] / base
        r["vs_best_single"] = r["tok_per_s"] / best_single
    two = "{:.2f}".format
    columns = ["drafter", Column("tok_per_s", "tok/s", "{:.1f}".format), Column("vs_target", "x target", two),
               Column("vs_best_single", "x best single", two), Column("tokens_per_call", "tok/call", two),
               Column("draft_forwards_per_call", "draft fwd/call", two),
               Column("acceptance_by_position", "acceptance by position")]
    title = (f"{args.pair} pair, {args.prompts} prompts ({num_prompts}), batch 1, T=0, gamma {args.gamma}, "
             f"{args.max_new_tokens} new tokens, {args.threads} thread(s), {args.clock} clock, "
             f"median of {repeats}")
    print(format_table(rows, columns, title=title))
    write_results(args.out, "cascades", rows, {**environment(), **vars(args)})


if __name__ == "__main__":
    main()
