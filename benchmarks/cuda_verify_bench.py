"""GPU benchmark of the verification step (``python benchmarks/bench_verify.py --device cuda``,
or run this file directly).

For each (B, gamma, V) in {(1, 5, 32000), (16, 5, 128256), (64, 8, 128256), (64, 8, 151936)},
each rule (token, block) and two sampling settings, on logits of one dtype (default bfloat16;
draft = target + noise, so acceptance is realistic):
  sampling "plain"    temperature 0.8;
  sampling "filters"  temperature 0.8, top-k 50, top-p 0.9, min-p 0.05 (specdecode rows only);
and these implementations:
  * specdecode op      - torch.ops.specdecode.verify_logits with pre-drawn uniforms (eager: the
                         kernels plus the status copy that raises on bad rows, one host sync);
  * specdecode philox  - verify_logits_philox, eager (coins drawn in the kernels);
  * specdecode graph   - verify_logits_philox captured in a CUDA graph with offset.add_(1) and
                         replayed (no host sync, no launch overhead);
  * specdecode API     - specdecode.verify_logits(..., generator=...) (draws the uniforms too);
  * torch vectorized   - the same rule written with batched PyTorch ops on the same GPU
                         (torch_baselines.py, plain sampling only);
  * torch.compile      - that implementation under torch.compile (compile time not counted).
Timing: CUDA events around each call, median of >= 50 timed calls after warm-up. GB/s counts
the bytes of target + draft logits (each read once by an ideal fused kernel). `copy_frac`
divides that by the bandwidth of a device-to-device copy measured in the same run (read +
write bytes of a 1 GiB copy). `kernel_us`: the GPU time of all of specdecode's kernels per
call, from torch.profiler (launch gaps, the status copy and host time excluded).

At the end a goals table compares the run with the targets of the CUDA kernels:
  (64, 8, 128256) token: op >= 70% of copy bandwidth and >= 2.5x torch.compile;
  (64, 8, 128256) block: op >= 2x torch.compile;
  (1, 5, 32000): graph replay <= 15 us per call, Philox op eager <= 30 us;
  filters (top-k 50 / top-p 0.9 / min-p 0.05) within 1.5x of plain temperature.

This module imports on a CPU-only machine; it only runs with a CUDA device.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any, Callable

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from torch_baselines import TORCH_IMPLS  # noqa: E402

FULL_SHAPES = [(1, 5, 32000), (16, 5, 128256), (64, 8, 128256), (64, 8, 151936)]
QUICK_SHAPES = [(1, 5, 32000), (64, 8, 128256)]
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


# ------------------------------------------------------------------------------ timing


def time_cuda(fn: Callable[[], Any], *, repeats: int, warmup: int) -> list[float]:
    """Seconds per call from CUDA events recorded around each call on the current stream."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    pairs = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        pairs.append((start, end))
    torch.cuda.synchronize()
    return [s.elapsed_time(e) * 1e-3 for s, e in pairs]


def copy_bandwidth(nbytes: int = 1 << 30, repeats: int = 20) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting read + write."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    seconds = statistics.median(time_cuda(lambda: dst.copy_(src), repeats=repeats, warmup=3))
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / seconds


def kernel_time(fn: Callable[[], Any], name_part: str = "specdecode::kernels::cuda", calls: int = 20) -> float | None:
    """Mean GPU time (s) per call of all kernels whose name contains `name_part` (every kernel
    of one specdecode call), by torch.profiler."""
    try:
        from torch.profiler import ProfilerActivity, profile

        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
        total_us = 0.0
        for event in prof.key_averages():
            if name_part in event.key:
                device_us = getattr(event, "self_device_time_total", None)
                if device_us is None:
                    device_us = getattr(event, "self_cuda_time_total", 0.0)
                total_us += float(device_us)
        return total_us * 1e-6 / calls if total_us > 0 else None
    except Exception:  # the profiler is optional here
        return None


# ------------------------------------------------------------------------------ the run


