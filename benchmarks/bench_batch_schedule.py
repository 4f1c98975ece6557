"""The default draft schedule by batch size: SmolLM2-135M-Instruct with its shipped drafter on the
CPU, the target alone (Hugging Face ``generate`` on specdecode's CPU fast path), the old default
(``draft_schedule="constant"``) and the new one (no ``draft_schedule``: ``"auto"`` on the eager
path), measured interleaved in one run.

    flock /tmp/bench.lock python benchmarks/bench_batch_schedule.py --prompt-set report
    flock /tmp/bench.lock python benchmarks/bench_batch_schedule.py --quick

Prompts: the chat requests of ``specdecode.prompt_sets.chat_prompt_set`` (``tune``: what the
schedule's settings were chosen on; ``report``: never looked at while tuning), each in the
tokenizer's chat template, grouped in order into left-padded batches of each --batches size.
Greedy, EOS off: every row generates exactly --max-new-tokens, and every speculative output is
checked equal to the target's (a difference stops the benchmark).

Each repeat runs, for every batch size and batch, the three methods back to back (their order
rotating between repeats); a method's time at a batch size is the sum over its batches. Columns:
tok/s (median over repeats), the speed-up over the target alone (median over repeats of the
ratio within the repeat), and for the speculative rows the mean gamma per step, the share of
plain steps (gamma 0) and tokens per target call.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from specdecode.bench.harness import base_parser, environment, format_table, without_eos, write_results

TARGET = "target alone, fast path"
OLD = "EAGLE, constant (old default)"
NEW = "EAGLE, default (auto)"
FULL = dict(batches=[1, 4, 8], max_new_tokens=48, repeats=3, num_prompts=16)
QUICK = dict(batches=[1, 2], max_new_tokens=8, repeats=1, num_prompts=2)


def batches_of(prompts: list[torch.Tensor], size: int, pad: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Consecutive groups of ``size`` prompts ``[1, L]`` as left-padded ``(ids, mask)`` ``[size, L]``
    (a last, smaller group is dropped)."""
    groups = []
    for start in range(0, len(prompts) - size + 1, size):
        rows = prompts[start: start + size]
        width = max(p.shape[1] for p in rows)
        ids = torch.full((size, width), pad, dtype=torch.long)
        mask = torch.zeros((size, width), dtype=torch.long)
        for i, p in enumerate(rows):
            ids[i, width - p.shape[1]:] = p[0]
            mask[i, width - p.shape[1]:] = 1
        groups.append((ids, mask))
    return groups


def run(method: str, target: Any, drafter: Any, ids: torch.Tensor, mask: torch.Tensor, *, max_new_tokens: int,
        num_draft_tokens: int, pad: int) -> tuple[torch.Tensor, Any]:
    """One greedy generation: ``(sequences, stats or None)``."""
    import specdecode

    if method == TARGET:
        with specdecode.cpu.accelerated(target, enabled=True):
            return target.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                                   pad_token_id=pad), None
    extra = {"draft_schedule": "constant"} if method == OLD else {}
    out = specdecode.generate(target, drafter, ids, mask, num_draft_tokens=num_draft_tokens, eos_token_id=None,
                              max_new_tokens=max_new_tokens, pad_token_id=pad, **extra)
    return out.sequences, out.stats


