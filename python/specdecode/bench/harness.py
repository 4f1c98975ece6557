"""Shared benchmark harness (used by the :mod:`specdecode.bench` modules and every script in
``benchmarks/``): timing with warm-up and medians, a table that fits 100 columns, CSV/JSON, and
the options the end-to-end benchmarks share (:func:`add_run_options`).

Machines here are noisy, so every benchmark reports medians and ratios against a baseline
measured in the same run; absolute times mean little.
"""

from __future__ import annotations

import argparse
import copy
import csv
import io
import json
import os
import platform
import shutil
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import torch


def time_call(fn: Callable[[], Any], *, repeats: int, warmup: int = 2, sync: Callable[[], None] | None = None,
              clock: Callable[[], float] = time.perf_counter) -> list[float]:
    """Seconds per call of ``fn`` over ``repeats`` runs after ``warmup`` runs, by ``clock``
    (wall time; ``time.thread_time`` counts only this thread's CPU time, which other processes
    on a busy machine disturb far less, and which sees CPU work only)."""
    for _ in range(warmup):
        fn()
    if sync:
        sync()
    times = []
    for _ in range(repeats):
        start = clock()
        fn()
        if sync:
            sync()
        times.append(clock() - start)
    return times


def capture_with_offset(fn: Callable[[], Any], offset: torch.Tensor) -> tuple[torch.cuda.CUDAGraph, Any]:
    """A CUDA graph of one call of ``fn`` followed by ``offset.add_(1)`` (the Philox ops'
    replay pattern), after one warm-up call on a side stream (lazy initialisation, allocator).
    Returns the graph and the captured call's outputs (refreshed by every replay).

    Shape: ``offset``: ``[1]`` int64 on the current CUDA device.
    """
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = fn()
        offset.add_(1)
    return graph, outputs


#: --clock: wall time, or the benchmark thread's CPU time (CPU runs with --threads 1 only: on a
#: machine shared with other work it is far less noisy; it does not see GPU time).
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.thread_time}


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def environment() -> dict[str, Any]:
    """What the numbers were measured on."""
    return {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "python": platform.python_version(),
    }


@dataclass(frozen=True)
class Column:
    """One column of :func:`format_table`: the row key, the header (default: the key with
    spaces for underscores; a newline splits it over two lines) and how to format a value
    (default: numbers with one number of decimals for the whole column, see :func:`format_table`).
    Rich fits the table in the width by wrapping headers and text at spaces; a column marked
    ``wrap`` is the one that takes whatever width is left."""

    key: str
    header: str | None = None
    fmt: Callable[[Any], str] | None = None
    wrap: bool = False  # an explanation column: it takes the width left over and wraps in it


def _auto_format(values: list[Any]) -> Callable[[Any], str]:
    """One format for a column of numbers: as many decimals as its largest magnitude needs
    (0 from 1000, 1 from 100, 2 from 1, else 3), so that ``4`` never stands beside ``3.31``."""
    numbers = [abs(float(v)) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)
               and v == v and not isinstance(v, int)]
    largest = max(numbers, default=0.0)
    decimals = 0 if largest >= 1000 else 1 if largest >= 100 else 2 if largest >= 1 else 3

    def fmt(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.{decimals}f}"
        return str(value)

    return fmt


def table_width() -> int:
    """Columns available for a table: the terminal's, at most 100 (100 when not a terminal)."""
    return min(shutil.get_terminal_size((100, 24)).columns, 100)


