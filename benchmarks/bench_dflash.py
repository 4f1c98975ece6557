"""DFlash against EAGLE at equal training: both trained on the demo target from one data cache,
the same minutes each, then measured on held-out prompts at batch 1, T = 0 and T = 1.

    python benchmarks/bench_dflash.py --minutes 16 --data-minutes 4 --train-dir runs/dflash-vs-eagle
    python benchmarks/bench_dflash.py --eagle runs/dflash-vs-eagle/eagle --dflash runs/dflash-vs-eagle/dflash

Training (unless both folders are given): ``train_drafters(["eagle", "dflash"], "demo", ...)`` with
equal time shares after the data stage (EAGLE with ``--unroll 4``, the recipe the kit ships;
DFlash with ``--block-size`` and ``--num-layers``).

Prompt sets: ``tune`` (the last 8 held-out prompts of the demo corpus) chooses each drafter's
chain length (the one with the most tokens per second at T = 0, from ``--chains``); ``report``
(the first ``--num-prompts`` held-out prompts, never looked at while tuning) gives the numbers.
Every method runs on every prompt in turn, ``--repeats`` times, interleaved (target alone on the
CPU fast path, EAGLE, DFlash); tok/s is the median over repeats, tokens per call pooled. Greedy
output is checked equal to the target's. The draft cost compares one DFlash step (one forward of
the whole block) with one EAGLE draft forward (one token), from the generations' statistics.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import torch

from specdecode.bench.harness import base_parser, format_table, write_results
from specdecode.bench.real_pair import speculative_row


def prompts(tokenizer: Any, prompt_set: str, n: int) -> list[torch.Tensor]:
    from specdecode.demo import demo_prompts

    every = demo_prompts(93)
    texts = every[-8:] if prompt_set == "tune" else every[:n]
    return [tokenizer(t, return_tensors="pt").input_ids[:, -96:] for t in texts]


def run_method(target: Any, drafter: Any, ids: list[torch.Tensor], k: int, temperature: float, new: int,
               seed: int) -> tuple[float, list[torch.Tensor], list[Any]]:
    """Seconds, outputs and statistics of one method over every prompt (drafter None: the
    target alone on the CPU fast path)."""
    import specdecode

    sampling = {"do_sample": temperature > 0, **({"temperature": temperature} if temperature > 0 else {})}
    outs, stats = [], []
    start = time.perf_counter()
    for i, p in enumerate(ids):
        torch.manual_seed(seed + i)
        if drafter is None:
            with specdecode.cpu.accelerated(target):
                outs.append(target.generate(p, attention_mask=torch.ones_like(p), max_new_tokens=new, pad_token_id=0,
                                            **sampling))
        else:
            out = specdecode.generate(target, drafter, p, num_draft_tokens=k, max_new_tokens=new, pad_token_id=0,
                                      eos_token_id=None, generator=torch.Generator().manual_seed(seed + i),
                                      **sampling)
            outs.append(out.sequences)
            stats.append(out.stats)
    return time.perf_counter() - start, outs, stats


def tune_chain(target: Any, drafter: Any, ids: list[torch.Tensor], chains: list[int], new: int) -> int:
    """The chain length with the most tokens per second on ``ids`` at T = 0 (one pass each)."""
    best, best_rate = chains[0], 0.0
    for k in chains:
        seconds, outs, _ = run_method(target, drafter, ids, k, 0.0, new, 0)
        rate = sum(o.shape[1] - p.shape[1] for o, p in zip(outs, ids)) / seconds
        if rate > best_rate:
            best, best_rate = k, rate
    return best


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    from specdecode.cli_args import int_at_least

    parser = base_parser("DFlash against EAGLE at equal training minutes (demo target, batch 1)")
    parser.add_argument("--eagle", default=None, help="a trained eagle folder (with --dflash: no training)")
    parser.add_argument("--dflash", default=None, help="a trained dflash folder")
    parser.add_argument("--train-dir", default="runs/dflash-vs-eagle", help="where the training run goes")
    parser.add_argument("--minutes", type=float, default=16.0, help="the training run's budget, data included")
    parser.add_argument("--data-minutes", type=float, default=4.0, help="the data stage's part of it")
    parser.add_argument("--block-size", type=int_at_least("block_size", 2), default=16)
    parser.add_argument("--num-layers", type=int_at_least("num_layers", 1), default=1)
    parser.add_argument("--target-layers", default=None, help="DFlash's target layers, e.g. 1,3,5 (default: the kit's)")
    parser.add_argument("--train-prompts", type=int_at_least("train_prompts", 1), default=3000,
                        help="default prompts the data stage may continue (it stops at its time)")
    parser.add_argument("--num-prompts", type=int_at_least("num_prompts", 1), default=16)
    parser.add_argument("--max-new-tokens", type=int_at_least("max_new_tokens", 1), default=64)
    parser.add_argument("--chains", default="2,3,4,5,6,8,10,12,15", help="chain lengths tried on the tune prompts")
    parser.add_argument("--threads", type=int_at_least("threads", 1), default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    import specdecode
    from specdecode.training import train_drafters

    target, _, tokenizer = specdecode.load_demo_pair()
    if args.eagle is None or args.dflash is None:
        out = Path(args.train_dir)
        dflash_options: dict[str, Any] = {"block_size": args.block_size, "num_layers": args.num_layers}
        if args.target_layers:
            dflash_options["target_layer_ids"] = [int(i) for i in args.target_layers.split(",")]
        train_drafters(["eagle", "dflash"], target, out, tokenizer=tokenizer, target_name="demo", minutes=args.minutes,
                       data_minutes=args.data_minutes, shares={"eagle": 0.5, "dflash": 0.5}, seed=args.seed,
                       num_prompts=args.train_prompts,
                       kind_options={"eagle": {"unroll": 4}, "dflash": dflash_options})
        args.eagle, args.dflash = str(out / "eagle"), str(out / "dflash")
    drafters = {"eagle": specdecode.load_drafter(args.eagle, target),
                "dflash": specdecode.load_drafter(args.dflash, target)}
    chains = [int(c) for c in args.chains.split(",")]
    tune = prompts(tokenizer, "tune", 8)
    chosen = {name: tune_chain(target, d, tune, [c for c in chains if name != "dflash" or c < d.model.block_size],
                               args.max_new_tokens) for name, d in drafters.items()}
    print(f"chain lengths chosen on the tune prompts: {chosen}")
    report = prompts(tokenizer, "report", args.num_prompts)
    repeats = args.repeats or 3
    rows: list[dict[str, Any]] = []
    for temperature in (0.0, 1.0):
        methods: dict[str, Any] = {"target alone (fast path)": None, **drafters}
        times: dict[str, list[float]] = {m: [] for m in methods}
        stats: dict[str, list[Any]] = {m: [] for m in methods}
        counts: dict[str, int] = {}
        reference: list[torch.Tensor] = []
        for r in range(repeats):
            for name, drafter in methods.items():
                seconds, outs, st = run_method(target, drafter, report, chosen.get(name, 1), temperature,
                                               args.max_new_tokens, args.seed + 1000 * r)
                counts[name] = sum(o.shape[1] - p.shape[1] for o, p in zip(outs, report))
                times[name].append(seconds)
                stats[name] += st
                if drafter is None and temperature == 0 and not reference:
                    reference = outs
                if drafter is not None and temperature == 0 and any(not torch.equal(o, w) for o, w in zip(outs, reference)):
                    raise SystemExit(f"{name}: greedy output differs from the target's")
        base = counts["target alone (fast path)"] / statistics.median(times["target alone (fast path)"])
        for name in methods:
            rate = counts[name] / statistics.median(times[name])
            row: dict[str, Any] = {"T": temperature, "method": name, "k": chosen.get(name), "tok/s": rate,
                                   "x target": rate / base, "tokens/call": 1.0, "draft s/forward": None}
            if stats[name]:
                pooled = speculative_row(stats[name])
                row["tokens/call"] = pooled["tokens_per_call"]
                row["acceptance by position"] = " ".join(f"{a:.2f}" for a in pooled["acceptance_by_position"][:8])
                row["draft s/forward"] = (sum(s.draft_time for s in stats[name])
                                          / max(1, sum(s.draft_calls for s in stats[name])))
            rows.append(row)
    columns = ["T", "method", "k", "tokens/call", "tok/s", "x target", "draft s/forward", "acceptance by position"]
    print(format_table(rows, columns, title=f"demo target, report prompts ({len(report)}), batch 1, "
                                            f"{args.max_new_tokens} new tokens, {repeats} interleaved repeats, "
                                            f"threads {torch.get_num_threads()}"))
    for temperature in (0.0, 1.0):
        e, d = (next(r for r in rows if r["T"] == temperature and r["method"] == m) for m in ("eagle", "dflash"))
        print(f"T={temperature:g}: DFlash / EAGLE: tokens per call {d['tokens/call'] / e['tokens/call']:.2f}x, "
              f"tok/s {d['tok/s'] / e['tok/s']:.2f}x; one DFlash step ({drafters['dflash'].model.block_size}-token "
              f"block) / one EAGLE draft forward: {d['draft s/forward'] / e['draft s/forward']:.2f}x")
    print(block_cost(target, drafters["dflash"], drafters["eagle"], report[:4], args.max_new_tokens))
    write_results(args.out, "dflash_vs_eagle", rows, {**vars(args), "chosen": chosen})
    return rows


def block_cost(target: Any, dflash: Any, eagle: Any, ids: list[torch.Tensor], new: int, size: int = 16) -> str:
    """One step of a ``size``-token block (an untrained network shaped like ``dflash``'s, drafting
    4 tokens, the head reading those 4) against one EAGLE draft forward, medians of the
    generations' statistics, interleaved over three rounds."""
    from dataclasses import replace

    from specdecode.drafters import DFlashDrafter
    from specdecode.drafters.dflash_model import DFlashModel

    wide = DFlashDrafter(target, DFlashModel(target, replace(dflash.model.config, block_size=size)).eval())
    per = {"dflash": [], "eagle": []}
    for _ in range(3):
        for name, drafter in (("dflash", wide), ("eagle", eagle)):
            _, _, stats = run_method(target, drafter, ids, 4, 0.0, new, 0)
            per[name].append(sum(s.draft_time for s in stats) / max(1, sum(s.draft_calls for s in stats)))
    d, e = statistics.median(per["dflash"]), statistics.median(per["eagle"])
    return (f"draft cost: one {size}-token DFlash step {1000 * d:.3f} ms, one EAGLE draft forward {1000 * e:.3f} ms: "
            f"{d / e:.2f}x")


if __name__ == "__main__":
    main()
