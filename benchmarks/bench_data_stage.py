r"""Benchmark of the training data stage's continuations: Hugging Face ``target.generate`` (the
data stage's former path) against specdecode's own decode path
(:func:`specdecode.training.continuations.continue_prompts`: the static path on the CPU, the
graphed path on CUDA), the same prompts and batch size.

For each target (``demo``: the embedded demo target; ``smollm2``: SmolLM2-135M-Instruct when
its wheel is installed) one batch of the target's default data prompts (cut as the data stage
cuts them) is continued by both paths: first greedily, where the two outputs must be equal
token for token (the rows that are, printed; float32), then timed at each ``--temperatures`` with a
new batch seed per repeat, the two paths in turn within each repeat (interleaved, order
rotating) after one untimed warm-up each. At T = 0 both paths make the same tokens (EOS on, as
the data stage runs); at T > 0 they sample different continuations, whose lengths would make
the comparison a lottery, so EOS is off there and every row makes ``--max-new-tokens`` tokens on
both paths. Reported: median seconds per batch, median generated tokens per second and the
ratio ours / HF of tokens/s.

    python benchmarks/bench_data_stage.py                                   # demo, CPU, 2 threads
    python benchmarks/bench_data_stage.py --targets demo smollm2 --batch-size 16
    python benchmarks/bench_data_stage.py --targets smollm2 --device cuda --batch-size 512 --dtype bfloat16
    python benchmarks/bench_data_stage.py --threads 1 --clock cpu           # a busy machine
    python benchmarks/bench_data_stage.py --quick                           # smoke run
    python benchmarks/bench_data_stage.py --labels --batch-size 32          # the whole stage, labels too
    # the GPU probe (scripts/gpu_session.sh probe): our path alone, two dtypes, two batch sizes,
    # and where one batch's time goes (torch.profiler, the top operators by device time)
    python benchmarks/bench_data_stage.py --targets smollm2 --device cuda --dtype float32 bfloat16 \
        --batch-size 512 1024 --temperatures 0.7 --ours-only --profile

``--ours-only`` times specdecode's path alone (no HF baseline, no greedy comparison); ``--profile``
runs one more batch of it under ``torch.profiler`` per (target, dtype, batch) and prints its top
operators (appended, one table per configuration, to ``data_stage_profiles.txt`` beside the
results). ``--attention grouped
sdpa`` times our path twice per configuration on CUDA: as the data stage runs it (grouped-query
heads folded, :mod:`specdecode.grouped_attention`) and with every call handed to Transformers'
own SDPA function instead (the benchmark switches the fold off for those rows).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from specdecode import grouped_attention
from specdecode.engine.static_layouts import clear_static_sessions
from specdecode.bench.harness import CLOCKS, base_parser, environment, format_table, median, write_results
from specdecode.training.continuations import continue_and_label, continue_prompts, data_decode_path
from specdecode.training.data import DataSettings, default_prompts, encode_prompt, label_sequences
from specdecode.training.device import cpu_data_batch

PATHS = ("hf_generate", "auto")


def _sync(device: torch.device) -> Callable[[], None]:
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def load(name: str, device: str, dtype: str) -> tuple[Any, Any] | None:
    """``(target, tokenizer)`` on ``device`` in ``dtype``, or None when the target is not installed."""
    from specdecode.training.targets import load_target

    try:
        target, tokenizer = load_target(name)
    except ValueError as exc:
        print(f"{name}: skipped ({exc})")
        return None
    return target.to(device=device, dtype=getattr(torch, dtype)), tokenizer


def batch_prompts(name: str, tokenizer: Any, settings: DataSettings, count: int, seed: int) -> list[list[int]]:
    """The target's default data prompts, cut to what the data stage keeps before a continuation."""
    keep = max(1, settings.max_length - settings.max_new_tokens)
    return [encode_prompt(tokenizer, text)[-keep:] for text in default_prompts(name, count, seed)]


@contextmanager
def _attention(kind: str) -> Iterator[None]:
    """``"grouped"``: as the data stage runs; ``"sdpa"``: every call of the grouped attention
    handed to Transformers' SDPA function (the fold's test switched off for the block)."""
    if kind == "grouped":
        yield
        return
    applies = grouped_attention.grouped_attention_applies
    grouped_attention.grouped_attention_applies = lambda *args, **kwargs: False
    try:
        yield
    finally:
        grouped_attention.grouped_attention_applies = applies


