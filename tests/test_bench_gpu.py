"""``python -m specdecode bench --device ...`` (specdecode.bench.gpu): the CPU smoke run of the
GPU benchmark exercises every method but the compiled ones (``--quick`` leaves them out: a C++
compiler runs per layout; tests/test_static_compiled.py covers that path, tests/test_bench_gpu_rows.py
the newer rows), the static path with
its kernels per step, and the greedy check, and writes its CSV/JSON; ``--device cuda`` without
a GPU is refused with a clear message."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def _bench(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specdecode", "bench", *args], cwd=cwd, env=ENV,
                          capture_output=True, text=True, timeout=300)


def test_quick_cpu_run_covers_every_method(tmp_path: Path) -> None:
    proc = _bench(["--device", "cpu", "--quick", "--out", str(tmp_path / "res"), "--no-plot"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = list(csv.DictReader((tmp_path / "res" / "bench_gpu.csv").open()))
    methods = {r["method"] for r in rows}
    assert methods == {"target HF", "target graphed", "HF assisted", "eager chain", "graphed chain", "eager tree",
                       "graphed static tree", "graphed dynamic tree", "eager lookup", "graphed lookup"}
    assert {float(r["temperature"]) for r in rows} == {0.0, 1.0} and {r["batch"] for r in rows} == {"1", "3"}
    assert all(float(r["tok_per_s"]) > 0 for r in rows)
    assert not any(r["method"] == "HF assisted" and r["batch"] != "1" for r in rows)  # batch 1 only
    for r in rows:
        if r["method"] in ("graphed chain", "target graphed", "graphed static tree", "graphed dynamic tree"):
            assert r["path"] == "static"  # no GPU: the same steps, not recorded as graphs
            assert float(r["host_syncs_per_step"]) <= 1.0
            assert float(r["target_share"]) > 0
            assert int(r["kernels_per_step"]) > 0
        if r["method"] == "eager chain":
            assert float(r["host_syncs_per_step"]) >= 2.0
        if r["method"] == "graphed chain":
            assert float(r["predicted"]) > 0 and float(r["draft_ms_per_forward"]) > 0
        if r["method"] == "graphed lookup":  # prompt lookup proposed on the host, the step static
            assert r["path"] == "static" and float(r["tokens_per_call"]) >= 1.0
    meta = json.loads((tmp_path / "res" / "bench_gpu.json").read_text())["meta"]
    check = {(c["dtype"], c["path"]): c for c in meta["greedy_check"]}
    assert set(check) == {("bfloat16", "eager"), ("bfloat16", "static"), ("float32", "eager"), ("float32", "static")}
    assert check[("float32", "static")]["divergent_rows"] == 0  # float32 greedy is exact
    assert (tmp_path / "res" / "bench_gpu_greedy_check.csv").exists()


def test_cuda_is_refused_without_a_gpu(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    proc = _bench(["--device", "cuda"], tmp_path)
    assert proc.returncode != 0
    assert "--device cuda: no CUDA device is available here" in proc.stderr
    assert not (tmp_path / "bench_results").exists()
