"""``python -m specdecode.info``: what was built, which code paths run, and why."""

from __future__ import annotations

import platform
import sys
import textwrap
from typing import Any

import torch

REBUILD = "pip install --no-build-isolation -e ."


def cuda_status(info: dict[str, Any]) -> str:
    """Whether the CUDA kernels were compiled, and if not, why and what to do about it."""
    if info.get("cuda"):
        device = "a CUDA device is visible" if torch.cuda.is_available() else "but no CUDA device is visible"
        return f"compiled; {device}"
    if torch.version.cuda is None:
        return (f"not compiled: torch {torch.__version__} is a CPU-only build. The CUDA kernels need a "
                f"CUDA build of torch and the CUDA toolkit (nvcc) when the extension is built; "
                f"then rebuild ({REBUILD}). Every op runs on the CPU meanwhile.")
    return (f"not compiled: torch has CUDA {torch.version.cuda}, but no CUDA compiler was found when the "
            f"extension was built (or SPECDECODE_DISABLE_CUDA was set). Put nvcc on PATH (or set CUDACXX) "
            f"and rebuild ({REBUILD}).")


def cpu_code_path(info: dict[str, Any]) -> str:
    """The instruction set the CPU logit loops run with in this process."""
    isa = info.get("cpu_isa")
    if isa is None:
        return "not reported by this build"
    return f"{isa} (the widest this CPU runs unless SPECDECODE_CPU_ISA=avx2|baseline narrows it)"


def build_report() -> str:
    """A plain-text report of the build: versions, compiler, code paths and each op's backends."""
    lines = [f"specdecode {_version()} on python {sys.version.split()[0]} ({platform.machine()}), "
             f"torch {torch.__version__}"]
    try:
        from specdecode._ops import build_info
        from specdecode.cpu import fast_path_report

        info = build_info()
    except ImportError as exc:
        lines.append(f"compiled library: NOT LOADED\n{exc}")
        return "\n".join(lines)
    lines += [
        f"extension built with torch {info['torch_build_version']}, {info['compiler']}, "
        f"cxx11 ABI {info['cxx11_abi']}",
        f"CPU code path: {cpu_code_path(info)}",
        textwrap.fill(f"CPU fast path: {fast_path_report()}", width=100, subsequent_indent="  ",
                      break_on_hyphens=False, break_long_words=False),
        textwrap.fill(f"CUDA kernels: {cuda_status(info)}", width=100, subsequent_indent="  ",
                      break_on_hyphens=False, break_long_words=False),
        "ops (torch.ops.specdecode):",
    ]
    for name in sorted(n for n in torch._C._dispatch_get_all_op_names() if n.startswith("specdecode::")):
        backends = [key for key in ("CPU", "CUDA") if torch._C._dispatch_has_kernel_for_dispatch_key(name, key)]
        lines.append(f"  {name.split('::')[1]:21s} {', '.join(backends) or 'none'}")
    from specdecode.rules import list_rules
    from specdecode.trees import list_tree_rules

    lines.append("verification rules (chains):")
    lines += [f"  {rule}" for rule in list_rules()]
    compiled = ", ".join(r.name for r in list_tree_rules() if r.compiled)
    python_only = ", ".join(r.name for r in list_tree_rules() if not r.compiled)
    tree_line = f"tree rules: {compiled}" + (f"; in Python only: {python_only}" if python_only else "")
    lines.append(textwrap.fill(tree_line, width=100, subsequent_indent="  ", break_on_hyphens=False,
                               break_long_words=False))
    lines.append(f"torch threads: {torch.get_num_threads()}; CUDA device available: {torch.cuda.is_available()}")
    return "\n".join(lines)


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("specdecode")
    except Exception:  # pragma: no cover - running from a source tree without metadata
        return "(source tree)"


def main() -> None:
    print(build_report())


if __name__ == "__main__":
    from specdecode.cli_args import run_command

    run_command(main)