def measure(target: Any, drafter: Any, prompts: list[torch.Tensor], *, batches: list[int], max_new_tokens: int,
            num_draft_tokens: int, repeats: int, pad: int) -> list[dict[str, Any]]:
    """One row per batch size and method (see the module docstring)."""
    methods = [TARGET, OLD, NEW]
    groups = {b: batches_of(prompts, b, pad) for b in batches}
    options = dict(num_draft_tokens=num_draft_tokens, pad=pad)
    for b in batches:  # warm-up: every shape once
        for method in methods:
            run(method, target, drafter, *groups[b][0], max_new_tokens=4, **options)
    times = {(b, m): [] for b in batches for m in methods}
    stats = {(b, m): [] for b in batches for m in methods}
    for repeat in range(repeats):
        order = methods[repeat % 3:] + methods[: repeat % 3]
        for b in batches:
            totals = dict.fromkeys(methods, 0.0)
            for ids, mask in groups[b]:
                reference = None
                for method in order:
                    start = time.perf_counter()
                    out, st = run(method, target, drafter, ids, mask, max_new_tokens=max_new_tokens, **options)
                    totals[method] += time.perf_counter() - start
                    if method == TARGET:
                        reference = out
                    else:
                        stats[b, method].append(st)
                    if reference is not None and not torch.equal(out, reference):
                        raise RuntimeError(f"{method}, batch {b}: greedy output differs from the target's")
            for method in methods:
                times[b, method].append(totals[method])
    rows = []
    for b in batches:
        tokens = len(groups[b]) * b * max_new_tokens
        for method in methods:
            row = {"batch": b, "method": method, "prompts": len(groups[b]) * b,
                   "tok_per_s": statistics.median(tokens / t for t in times[b, method]),
                   "x_target": statistics.median(t0 / t for t0, t in zip(times[b, TARGET], times[b, method])),
                   "runs_x_target": [round(t0 / t, 3) for t0, t in zip(times[b, TARGET], times[b, method])]}
            if method != TARGET:
                history = [g for s in stats[b, method] for g in s.num_draft_tokens_history]
                row["mean_gamma"] = statistics.fmean(history)
                row["plain_steps"] = sum(g == 0 for g in history) / len(history)
                row["tokens_per_call"] = (sum(s.new_tokens for s in stats[b, method])
                                          / sum(s.row_steps for s in stats[b, method]))
                row["gammas_last_run"] = stats[b, method][-1].num_draft_tokens_history
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    import specdecode
    from specdecode.bench.real_pair import chat_prompts
    from specdecode.cli_args import int_at_least

    parser = base_parser("the default draft schedule by batch size (SmolLM2 + shipped EAGLE, CPU, T = 0, EOS off)")
    parser.add_argument("--prompt-set", choices=["report", "tune"], default="report",
                        help="chat requests: 'tune' (the schedule was tuned on) or 'report' (never looked at)")
    parser.add_argument("--num-prompts", type=int_at_least("num_prompts", 1), default=None,
                        help=f"the first N prompts (default {FULL['num_prompts']}; --quick {QUICK['num_prompts']})")
    parser.add_argument("--batches", type=int_at_least("batch", 1), nargs="+", default=None,
                        help=f"batch sizes (default {FULL['batches']}; --quick {QUICK['batches']})")
    parser.add_argument("--max-new-tokens", type=int_at_least("max_new_tokens", 1), default=None,
                        help=f"tokens per row, EOS off (default {FULL['max_new_tokens']})")
    parser.add_argument("--num-draft-tokens", type=int_at_least("num_draft_tokens", 1), default=5,
                        help="gamma of the old default, and the most the new one drafts")
    parser.add_argument("--threads", type=int_at_least("threads", 1), default=None, help="torch CPU threads")
    args = parser.parse_args(argv)
    for name, value in (QUICK if args.quick else FULL).items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    if args.threads:
        torch.set_num_threads(args.threads)
    if max(args.batches) > args.num_prompts:
        parser.error(f"argument --batches: batch {max(args.batches)} needs {max(args.batches)} prompts or more")
    target, drafter, tokenizer = specdecode.load_pair("smollm2")
    without_eos(target)
    prompts = chat_prompts(tokenizer, args.prompt_set, args.num_prompts)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    rows = measure(target, drafter, prompts, batches=args.batches, max_new_tokens=args.max_new_tokens,
                   num_draft_tokens=args.num_draft_tokens, repeats=args.repeats, pad=pad)
    title = (f"SmolLM2-135M-Instruct + shipped {type(drafter).__name__}, {args.prompt_set} chat prompts, "
             f"{args.max_new_tokens} new tokens, EOS off, T=0, gamma {args.num_draft_tokens}, median of "
             f"{args.repeats}, threads {torch.get_num_threads()}")
    print(format_table(rows, ["batch", "method", "tok_per_s", "x_target", "runs_x_target", "mean_gamma",
                              "plain_steps", "tokens_per_call"], title=title))
    meta = {**environment(), "args": vars(args)}
    csv_path, json_path = write_results(args.out, "bench_batch_schedule", rows, meta)
    print(f"wrote {csv_path} and {json_path}")
    return rows


if __name__ == "__main__":
    main()
