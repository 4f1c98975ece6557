"""Robustness of every public op and Python entry point, each run in a SUBPROCESS so that a
segfault or abort fails the test instead of killing pytest:

* fuzzing (``fuzz_ops.py``): > 10^4 hypothesis-driven calls (derandomized: reproducible) with
  random shapes (empty batches, V = 1, ragged counts), dtypes (wrong ones too), NaN / inf,
  out-of-range ids, meta tensors, non-contiguous inputs, bad rule names and settings; every
  call must return a valid result or raise ValueError / TypeError;
* memory (``leak_check.py``): 10^4 verification calls and 10^4 sampling calls (errors
  included) must not grow the resident set size.

Both harnesses are shown to be able to fail: the validity checks reject broken results, a
crashing child is reported, and a deliberate leak is seen.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch

import fuzz_ops

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
# Resident memory may grow by at most this much over the measured calls (2 x 10^4 calls:
# ~100 bytes per call). Heap and allocator caches are warmed up first; measured growth is 0.
LEAK_TOLERANCE_BYTES = 2 * 1024 * 1024


def run_isolated(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    """Runs ``python args...`` in a fresh process; a child killed by a signal (segfault,
    abort) or failing in any way raises AssertionError with its output."""
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode < 0:
        raise AssertionError(f"child crashed with signal {-proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    if proc.returncode != 0:
        raise AssertionError(f"child failed (exit {proc.returncode}):\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}")
    return proc


# ----------------------------------------------------------------------------------- fuzzing


def test_fuzz_every_op_and_entry_point(tmp_path):
    last_case = tmp_path / "last_case.txt"
    try:
        proc = run_isolated([os.path.join(TESTS_DIR, "fuzz_ops.py"), "--last-case", str(last_case)], timeout=600)
    except AssertionError as exc:
        replay = last_case.read_text() if last_case.exists() else "(none)"
        raise AssertionError(f"{exc}\ncase being run: {replay}") from None
    lines = {m.group(1): m for m in re.finditer(
        r"^(\S+)\s+calls\s+(\d+)\s+valid results\s+(\d+)\s+rejected: (.*)\(", proc.stdout, re.M)}
    assert set(lines) == {t.name for t in fuzz_ops.TARGETS}, proc.stdout
    for name, m in lines.items():
        calls, valid = int(m.group(2)), int(m.group(3))
        assert valid > calls // 4, f"{name}: only {valid} of {calls} calls were valid (too few reach the kernels)"
        assert "ValueError" in m.group(4) and "TypeError" in m.group(4), f"{name}: rejections {m.group(4)}"
    total = int(re.search(r"TOTAL calls (\d+)", proc.stdout).group(1))
    assert total >= 10_000, proc.stdout


def _verify_case(num_draft=None):
    return fuzz_ops.Case(batch=2, gamma=3, vocab=5, num_draft=num_draft, draft_tokens=torch.tensor([[1, 2, 3], [4, 0, 1]]))


@pytest.mark.parametrize("tokens, accepted_len, num_draft, problem", [
    ([[1, 2, 3, 4], [4, 0, -1, -1]], [3, 1], None, None),  # valid
    ([[1, 2, 3, 4], [4, 0, -1, -1]], [3, 2], None, "emitted token"),  # accepted_len disagrees with the tokens
    ([[1, 2, 3, 5], [4, 0, -1, -1]], [3, 1], None, "emitted token"),  # id == V
    ([[1, 2, 3, 4], [3, 0, -1, -1]], [3, 1], None, "not the drafts"),  # accepted token is not the draft
    ([[1, 2, 3, 4], [4, 0, 7, -1]], [3, 1], None, "padding"),  # garbage after the emitted token
    ([[1, 2, 3, 4], [4, 0, -1, -1]], [4, 1], None, "accepted_len"),  # more than gamma
    ([[1, 2, 3, 4], [4, 0, -1, -1]], [3, 1], [3, 0], "accepted_len"),  # more than row 1's draft count
])
def test_fuzz_verify_check_rejects_broken_results(tokens, accepted_len, num_draft, problem):
    """The validity check can fail: broken outputs are rejected, naming the problem."""
    case = _verify_case(None if num_draft is None else torch.tensor(num_draft))
    result = (torch.tensor(tokens), torch.tensor(accepted_len))
    if problem is None:
        fuzz_ops.check_verify_result(case, result)
    else:
        with pytest.raises(AssertionError, match=problem):
            fuzz_ops.check_verify_result(case, result)


def test_fuzz_sample_check_rejects_broken_results():
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 2.0, 0.0]])
    case = fuzz_ops.Case(batch=2, vocab=3, logits=logits, greedy=True)
    fuzz_ops.check_sample_result(case, torch.tensor([1, 0]))
    for bad in (torch.tensor([1, 1]), torch.tensor([1, 3]), torch.tensor([1]), torch.tensor([1, 0], dtype=torch.int32)):
        with pytest.raises(AssertionError):
            fuzz_ops.check_sample_result(case, bad)


def test_fuzz_harness_rejects_unexpected_exceptions():
    """A call raising anything but ValueError / TypeError fails its target (here a
    RuntimeError that is not torch's schema parsing)."""
    def boom(case):
        raise RuntimeError("kernel exploded")

    target = fuzz_ops.FuzzTarget("boom", ["none"], lambda rng, brk: fuzz_ops.Case(), boom, lambda c, r: None,
                                 direct_op=True)
    tally = fuzz_ops.fuzz_target(target, calls=4, last_case_fd=None)
    assert tally.failure is not None and "kernel exploded" in tally.failure


def test_a_crashing_child_fails():
    with pytest.raises(AssertionError, match="signal"):
        run_isolated(["-c", "import ctypes; ctypes.string_at(0)"], timeout=60)


# ------------------------------------------------------------------------------------ memory


def _leak_check(*extra: str) -> dict:
    proc = run_isolated([os.path.join(TESTS_DIR, "leak_check.py"), *extra], timeout=600)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_repeated_calls_do_not_grow_resident_memory():
    """10^4 verification calls (token, block, typical, top_beta; logits and probabilities;
    Philox and explicit coins; ValueError paths) and 10^4 sampling calls keep the resident set
    size within LEAK_TOLERANCE_BYTES of its value after a warm-up."""
    report = _leak_check("--calls", "10000")
    assert report["growth"] <= LEAK_TOLERANCE_BYTES, report


def test_leak_check_sees_a_deliberate_leak():
    """The same measurement with 1 KiB kept per call (4000 calls per group: ~8 MiB) exceeds the
    tolerance: the check has the power to catch a leak of that size."""
    report = _leak_check("--calls", "4000", "--warmup", "200", "--leak-bytes", "1024")
    assert report["growth"] > LEAK_TOLERANCE_BYTES, report
