"""The decode-path benchmark: the target alone (Hugging Face ``generate`` and the graphed static
path), Hugging Face assisted generation, and specdecode eager / graphed, chain and tree, per
batch size and temperature, with ratios, the time split, host synchronisations per step, the
Leviathan prediction, and the bfloat16 greedy check.

    python -m specdecode bench --device cuda                 # the GPU run (demo + 1B pairs, bf16)
    python -m specdecode bench --device cpu --quick          # CPU smoke run of the same script (CI)

Per (pair, temperature, batch size) every method generates ``max_new_tokens`` for the same
left-padded prompts with EOS off, once as a warm-up (CUDA graphs are recorded then and reused
after, as they are in a serving loop) and ``--repeats`` timed times; tokens/s is the median.
Methods (``--methods`` picks some):

- ``target HF``: ``target.generate`` (Hugging Face, eager, its own dynamic cache);
- ``target graphed``: the target alone on specdecode's graphed static path (``draft=None``; on a
  CPU the same static path without graphs): the baseline that isolates the speculative gain;
- ``HF assisted``: ``target.generate(assistant_model=draft)``, constant gamma, batch 1 only
  (Hugging Face supports no more);
- ``eager chain`` / ``graphed chain``: ``specdecode.generate`` with the token rule on the
  eager path and on the graphed static path (CPU: static);
- ``eager tree``: a dynamic (EAGLE-2) tree of ``--tree-nodes`` nodes on the eager path (skipped
  where ``verify_tree`` has no kernel for the device);
- ``target compiled`` / ``compiled chain``: the target alone and the chain on the compiled static
  path (``decode_path="compiled"``: the step compiled by ``torch.compile``, then on CUDA recorded
  as CUDA graphs; compiled during the warm-up). ``--quick`` leaves them out unless ``--methods``
  names them: each layout runs a compiler for seconds to minutes.

``kernels_per_step``: the kernels one step of the static, graphed or compiled methods launches
(:func:`specdecode.engine.launch_count.step_launches`: eager operators on the CPU, the kernels
compiled code calls, the CUDA kernels on a GPU), counted on the last layout after the timed runs.

For the static/graphed methods one extra generation with ``phase_timing=True`` gives the time
split (draft / target / verify / bookkeeping) and the time per draft forward, without
perturbing the timed runs. ``x_target`` compares with ``target HF``, ``x_graphed`` with
``target graphed`` (same path, so the purely speculative gain), ``x_hf`` with ``HF assisted``
(batch 1). ``predicted`` is Leviathan's ``(1 - a^(g+1)) / ((1 - a)(g c + 1))`` from the measured
acceptance ``a`` and cost ratio ``c`` = one draft forward / one target step of the same path;
``measured_over_predicted`` divides the same-path speedup by it.

The greedy check: greedy speculative output against the target's own greedy ``generate`` on
left-padded batches, row by row, in bfloat16 (default backend settings, and with reduced-
precision bf16 reductions switched off) and in float32.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

from specdecode.analysis import expected_speedup
from specdecode.bench.harness import base_parser, environment, format_table, write_results

METHODS = ("target HF", "target graphed", "HF assisted", "eager chain", "graphed chain", "eager tree",
           "target compiled", "compiled chain")
#: The methods that run on a static path (kernels per step counted), with the path's name.
STATIC_METHODS = {"target graphed": "graphed", "graphed chain": "graphed", "target compiled": "compiled",
                  "compiled chain": "compiled"}
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


# ---------------------------------------------------------------------- inputs
def load(pair: str, device: torch.device, dtype: torch.dtype) -> tuple[Any, Any, Any]:
    from specdecode.demo import load_benchmark_pair, load_demo_pair

    if pair == "demo":
        target, draft, tokenizer = load_demo_pair(device=device, dtype=dtype)
    elif pair == "1b":
        target, draft, tokenizer = load_benchmark_pair(device=device, dtype=dtype, size="1b")
    else:
        raise SystemExit(f"--pairs: unknown pair {pair!r} (demo, 1b)")
    for model in (target, draft):
        model.generation_config = copy.deepcopy(model.generation_config)
        model.generation_config.eos_token_id = None
    return target, draft, tokenizer


def prompt_batches(tokenizer: Any, num_prompts: int, batch_size: int, max_prompt_tokens: int, pad_id: int,
                   device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Left-padded batches of the held-out demo prompts (cycled when more are needed)."""
    from specdecode.demo import demo_prompts

    texts = demo_prompts()
    rows = [tokenizer(texts[i % len(texts)], return_tensors="pt").input_ids[0, -max_prompt_tokens:]
            for i in range(num_prompts)]
    batches = []
    for i in range(0, len(rows), batch_size):
        group = rows[i: i + batch_size]
        width = max(len(r) for r in group)
        ids = torch.full((len(group), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(group), width), dtype=torch.long)
        for j, r in enumerate(group):
            ids[j, width - len(r):] = r
            mask[j, width - len(r):] = 1
        batches.append((ids.to(device), mask.to(device)))
    return batches


