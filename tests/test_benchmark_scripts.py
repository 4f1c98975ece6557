"""Every script in benchmarks/ at least starts: its imports resolve and its argument parser
answers ``--help`` (a moved module once left a benchmark failing at import, unnoticed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
SCRIPTS = sorted(p.name for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_"))
# helper modules imported by the scripts, not scripts themselves
LIBRARIES = {"torch_baselines.py"}


@pytest.mark.parametrize("script", [s for s in SCRIPTS if s not in LIBRARIES])
def test_benchmark_script_answers_help(script: str) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(BENCHMARKS), *sys.path]))
    done = subprocess.run([sys.executable, str(BENCHMARKS / script), "--help"], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage" in done.stdout.lower()


def test_benchmark_libraries_import() -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(BENCHMARKS), *sys.path]))
    for name in LIBRARIES:
        done = subprocess.run([sys.executable, "-c", f"import {Path(name).stem}"], capture_output=True, text=True,
                              env=env, timeout=120, cwd=BENCHMARKS)
        assert done.returncode == 0, done.stderr[-2000:]
