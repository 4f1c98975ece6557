"""Shared benchmark harness (used by every script in ``benchmarks/``): timing with warm-up and medians, a plain-text table, CSV/JSON.

Machines here are noisy, so every benchmark reports medians and ratios against a baseline
measured in the same run; absolute times mean little.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import torch


def time_call(fn: Callable[[], Any], *, repeats: int, warmup: int = 2, sync: Callable[[], None] | None = None) -> list[float]:
    """Seconds per call of ``fn`` over ``repeats`` runs after ``warmup`` runs."""
    for _ in range(warmup):
        fn()
    if sync:
        sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        if sync:
            sync()
        times.append(time.perf_counter() - start)
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


def format_table(rows: Iterable[dict[str, Any]], columns: Sequence[str]) -> str:
    """Rows of dicts as an aligned plain-text table (floats with 3 significant digits)."""

    def cell(value: Any) -> str:
        if isinstance(value, float):
            if value != value:
                return "-"
            return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
        return "-" if value is None else str(value)

    rows = list(rows)
    text = [[cell(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(t[i]) for t in text)) if text else len(c) for i, c in enumerate(columns)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(columns, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(v.rjust(w) for v, w in zip(t, widths)) for t in text]
    return "\n".join(lines)


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


def base_parser(description: str, prog: str | None = None) -> argparse.ArgumentParser:
    """Arguments every benchmark takes: --quick, --repeats, --out, --seed."""
    parser = argparse.ArgumentParser(description=description, prog=prog)
    parser.add_argument("--quick", action="store_true", help="small shapes and few repeats (CI smoke run)")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per case (median reported)")
    parser.add_argument("--out", default="bench_results", help="directory for the CSV/JSON results")
    parser.add_argument("--seed", type=int, default=0)
    return parser
