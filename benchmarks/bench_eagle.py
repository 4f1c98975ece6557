"""EAGLE feature drafters end to end: tokens per target call, acceptance per draft position,
the cost ratio c and tokens/s against the target alone, at batch 1, temperature 0.

    python benchmarks/bench_eagle.py --target demo --drafter-dir runs/demo-eagle --threads 1 --clock cpu
    python benchmarks/bench_eagle.py --target smollm2 --drafter-dir runs/smol-eagle --threads 1 --clock cpu

Rows: the target alone (``target.generate``, greedy, CPU fast path as ``--cpu-fast-path`` says),
then specdecode with each drafter: for ``demo`` the shipped 0.6M draft model, and the EAGLE
drafter of ``--drafter-dir``; a drafter trained with a reduced head runs twice, with it and
with the target's full head in its place (same trained decoder); ``--tree-nodes N`` adds the
EAGLE drafter with a dynamic tree (tokens per call then count tree steps). Greedy output is checked
equal to the target's for every prompt.

Prompt sets (``--prompt-set``): ``tune`` (what ``--gamma`` was chosen on) and ``eval`` (never
looked at while tuning; the numbers to report). For ``demo`` both come from the held-out files of
the demo corpus (``demo_prompts()``, disjoint slices); for ``smollm2`` they are chat requests
written for this benchmark, none of them among the training kit's default prompts.

``c`` is measured inside the generation: (draft seconds per draft forward) / (target seconds per
verification forward), from the run's statistics.
"""

from __future__ import annotations

import copy
import statistics
from typing import Any

import torch

from specdecode.bench.harness import CLOCKS, base_parser, format_table, time_call, write_results
from specdecode.bench.real_pair import speculative_row
from specdecode.vocabulary import rates


def prompts_for(target_name: str, tokenizer: Any, prompt_set: str, n: int) -> list[torch.Tensor]:
    """Token ids ``[1, L]`` of the chosen prompt set."""
    if target_name == "demo":
        from specdecode.demo import demo_prompts

        every = demo_prompts(93)
        texts = every[-8:] if prompt_set == "tune" else every[:n]
        return [tokenizer(t, return_tensors="pt").input_ids[:, -96:] for t in texts[:n]]
    from specdecode.prompt_sets import chat_prompt_set
    from specdecode.bench.real_pair import chat_prompts

    name = "tune" if prompt_set == "tune" else "report"
    return chat_prompts(tokenizer, name, min(n, len(chat_prompt_set(name))))


def full_head_variant(drafter: Any) -> Any:
    """The same trained EAGLE decoder with the target's own head instead of its reduced one."""
    from specdecode.drafters.eagle import EagleDrafter

    model = copy.deepcopy(drafter.model)
    model.lm_head = None
    model.draft_to_target = model.draft_to_target[:0]
    return EagleDrafter(drafter.target, model)


