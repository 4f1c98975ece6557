"""Counting the kernels a piece of host code launches: how ``decode_path="compiled"`` is
measured against the static step it compiles (``python -m specdecode bench`` prints it).

A decoding step costs, besides its arithmetic, one launch per kernel: on a GPU a few
microseconds each, even replayed from a CUDA graph, so a step of a few hundred small kernels
is bound by their number. :func:`count_launches` counts them for one call of a function:

- **eager code** (``compiled=False``): every operator that reaches a kernel, seen by a
  ``TorchDispatchMode`` below autograd and the composite operators (so ``linear`` is the matrix
  product it runs); views and other operators that only make a new tensor header (``view``,
  ``transpose``, ``slice``, ``expand``, ...) launch nothing and are not counted;
- **compiled code** (``compiled=True``): every call that Inductor's generated code makes to a
  kernel: its own fused kernels, library calls (matrix products, attention) and operators it
  leaves as they are (specdecode's ops), counted by a profile hook on the generated code's
  frames (allocations, stride checks and tensor headers are not calls to kernels);
- **on CUDA** either way: the CUDA kernels ``torch.profiler`` records.

Counts are per call of ``fn``; run it on a state where a second run is harmless (a kept
static layout after a generation: the next generation resets every buffer it reads).
"""

from __future__ import annotations

import sys
from types import CodeType, FrameType
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: Callables the generated code uses for bookkeeping, not kernels (allocation, headers, checks).
_NOT_KERNELS = ("torch._C._dynamo", "builtins")


class _EagerOps(TorchDispatchMode):
    """Counts the operators that reach a kernel (views excluded)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if not getattr(func, "is_view", False) and func.namespace != "prim":
            self.count += 1
        return func(*args, **(kwargs or {}))


def _is_generated(code: CodeType, frame: FrameType) -> bool:
    """Whether a frame runs the ``call`` of a module Inductor generated (it holds the kernels'
    handles as globals next to ``extern_kernels``)."""
    return code.co_name == "call" and "extern_kernels" in frame.f_globals


class _CompiledCalls:
    """A ``sys.setprofile`` hook counting the kernels that Inductor's generated code calls."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "c_call":
            if _is_generated(frame.f_code, frame):
                module = getattr(arg, "__module__", None) or "builtins"
                if not module.startswith(_NOT_KERNELS):
                    self.count += 1  # a fused C++ kernel, or a library call (extern_kernels.mm is torch.mm)
        elif event == "call":
            parent = frame.f_back
            if parent is not None and _is_generated(parent.f_code, parent):
                code = frame.f_code
                if (code.co_name == "__call__" and code.co_filename.endswith("_ops.py")) or code.co_name == "run":
                    self.count += 1  # an operator left to ATen or specdecode, or a Triton kernel's launch


def _cuda_kernels(fn: Callable[[], Any]) -> int:
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
               and not e.name.startswith(("Memcpy", "Memset")))


def count_launches(fn: Callable[[], Any], *, compiled: bool, device: torch.device | str = "cpu") -> int:
    """Kernels launched by one call of ``fn`` (see the module docstring): its eager operators
    (``compiled=False``) or the kernels its compiled code calls (``compiled=True``); on a CUDA
    ``device`` the CUDA kernels the profiler records, either way.

    Example:
        >>> x = torch.randn(4, 4)
        >>> count_launches(lambda: (x @ x).relu().t(), compiled=False)  # mm, relu; t is a view
        2
    """
    if torch.device(device).type == "cuda":
        return _cuda_kernels(fn)
    if not compiled:
        with _EagerOps() as mode:
            fn()
        return mode.count
    hook = _CompiledCalls()
    previous = sys.getprofile()
    sys.setprofile(hook)
    try:
        fn()
    finally:
        sys.setprofile(previous)
    return hook.count


def step_launches(layout: Any, drafter: Any) -> int:
    """Kernels one step of a kept static layout launches (eager phases on the static path, the
    compiled step on the compiled one), counted by running one more step on it with
    ``drafter`` (the one its last generation ran with: its static buffers are the layout's).
    Harmless to later generations, which reset every buffer; for benchmarks and tests.

    ``layout``: an entry of :func:`specdecode.engine.static_layouts.kept_layouts`.
    """
    program = layout.program
    layout.drafter = drafter
    layout.step.zero_()  # the step's row of the accepted-length log
    try:
        with torch.no_grad():  # as generations run (compiled code is guarded on it)
            return count_launches(lambda: [fn() for _, fn in program.phases], compiled=program.compiled,
                                  device=program.device)
    finally:
        layout.drafter = None