def profile_batch(target: Any, prompts: list[list[int]], settings: DataSettings, args: Any, label: str) -> None:
    """One batch of our path under ``torch.profiler``: its top operators by device time (CPU time
    on the CPU), printed and appended to ``OUT/data_stage_profiles.txt`` under ``label``."""
    from torch.profiler import ProfilerActivity, profile

    device = next(target.parameters()).device
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        continue_prompts(target, prompts, settings, args.seed, decode_path="auto")
        _sync(device)()
    table = prof.key_averages().table(sort_by="cuda_time_total" if cuda else "cpu_time_total", row_limit=25,
                                      max_name_column_width=60)
    print(f"profile of one batch ({label}):\n{table}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "data_stage_profiles.txt", "a", encoding="utf-8") as file:  # one file: the device returns 8
        file.write(f"profile of one batch ({label})\n{table}\n\n")


def bench_target(name: str, target: Any, prompts: list[list[int]], args: Any, attention: str = "grouped"
                 ) -> list[dict[str, Any]]:
    device = next(target.parameters()).device
    sync, clock = _sync(device), CLOCKS[args.clock]
    ours = data_decode_path(target, DataSettings(max_new_tokens=args.max_new_tokens, temperature=0.7))
    paths = ("auto",) if args.ours_only else PATHS
    equal = None
    if not args.ours_only:
        greedy = DataSettings(max_new_tokens=args.max_new_tokens, temperature=0.0, batch_size=len(prompts))
        outputs = {path: continue_prompts(target, prompts, greedy, args.seed, decode_path=path) for path in PATHS}
        equal = sum(a == b for a, b in zip(outputs["hf_generate"], outputs["auto"]))
    rows = []
    for temperature in args.temperatures:
        settings = DataSettings(max_new_tokens=args.max_new_tokens, temperature=temperature, batch_size=len(prompts))
        seconds: dict[str, list[float]] = {p: [] for p in paths}
        rates: dict[str, list[float]] = {p: [] for p in paths}
        eos = target.generation_config.eos_token_id
        if temperature > 0:
            target.generation_config.eos_token_id = None  # the same number of tokens on both paths
        for i in range(1 + args.repeats):
            for path in paths[i % len(paths):] + paths[:i % len(paths)]:
                sync()
                start = clock()
                out = continue_prompts(target, prompts, settings, args.seed + 1 + i, decode_path=path)
                sync()
                took = clock() - start
                if i == 0:
                    continue  # warm-up: the static layout (and on CUDA its graphs) is built here
                seconds[path].append(took)
                rates[path].append(sum(len(o) - len(p) for o, p in zip(out, prompts)) / took)
        if args.profile and temperature == args.temperatures[-1]:
            profile_batch(target, prompts, settings, args,
                          f"{name}_{str(target.dtype).replace('torch.', '')}_b{len(prompts)}_{attention}")
        target.generation_config.eos_token_id = eos
        our_rate = median(rates["auto"])
        hf_rate = None if args.ours_only else median(rates["hf_generate"])
        rows.append({"target": name, "device": str(device), "dtype": str(target.dtype).replace("torch.", ""),
                     "batch": len(prompts), "T": temperature, "eos": "on" if temperature == 0 else "off",
                     "path": ours, "greedy_equal": "-" if equal is None else f"{equal}/{len(prompts)}",
                     "hf_s": None if args.ours_only else median(seconds["hf_generate"]),
                     "ours_s": median(seconds["auto"]), "hf_tok_s": hf_rate, "ours_tok_s": our_rate,
                     "ours_tok_min": 60 * our_rate, "ours/hf": None if hf_rate is None else our_rate / hf_rate})
    return rows


LABEL_METHODS = ("hf_generate+forward", "ours+forward", "ours_decode_labels")


def bench_labels(name: str, target: Any, prompts: list[list[int]], args: Any) -> dict[str, Any]:
    """``--labels``: one batch's whole data-stage work (continuations and their labels, top
    ``k`` = 64 and the last hidden state), the three ways in turn within each repeat: HF
    ``generate`` then the labelling forward (the stage before specdecode's path), our path then
    the labelling forward (the stage before the decode labels), our path keeping the labels of
    its own decode steps (the stage now). T = 0.7, EOS off. Reported: median seconds per batch and
    the generated tokens per second of the whole work, and each against HF + forward."""
    device = next(target.parameters()).device
    sync, clock = _sync(device), CLOCKS[args.clock]
    settings = DataSettings(max_new_tokens=args.max_new_tokens, temperature=0.7, batch_size=len(prompts),
                            feature_layers=(-1,))
    starts = [len(p) - 1 for p in prompts]

    def run(method: str, seed: int) -> None:
        if method == "ours_decode_labels":
            continue_and_label(target, prompts, settings, seed)
            return
        path = "hf_generate" if method.startswith("hf") else "auto"
        out = continue_prompts(target, prompts, settings, seed, decode_path=path)
        label_sequences(target, out, starts, settings.top_k, settings.feature_layers)

    eos, target.generation_config.eos_token_id = target.generation_config.eos_token_id, None
    seconds: dict[str, list[float]] = {m: [] for m in LABEL_METHODS}
    try:
        for i in range(1 + args.repeats):
            for method in LABEL_METHODS[i % 3:] + LABEL_METHODS[:i % 3]:
                sync()
                start = clock()
                run(method, args.seed + 1 + i)
                sync()
                if i:  # the first round warms up
                    seconds[method].append(clock() - start)
    finally:
        target.generation_config.eos_token_id = eos
    new_tokens = len(prompts) * args.max_new_tokens
    row: dict[str, Any] = {"target": name, "device": str(device), "dtype": str(target.dtype).replace("torch.", ""),
                           "batch": len(prompts)}
    base = median(seconds[LABEL_METHODS[0]])
    for method in LABEL_METHODS:
        row[f"{method}_s"] = median(seconds[method])
        row[f"{method}_tok_s"] = new_tokens / row[f"{method}_s"]
        row[f"{method}/hf"] = base / row[f"{method}_s"]
    return row


def main() -> None:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--targets", nargs="+", choices=["demo", "smollm2"], default=["demo"], help="targets to time")
    parser.add_argument("--device", default="cpu", help="where the targets run (cpu, cuda)")
    parser.add_argument("--dtype", nargs="+", choices=["float32", "bfloat16"], default=["float32"],
                        help="the targets' dtypes (each timed in turn)")
    parser.add_argument("--batch-size", type=int, nargs="+", default=None,
                        help="prompts per batch, each timed in turn (default: the CPU data batch, cpu_data_batch(); "
                             "--quick: 3)")
    parser.add_argument("--ours-only", action="store_true", help="time specdecode's path alone (no HF baseline)")
    parser.add_argument("--attention", nargs="+", choices=["grouped", "sdpa"], default=["grouped"],
                        help="our path's attention on CUDA: grouped heads folded (the data stage's), or "
                             "Transformers' SDPA function; each timed in turn")
    parser.add_argument("--labels", action="store_true",
                        help="time the whole labelled stage instead: HF generate + labelling forward, ours + "
                             "labelling forward, ours with the decode steps' labels")
    parser.add_argument("--profile", action="store_true",
                        help="profile one more batch of our path per (target, dtype, batch) with torch.profiler")
    parser.add_argument("--max-new-tokens", type=int, default=None,
                        help="tokens per continuation (default: 96, the data stage's; --quick: 8)")
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7], help="timed temperatures")
    parser.add_argument("--threads", type=int, default=2, help="torch threads on the CPU")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="wall time, or this thread's CPU time (with --threads 1 on a busy CPU machine)")
    args = parser.parse_args()
    if args.clock == "cpu" and (args.threads != 1 or args.device != "cpu"):
        parser.error("clock: 'cpu' measures one thread's CPU time; use it with --threads 1 on the CPU")
    args.repeats = args.repeats or (1 if args.quick else 5)
    args.batch_size = args.batch_size or [3 if args.quick else cpu_data_batch()]
    args.max_new_tokens = args.max_new_tokens or (8 if args.quick else 96)
    torch.set_num_threads(args.threads)
    rows = []
    for name in args.targets:
        for dtype in args.dtype:
            loaded = load(name, args.device, dtype)
            if loaded is None:
                break
            target, tokenizer = loaded
            settings = DataSettings(max_new_tokens=args.max_new_tokens)
            for batch_size in args.batch_size:
                prompts = batch_prompts(name, tokenizer, settings, batch_size, args.seed)
                if args.labels:
                    rows.append(bench_labels(name, target, prompts, args))
                    keys = [k for k in rows[-1] if k.endswith(("_tok_s", "/hf"))]
                    print(format_table(rows[-1:], ["target", "dtype", "batch", *keys]), flush=True)
                    write_results(args.out, "data_stage_labels", rows, {**environment(), "args": vars(args)})
                    continue
                for attention in args.attention:
                    clear_static_sessions(target)  # graphs recorded with the other attention are not replayed
                    with _attention(attention):
                        made = bench_target(name, target, prompts, args, attention)
                    rows += [{**row, "attention": attention} for row in made]
                    print(format_table(rows[-len(made):], ["target", "dtype", "batch", "attention", "T",
                                                           "ours_tok_s", "ours_tok_min", "ours/hf"]), flush=True)
                    # after every configuration: a run stopped at its time limit keeps what it measured
                    write_results(args.out, "data_stage", rows, {**environment(), "args": vars(args)})
            del target
            if args.device.startswith("cuda"):
                torch.cuda.empty_cache()
    if args.labels:
        return
    print(format_table(rows, ["target", "device", "dtype", "batch", "attention", "T", "eos", "path", "greedy_equal", "hf_s",
                              "ours_s", "hf_tok_s", "ours_tok_s", "ours_tok_min", "ours/hf"],
                       title=f"data-stage continuations, {args.max_new_tokens} new tokens, HF generate vs ours "
                             f"(medians of {args.repeats}, {args.threads} CPU threads, {args.clock} clock)"))
    write_results(args.out, "data_stage", rows, {**environment(), "args": vars(args)})


if __name__ == "__main__":
    main()
