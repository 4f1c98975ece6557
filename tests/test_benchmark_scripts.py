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


def test_bench_suffix_settings() -> None:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        from bench_suffix import parse_setting
    finally:
        sys.path.remove(str(BENCHMARKS))
    assert parse_setting("chain:12:0.4:2") == {"min_token_prob": 0.4, "max_spec_factor": 2.0, "num_draft_tokens": 12}
    assert parse_setting("trie:16") == {"min_token_prob": 0.1, "max_spec_factor": 1.0, "num_nodes": 16,
                                        "num_draft_tokens": None}
    assert parse_setting("fallback:12:0.4:2:4") == {"min_token_prob": 0.4, "max_spec_factor": 2.0,
                                                    "num_draft_tokens": 12, "min_tokens": 4}
    for bad in ("chain", "chain:x", "tree:4", "chain:4:0.1:1:9", "fallback:12:0.4:2"):
        with pytest.raises(ValueError, match="settings"):
            parse_setting(bad)
    from specdecode.prompt_sets import RECORD_PEOPLE

    assert not set(RECORD_PEOPLE["tune"]) & set(RECORD_PEOPLE["report"])  # held-out inputs stay held out
