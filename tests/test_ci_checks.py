"""The CI check that keeps error messages out of CUDA translation units
(scripts/check_cuda_kernels.sh, step 1): it passes on the repository and fails on a .cu/.cuh
file that formats a message, throws or includes torch."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "check_cuda_kernels.sh"


def _run(root: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, SPECDECODE_CUDA_SOURCE_ROOT=str(root))
    return subprocess.run(["bash", str(SCRIPT), "--messages-only"], cwd=REPO, env=env, capture_output=True, text=True)


@pytest.fixture
def bash():
    if shutil.which("bash") is None or shutil.which("sed") is None:
        pytest.skip("needs bash and sed")


def test_repository_cuda_sources_format_no_messages(bash):
    result = _run(REPO / "csrc")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("line", [
    'void f() { TORCH_CHECK(x > 0, "x: bad"); }',
    'void f() { TORCH_CHECK_VALUE(false, "x"); }',
    'auto s = c10::str("row ", 3);',
    'std::ostringstream out;',
    'auto s = std::to_string(3);',
    'void f() { throw 1; }',
    '#include <sstream>',
    '#include <ATen/ATen.h>',
    'void f() { AT_ERROR("x"); }',
])
def test_check_fails_on_a_message_in_a_cuda_file(bash, tmp_path, line):
    (tmp_path / "kernel.cuh").write_text(f"// TORCH_CHECK in a comment is fine\nint thrower = 1;\n{line}\n")
    result = _run(tmp_path)
    assert result.returncode == 1 and "kernel.cuh:3" in result.stdout, result.stdout


def test_check_ignores_comments_and_identifiers(bash, tmp_path):
    (tmp_path / "ok.cu").write_text("// throw TORCH_CHECK c10::str\n/* std::to_string */ int thrower_count = 0;\n")
    assert _run(tmp_path).returncode == 0
