"""Host drafters (prompt lookup, SuffixDecoding, their tries, a draft model across tokenizers) on
the static decode paths beside the eager one: the same drafter, the target's step static,
compiled or CUDA-graphed, the drafts proposed on the host between steps
(:mod:`specdecode.engine.host_drafts`). Batch 1, T = 0.

    # the CPU rows (demo target, held-out demo prompts)
    python benchmarks/bench_host_drafters.py --num-prompts 8 --repeats 3
    # SmolLM2 on the records workload (one JSON task over many people), report half
    python benchmarks/bench_host_drafters.py --pair smollm2 --workload records --prompt-set report
    # on a GPU: the graphed target alone, then prompt lookup and suffix drafting graphed (the device
    # script's call, scripts/gpu_session.sh host)
    python benchmarks/bench_host_drafters.py --pair smollm2 --workload records --device cuda \\
        --paths eager,graphed --drafters lookup,suffix,suffix-trie

Rows: the target alone on each decode path (the eager one is Hugging Face's ``generate``, on the
CPU inside specdecode's CPU fast path), then
each drafter on each path; every method runs on every prompt in turn, interleaved over
``--repeats`` rounds (tok/s: the median of the rounds' totals), greedy output checked equal to the
target's. ``x target`` is over the target alone on the same path, ``x base`` over the first
baseline row. Workloads: ``demo`` (windows of standard-library files, demo pair only), ``chat``
(chat requests), ``records`` (one JSON-record task over many people) and ``code`` (code to
continue, raw text), each with a ``tune`` and a ``report`` half (:mod:`specdecode.prompt_sets`).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Any, Callable

import torch

from specdecode.bench.harness import base_parser, format_table, write_results

def _drafters() -> dict[str, tuple[str, Callable[[], Any]]]:
    """The drafters ``--drafters`` takes: name -> (row label, factory)."""
    from specdecode.drafters import NgramDrafter, SuffixDrafter

    return {"lookup": ("prompt lookup", NgramDrafter),
            "suffix": ("SuffixDecoding", SuffixDrafter),
            "lookup-trie": ("prompt lookup tries (16)", lambda: NgramDrafter(num_nodes=16, tree_depth=6)),
            "suffix-trie": ("SuffixDecoding tries (16)", lambda: SuffixDrafter(num_nodes=16, tree_depth=6))}


def prompts_of(pair: str, workload: str, prompt_set: str, tok: Any, num_prompts: int) -> list[torch.Tensor]:
    """The prompts ``[1, L]`` of ``workload``'s ``prompt_set`` half, for ``pair``'s tokenizer."""
    from specdecode.prompt_sets import chat_prompt_set, prompt_set as code_set, record_prompt_set

    if workload == "demo":
        if pair != "demo":
            raise SystemExit("--workload demo: the demo prompts are for the demo pair (chat, records or code)")
        from specdecode.demo import demo_prompts

        return [tok(t, return_tensors="pt").input_ids[:, -96:] for t in demo_prompts(93)[:num_prompts]]
    if workload == "code":
        return [tok(t, return_tensors="pt").input_ids[:, -256:] for t in code_set(f"{prompt_set}-code")[:num_prompts]]
    from specdecode.bench.real_pair import chat_ids

    if pair == "demo":
        raise SystemExit(f"--workload {workload}: chat requests need a chat target (--pair smollm2)")
    texts = chat_prompt_set(prompt_set) if workload == "chat" else record_prompt_set(prompt_set)
    return [chat_ids(tok, t) for t in texts[:num_prompts]]


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    from specdecode.cli_args import int_at_least

    parser = base_parser("host drafters on the eager, static, compiled and graphed decode paths (batch 1, T = 0)")
    parser.add_argument("--pair", choices=["demo", "smollm2"], default="demo")
    parser.add_argument("--workload", choices=["demo", "chat", "records", "code"], default=None,
                        help="default: demo for the demo pair, records for smollm2")
    parser.add_argument("--prompt-set", choices=["tune", "report"], default="report")
    parser.add_argument("--num-prompts", type=int_at_least("num_prompts", 1), default=8)
    parser.add_argument("--max-new-tokens", type=int_at_least("max_new_tokens", 1), default=64)
    parser.add_argument("--num-draft-tokens", type=int_at_least("num_draft_tokens", 1), default=4)
    parser.add_argument("--paths", default="eager,static", help="decode paths: eager,static,compiled,graphed")
    parser.add_argument("--drafters", default="lookup,suffix", help="of: " + ", ".join(_drafters()))
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    args = parser.parse_args(argv)
    paths, names = args.paths.split(","), args.drafters.split(",")
    known = _drafters()
    for name in names:
        if name not in known:
            raise SystemExit(f"--drafters: unknown drafter {name!r} ({', '.join(known)})")
    for path in paths:
        if path not in ("eager", "static", "compiled", "graphed"):
            raise SystemExit(f"--paths: unknown decode path {path!r} (eager, static, compiled, graphed)")
    device = torch.device(args.device)
    if "graphed" in paths and device.type != "cuda":
        raise SystemExit("--paths graphed: CUDA graphs need --device cuda")
    import specdecode

    workload = args.workload or ("demo" if args.pair == "demo" else "records")
    if args.pair == "demo":
        target, _, tok = specdecode.load_demo_pair()
    else:
        target, _, tok = specdecode.load_pair("smollm2", drafter="ngram")
    target.to(device=device, dtype=getattr(torch, args.dtype))
    target.generation_config.eos_token_id = None
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    prompts = [p.to(device) for p in prompts_of(args.pair, workload, args.prompt_set, tok, args.num_prompts)]
    methods: dict[str, Any] = {}
    for path in paths:
        methods[f"target alone, {path}" + (" (CPU fast path)" if path == "eager" and device.type == "cpu" else "")] \
            = (None, path)
    for name in names:
        label, make = known[name]
        for path in paths:
            methods[f"{label}, {path}"] = (make, path)
    outputs: dict[str, list[torch.Tensor]] = {}

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    def run(name: str) -> tuple[float, int, list[Any]]:
        make, path = methods[name]
        outs, stats = [], []
        sync()
        start = time.perf_counter()
        for p in prompts:
            common = dict(max_new_tokens=args.max_new_tokens, pad_token_id=pad)
            if make is None and path == "eager":
                with specdecode.cpu.accelerated(target) if device.type == "cpu" else contextlib.nullcontext():
                    outs.append(target.generate(p, attention_mask=torch.ones_like(p), do_sample=False,
                                                eos_token_id=None, **common))
                continue
            drafter = None if make is None else make()  # None: the target alone on that path
            out = specdecode.generate(target, drafter, p, num_draft_tokens=args.num_draft_tokens, eos_token_id=None,
                                      decode_path=path, **common)
            outs.append(out.sequences)
            stats.append(out.stats)
        sync()
        seconds = time.perf_counter() - start
        if name in outputs and any(not torch.equal(a, b) for a, b in zip(outs, outputs[name])):
            raise SystemExit(f"{name}: output changed between rounds")
        outputs[name] = outs
        return seconds, sum(o.shape[1] - p.shape[1] for o, p in zip(outs, prompts)), stats

    for name in methods:
        run(name)  # warm-up (the static layouts, compilation, CUDA graphs)
    times: dict[str, list[float]] = {name: [] for name in methods}
    counts: dict[str, int] = {}
    pooled: dict[str, list[Any]] = {name: [] for name in methods}
    for _ in range(args.repeats or 3):
        for name in methods:
            seconds, counts[name], stats = run(name)
            times[name].append(seconds)
            pooled[name] += stats
    first = next(iter(methods))
    reference = outputs[first]
    rate = {name: counts[name] / statistics.median(times[name]) for name in methods}
    alone = {path: rate[name] for name, (make, path) in methods.items() if make is None}
    rows = []
    for name, (make, path) in methods.items():
        if any(not torch.equal(a.cpu(), b.cpu()) for a, b in zip(outputs[name], reference)):
            raise SystemExit(f"{name}: greedy output differs from the target's")
        stats = pooled[name]
        calls = sum(s.new_tokens for s in stats) / max(1, sum(s.row_steps for s in stats)) if make else 1.0
        rows.append({"method": name, "tokens/call": calls, "tok/s": rate[name], "x target": rate[name] / alone[path],
                     "x base": rate[name] / rate[first]})
    print(format_table(rows, ["method", "tokens/call", "tok/s", "x target", "x base"],
                       title=f"{args.pair} target on {device} ({args.dtype}), {len(prompts)} {args.prompt_set} "
                             f"{workload} prompts, batch 1, T=0, {args.max_new_tokens} new tokens, "
                             f"k={args.num_draft_tokens}, threads {torch.get_num_threads()}"))
    write_results(args.out, f"host_drafters_{args.pair}_{workload}_{device.type}", rows, vars(args))
    return rows


if __name__ == "__main__":
    main()
