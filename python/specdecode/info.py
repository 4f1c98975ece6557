"""``python -m specdecode.info``: what was built and what is registered."""

from __future__ import annotations

import platform
import sys

import torch


def build_report() -> str:
    """A plain-text report of the build: versions, compiler, and which ops have which backends."""
    lines = [f"specdecode {_version()}", f"python     {sys.version.split()[0]} ({platform.machine()})",
             f"torch      {torch.__version__} (CUDA {torch.version.cuda or 'none'})"]
    try:
        from specdecode._ops import build_info

        info = build_info()
    except ImportError as exc:
        lines.append(f"compiled library: NOT LOADED\n{exc}")
        return "\n".join(lines)
    lines += [
        f"built with torch {info['torch_build_version']}, {info['compiler']}, cxx11 ABI {info['cxx11_abi']}",
        f"CUDA kernels compiled: {'yes' if info['cuda'] else 'no'}",
        f"CPU logit loops: {info.get('cpu_isa', '?')} (narrow with SPECDECODE_CPU_ISA=avx2|baseline)",
        "ops (torch.ops.specdecode):",
    ]
    for op in ("verify_probs", "verify_logits", "verify_probs_philox", "verify_logits_philox", "sample_logits",
               "sample_logits_philox", "processed_probs", "tree_attention_mask", "verify_tree", "verify_tree_philox"):
        backends = [key for key in ("CPU", "CUDA") if torch._C._dispatch_has_kernel_for_dispatch_key(f"specdecode::{op}", key)]
        lines.append(f"  {op:21s} {', '.join(backends)}")
    from specdecode.rules import list_rules

    lines.append("rules:")
    lines += [f"  {rule}" for rule in list_rules()]
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
    main()
