"""End-to-end generation benchmark: the target alone, Hugging Face assisted generation (with the
draft model, and its prompt-lookup mode), and specdecode with every drafter and rule, on the
same pair, prompts, seed and max_new_tokens.

    python -m specdecode bench                  # cost-realistic pair, full table
    python -m specdecode bench --quick          # the same pair, shorter: about half a minute
    python -m specdecode bench --trees          # token trees by size (bench --trees --help)
    python -m specdecode bench --device cuda    # the decode paths on a GPU (bench --device cuda --help)
    python -m specdecode bench --drafters ngram --rules token --batch-sizes 1
    python -m specdecode bench --plot           # also PNGs: acceptance by position, speedup vs gamma
    python benchmarks/bench_generate.py ...     # the same
    python -m specdecode bench --pair smollm2   # SmolLM2 on chat prompts: specdecode.bench.real_pair

Drafters (--drafters, see drafter_factories): model (the draft model, ModelDrafter), ngram
(prompt lookup, NgramDrafter), ngram-trie (its tries of 16 nodes, verified with the lossless
tree rule whatever --rules says), and layerskip-1/2/3 (the target's first k layers,
LayerSkipDrafter). Each chain drafter runs with every rule of --rules.

Every configuration runs in one process, one after the other, after an untimed warm-up, and
--repeats times; tokens/s is the median over repeats. EOS is disabled for every method, so each
generates exactly max_new_tokens per prompt. Batch 8: specdecode runs one left-padded batch;
the target alone runs one batched generate; Hugging Face assisted generation (both modes)
supports batch 1 only, so it is 8 sequential calls. Ratios compare with the target alone and
with both HF modes measured in the same run. The columns use the words of docs/guide.md
(section 2).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from specdecode import cli_args, pairs
from specdecode import vocabulary as words
from specdecode.analysis import expected_speedup
from specdecode.bench.harness import (CLOCKS, Column, add_run_options, base_parser, environment, finish_run_options,
                                      format_table, time_call, without_eos, write_results)

BASELINES = ("target alone", "target alone, fast path", "HF assisted", "HF prompt lookup")
# "target alone, fast path": the target's own generate through specdecode.cpu's fast path (the
# path specdecode's runs take with --cpu-fast-path auto/on), so that the speculative gain and the
# fast path's own gain are separate numbers.
# --clock (harness.CLOCKS): the per-phase times of SpeculativeStats behind the cost-aware
# prediction stay wall times.
RULES = ("token", "block")
#: The drafter axis (:func:`drafter_factories` builds them).
DRAFTERS = ("model", "ngram", "ngram-trie", "layerskip-1", "layerskip-2", "layerskip-3")


def drafter_factories(target: Any, draft: Any) -> dict[str, Callable[[], Any]]:
    """The drafter axis: name -> a function building a fresh drafter (or a draft model) for one
    generation. Adding a drafter to the benchmark is one entry here."""
    from specdecode import drafters

    factories: dict[str, Callable[[], Any]] = {
        "model": lambda: drafters.ModelDrafter(draft),
        "ngram": lambda: drafters.NgramDrafter(),
        "ngram-trie": lambda: drafters.NgramDrafter(num_nodes=16),
    }
    for k in (1, 2, 3):
        factories[f"layerskip-{k}"] = lambda k=k: drafters.LayerSkipDrafter(target, num_layers=k)
    assert tuple(factories) == DRAFTERS
    return factories


#: Drafters that propose token trees: they run once, with the lossless tree rule of their
#: children (``rule=None``), whatever ``--rules`` says (those are chain rules).
TREE_DRAFTERS = ("ngram-trie",)
TREE_RULE = "tree"


def method_name(drafter: str, rule: str) -> str:
    return f"specdecode {drafter} {rule}"


def drafter_rules(drafter: str, rules: list[str]) -> list[str]:
    """The rules a drafter runs with: ``--rules`` for chains, the tree rule for tree drafters."""
    return [TREE_RULE] if drafter in TREE_DRAFTERS else list(rules)


def _prompts(tokenizer: Any, n: int, max_prompt_tokens: int) -> list[torch.Tensor]:
    from specdecode.demo import demo_prompts

    out = []
    for text in demo_prompts(n):
        ids = tokenizer(text, return_tensors="pt").input_ids[:, -max_prompt_tokens:]
        out.append(ids)
    return out


def _left_pad(prompts: list[torch.Tensor], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(p.shape[1] for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - p.shape[1]:] = p[0]
        mask[i, width - p.shape[1]:] = 1
    return ids, mask


def _batches(prompts: list[torch.Tensor], batch_size: int) -> list[list[torch.Tensor]]:
    return [prompts[i: i + batch_size] for i in range(0, len(prompts), batch_size)]


class _DropMessage(logging.Filter):
    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefix)


@contextmanager
def _hf_assisted_generation() -> Iterator[None]:
    """transformers' own assisted generation calls the assistant's ``generate`` with both a
    ``generation_config`` and length keywords, and transformers then warns, once, that this
    combination is deprecated (printed in the middle of the progress bar). Nothing the benchmark
    passes causes it, so exactly that record is dropped while HF assisted generation runs."""
    logger = logging.getLogger("transformers.generation.utils")
    drop = _DropMessage("Passing `generation_config` together with generation-related arguments")
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


def measure_cost_ratio(target: Any, draft: Any, repeats: int = 3) -> float:
    """c = (draft decode step) / (target decode step), single token with KV cache, batch 1."""
    from specdecode.demo import decode_step_seconds

    return decode_step_seconds(draft, repeats=repeats) / decode_step_seconds(target, repeats=repeats)


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    from tqdm.auto import tqdm

    import specdecode

    torch.manual_seed(args.seed)
    target, draft, tokenizer, pair_name = pairs.load_command_pair(args.pair, target_path=args.target,
                                                                  draft_path=args.draft)
    target, draft = without_eos(target), without_eos(draft)
    # HF's assisted generation reads its draft length from the *assistant's* generation config:
    # the same constant gamma as ours, and no confidence-based early stop of drafting.
    draft.generation_config.num_assistant_tokens = args.num_draft_tokens
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    prompts = _prompts(tokenizer, args.num_prompts, args.max_prompt_tokens)
    gamma = args.num_draft_tokens
    c_measured = measure_cost_ratio(target, draft, repeats=1 if args.quick else 3)
    sizes = "; ".join(f"{who} {sum(p.numel() for p in m.parameters()) / 1e6:.2f}M parameters"
                      for who, m in (("target", target), ("draft", draft)))
    print(f"pair: {pair_name}\n  {sizes}\n  {len(prompts)} prompts, {args.max_new_tokens} new tokens each, "
          f"gamma {gamma}, {words.COST_RATIO.name} {words.cost(c_measured)}, {args.repeats} timed run(s) per case")
    if args.pair == "demo" and not args.target:
        print("  note: the trained demo pair is so small that per-call overhead dominates (c is high), so speculation\n"
              "  looks slower than it is; the default pair (--pair benchmark) has a realistic cost ratio.")

    sampling = cli_args.sampling

    factories = drafter_factories(target, draft)
    unknown = [d for d in args.drafters if d not in factories]
    if unknown:
        raise SystemExit(f"--drafters: unknown {unknown}; this build has {sorted(factories)}")
    specs = {method_name(d, r): (d, r) for d in args.drafters for r in drafter_rules(d, args.rules)}
    methods = list(BASELINES) + list(specs)
    cases: list[tuple[float, int, str]] = [
        (t, b, m) for t in args.temperatures for b in args.batch_sizes for m in methods
    ]
    results: dict[tuple[float, int, str], dict[str, Any]] = {}
    bar = tqdm(total=len(cases) * args.repeats, desc="bench", unit="run", leave=False)
    for temperature, batch_size, method in cases:
        groups = _batches(prompts, batch_size)
        padded = [_left_pad(g, pad_id) for g in groups]
        stats_runs: list[Any] = []

        def once(warmup: bool = False) -> int:
            new_tokens = 0
            gen = torch.Generator().manual_seed(args.seed)
            torch.manual_seed(args.seed)
            common = dict(max_new_tokens=2 if warmup else args.max_new_tokens, pad_token_id=pad_id)
            if method.startswith("target alone"):
                with specdecode.cpu.accelerated(target, enabled=method.endswith("fast path")):
                    for ids, mask in padded:
                        out = target.generate(ids, attention_mask=mask, **common, **sampling(temperature))
                        new_tokens += (out.shape[1] - ids.shape[1]) * ids.shape[0]
            elif method.startswith("HF "):  # batch 1 only: one call per prompt
                mode = dict(assistant_model=draft) if method == "HF assisted" else dict(prompt_lookup_num_tokens=gamma)
                for p in prompts[: len(groups) * batch_size]:
                    with _hf_assisted_generation():
                        out = target.generate(p, attention_mask=torch.ones_like(p), **mode, **common,
                                              **sampling(temperature))
                    new_tokens += out.shape[1] - p.shape[1]
            else:
                name, rule = specs[method]
                for ids, mask in padded:
                    out = specdecode.generate(target, factories[name](), ids, mask if batch_size > 1 else None,
                                              num_draft_tokens=gamma, rule=None if rule == TREE_RULE else rule,
                                              eos_token_id=None, cpu_fast_path=cli_args.cpu_fast_path(args),
                                              generator=gen, **common, **sampling(temperature))
                    new_tokens += (out.sequences.shape[1] - ids.shape[1]) * ids.shape[0]
                    if not warmup:
                        stats_runs.append(out.stats)
            return new_tokens

        once(warmup=True)  # untimed: first calls of each method and shape pay one-time costs
        counts: list[int] = []
        times = time_call(lambda: counts.append(once()) or bar.update(1), repeats=args.repeats, warmup=0,
                          clock=CLOCKS[args.clock])
        tokens_per_s = statistics.median(n / t for n, t in zip(counts, times))
        row: dict[str, Any] = {"temperature": temperature, "batch": batch_size, "method": method,
                               "tokens": counts[0], "tok_per_s": tokens_per_s}
        if stats_runs:
            name = specs[method][0]
            alpha = statistics.median(s.alpha for s in stats_runs)
            per_position = [statistics.median(s.acceptance_by_position[i] for s in stats_runs
                                              if i < len(s.acceptance_by_position))
                            for i in range(gamma)]
            efficiency = statistics.median(s.block_efficiency for s in stats_runs)
            # Leviathan's c: the measured decode-step ratio for the draft model; for other
            # drafters the per-call ratio the run measured (0 for a drafter without a model).
            c = c_measured if name == "model" else statistics.median(s.cost_ratio for s in stats_runs)
            row.update(drafter=name, rule=specs[method][1], alpha=alpha, block_efficiency=efficiency,
                       acceptance_rate=statistics.median(s.acceptance_rate for s in stats_runs),
                       draft_call_s=statistics.median(s.draft_time_per_call for s in stats_runs),
                       draft_step_s=statistics.median(s.draft_time / max(s.steps, 1) for s in stats_runs),
                       verify_call_s=statistics.median(s.target_time_per_call for s in stats_runs),
                       acceptance_by_position=[round(a, 4) for a in per_position],
                       predicted_speedup=expected_speedup(min(alpha, 1.0), gamma, c),
                       verify_share=statistics.median(s.verify_time / max(s.total_time, 1e-12) for s in stats_runs),
                       bookkeeping_share=statistics.median(s.bookkeeping_time / max(s.total_time, 1e-12)
                                                           for s in stats_runs))
        results[(temperature, batch_size, method)] = row
    bar.close()

    rows = []
    for (temperature, batch_size, method), row in results.items():
        base = results[(temperature, batch_size, "target alone")]["tok_per_s"]
        row["x_target"] = row["tok_per_s"] / base
        row["x_target_fast"] = row["tok_per_s"] / results[(temperature, batch_size, "target alone, fast path")]["tok_per_s"]
        row["x_hf_assisted"] = row["tok_per_s"] / results[(temperature, batch_size, "HF assisted")]["tok_per_s"]
        row["x_hf_lookup"] = row["tok_per_s"] / results[(temperature, batch_size, "HF prompt lookup")]["tok_per_s"]
        if "predicted_speedup" in row:
            row["measured_over_predicted"] = row["x_target"] / row["predicted_speedup"]
            # Leviathan's formula assumes a verify call (gamma+1 tokens) costs one decode step of
            # the target. On a CPU it costs more; this prediction uses the measured costs instead:
            # tokens per call x (target-alone time per token) / (drafting + one verify call per step).
            step_s = batch_size / base  # target alone: seconds per decode step of the batch
            row["cost_aware_prediction"] = (row["block_efficiency"] * step_s
                                            / (row["draft_step_s"] + row["verify_call_s"]))
            row["measured_over_cost_aware"] = row["x_target"] / row["cost_aware_prediction"]
            row["verify_call_in_steps"] = row["verify_call_s"] / step_s
        rows.append(row)
    meta = {**environment(), "clock": args.clock, "pair": pair_name, "cost_ratio_c": c_measured, "gamma": gamma,
            "max_new_tokens": args.max_new_tokens, "num_prompts": len(prompts), "args": vars(args)}

    if args.plot:
        sweep = gamma_sweep(target, draft, prompts, args, c_measured, pad_id)
        meta["gamma_sweep"] = sweep
        plot(rows, sweep, Path(args.out))
    print(report(rows, pair_name, gamma, c_measured))
    csv_path, json_path = write_results(args.out, "bench_generate", rows, meta)
    print(f"wrote {csv_path} and {json_path}")
    return rows


def report(rows: list[dict[str, Any]], pair_name: str, gamma: int, c: float) -> str:
    """The benchmark's screen: the main table, acceptance by position, and what the columns mean."""
    columns = [
        Column("temperature", "T", lambda v: f"{v:g}"), Column("batch"), Column("method"),
        Column("tok_per_s", "tok/s", words.per_second), Column("x_target", words.SPEEDUP.name, words.speedup),
        Column("x_target_fast", "vs target\nfast path", words.speedup),
        Column("x_hf_assisted", "vs HF\nassisted", words.speedup), Column("x_hf_lookup", "vs HF\nlookup", words.speedup),
        Column("alpha", words.ALPHA.name, words.rate), Column("block_efficiency", "block\nefficiency", words.tokens),
        Column("predicted_speedup", "predicted\nspeedup", words.speedup),
        Column("cost_aware_prediction", "cost-aware\nprediction", words.speedup),
    ]
    spec_rows = [r for r in rows if "acceptance_by_position" in r]
    by_position = [{"temperature": r["temperature"], "batch": r["batch"], "method": r["method"],
                    "acceptance_rate": r["acceptance_rate"],
                    "acceptance by position": words.rates(r["acceptance_by_position"])} for r in spec_rows]
    verify_steps = [r["verify_call_in_steps"] for r in spec_rows if r["batch"] == 1]
    notes = [
        f"{words.SPEEDUP.name}: {words.SPEEDUP.definition}, measured in the same run.",
        f"{words.PREDICTED_SPEEDUP.name}: {words.PREDICTED_SPEEDUP.definition} (here gamma {gamma}, "
        f"c {words.cost(c)}).",
        f"{words.COST_AWARE_SPEEDUP.name}: {words.COST_AWARE_SPEEDUP.definition}"
        + (f"; at batch 1 a verify call costs {statistics.median(verify_steps):.1f} target decode steps here."
           if verify_steps else "."),
    ]
    import textwrap

    from specdecode.bench.harness import table_width

    wrapped = [textwrap.fill(n, width=table_width(), subsequent_indent="  ") for n in notes]
    return "\n\n".join([format_table(rows, columns, title=f"pair: {pair_name}"),
                         format_table(by_position, [Column("temperature", "T", lambda v: f"{v:g}"), Column("batch"),
                                                    Column("method"),
                                                    Column("acceptance_rate", words.ACCEPTANCE_RATE.name, words.rate),
                                                    Column("acceptance by position")]),
                         "\n".join(wrapped)])