def has_kernel(op: str, device: torch.device) -> bool:
    if device.type == "cpu":
        return True
    key = {"cuda": "CUDA"}.get(device.type, device.type.upper())
    return bool(torch._C._dispatch_has_kernel_for_dispatch_key(f"specdecode::{op}", key))


# ---------------------------------------------------------------------- one method
def make_runner(method: str, target: Any, draft: Any, batches: list, args: argparse.Namespace, temperature: float,
                device: torch.device, pad_id: int) -> Callable[[bool], tuple[int, list[Any]]] | None:
    """A function ``run(phase_timing) -> (new tokens, stats list)`` over all batches, or None
    when the method does not apply."""
    import specdecode
    from specdecode.drafters import ModelDrafter
    from specdecode.engine.static_loop import TargetOnly

    static_path = "graphed" if device.type == "cuda" else "static"
    sampling = dict(do_sample=True, temperature=temperature) if temperature > 0 else dict(do_sample=False)
    common = dict(max_new_tokens=args.max_new_tokens, pad_token_id=pad_id)
    batch = batches[0][0].shape[0]
    if method == "HF assisted" and batch != 1:
        return None
    if method == "eager tree" and not has_kernel("verify_tree", device):
        return None
    if method in STATIC_METHODS:
        if device.type == "cuda" and not has_kernel("verify_logits_philox", device):
            return None
        if temperature > 0 and device.type == "cuda" and not has_kernel("sample_logits_philox", device):
            return None

    # static methods get the drafter object itself, so that their kernels per step can be counted
    static_drafter = TargetOnly() if method.startswith("target") else ModelDrafter(draft)

    def run(phase_timing: bool = False) -> tuple[int, list[Any]]:
        new, stats = 0, []
        gen = torch.Generator(device=device if device.type == "cuda" else "cpu").manual_seed(args.seed)
        torch.manual_seed(args.seed)
        for ids, mask in batches:
            if method == "target HF":
                out = target.generate(ids, attention_mask=mask, **common, **sampling)
                new += (out.shape[1] - ids.shape[1]) * ids.shape[0]
            elif method == "HF assisted":
                out = target.generate(ids, attention_mask=mask, assistant_model=draft, **common, **sampling)
                new += out.shape[1] - ids.shape[1]
            else:
                kwargs: dict[str, Any] = dict(eos_token_id=[], generator=gen, **common, **sampling)
                if method in STATIC_METHODS:
                    path = static_path if STATIC_METHODS[method] == "graphed" else "compiled"
                    model = None if method.startswith("target") else static_drafter
                    kwargs["decode_path"], kwargs["phase_timing"] = path, phase_timing
                    if model is not None:
                        kwargs.update(num_draft_tokens=args.gamma, rule="token")
                elif method == "eager chain":
                    model = draft
                    kwargs.update(num_draft_tokens=args.gamma, rule="token")
                else:  # eager tree
                    model = draft
                    kwargs.update(tree="dynamic", num_nodes=args.tree_nodes)
                out = specdecode.generate(target, model, ids, mask, **kwargs)
                new += (out.sequences.shape[1] - ids.shape[1]) * ids.shape[0]
                stats.append(out.stats)
        return new, stats

    run.drafter = static_drafter  # type: ignore[attr-defined]
    return run


