"""Early-exit adapters on SmolLM2-135M-Instruct (CPU, batch 1, T = 0): acceptance by position,
tokens per target call, cost ratio and speed for each trained exit depth k.

    python -m specdecode train exit --target smollm2 --out runs/smol-exit8 --layer 8 --max-steps 150 \\
        --head-tokens 8192 --threads 1
    python benchmarks/bench_exit_adapters.py runs/smol-exit8 runs/smol-exit16 --prompts tune
    python benchmarks/bench_exit_adapters.py runs/smol-exit8 runs/smol-exit16 --prompts report --layer-skip

Each drafter folder (``train exit``) is loaded with ``specdecode.load_drafter``. Rows: the target
alone (Hugging Face ``generate``), then per folder the exit-adapter drafter and, with
``--layer-skip``, the plain ``LayerSkipDrafter`` of the same k (no adapter: the baseline the
adapter fixes; slow). Every speculative row's output is checked against the target's own greedy
output. ``c`` is the cost ratio: one decoding step of the drafter's model over one of the target
(median of one-token forwards after a 64-token prompt, on the CPU fast path, timed by the same
clock). Tokens/s are the sum over prompts (``--clock cpu``: this thread's CPU time, steadier on a
shared machine).

Prompts: two sets of chat requests written for this benchmark, neither among the training kit's
prompts (``specdecode.training.data.GENERAL_PROMPTS``): ``tune`` was used to choose k and gamma,
``report`` only to report.
"""

from __future__ import annotations

import time
from typing import Any

import torch

import specdecode
from specdecode.bench.harness import Column, base_parser, environment, format_table, median, write_results
from specdecode.bench.real_pair import speculative_row

PROMPTS = {
    "tune": (
        "What are the main differences between a violin and a viola?",
        "Write a short recipe for pancakes.",
        "Explain how a refrigerator keeps food cold.",
        "Give me four tips for writing a good resume.",
        "Why do leaves change color in the fall?",
        "Describe how to change a flat bicycle tire.",
        "What is the difference between a virus and a bacterium?",
        "Write a friendly message inviting a neighbor to dinner.",
    ),
    "report": (
        "How does a rainbow form?",
        "List three benefits of regular exercise.",
        "Explain what a budget is and how to make one.",
        "Write a short poem about a mountain lake.",
        "What should I consider when adopting a dog?",
        "How do airplanes stay in the air?",
        "Give me a simple plan to learn basic Spanish.",
        "What is the purpose of a library card?",
    ),
}


def step_cost(model: torch.nn.Module, clock: Any, repeats: int = 15) -> float:
    """Median seconds of a one-token forward after a 64-token prompt (KV cache cropped back)."""

    from specdecode.models import cache_kwargs, kv_cache

    ids = torch.randint(100, 1000, (1, 65), generator=torch.Generator().manual_seed(0))
    times = []
    with torch.no_grad():
        cache = kv_cache.new_cache()
        model(input_ids=ids[:, :64], **cache_kwargs(model, cache))
        for _ in range(repeats + 2):
            start = clock()
            model(input_ids=ids[:, 64:], position_ids=torch.tensor([[64]]), **cache_kwargs(model, cache))
            times.append(clock() - start)
            kv_cache.crop(cache, 64)
    return median(times[2:])


def main() -> None:
    parser = base_parser(__doc__.split("\n\n")[0], prog="bench_exit_adapters.py")
    parser.add_argument("folders", nargs="+", help="exit-adapter folders made by `train exit`")
    parser.add_argument("--prompts", choices=tuple(PROMPTS), default="report")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--gamma", type=int, default=4, help="num_draft_tokens")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    parser.add_argument("--layer-skip", action="store_true", help="also the plain LayerSkipDrafter of each k")
    args = parser.parse_args()
    from specdecode.training.targets import load_target

    torch.set_num_threads(args.threads)
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    target, tok = load_target("smollm2")
    prompts = list(PROMPTS[args.prompts][: 2 if args.quick else None])
    max_new = 16 if args.quick else args.max_new_tokens
    inputs = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                      return_tensors="pt", return_dict=True).input_ids for p in prompts]
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    reference = []
    with specdecode.cpu.accelerated(target, None):
        target_step = step_cost(target, clock)
    start = clock()
    for ids in inputs:
        reference.append(target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new,
                                         do_sample=False, pad_token_id=pad))
    seconds = clock() - start
    tokens = sum(r.shape[1] - i.shape[1] for r, i in zip(reference, inputs))
    rows: list[dict[str, Any]] = [{"drafter": "target alone", "tok_per_s": tokens / seconds, "c": 1.0}]
    candidates = []
    for folder in args.folders:
        drafter = specdecode.load_drafter(folder, target)
        k = drafter.adapter.exit_layer
        candidates.append((f"exit adapter k={k}", drafter))
        if args.layer_skip:
            candidates.append((f"layer skip k={k}", specdecode.LayerSkipDrafter(target, num_layers=k)))
    for name, drafter in candidates:
        with specdecode.cpu.accelerated(target, drafter.model):
            c = step_cost(drafter.model, clock) / target_step
        calls = accepted = drafted = total = 0
        runs: list[Any] = []
        start = clock()
        for ids, want in zip(inputs, reference):
            out = specdecode.generate(target, drafter, ids, num_draft_tokens=args.gamma, max_new_tokens=max_new,
                                      pad_token_id=pad)
            if not torch.equal(out.sequences, want[:, : out.sequences.shape[1]]):
                raise AssertionError(f"{name}: greedy output differs from the target's own")
            s = out.stats
            calls, accepted, drafted = calls + s.target_calls, accepted + s.accepted_tokens, drafted + s.drafted_tokens
            total += out.sequences.shape[1] - ids.shape[1]
            runs.append(s)
        seconds = clock() - start
        by_pos = speculative_row(runs)["acceptance_by_position"][: args.gamma]  # pooled over the prompts
        rows.append({"drafter": name, "tok_per_s": total / seconds, "c": c, "tokens_per_call": total / max(calls, 1),
                     "acceptance": accepted / max(drafted, 1),
                     "acceptance_by_position": " ".join(f"{a:.2f}" for a in by_pos),
                     "params": drafter.describe().get("adapter_params")})
        print(f"{name}: {rows[-1]['tokens_per_call']:.2f} tokens per call", flush=True)
    base = rows[0]["tok_per_s"]
    for r in rows:
        r["vs_target"] = r["tok_per_s"] / base
    two = "{:.2f}".format
    columns = ["drafter", Column("tokens_per_call", "tok/call", two), Column("acceptance", "accept", two),
               Column("acceptance_by_position", "acceptance by position"), Column("c", "c", two),
               Column("tok_per_s", "tok/s", "{:.1f}".format), Column("vs_target", "x target", two)]
    title = (f"SmolLM2-135M, {args.prompts} prompts ({len(prompts)}), batch 1, T=0, gamma {args.gamma}, "
             f"{max_new} new tokens, {args.threads} thread(s), {args.clock} clock")
    print(format_table(rows, columns, title=title))
    write_results(args.out, f"exit_adapters_{args.prompts}", rows, {**environment(), **vars(args)})


if __name__ == "__main__":
    main()