def make_inputs(B: int, gamma: int, V: int, dtype: torch.dtype, seed: int, noise: float = 1.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    target = torch.randn((B, gamma + 1, V), generator=g, device="cuda") * 3.0
    draft = target[:, :gamma] + noise * torch.randn((B, gamma, V), generator=g, device="cuda")
    q = torch.softmax(draft, -1)
    tokens = torch.multinomial(q.reshape(-1, V), 1, generator=g).reshape(B, gamma)
    uniforms = torch.rand((B, gamma + 1), dtype=torch.float64, generator=g, device="cuda")
    return target.to(dtype), draft.to(dtype), tokens, uniforms


SAMPLINGS = {"plain": (0.8, 0, 1.0, 0.0), "filters": (0.8, 50, 0.9, 0.05)}


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    import specdecode
    from specdecode.bench.harness import capture_with_offset, environment, format_table, write_results

    if not torch.cuda.is_available():
        raise SystemExit("cuda_verify_bench: no CUDA device available (this benchmark runs on the GPU only)")
    ops = torch.ops.specdecode
    if not torch._C._dispatch_has_kernel_for_dispatch_key("specdecode::verify_logits", "CUDA"):
        raise SystemExit("cuda_verify_bench: specdecode was built without CUDA kernels (python -m specdecode.info)")
    dtype = DTYPES[getattr(args, "dtype", None) or "bfloat16"]
    shapes = QUICK_SHAPES if args.quick else FULL_SHAPES
    repeats = max(50, args.repeats or (50 if args.quick else 100))
    warmup = 10
    with_compile = not getattr(args, "no_compile", False)

    copy_bw = copy_bandwidth()
    print(f"device-to-device copy: {copy_bw / 1e9:.0f} GB/s (read + write) on {torch.cuda.get_device_name()}")
    rows: list[dict[str, Any]] = []
    for B, gamma, V in shapes:
        target, draft, tokens, uniforms = make_inputs(B, gamma, V, dtype, args.seed)
        num = torch.full((B,), gamma, dtype=torch.int64, device="cuda")
        bytes_read = (target.numel() + draft.numel()) * target.element_size()
        for rule in ("token", "block"):
            baseline: dict[str, float] = {}
            impl = TORCH_IMPLS[rule]
            cases_torch: dict[str, Callable[[], Any]] = {
                "torch vectorized": lambda impl=impl: impl(target, draft, tokens, uniforms)}
            if with_compile:
                try:
                    compiled = torch.compile(impl, dynamic=False)
                    compiled(target, draft, tokens, uniforms)  # compile outside the timing
                    cases_torch["torch.compile"] = lambda compiled=compiled: compiled(target, draft, tokens, uniforms)
                except Exception as exc:  # report, do not abort the whole table
                    print(f"torch.compile failed for {rule} {(B, gamma, V)}: {type(exc).__name__}: {exc}")
            for name, fn in cases_torch.items():
                baseline[name] = statistics.median(time_cuda(fn, repeats=repeats, warmup=warmup))
            for sampling_name, sampling in SAMPLINGS.items():
                seed_t = torch.tensor([args.seed], dtype=torch.int64, device="cuda")
                offset_t = torch.zeros(1, dtype=torch.int64, device="cuda")
                gen = torch.Generator(device="cuda").manual_seed(args.seed)

                def op_call(rule=rule, sampling=sampling):
                    return ops.verify_logits(target, draft, tokens, num, uniforms, *sampling, rule, [])

                def philox_call(rule=rule, sampling=sampling, seed_t=seed_t, offset_t=offset_t):
                    return ops.verify_logits_philox(target, draft, tokens, num, seed_t, offset_t, *sampling, rule, [])

                def api_call(rule=rule, sampling=sampling, gen=gen):
                    T, k, p, m = sampling
                    return specdecode.verify_logits(target, draft, tokens, rule=rule, generator=gen, temperature=T,
                                                    top_k=k, top_p=p, min_p=m)

                cases: dict[str, Callable[[], Any]] = {
                    "specdecode op": op_call, "specdecode philox": philox_call,
                    "specdecode graph": capture_with_offset(philox_call, offset_t)[0].replay, "specdecode API": api_call}
                times = {name: statistics.median(time_cuda(fn, repeats=repeats, warmup=warmup))
                         for name, fn in cases.items()}
                if sampling_name == "plain":
                    times.update(baseline)
                kernel_s = kernel_time(op_call)
                accepted = op_call()[1].float().mean().item()
                for name, seconds in times.items():
                    gbps = bytes_read / seconds / 1e9
                    rows.append({
                        "B": B, "gamma": gamma, "V": V, "dtype": str(dtype).replace("torch.", ""), "rule": rule,
                        "sampling": sampling_name, "impl": name, "median_us": seconds * 1e6,
                        "kernel_us": kernel_s * 1e6 if (kernel_s and name == "specdecode op") else None,
                        "GB/s": gbps, "copy_frac": gbps * 1e9 / copy_bw,
                        "x_vs_torch": baseline["torch vectorized"] / seconds,
                        "x_vs_compile": (baseline["torch.compile"] / seconds) if "torch.compile" in baseline else None,
                        "mean_accepted": accepted,
                    })
        del target, draft
        torch.cuda.empty_cache()
    columns = ["B", "gamma", "V", "dtype", "rule", "sampling", "impl", "median_us", "kernel_us", "GB/s", "copy_frac",
               "x_vs_torch", "x_vs_compile", "mean_accepted"]
    print(format_table(rows, columns))
    goals = goal_rows(rows)
    if goals:
        print("\ngoals of the CUDA kernels (this run):")
        print(format_table(goals, ["goal", "measured", "target", "met"]))
    meta = {**environment(), "gpu": torch.cuda.get_device_name(), "cuda": torch.version.cuda,
            "copy_GBps": copy_bw / 1e9, "repeats": repeats, "args": vars(args), "goals": goals}
    csv_path, json_path = write_results(args.out, "bench_verify_cuda", rows, meta)
    print(f"\nwrote {csv_path} and {json_path}")
    return rows


def goal_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The goals of the CUDA kernels, evaluated on this run's rows (skipped when a shape or
    implementation was not measured)."""
    def find(shape, rule, sampling, impl):
        for r in rows:
            if (r["B"], r["gamma"], r["V"]) == shape and r["rule"] == rule and r["sampling"] == sampling \
                    and r["impl"] == impl:
                return r
        return None

    goals: list[dict[str, Any]] = []

    def add(name, value, target, met, unit=""):
        goals.append({"goal": name, "measured": f"{value:.3g}{unit}", "target": target, "met": "yes" if met else "NO"})

    big, small = (64, 8, 128256), (1, 5, 32000)
    token_op = find(big, "token", "plain", "specdecode op")
    if token_op is not None:
        add("token (64,8,128256) op: fraction of copy bandwidth", token_op["copy_frac"], ">= 0.70",
            token_op["copy_frac"] >= 0.70)
        if token_op["x_vs_compile"] is not None:
            add("token (64,8,128256) op: x torch.compile", token_op["x_vs_compile"], ">= 2.5",
                token_op["x_vs_compile"] >= 2.5)
    block_op = find(big, "block", "plain", "specdecode op")
    if block_op is not None and block_op["x_vs_compile"] is not None:
        add("block (64,8,128256) op: x torch.compile", block_op["x_vs_compile"], ">= 2.0", block_op["x_vs_compile"] >= 2.0)
    for rule in ("token", "block"):
        graph = find(small, rule, "plain", "specdecode graph")
        if graph is not None:
            add(f"{rule} (1,5,32000) graph replay", graph["median_us"], "<= 15 us", graph["median_us"] <= 15.0, " us")
        eager = find(small, rule, "plain", "specdecode philox")
        if eager is not None:
            add(f"{rule} (1,5,32000) Philox op eager", eager["median_us"], "<= 30 us", eager["median_us"] <= 30.0, " us")
        plain, filtered = find(big, rule, "plain", "specdecode op"), find(big, rule, "filters", "specdecode op")
        if plain is not None and filtered is not None:
            ratio = filtered["median_us"] / plain["median_us"]
            add(f"{rule} (64,8,128256) filters / plain temperature", ratio, "<= 1.5", ratio <= 1.5)
    return goals


def build_parser() -> argparse.ArgumentParser:
    from specdecode.bench.harness import base_parser

    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda"])
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    return parser


def main(args: argparse.Namespace | None = None) -> list[dict[str, Any]]:
    """Entry point; bench_verify.py passes its own parsed arguments (--quick, --repeats, --out,
    --seed; --dtype and --no-compile default when absent)."""
    if args is None:
        args = build_parser().parse_args()
    return run(args)


if __name__ == "__main__":
    main()