def gamma_sweep(target: Any, draft: Any, prompts: list[torch.Tensor], args: argparse.Namespace, c: float,
                pad_id: int) -> list[dict[str, float]]:
    """Batch-1 token verification at temperature 0 for gamma = 1..8: measured speedup over the
    target alone against Leviathan's prediction from the measured alpha and c."""
    import specdecode

    def tokens_per_s(fn: Callable[[], int]) -> float:
        counts: list[int] = []
        times = time_call(lambda: counts.append(fn()), repeats=args.repeats, warmup=0)
        return statistics.median(n / t for n, t in zip(counts, times))

    fast = cli_args.cpu_fast_path(args)

    def plain() -> int:  # through the same CPU path as the speculative runs
        with specdecode.cpu.accelerated(target, enabled=fast):
            return sum(target.generate(p, attention_mask=torch.ones_like(p), max_new_tokens=args.max_new_tokens,
                                       do_sample=False, pad_token_id=pad_id).shape[1] - p.shape[1] for p in prompts)

    base = tokens_per_s(plain)
    sweep = []
    for g in range(1, 9):
        alphas: list[float] = []

        def spec(g: int = g) -> int:
            n = 0
            for p in prompts:
                out = specdecode.generate(target, draft, p, num_draft_tokens=g, rule="token",
                                          max_new_tokens=args.max_new_tokens, eos_token_id=None, pad_token_id=pad_id,
                                          cpu_fast_path=fast)
                alphas.append(out.stats.alpha)
                n += out.sequences.shape[1] - p.shape[1]
            return n

        measured = tokens_per_s(spec) / base
        alpha = statistics.median(alphas)
        sweep.append({"gamma": g, "alpha": alpha, "measured_speedup": measured,
                      "predicted_speedup": expected_speedup(min(alpha, 1.0), g, c)})
    return sweep


