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
from typing import Any

import pytest

from specdecode import vocabulary as words
from specdecode.integrations.hf.arguments import check_int
from specdecode.rules import get_rule
from specdecode.sampling import SamplingParams

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "2"}


def _run(args: list[str], cwd: Path, timeout: float) -> tuple[subprocess.CompletedProcess, float]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "specdecode", *args], cwd=cwd, env=ENV, capture_output=True,
                          text=True, timeout=timeout)
    return proc, time.perf_counter() - start


def _screen_lines(text: str) -> list[str]:
    """The lines the CLI draws itself (the streamed continuation is the model's text)."""
    rules = [i for i, line in enumerate(text.splitlines()) if set(line) == {"-"} and len(line) > 20]
    lines = text.splitlines()
    return lines[: rules[0]] + lines[rules[1] + 1:] if len(rules) >= 2 else lines


def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    """Prompt in, streamed text out, then the statistics in the shared vocabulary; greedy equals
    the target's greedy; nothing on stderr (no loading bars, no dependency warnings)."""
    proc, seconds = _run(["demo", "--max-new-tokens", "24", "--gamma", "4"], tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "binary_search" in out  # the prompt is echoed by the streamer
    assert "pair: embedded pair, cost-realistic target" in out
    for term in (words.ACCEPTANCE_RATE, words.ALPHA, words.ACCEPTANCE_BY_POSITION, words.BLOCK_EFFICIENCY,
                 words.COST_RATIO, words.SPEEDUP, words.PREDICTED_SPEEDUP):
        assert f"\n{term.name}  " in out, term.name
    flat = " ".join(out.split())
    assert "why the gap: speedup " in flat and "target decode step" in flat
    assert "greedy output identical to the target's own greedy generate: yes" in out
    assert all(len(line) <= 100 for line in _screen_lines(out))
    assert proc.stderr == ""
    print(f"demo wall time: {seconds:.1f} s")  # the timeout above only guards against a hang


def test_demo_sampling_block_rule(tmp_path: Path) -> None:
    proc, _ = _run(["demo", "--pair", "demo", "--rule", "block", "--temperature", "1", "--max-new-tokens", "16",
                    "--prompt", "import os\n"], tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "rule block" in proc.stdout and "sampling at temperature 1" in proc.stdout
    assert "greedy output identical" not in proc.stdout


MISUSE = [
    # (arguments, the argument named, the Python API's own message for the same value)
    (["demo", "--temperature", "-1"], "--temperature", lambda: SamplingParams(temperature=-1.0)),
    (["demo", "--rule", "nope"], "--rule", lambda: get_rule("nope")),
    (["demo", "--gamma", "0"], "--gamma", lambda: check_int("num_draft_tokens", 0, 1)),
    (["demo", "--num-draft-tokens", "two"], "--gamma", None),
    (["demo", "--max-new-tokens", "0"], "--max-new-tokens", lambda: check_int("max_new_tokens", 0, 1)),
    (["demo", "--prompt", ""], "--prompt", None),
    (["demo", "--seed", "-3"], "--seed", None),
    (["demo", "--threads", "0"], "--threads", None),
    (["demo", "--target", "some/path"], "--target", None),
    (["demo", "--frobnicate"], "unrecognized", None),
    (["bench", "--temperatures", "0", "-1"], "--temperatures", lambda: SamplingParams(temperature=-1.0)),
    (["bench", "--gamma", "0"], "--num-draft-tokens", lambda: check_int("num_draft_tokens", 0, 1)),
    (["bench", "--batch-sizes", "1", "0"], "--batch-sizes", None),
    (["bench", "--num-prompts", "0"], "--num-prompts", None),
    (["bench", "--num-prompts", "100000"], "--num-prompts", None),
    (["bench", "--repeats", "0"], "--repeats", None),
    (["bench", "--max-new-tokens", "-5"], "--max-new-tokens", None),
    (["bench", "--draft", "some/path"], "--draft", None),  # no such folder, before "--target goes with it"
    (["bench", "--drafters", "model", "eagle"], "--drafters", None),
    (["bench", "--drafter-dir", "runs/smol-eagle"], "--drafter-dir", None),
    (["bench", "--pair", "smollm2", "--num-prompts", "17"], "--num-prompts", None),
    (["bench", "--pair", "smollm2", "--prompt-set", "tune", "--num-prompts", "17"], "--num-prompts", None),
    (["bench", "--pair", "smollm2", "--gamma", "0"], "--num-draft-tokens", lambda: check_int("num_draft_tokens", 0, 1)),
    (["bench", "--pair", "smollm2", "--temperatures", "-1"], "--temperatures", lambda: SamplingParams(temperature=-1.0)),
    (["bench", "--pair", "smollm2", "--clock", "cpu", "--threads", "2"], "--clock", None),
]


@pytest.mark.parametrize("argv, named, api", MISUSE, ids=[" ".join(m[0]) for m in MISUSE])
def test_misuse_is_refused_before_any_model_loads(argv: list[str], named: str, api: Any,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Bad values stop the command at parse time, with the API's message: loading a model
    here would fail the test."""
    import specdecode.demo as demo_module
    import specdecode.pairs as pairs
    from specdecode.cli import main

    def no_loading(*args: object, **kwargs: object) -> None:
        raise AssertionError("a model was loaded before the arguments were checked")

    monkeypatch.setattr(pairs, "load_command_pair", no_loading)
    monkeypatch.setattr(pairs, "load_pair", no_loading)
    monkeypatch.setattr(demo_module, "load_demo_pair", no_loading)
    monkeypatch.setattr(demo_module, "load_benchmark_pair", no_loading)
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert named in err, err
    if api is not None:
        with pytest.raises((ValueError, TypeError)) as api_error:
            api()
        assert str(api_error.value) in err


def test_help_shows_defaults_without_markup(capsys: pytest.CaptureFixture[str]) -> None:
    from specdecode.cli import main

    for argv in (["--help"], ["demo", "--help"], ["bench", "--help"], ["bench", "--trees", "--help"]):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 0
        text = " ".join(capsys.readouterr().out.split())
        assert "``" not in text and ":func:" not in text, argv
        if argv == ["demo", "--help"]:
            assert "draft tokens proposed per step (default: the drafter's own setting, else 5)" in text
            assert "default: token, or the lossless tree rule" in text and "0 is greedy decoding (default: 0.0)" in text
        if argv == ["bench", "--help"]:
            assert "(default: 8; --quick: 2)" in text
    # every option of the demo and the benchmark explains itself
    from specdecode.bench.generate import build_parser

    for action in build_parser()._actions:
        assert action.help, action.option_strings


def test_bench_quick_runs_the_cost_realistic_pair(tmp_path: Path) -> None:
    """The quick run uses the pair the README's numbers use, says so, fits 100 columns, and
    shows no loading bars or dependency warnings."""
    proc, _ = _run(["bench", "--quick", "--threads", "1", "--out", str(tmp_path / "res")], tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = list(csv.DictReader((tmp_path / "res" / "bench_generate.csv").open()))
    methods = {r["method"] for r in rows}
    assert methods == {"target alone", "target alone, fast path", "HF assisted", "HF prompt lookup", "specdecode model token",
                       "specdecode model block", "specdecode ngram token", "specdecode ngram block"}
    assert {float(r["temperature"]) for r in rows} == {0.0, 1.0}
    assert all(float(r["tok_per_s"]) > 0 for r in rows)
    assert all(0 <= float(r["alpha"]) <= 1 and float(r["block_efficiency"]) >= 1 for r in rows
               if r["method"].startswith("specdecode"))
    meta = json.loads((tmp_path / "res" / "bench_generate.json").read_text())["meta"]
    assert meta["cost_ratio_c"] > 0 and meta["pair"].startswith("embedded pair, cost-realistic target")
    assert "pair: embedded pair, cost-realistic target" in proc.stdout
    table = proc.stdout.split("pair: embedded pair", 2)[2].split("\nwrote ")[0]
    assert all(len(line) <= 100 for line in table.splitlines())
    for term in (words.SPEEDUP, words.ALPHA, words.PREDICTED_SPEEDUP, words.ACCEPTANCE_RATE):
        assert term.name in table
    for noise in ("Loading weights", "Passing `generation_config`", "Warning", "warn"):
        assert noise not in proc.stdout + proc.stderr.replace("bench:", ""), noise


def test_info_reports_the_build(tmp_path: Path) -> None:
    proc, _ = _run(["info"], tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "verify_probs" in proc.stdout and "CPU" in proc.stdout


@pytest.mark.parametrize("module", ["specdecode.info"])
def test_python_m_info(tmp_path: Path, module: str) -> None:
    proc = subprocess.run([sys.executable, "-m", module], cwd=tmp_path, env=ENV, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and "CUDA kernels:" in proc.stdout and "CPU code path:" in proc.stdout


def test_info_explains_missing_cuda_and_names_the_cpu_path(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from specdecode import info

    monkeypatch.setattr(torch.version, "cuda", None)
    assert "CPU-only build" in info.cuda_status({"cuda": False})
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    reason = info.cuda_status({"cuda": False})
    assert "12.4" in reason and "no CUDA compiler" in reason and "--no-build-isolation" in reason
    assert info.cuda_status({"cuda": True}).startswith("compiled")
    assert info.cpu_code_path({"cpu_isa": "avx2"}).startswith("avx2")
    assert "not reported" in info.cpu_code_path({})
