"""Loads the compiled extension (``specdecode._C``), which registers ``torch.ops.specdecode.*``."""

from __future__ import annotations

from typing import Any

import torch

try:
    import specdecode._C as _C  # noqa: F401  (importing registers the ops)
except ImportError as exc:  # pragma: no cover - exercised only on a broken install
    raise ImportError(
        "specdecode: the compiled extension specdecode._C could not be loaded "
        f"({exc}). It must be built against the torch you are running "
        f"(torch {torch.__version__} now). Reinstall from the repository root with:\n"
        "    pip install torch==<your torch version>\n"
        "    pip install --no-build-isolation -e .\n"
        "and run `python -m specdecode.info` to check the build."
    ) from exc

ops = torch.ops.specdecode


def build_info() -> dict[str, Any]:
    """What the compiled library was built with (CUDA or not, compiler, torch version)."""
    return dict(_C.build_info())