def main(argv: list[str] | None = None) -> None:
    from specdecode.cli_args import int_at_least

    parser = base_parser("EAGLE drafters end to end (batch 1, temperature 0)")
    parser.add_argument("--target", choices=["demo", "smollm2"], default="demo")
    parser.add_argument("--drafter-dir", required=True, help="folder of a trained eagle drafter")
    parser.add_argument("--prompt-set", choices=["tune", "eval"], default="eval")
    parser.add_argument("--num-prompts", type=int_at_least("num_prompts", 1), default=8)
    parser.add_argument("--max-new-tokens", type=int_at_least("max_new_tokens", 1), default=64)
    parser.add_argument("--gamma", type=int_at_least("gamma", 1), default=4)
    parser.add_argument("--tree-nodes", type=int_at_least("tree_nodes", 2), default=None,
                        help="also run the EAGLE drafter with an EAGLE-2 dynamic tree of this many nodes")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall")
    parser.add_argument("--threads", type=int_at_least("threads", 1), default=None)
    parser.add_argument("--cpu-fast-path", choices=["auto", "on", "off"], default="auto")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    import specdecode
    from specdecode.cli_args import cpu_fast_path

    fast = cpu_fast_path(args)
    repeats = args.repeats or 1
    draft_model = None
    if args.target == "demo":
        target, draft_model, tokenizer = specdecode.load_demo_pair()
    else:
        from specdecode.training.targets import load_target

        target, tokenizer = load_target("smollm2")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    prompts = prompts_for(args.target, tokenizer, args.prompt_set, args.num_prompts)
    eagle = specdecode.load_drafter(args.drafter_dir, target)
    drafters: dict[str, Any] = {}
    if draft_model is not None:
        drafters["draft model (shipped)"] = specdecode.ModelDrafter(draft_model)
    if eagle.model.draft_vocab_size is not None:
        drafters["eagle, full head"] = full_head_variant(eagle)
        drafters[f"eagle, reduced head ({eagle.model.draft_vocab_size})"] = eagle
    else:
        drafters["eagle, full head"] = eagle
    if args.tree_nodes:
        from specdecode.drafters.eagle import EagleDrafter
        from specdecode.trees.builders import DynamicTree

        drafters[f"eagle, dynamic tree ({args.tree_nodes})"] = EagleDrafter(target, eagle.model,
                                                                           tree=DynamicTree(args.tree_nodes))
    clock = CLOCKS[args.clock]

    reference: list[torch.Tensor] = []

    def plain() -> int:
        reference.clear()
        with specdecode.cpu.accelerated(target, enabled=fast):
            for p in prompts:
                reference.append(target.generate(p, attention_mask=torch.ones_like(p), do_sample=False,
                                                 max_new_tokens=args.max_new_tokens, pad_token_id=pad))
        return sum(r.shape[1] - p.shape[1] for r, p in zip(reference, prompts))

    new = plain()
    base_times = time_call(plain, repeats=repeats, warmup=0, clock=clock)
    base = new / statistics.median(base_times)
    rows = [{"method": "target alone", "tokens/call": 1.0, "acceptance": None, "acceptance by position": "",
             "c": None, "tok/s": base, "speedup": 1.0}]
    for name, drafter in drafters.items():
        stats: list[Any] = []

        def spec(drafter: Any = drafter) -> int:
            stats.clear()
            n = 0
            for p, want in zip(prompts, reference):
                rule = None if getattr(drafter, "tree", None) is not None else "token"
                out = specdecode.generate(target, drafter, p, num_draft_tokens=args.gamma, rule=rule,
                                          max_new_tokens=args.max_new_tokens, pad_token_id=pad, cpu_fast_path=fast)
                if not torch.equal(out.sequences, want):
                    raise SystemExit(f"{name}: greedy output differs from the target's")
                stats.append(out.stats)
                n += out.sequences.shape[1] - p.shape[1]
            return n

        n = spec()
        times = time_call(spec, repeats=repeats, warmup=0, clock=clock)
        tps = n / statistics.median(times)
        pooled = speculative_row(stats)
        calls = sum(s.target_calls for s in stats)  # prefill included
        rows.append({"method": name, "tokens/call": n / max(1, calls), "acceptance": pooled["acceptance_rate"],
                     "acceptance by position": rates(pooled["acceptance_by_position"][: args.gamma]),
                     "c": pooled["cost_ratio"],
                     "tok/s": tps, "speedup": tps / base})
    title = (f"{args.target}, {args.prompt_set} prompts ({len(prompts)}), batch 1, T=0, gamma {args.gamma}, "
             f"{args.max_new_tokens} new tokens, clock {args.clock}, threads {torch.get_num_threads()}, "
             f"cpu fast path {args.cpu_fast_path}")
    print(format_table(rows, ["method", "tokens/call", "acceptance", "acceptance by position", "c", "tok/s", "speedup"],
                       title=title))
    write_results(args.out, f"eagle_{args.target}_{args.prompt_set}", rows, vars(args))


if __name__ == "__main__":
    main()
