"""Token trees against chains, on the embedded demo pair and its held-out prompts.

    python -m specdecode bench --trees             # full table (demo pair, 8 prompts x 48 tokens)
    python -m specdecode bench --trees --quick     # smoke run
    python -m specdecode bench --trees --prompt-set report --max-new-tokens 64 --threads 1 --clock cpu
    python benchmarks/bench_trees.py --plot        # also tokens per target call vs tree size

For every temperature (0 and 1) it runs the chain (gamma = 5, token rule), the chain with the
trees' node budget (gamma = n - 1) and the static, dynamic (EAGLE-2, calibrated) and Sequoia
(re-planned by rank and depth) trees with 8, 16 and 32 nodes (root included), each with its
lossless rule: ``deterministic`` for static and dynamic trees (top-k children), ``rrs`` for
Sequoia (children drawn without replacement). Reported per configuration: tokens per target
call (block efficiency), acceptance by depth and by child rank, tokens/s (median over
repeats; ``--clock cpu``: this thread's CPU time), and the ratio of tokens per call to the
chain's. ``--prompt-set`` picks the prompts: ``demo`` (the demo pair's held-out stdlib
windows) or a set of :mod:`specdecode.prompt_sets` (``tune`` / ``report``, code and
prose). For Sequoia rows a second table gives the conditional acceptance by depth and rank that
the builders counted (summed over prompts). A last table times the compiled ``verify_tree`` op
at N = 32 against one target forward over the same 32 tree nodes.

On this CPU a forward over 32 tree nodes costs several times a one-token decode step (matrix
products are compute-bound beyond a few rows), so tokens/s hides much of the gain that tokens
per target call shows; on a GPU a forward over 32 tokens costs about one decode step.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from specdecode import vocabulary as words
from specdecode.bench.harness import (Column, base_parser, environment, format_table, median, time_call,
                                     write_results)


def _prompts(tokenizer: Any, n: int, prompt_set: str = "demo", max_prompt_tokens: int = 96) -> list[torch.Tensor]:
    if prompt_set == "demo":
        from specdecode.demo import demo_prompts

        texts = demo_prompts(n)
    else:
        from specdecode.prompt_sets import prompt_set as named_set

        texts = named_set(prompt_set)
    return [tokenizer(t, return_tensors="pt").input_ids[:, -max_prompt_tokens:] for t in texts]


def _configs(sizes: list[int]) -> list[dict[str, Any]]:
    configs: list[dict[str, Any]] = [{"method": "chain g=5", "tree": None, "nodes": 6}]
    for n in sizes:
        if n != 6:
            configs.append({"method": f"chain g={n - 1}", "tree": None, "nodes": n})
        configs.append({"method": f"static {n}", "tree": "static", "nodes": n})
        configs.append({"method": f"dynamic {n}", "tree": "dynamic", "nodes": n})
        configs.append({"method": f"sequoia {n}", "tree": "sequoia", "nodes": n})
        if n == 16:  # the builders as they were before issue 19, for comparison
            configs.append({"method": f"dynamic raw {n}", "tree": "dynamic-raw", "nodes": n})
            configs.append({"method": f"sequoia/rank {n}", "tree": "sequoia-rank", "nodes": n})
    return configs


def _builder(kind: str, nodes: int) -> Any:
    """A fresh builder: ``make_tree_builder``'s, or the pre-issue-19 variants (raw EAGLE-2
    values; Sequoia planned from the acceptance by rank only, re-planned every 16 steps)."""
    from specdecode.trees.builders import DynamicTree, SequoiaTree, make_tree_builder

    if kind == "dynamic-raw":
        return DynamicTree(nodes, calibrated=False)
    if kind == "sequoia-rank":
        return SequoiaTree(nodes, by_depth=False)
    return make_tree_builder(kind, num_nodes=nodes)


def run(args: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    import specdecode
    from specdecode.demo import load_demo_pair

    torch.set_num_threads(args.threads)
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    target, draft, tokenizer = load_demo_pair()
    prompts = _prompts(tokenizer, args.num_prompts, args.prompt_set)
    rank_depth: list[dict[str, Any]] = []
    sizes = args.sizes
    rows: list[dict[str, Any]] = []
    for temperature in args.temperatures:
        sampling = dict(do_sample=True, temperature=temperature) if temperature > 0 else dict(do_sample=False)
        chain_eff = chain_speed = None
        for config in _configs(sizes):
            effs, speeds, depth_rates, rank_rates = [], [], [], []
            tried = accepted = None
            for repeat in range(args.repeats):
                stats = specdecode.SpeculativeStats()
                seconds = 0.0
                for i, ids in enumerate(prompts):
                    gen = torch.Generator().manual_seed(args.seed + 1000 * repeat + i)
                    drafter: Any = draft
                    kwargs: dict[str, Any] = dict(num_draft_tokens=config["nodes"] - 1)
                    if config["tree"] is not None:  # a fresh builder per generation, as tree=... makes
                        builder = _builder(config["tree"], config["nodes"])
                        drafter, kwargs = specdecode.ModelDrafter(draft, tree=builder), {}
                    start = clock()
                    specdecode.generate(target, drafter, ids, max_new_tokens=args.max_new_tokens, eos_token_id=[],
                                        generator=gen, stats=stats, **kwargs, **sampling)
                    seconds += clock() - start
                    counts = getattr(getattr(drafter, "tree", None), "counts", None)
                    if counts is not None and repeat == 0:
                        tried = counts.tried if tried is None else tried + counts.tried
                        accepted = counts.accepted if accepted is None else accepted + counts.accepted
                effs.append(stats.block_efficiency)
                speeds.append(stats.new_tokens / max(seconds, 1e-9))
                depth_rates = stats.acceptance_by_position
                rank_rates = stats.acceptance_by_rank
            if tried is not None:
                for d in range(min(6, tried.shape[0])):
                    if float(tried[d].sum()) > 0:
                        rank_depth.append({"T": temperature, "method": config["method"], "depth": d + 1, **{
                            f"r{r}": (f"{float(accepted[d, r] / tried[d, r]):.2f} ({int(tried[d, r])})"
                                      if float(tried[d, r]) else "-") for r in range(4)}})
            eff = median(effs)
            if config["method"] == "chain g=5":
                chain_eff, chain_speed = eff, median(speeds)
            rows.append({
                "T": temperature, "method": config["method"], "nodes": config["nodes"],
                "rule": stats.tree_rule or "token", "tokens_per_call": eff,
                "x_chain": eff / chain_eff if chain_eff else float("nan"), "tok_per_s": median(speeds),
                "x_chain_tok_s": median(speeds) / chain_speed if chain_speed else float("nan"),
                "accept_by_depth": " ".join(f"{r:.2f}" for r in depth_rates[:6]),
                "accept_by_rank": " ".join(f"{r:.2f}" for r in rank_rates[:4]) or "-",
            })
            print(f"  T={temperature:g} {config['method']:12s} block efficiency {words.tokens(eff)}", flush=True)
    return rows, rank_depth, _verify_cost(target, args)


def _verify_cost(target: torch.nn.Module, args: Any) -> list[dict[str, Any]]:
    """verify_tree at N = 32 (deterministic and rrs rules) vs one target forward over 32 nodes."""
    from specdecode.models import cache_kwargs, kv_cache
    from specdecode.trees import TokenTree, tree_attention_mask, verify_tree

    N, prefix = 32, 128
    V = target.get_output_embeddings().weight.shape[0]
    gen = torch.Generator().manual_seed(0)
    parents = torch.tensor([[-1] + [(i - 1) // 2 for i in range(1, N)]])
    tokens = torch.randint(0, V, (1, N), generator=gen)
    tokens[0, 1:] = torch.arange(1, N) * 7 % V  # distinct siblings
    tree = TokenTree(tokens, parents, torch.tensor([N]))
    logits = torch.randn(1, N, V, generator=gen) * 3
    repeats = 20 if args.quick else 200
    rows = []
    for rule, draft in (("deterministic", None), ("rrs", torch.randn(1, N, V, generator=gen) * 3)):
        t = time_call(lambda: verify_tree(logits, draft, tree, rule=rule, temperature=1.0,
                                          generator=torch.Generator().manual_seed(1)), repeats=repeats)
        rows.append({"what": f"verify_tree {rule} N=32 V={V}", "median_us": median(t) * 1e6})
    ids = torch.randint(0, V, (1, prefix), generator=gen)
    with torch.no_grad():
        def forward() -> None:
            cache = kv_cache.new_cache()
            target(input_ids=ids, **cache_kwargs(target, cache))
            masks = tree_attention_mask(tree, torch.ones(1, prefix, dtype=torch.bool))
            start = time.perf_counter()
            target(input_ids=tokens, attention_mask=masks.additive_mask(), position_ids=masks.positions,
                   **cache_kwargs(target, cache))
            forward.seconds.append(time.perf_counter() - start)

        forward.seconds = []  # type: ignore[attr-defined]
        for _ in range(max(5, repeats // 10)):
            forward()
    forward_us = statistics.median(forward.seconds) * 1e6  # type: ignore[attr-defined]
    rows.append({"what": f"target forward over N=32 nodes (prefix {prefix})", "median_us": forward_us})
    for r in rows[:-1]:
        r["pct_of_forward"] = 100.0 * r["median_us"] / forward_us
    return rows


def plot(rows: list[dict[str, Any]], out: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, temperature in zip(axes, sorted({r["T"] for r in rows})):
        chain = [r for r in rows if r["T"] == temperature and r["method"].startswith("chain")]
        for kind in ("static", "dynamic", "sequoia"):
            pts = sorted((r["nodes"], r["tokens_per_call"]) for r in rows
                         if r["T"] == temperature and r["method"].startswith(kind))
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=kind)
        if chain:
            ax.axhline(chain[0]["tokens_per_call"], color="grey", linestyle="--", label="chain, gamma = 5")
        ax.set_title(f"temperature {temperature}")
        ax.set_xlabel("tree size (nodes, root included)")
        ax.set_xscale("log", base=2)
        ax.legend()
    axes[0].set_ylabel("tokens per target call")
    fig.suptitle("Demo pair: tokens per target call vs tree size")
    fig.tight_layout()
    path = f"{out}/tokens_per_call_vs_tree_size.png"
    fig.savefig(path, dpi=110)
    return path


#: Defaults of a full run and of a --quick one; values given on the command line win over both.
FULL = dict(num_prompts=8, max_new_tokens=48, sizes=[8, 16, 32])
QUICK = dict(num_prompts=2, max_new_tokens=16, sizes=[8])


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    from specdecode import cli_args

    at_least = cli_args.int_at_least
    parser = base_parser(__doc__.splitlines()[0], prog=prog, repeats_help="timed runs per case (default: 1)",
                         quick_help="a shorter run (the defaults below after the semicolons); options given "
                                    "explicitly win")
    parser.add_argument("--threads", type=at_least("threads", 1), default=1, help="torch CPU threads")
    parser.add_argument("--num-prompts", type=at_least("num_prompts", 1),
                        help=f"prompts (default: {FULL['num_prompts']}; --quick: {QUICK['num_prompts']})")
    parser.add_argument("--max-new-tokens", type=at_least("max_new_tokens", 1),
                        help=f"tokens generated per prompt (default: {FULL['max_new_tokens']}; --quick: "
                             f"{QUICK['max_new_tokens']})")
    parser.add_argument("--sizes", type=at_least("sizes", 2), nargs="+",
                        help=f"tree sizes, nodes with the root (default: {' '.join(map(str, FULL['sizes']))}; "
                             f"--quick: {' '.join(map(str, QUICK['sizes']))})")
    parser.add_argument("--temperatures", type=cli_args.temperature, nargs="+", default=[0.0, 1.0],
                        help="sampling temperatures; 0 is greedy")
    parser.add_argument("--plot", action="store_true", help="write a PNG of tokens per call vs tree size")
    parser.add_argument("--prompt-set", default="demo",
                        choices=["demo", "tune", "tune-code", "tune-prose", "report", "report-code", "report-prose"],
                        help="demo: the demo pair's held-out stdlib windows; tune / report (and their -code / -prose "
                             "halves): specdecode.prompt_sets (tune on one, report on the other)")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="tokens/s from wall time or this thread's CPU time (cpu needs --threads 1)")
    args = parser.parse_args(argv)
    if args.clock == "cpu" and args.threads != 1:
        parser.error("--clock cpu counts only this thread's CPU time; run with --threads 1")
    for name, value in (QUICK if args.quick else FULL).items():  # explicit options win over --quick
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.repeats = args.repeats or 1
    rows, rank_depth, cost = run(args)
    print()
    temperature = Column("T", fmt=lambda v: f"{v:g}")
    print(format_table(rows, [temperature, Column("method"), Column("nodes"), Column("rule"),
                              Column("tokens_per_call", "block\nefficiency", words.tokens),
                              Column("x_chain", "vs\nchain", words.speedup),
                              Column("tok_per_s", "tok/s", words.per_second),
                              Column("x_chain_tok_s", "tok/s vs\nchain", words.speedup),
                              Column("accept_by_depth", "acceptance\nby depth 1-4",
                                     lambda v: " ".join(v.split()[:4])),
                              Column("accept_by_rank", "acceptance\nby rank 0-2",
                                     lambda v: " ".join(v.split()[:3]))]))
    if rank_depth:
        print("\nconditional acceptance by depth and child rank (accepted / tried, tries in brackets), Sequoia rows")
        print(format_table(rank_depth, [temperature, Column("method"), Column("depth")]
                           + [Column(f"r{r}", f"rank {r}") for r in range(4)]))
    print()
    print(format_table(cost, [Column("what"), Column("median_us", "median µs", lambda v: f"{v:.0f}"),
                              Column("pct_of_forward", "% of the forward", lambda v: f"{v:.1f}%")]))
    meta = {"environment": environment(), "args": vars(args)}
    write_results(args.out, "bench_trees", rows, meta)
    if rank_depth:
        write_results(args.out, "bench_trees_rank_depth", rank_depth, meta)
    write_results(args.out, "bench_trees_verify_cost", cost, meta)
    if args.plot:
        print(f"figure: {plot(rows, args.out)}")


if __name__ == "__main__":
    main()