def plot(rows: list[dict[str, Any]], sweep: list[dict[str, float]], out_dir: Path) -> None:
    """acceptance_by_position.png and speedup_vs_gamma.png in ``out_dir``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 4))
    for row in rows:
        if "acceptance_by_position" in row and row["batch"] == 1:
            acc = row["acceptance_by_position"]
            ax.plot(range(1, len(acc) + 1), acc, marker="o", label=f"{row['method']}, T={row['temperature']}")
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance rate")
    ax.set_ylim(0, 1.05)
    ax.set_title("Acceptance by draft position (batch 1)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / "acceptance_by_position.png", dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([s["gamma"] for s in sweep], [s["measured_speedup"] for s in sweep], marker="o", label="measured")
    ax.plot([s["gamma"] for s in sweep], [s["predicted_speedup"] for s in sweep], marker="s", linestyle="--",
            label="Leviathan prediction (measured alpha, c)")
    ax.set_xlabel("gamma (draft tokens per step)")
    ax.set_ylabel("speedup over the target alone")
    ax.set_title("Token verification, temperature 0, batch 1")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / "speedup_vs_gamma.png", dpi=120)
    plt.close(fig)
    print(f"wrote {out_dir / 'acceptance_by_position.png'} and {out_dir / 'speedup_vs_gamma.png'}")


#: Defaults of a full run and of a --quick one (same pair, fewer and shorter runs); values
#: given on the command line win over both.
FULL = dict(num_prompts=8, max_new_tokens=64, batch_sizes=[1, 8], repeats=3)
QUICK = dict(num_prompts=2, max_new_tokens=32, batch_sizes=[1], repeats=1)


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    at_least = cli_args.int_at_least
    parser = base_parser(__doc__, prog=prog,
                         quick_help="a shorter run on the same pair (the defaults below after the semicolons)",
                         repeats_help=f"timed runs per case, median reported (default: {FULL['repeats']}; "
                                      f"--quick: {QUICK['repeats']})")
    parser.add_argument("--pair", choices=["benchmark", "demo", "smollm2"], default="benchmark",
                        help="embedded pair: 'benchmark' enlarges the trained target to a realistic cost without "
                             "changing its outputs; 'demo' is the pair as trained (tiny, so call overhead dominates "
                             "and speculation looks slower than it is); 'smollm2': SmolLM2-135M-Instruct on chat "
                             "prompts, its own table and options (bench --pair smollm2 --help)")
    parser.add_argument("--drafter-dir", nargs="+", metavar="DIR",
                        help="with --pair smollm2 only: folders of trained drafters, one row each")
    parser.add_argument("--target", type=cli_args.existing_dir("target"),
                        help="path of a local Hugging Face target model (with --draft)")
    parser.add_argument("--draft", type=cli_args.existing_dir("draft"),
                        help="path of a local Hugging Face draft model (with --target)")
    parser.add_argument("--num-prompts", type=at_least("num_prompts", 1),
                        help=f"held-out prompts from the embedded corpus (default: {FULL['num_prompts']}; "
                             f"--quick: {QUICK['num_prompts']})")
    parser.add_argument("--max-prompt-tokens", type=at_least("max_prompt_tokens", 1), default=96,
                        help="prompts keep their last tokens up to this many")
    parser.add_argument("--batch-sizes", type=at_least("batch_size", 1), nargs="+",
                        help=f"prompts per generate call (default: {' '.join(map(str, FULL['batch_sizes']))}; "
                             f"--quick: {' '.join(map(str, QUICK['batch_sizes']))})")
    parser.add_argument("--drafters", nargs="+", default=None, choices=DRAFTERS, metavar="DRAFTER",
                        help=f"specdecode drafters to run, of {' '.join(DRAFTERS)} (default: all; --quick: model "
                             "ngram)")
    parser.add_argument("--rules", nargs="+", type=cli_args.rule, default=None, metavar="RULE",
                        help=f"verification rules for every chain drafter (default: {' '.join(RULES)})")
    parser.add_argument("--plot", action="store_true", help="write PNG figures to --out")
    add_run_options(parser, FULL, QUICK, gamma=5, gamma_users="specdecode and HF assisted generation")
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    from specdecode.bench import real_pair

    if real_pair.names_real_pair(sys.argv[1:] if argv is None else argv):
        real_pair.main(argv, prog)
        return
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if args.drafter_dir:
        parser.error("argument --drafter-dir: goes with --pair smollm2 (drafters trained for SmolLM2)")
    if bool(args.target) != bool(args.draft):
        parser.error("--target and --draft go together (paths of a local Hugging Face pair)")
    finish_run_options(parser, args, FULL, QUICK)
    from specdecode.demo import demo_prompts

    if args.num_prompts > len(demo_prompts()):
        parser.error(f"argument --num-prompts: num_prompts: at most {len(demo_prompts())} held-out prompts exist")
    if args.drafters is None:
        args.drafters = ["model", "ngram"] if args.quick else list(DRAFTERS)
    args.rules = args.rules or list(RULES)
    run(args)


if __name__ == "__main__":
    main()
