"""GPU benchmark of the verification step (``python benchmarks/bench_verify.py --device cuda``,
or run this file directly).

For each (B, gamma, V) in {(1, 5, 32000), (16, 5, 128256), (64, 8, 128256), (64, 8, 151936)}
and each rule (token, block), on logits of one dtype (default bfloat16; draft = target + noise,
so acceptance is realistic):
  * specdecode op      - torch.ops.specdecode.verify_logits with pre-drawn uniforms (one kernel
                         launch plus the status copy that raises on bad rows: one host sync);
  * specdecode API     - specdecode.verify_logits(..., generator=...): the public call, which
                         also draws the uniforms with torch.rand on the GPU;
  * specdecode graph   - the graph-safe Philox op captured in a CUDA graph and replayed (no
                         host sync, no launch overhead), when that op is registered;
  * torch vectorized   - the same rule written with batched PyTorch ops on the same GPU;
  * torch.compile      - that implementation under torch.compile (compile time not counted).
Timing: CUDA events around each call, median of >= 50 timed calls after warm-up. GB/s counts
the bytes of target + draft logits (each read once by an ideal fused kernel; token
verification may stop early and read less). `copy_frac` divides that by the bandwidth of a
device-to-device copy measured in the same run (read + write bytes of a 1 GiB copy), i.e. the
fraction of the practical memory bandwidth achieved. `kernel_us` is the verification kernel's
own GPU time from torch.profiler (launch and sync overhead excluded).

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
QUICK_SHAPES = [(1, 5, 32000), (16, 5, 128256)]
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


# ------------------------------------------------------------------ pure-PyTorch baselines




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


def kernel_time(fn: Callable[[], Any], name_part: str, calls: int = 20) -> float | None:
    """Mean GPU time (s) per call of the kernels whose name contains `name_part`, by torch.profiler."""
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


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    import specdecode
    from specdecode.benchmarking import environment, format_table, write_results

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
    has_philox = hasattr(ops, "verify_logits_philox")

    copy_bw = copy_bandwidth()
    print(f"device-to-device copy: {copy_bw / 1e9:.0f} GB/s (read + write) on {torch.cuda.get_device_name()}")
    rows: list[dict[str, Any]] = []
    for B, gamma, V in shapes:
        target, draft, tokens, uniforms = make_inputs(B, gamma, V, dtype, args.seed)
        num = torch.full((B,), gamma, dtype=torch.int64, device="cuda")
        bytes_read = (target.numel() + draft.numel()) * target.element_size()
        for rule in ("token", "block"):
            gen = torch.Generator(device="cuda").manual_seed(args.seed)
            def op_call(rule=rule):
                return ops.verify_logits(target, draft, tokens, num, uniforms, 1.0, 0, 1.0, 0.0, rule, [])

            def api_call(rule=rule, gen=gen):
                return specdecode.verify_logits(target, draft, tokens, rule=rule, generator=gen)

            cases: dict[str, Callable[[], Any]] = {"specdecode op": op_call, "specdecode API": api_call}
            if has_philox:
                seed_t = torch.tensor([args.seed], dtype=torch.int64, device="cuda")
                offset_t = torch.zeros(1, dtype=torch.int64, device="cuda")
                philox = lambda rule=rule: ops.verify_logits_philox(  # noqa: E731
                    target, draft, tokens, num, seed_t, offset_t, 1.0, 0, 1.0, 0.0, rule, [])
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    philox()
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    philox()
                    offset_t.add_(1)
                cases["specdecode graph"] = graph.replay
            impl = TORCH_IMPLS[rule]
            cases["torch vectorized"] = lambda impl=impl: impl(target, draft, tokens, uniforms)
            if with_compile:
                try:
                    compiled = torch.compile(impl, dynamic=False)
                    compiled(target, draft, tokens, uniforms)  # compile outside the timing
                    cases["torch.compile"] = lambda compiled=compiled: compiled(target, draft, tokens, uniforms)
                except Exception as exc:  # report, do not abort the whole table
                    print(f"torch.compile failed for {rule} {(B, gamma, V)}: {type(exc).__name__}: {exc}")
            times = {name: statistics.median(time_cuda(fn, repeats=repeats, warmup=warmup))
                     for name, fn in cases.items()}
            kernel_s = kernel_time(op_call, "verify_rows_kernel")
            accepted = op_call()[1].float().mean().item()
            for name, seconds in times.items():
                gbps = bytes_read / seconds / 1e9
                rows.append({
                    "B": B, "gamma": gamma, "V": V, "dtype": str(dtype).replace("torch.", ""), "rule": rule,
                    "impl": name, "median_us": seconds * 1e6,
                    "kernel_us": kernel_s * 1e6 if (kernel_s and name == "specdecode op") else None,
                    "GB/s": gbps, "copy_frac": gbps * 1e9 / copy_bw,
                    "x_vs_torch": times["torch vectorized"] / seconds,
                    "x_vs_compile": (times["torch.compile"] / seconds) if "torch.compile" in times else None,
                    "mean_accepted": accepted,
                })
        del target, draft
        torch.cuda.empty_cache()
    columns = ["B", "gamma", "V", "dtype", "rule", "impl", "median_us", "kernel_us", "GB/s", "copy_frac",
               "x_vs_torch", "x_vs_compile", "mean_accepted"]
    print(format_table(rows, columns))
    meta = {**environment(), "gpu": torch.cuda.get_device_name(), "cuda": torch.version.cuda,
            "copy_GBps": copy_bw / 1e9, "repeats": repeats, "args": vars(args)}
    csv_path, json_path = write_results(args.out, "bench_verify_cuda", rows, meta)
    print(f"\nwrote {csv_path} and {json_path}")
    return rows


def build_parser() -> argparse.ArgumentParser:
    from specdecode.benchmarking import base_parser

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
