"""The README's entry points: `python -m specdecode demo`, `bench --quick` and `info` run end to
end on the embedded pair (no network), within the time a newcomer would wait."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "2"}


def _run(args: list[str], cwd: Path, timeout: float) -> tuple[subprocess.CompletedProcess, float]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "specdecode", *args], cwd=cwd, env=ENV, capture_output=True,
                          text=True, timeout=timeout)
    return proc, time.perf_counter() - start


def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    """Prompt in, streamed text out, then the statistics table; greedy equals the target's greedy."""
    proc, seconds = _run(["demo", "--max-new-tokens", "24", "--gamma", "4"], tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "binary_search" in out  # the prompt is echoed by the streamer
    for column in ("rule", "gamma", "acceptance", "block_eff", "tok/s spec", "tok/s target", "speedup", "predicted"):
        assert column in out
    assert "greedy output identical to the target's own greedy generate: True" in out
    print(f"demo wall time: {seconds:.1f} s")  # the timeout above only guards against a hang


def test_demo_sampling_block_rule(tmp_path: Path) -> None:
    proc, _ = _run(["demo", "--pair", "demo", "--rule", "block", "--temperature", "1", "--max-new-tokens", "16",
                    "--prompt", "import os\n"], tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "block" in proc.stdout


def test_demo_rejects_unknown_rule(tmp_path: Path) -> None:
    proc, _ = _run(["demo", "--pair", "demo", "--rule", "nope", "--max-new-tokens", "4"], tmp_path, timeout=120)
    assert proc.returncode != 0
    assert "rule" in proc.stderr and "nope" in proc.stderr


def test_bench_quick_writes_csv_and_json(tmp_path: Path) -> None:
    proc, _ = _run(["bench", "--quick", "--out", str(tmp_path / "res")], tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = list(csv.DictReader((tmp_path / "res" / "bench_generate.csv").open()))
    methods = {r["method"] for r in rows}
    assert methods == {"target alone", "HF assisted", "HF prompt lookup", "specdecode model token",
                       "specdecode model block", "specdecode ngram token", "specdecode ngram block"}
    assert {float(r["temperature"]) for r in rows} == {0.0, 1.0}
    assert all(float(r["tok_per_s"]) > 0 for r in rows)
    assert all(0 <= float(r["alpha"]) <= 1 and float(r["block_efficiency"]) >= 1 for r in rows
               if r["method"].startswith("specdecode"))
    meta = json.loads((tmp_path / "res" / "bench_generate.json").read_text())["meta"]
    assert meta["cost_ratio_c"] > 0


def test_info_reports_the_build(tmp_path: Path) -> None:
    proc, _ = _run(["info"], tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "verify_probs" in proc.stdout and "CPU" in proc.stdout


@pytest.mark.parametrize("module", ["specdecode.info"])
def test_python_m_info(tmp_path: Path, module: str) -> None:
    proc = subprocess.run([sys.executable, "-m", module], cwd=tmp_path, env=ENV, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and "CUDA kernels compiled" in proc.stdout