def timed(run: Callable[..., tuple[int, list[Any]]], repeats: int, device: torch.device) -> tuple[float, list[Any]]:
    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    run()  # warm-up: CUDA graphs are recorded here and replayed afterwards
    speeds, all_stats = [], []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        new, stats = run()
        sync()
        speeds.append(new / (time.perf_counter() - t0))
        all_stats += stats
    return statistics.median(speeds), all_stats


def _median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def summarize(stats: list[Any]) -> dict[str, Any]:
    if not stats:
        return {}
    total = sum(s.total_time for s in stats) or 1.0
    row = {
        "alpha": _median([s.alpha for s in stats]),
        "block_efficiency": _median([s.block_efficiency for s in stats]),
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
        batches = prompt_batches(tokenizer, args.check_prompts, args.check_batch, args.max_prompt_tokens, pad_id,
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
    come first); ``on_group(rows so far)`` after each group (the results are written as they come)."""
    device = torch.device(args.device)
    dtype = DTYPES[args.dtype]
    pairs = {}
    for pair in args.pairs:
        target, draft, tokenizer = load(pair, device, dtype)
        draft.generation_config.num_assistant_tokens = args.gamma
        draft.generation_config.num_assistant_tokens_schedule = "constant"
        draft.generation_config.assistant_confidence_threshold = 0.0
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        params = sum(p.numel() for p in target.parameters()), sum(p.numel() for p in draft.parameters())
        print(f"pair {pair}: target {params[0] / 1e6:.1f}M, draft {params[1] / 1e6:.2f}M parameters, {args.dtype}, "
              f"{device}", flush=True)
        pairs[pair] = (target, draft, tokenizer, pad_id)
    results: list[dict[str, Any]] = []
    for batch in args.batch_sizes:
        for pair, (target, draft, tokenizer, pad_id) in pairs.items():
            n_prompts = args.prompts_batch1 if batch == 1 else batch
            batches = prompt_batches(tokenizer, n_prompts, batch, args.max_prompt_tokens, pad_id, device)
            for temperature in args.temperatures:
                group: dict[str, dict[str, Any]] = {}
                for method in args.methods:
                    runner = make_runner(method, target, draft, batches, args, temperature, device, pad_id)
                    if runner is None:
                        continue
                    speed, stats = timed(runner, args.repeats, device)
                    row: dict[str, Any] = {"pair": pair, "dtype": args.dtype, "temperature": temperature,
                                           "batch": batch, "method": method, "tok_per_s": speed}
                    row.update(summarize(stats))
                    if method in STATIC_METHODS:
                        row["kernels_per_step"] = kernels_per_step(target, runner)
                    if method in ("target graphed", "graphed chain"):
                        runner(True)  # records the per-phase graphs (a separate layout)
                        _, timed_stats = runner(True)
                        row.update(split_from(timed_stats))
                    group[method] = row
                    print(f"  {pair:4s} T={temperature} B={batch:3d} {method:15s} {speed:10.1f} tok/s", flush=True)
                finish_group(group, args.gamma)
                results += group.values()
                if on_group is not None:
                    on_group(results)
    return results


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
        speed = row["tok_per_s"]
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
    parser = base_parser(__doc__.splitlines()[0], prog=prog)
    from specdecode import cli_args

    parser.add_argument("--device", type=cli_args.device, default="cuda",
                        help="cuda (the real run) or cpu (smoke run, with --quick)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=None,
                        help="model dtype (default bfloat16; float32 with --quick)")
    parser.add_argument("--pairs", nargs="+", default=["demo", "1b"], help="demo (the trained pair), 1b (1.03B target)")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS, metavar="METHOD",
                        help=f"any of: {', '.join(METHODS)}")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--max-prompt-tokens", type=int, default=96)
    parser.add_argument("--prompts-batch1", type=int, default=4, help="prompts generated one by one at batch 1")
    parser.add_argument("--gamma", type=int, default=5)
    parser.add_argument("--tree-nodes", type=int, default=16)
    parser.add_argument("--check-prompts", type=int, default=32, help="greedy check: prompts (0 = skip the check)")
    parser.add_argument("--check-batch", type=int, default=4)
    parser.add_argument("--check-new-tokens", type=int, default=48)
    parser.add_argument("--check-pair", default="demo")
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: 1 with --device cpu: intra-op threads stall on a busy machine)")
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> list[dict[str, Any]]:
    args = build_parser(prog).parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is available here (torch.cuda.is_available() is False, torch "
                         f"{torch.__version__}); run this on a GPU machine (scripts/gpu_run.sh), or use "
                         "--device cpu --quick for the CPU smoke run")
    if device.type == "cuda" and not has_kernel("verify_logits_philox", device):
        raise SystemExit("--device cuda: this build of specdecode has no CUDA kernels (python -m specdecode info); "
                         "rebuild with CUDA available")
    if args.quick:
        if "--methods" not in (argv if argv is not None else sys.argv[1:]):
            args.methods = [m for m in args.methods if m not in ("target compiled", "compiled chain")]
        args.pairs = ["demo"]
        args.batch_sizes = [1, 3]
        args.dtype = args.dtype or "float32"
        args.max_new_tokens = min(args.max_new_tokens, 6)
        args.max_prompt_tokens = min(args.max_prompt_tokens, 16)
        args.prompts_batch1 = 1
        args.check_prompts = min(args.check_prompts, 2)
        args.check_batch = min(args.check_batch, 2)
        args.check_new_tokens = min(args.check_new_tokens, 6)
        args.tree_nodes = min(args.tree_nodes, 6)
    args.dtype = args.dtype or "bfloat16"
    args.repeats = args.repeats or (1 if args.quick else 3)
    if args.threads or device.type == "cpu":
        torch.set_num_threads(args.threads or 1)
    start = time.perf_counter()
    meta = {**environment(), "device": str(device), "args": vars(args)}
    if device.type == "cuda":
        meta["gpu"] = torch.cuda.get_device_name(device)
    rows = run(args, on_group=lambda so_far: write_results(args.out, "bench_gpu", so_far, meta))
    checks = greedy_check(args.check_pair, device, args) if args.check_prompts > 0 else []
    columns = ["pair", "temperature", "batch", "method", "tok_per_s", "x_target", "x_graphed", "x_hf", "alpha",
               "block_efficiency", "host_syncs_per_step", "kernels_per_step", "draft_ms_per_forward", "draft_share",
               "predicted", "measured_over_predicted"]
    print(format_table(rows, columns))
    if checks:
        print("greedy check (rows whose greedy speculative output differs from the target's own greedy generate):")
        print(format_table(checks, ["pair", "dtype", "path", "rows", "divergent_rows", "divergent_rate",
                                    "mean_first_divergence"]))
    meta.update(seconds=time.perf_counter() - start, greedy_check=checks)
    csv_path, json_path = write_results(args.out, "bench_gpu", rows, meta)
    if checks:
        write_results(args.out, "bench_gpu_greedy_check", checks, meta)
    print(f"wrote {csv_path} and {json_path}")
    if not args.no_plot:
        for path in plot(rows, Path(args.out)):
            print(f"wrote {path}")
    return rows


if __name__ == "__main__":
    main()
