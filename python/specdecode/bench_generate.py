"""End-to-end generation benchmark: the target alone, Hugging Face assisted generation (with the
draft model, and its prompt-lookup mode), and specdecode with every drafter and rule, on the
same pair, prompts, seed and ``max_new_tokens``.

    python -m specdecode bench                  # cost-realistic pair, full table
    python -m specdecode bench --quick          # CI smoke run (small, a few seconds)
    python -m specdecode bench --drafters ngram --rules token --batch-sizes 1
    python -m specdecode bench --plot           # also PNGs: acceptance by position, speedup vs gamma
    python benchmarks/bench_generate.py ...     # the same

Drafters (``--drafters``, see :func:`drafter_factories`): ``model`` (the draft model,
:class:`~specdecode.drafters.ModelDrafter`), ``ngram`` (prompt lookup,
:class:`~specdecode.drafters.NgramDrafter`), ``ngram-trie`` (its tries of 16 nodes, verified with the
lossless tree rule whatever ``--rules`` says), and ``layerskip-1/2/3`` (the target's first k
layers, :class:`~specdecode.drafters.LayerSkipDrafter`). Each chain drafter runs with every rule of
``--rules``.

Every configuration runs in one process, one after the other, ``--repeats`` times; tokens/s is
the median over repeats. EOS is disabled for every method, so each generates exactly
``max_new_tokens`` per prompt. Batch 8: specdecode runs one left-padded batch; the target alone
runs one batched ``generate``; Hugging Face assisted generation (both modes) supports batch 1
only, so it is 8 sequential calls. Ratios compare with the target alone and with both HF modes
measured in the same run.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import torch

from specdecode.analysis import expected_speedup
from specdecode.benchmarking import base_parser, environment, format_table, time_call, write_results

BASELINES = ("target alone", "HF assisted", "HF prompt lookup")
# --clock: wall time, or the benchmark thread's CPU time (CPU runs with --threads 1 only: on a
# machine shared with other work it is far less noisy; it does not see GPU time). The per-phase
# times of SpeculativeStats behind the cost-aware prediction stay wall times.
CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}
RULES = ("token", "block")


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


def load_pair(pair: str = "benchmark", target_path: str | None = None, draft_path: str | None = None
              ) -> tuple[Any, Any, Any, str]:
    """``(target, draft, tokenizer, description)`` for the CLI: a local Hugging Face pair when
    both paths are given, else the embedded pair, as trained (``"demo"``) or with the
    cost-realistic enlarged target (``"benchmark"``)."""
    from specdecode.demo import load_benchmark_pair, load_demo_pair

    if target_path or draft_path:
        if not (target_path and draft_path):
            raise SystemExit("--target and --draft go together")
        from transformers import AutoModelForCausalLM, AutoTokenizer

        target = AutoModelForCausalLM.from_pretrained(target_path).eval()
        draft = AutoModelForCausalLM.from_pretrained(draft_path).eval()
        return target, draft, AutoTokenizer.from_pretrained(target_path), f"{target_path} / {draft_path}"
    if pair == "demo":
        target, draft, tokenizer = load_demo_pair()
        return target, draft, tokenizer, "embedded demo pair (trained on the Python standard library)"
    target, draft, tokenizer = load_benchmark_pair()
    return target, draft, tokenizer, "embedded pair, cost-realistic target (function-preserving enlargement)"


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


def _no_eos(model: Any) -> Any:
    model.generation_config = copy.deepcopy(model.generation_config)
    model.generation_config.eos_token_id = None
    return model


def measure_cost_ratio(target: Any, draft: Any, repeats: int = 3) -> float:
    """c = (draft decode step) / (target decode step), single token with KV cache, batch 1."""
    from specdecode.demo import decode_step_seconds

    return decode_step_seconds(draft, repeats=repeats) / decode_step_seconds(target, repeats=repeats)


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    from tqdm.auto import tqdm

    import specdecode

    torch.manual_seed(args.seed)
    target, draft, tokenizer, pair_name = load_pair(args.pair, args.target, args.draft)
    target, draft = _no_eos(target), _no_eos(draft)
    # HF's assisted generation reads its draft length from the *assistant's* generation config:
    # the same constant gamma as ours, and no confidence-based early stop of drafting.
    draft.generation_config.num_assistant_tokens = args.num_draft_tokens
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    prompts = _prompts(tokenizer, args.num_prompts, args.max_prompt_tokens)
    gamma = args.num_draft_tokens
    c_measured = measure_cost_ratio(target, draft, repeats=1 if args.quick else 3)
    print(f"pair: {pair_name}\n{len(prompts)} prompts, max_new_tokens={args.max_new_tokens}, gamma={gamma}, "
          f"measured cost ratio c = t_draft / t_target = {c_measured:.4f}")

    common = dict(max_new_tokens=args.max_new_tokens, pad_token_id=pad_id)

    def sampling(temperature: float) -> dict[str, Any]:
        return dict(do_sample=True, temperature=temperature) if temperature > 0 else dict(do_sample=False)

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
    bar = tqdm(total=len(cases) * args.repeats, desc="bench", unit="run")
    for temperature, batch_size, method in cases:
        groups = _batches(prompts, batch_size)
        padded = [_left_pad(g, pad_id) for g in groups]
        stats_runs: list[Any] = []

        def once() -> int:
            new_tokens = 0
            gen = torch.Generator().manual_seed(args.seed)
            torch.manual_seed(args.seed)
            if method == "target alone":
                for ids, mask in padded:
                    out = target.generate(ids, attention_mask=mask, **common, **sampling(temperature))
                    new_tokens += (out.shape[1] - ids.shape[1]) * ids.shape[0]
            elif method.startswith("HF "):  # batch 1 only: one call per prompt
                mode = dict(assistant_model=draft) if method == "HF assisted" else dict(prompt_lookup_num_tokens=gamma)
                for p in prompts[: len(groups) * batch_size]:
                    out = target.generate(p, attention_mask=torch.ones_like(p), **mode, **common,
                                          **sampling(temperature))
                    new_tokens += out.shape[1] - p.shape[1]
            else:
                name, rule = specs[method]
                for ids, mask in padded:
                    out = specdecode.generate(target, factories[name](), ids, mask if batch_size > 1 else None,
                                              num_draft_tokens=gamma, rule=None if rule == TREE_RULE else rule,
                                              eos_token_id=None,
                                              generator=gen, **common, **sampling(temperature))
                    new_tokens += (out.sequences.shape[1] - ids.shape[1]) * ids.shape[0]
                    stats_runs.append(out.stats)
            return new_tokens

        counts: list[int] = []
        times = time_call(lambda: counts.append(once()) or bar.update(1), repeats=args.repeats, warmup=0,
                          clock=CLOCKS[args.clock])
        tokens_per_s = statistics.median(n / t for n, t in zip(counts, times))
        row: dict[str, Any] = {"temperature": temperature, "batch": batch_size, "method": method,
                               "tokens": counts[0], "tok_per_s": tokens_per_s}
        if stats_runs:
            name = specs[method][0]
            alpha = statistics.median(s.alpha for s in stats_runs)
            per_position = [statistics.median(s.acceptance_rate_per_position[i] for s in stats_runs
                                              if i < len(s.acceptance_rate_per_position))
                            for i in range(gamma)]
            efficiency = statistics.median(s.block_efficiency for s in stats_runs)
            # Leviathan's c: the measured decode-step ratio for the draft model; for other
            # drafters the per-call ratio the run measured (0 for a drafter without a model).
            c = c_measured if name == "model" else statistics.median(s.cost_ratio for s in stats_runs)
            row.update(drafter=name, rule=specs[method][1], alpha=alpha, block_efficiency=efficiency,
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
        rows.append(row)
    meta = {**environment(), "clock": args.clock, "pair": pair_name, "cost_ratio_c": c_measured, "gamma": gamma,
            "max_new_tokens": args.max_new_tokens, "num_prompts": len(prompts), "args": vars(args)}

    if args.plot:
        sweep = gamma_sweep(target, draft, prompts, args, c_measured, pad_id)
        meta["gamma_sweep"] = sweep
        plot(rows, sweep, Path(args.out))
    columns = ["temperature", "batch", "method", "tok_per_s", "x_target", "x_hf_assisted", "x_hf_lookup", "alpha",
               "block_efficiency", "predicted_speedup", "cost_aware_prediction", "measured_over_cost_aware"]
    print(format_table(rows, columns))
    for row in rows:
        if "acceptance_by_position" in row:
            print(f"  alpha by position  T={row['temperature']} B={row['batch']} {row['method']:26s} "
                  + " ".join(f"{a:.2f}" for a in row["acceptance_by_position"]))
    csv_path, json_path = write_results(args.out, "bench_generate", rows, meta)
    print(f"wrote {csv_path} and {json_path}")
    return rows


def gamma_sweep(target: Any, draft: Any, prompts: list[torch.Tensor], args: argparse.Namespace, c: float,
                pad_id: int) -> list[dict[str, float]]:
    """Batch-1 token verification at temperature 0 for gamma = 1..8: measured speedup over the
    target alone against Leviathan's prediction from the measured alpha and c."""
    import specdecode

    def tokens_per_s(fn: Callable[[], int]) -> float:
        counts: list[int] = []
        times = time_call(lambda: counts.append(fn()), repeats=args.repeats, warmup=0)
        return statistics.median(n / t for n, t in zip(counts, times))

    def plain() -> int:
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
                                          max_new_tokens=args.max_new_tokens, eos_token_id=None, pad_token_id=pad_id)
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


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = base_parser(__doc__.splitlines()[0], prog=prog)
    parser.add_argument("--pair", choices=["benchmark", "demo"], default="benchmark",
                        help="benchmark: cost-realistic enlarged target (default); demo: the trained pair as is")
    parser.add_argument("--target", help="path of a local HF target model (with --draft)")
    parser.add_argument("--draft", help="path of a local HF draft model (with --target)")
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--max-prompt-tokens", type=int, default=96)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--num-draft-tokens", "--gamma", type=int, default=5)
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--drafters", nargs="+", default=None,
                        help="specdecode drafters to run (default: every one this build has; see drafter_factories)")
    parser.add_argument("--rules", nargs="+", default=list(RULES), help="verification rules for every drafter")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="wall time, or this thread's CPU time (with --threads 1 on a busy CPU machine)")
    parser.add_argument("--plot", action="store_true", help="write PNG figures to --out")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: torch's choice; 1 avoids stalls on a busy machine)")
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    args = build_parser(prog).parse_args(argv)
    if args.quick:
        args.pair = "demo" if not (args.target or args.draft) else args.pair
        args.num_prompts = min(args.num_prompts, 2)
        args.max_new_tokens = min(args.max_new_tokens, 12)
        args.batch_sizes = [b if b == 1 else 2 for b in args.batch_sizes]
    args.repeats = args.repeats or (1 if args.quick else 3)
    if args.drafters is None:
        args.drafters = ["model", "ngram"] + ([] if args.quick else ["ngram-trie"]
                                              + [f"layerskip-{k}" for k in (1, 2, 3)])
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.clock == "cpu" and torch.get_num_threads() != 1:
        raise SystemExit("--clock cpu: counts only this thread's CPU time; run with --threads 1")
    run(args)


if __name__ == "__main__":
    main()