def format_table(rows: Iterable[dict[str, Any]], columns: Sequence[str | Column], *, title: str | None = None,
                 width: int | None = None) -> str:
    """Rows of dicts as a table at most ``width`` (default :func:`table_width`) characters wide,
    drawn by ``rich``: numbers right-aligned with one format per column, text left-aligned,
    missing values (None, NaN, absent keys) as ``-``."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    rows = list(rows)
    specs = [c if isinstance(c, Column) else Column(c) for c in columns]
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, padding=(0, 0, 0, 1), title=title,
                  title_justify="left")
    formatted = []
    for spec in specs:
        values = [r.get(spec.key) for r in rows]
        fmt = spec.fmt or _auto_format(values)
        cells = ["-" if v is None or (isinstance(v, float) and v != v) else fmt(v) for v in values]
        text = any(isinstance(v, str) for v in values)
        header = spec.header if spec.header is not None else spec.key.replace("_", " ")
        table.add_column(header, justify="left" if text else "right", overflow="fold",
                         ratio=1 if spec.wrap else None)
        formatted.append(cells)
    for i in range(len(rows)):
        table.add_row(*(cells[i] for cells in formatted))
    out = io.StringIO()
    Console(file=out, width=width or table_width(), color_system=None, force_terminal=False, force_jupyter=False,
            highlight=False).print(table)
    return "\n".join(line.rstrip() for line in out.getvalue().rstrip("\n").splitlines())


def write_results(out_dir: str | Path, name: str, rows: list[dict[str, Any]], meta: dict[str, Any]) -> tuple[Path, Path]:
    """Write ``name.csv`` and ``name.json`` (rows plus environment) into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    csv_path, json_path = out / f"{name}.csv", out / f"{name}.json"
    columns = list(dict.fromkeys(k for r in rows for k in r))
    with csv_path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    json_path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2, default=str))
    return csv_path, json_path


def base_parser(description: str, prog: str | None = None,
                quick_help: str = "small shapes and few repeats (a smoke run)",
                repeats_help: str = "timed runs per case, median reported (default: chosen per case)",
                ) -> argparse.ArgumentParser:
    """Arguments every benchmark takes: --quick, --repeats, --out, --seed; help shows defaults."""
    from specdecode.cli_args import ArgumentParser, HelpFormatter, int_at_least

    parser = ArgumentParser(description=description, prog=prog, formatter_class=HelpFormatter)
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--repeats", type=int_at_least("repeats", 1), default=None, help=repeats_help)
    parser.add_argument("--out", default="bench_results", help="directory for the CSV/JSON results")
    parser.add_argument("--seed", type=int_at_least("seed", 0), default=0, help="random seed")
    return parser


def add_run_options(parser: argparse.ArgumentParser, full: dict[str, Any], quick: dict[str, Any], *, gamma: int,
                    gamma_users: str) -> None:
    """The options an end-to-end benchmark shares: --max-new-tokens (default ``full`` /
    ``quick``'s, filled in by :func:`finish_run_options`), --num-draft-tokens (``gamma``, for
    ``gamma_users``), --temperatures, --clock, --threads and --cpu-fast-path."""
    from specdecode import cli_args

    at_least = cli_args.int_at_least
    parser.add_argument("--max-new-tokens", type=at_least("max_new_tokens", 1),
                        help=f"tokens generated per prompt, EOS off (default: {full['max_new_tokens']}; "
                             f"--quick: {quick['max_new_tokens']})")
    parser.add_argument("--num-draft-tokens", "--gamma", type=at_least("num_draft_tokens", 1), default=gamma,
                        help=f"gamma: draft tokens per step, for {gamma_users}")
    parser.add_argument("--temperatures", type=cli_args.temperature, nargs="+", default=[0.0, 1.0],
                        help="sampling temperatures; 0 is greedy")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="wall time, or this thread's CPU time (with --threads 1 on a busy CPU machine)")
    parser.add_argument("--threads", type=at_least("threads", 1), default=None,
                        help="torch CPU threads (default: torch's choice; 1 avoids stalls on a busy machine)")
    cli_args.add_cpu_fast_path(parser)


def finish_run_options(parser: argparse.ArgumentParser, args: argparse.Namespace, full: dict[str, Any],
                       quick: dict[str, Any]) -> None:
    """After parsing: the defaults of a full or --quick run for what the command line left
    unset, torch's thread count (--threads), and --clock cpu refused unless on one thread."""
    for name, value in (quick if args.quick else full).items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.clock == "cpu" and torch.get_num_threads() != 1:
        parser.error("--clock cpu counts only this thread's CPU time; run with --threads 1")


def without_eos(model: Any) -> Any:
    """``model`` with a copy of its generation config in which EOS is off (every generate call
    then runs to max_new_tokens)."""
    model.generation_config = copy.deepcopy(model.generation_config)
    model.generation_config.eos_token_id = None
    return model
