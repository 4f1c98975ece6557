"""A CPU fast path for multi-token forwards: speculative decoding's verification forward (the
target over a handful of tokens) and drafters that run several rows.

On a CPU a small model's forward is bound by reading its weights, so a forward over 6 tokens
should cost about what a one-token step costs. torch's ``F.linear`` does not get there with a
few rows (it picks GEMM paths tuned for large matrices); ``torch.ops.specdecode.skinny_linear``
reads each weight row once and multiplies every row of the input with it while it is in cache.

>>> handle = specdecode.cpu.accelerate(model)     # model's nn.Linear layers use the fast path
>>> specdecode.cpu.is_accelerated(model)
True
>>> handle.remove()                               # or specdecode.cpu.restore(model)

``accelerate`` changes the ``forward`` of each eligible ``nn.Linear`` (an instance attribute,
deleted again on removal) and, for a model whose attention implementation is ``"sdpa"``, that
name on its config (to :data:`specdecode.cpu_attention.ATTENTION_NAME`, put back on removal:
few-query attention steps then run ``torch.ops.specdecode.skinny_attention``, which skips the
columns a static cache's mask rules out; see :mod:`specdecode.cpu_attention`). Parameters,
buffers, state_dict and hooks stay as they are. The fast forward runs the op only when it is
safe: CPU tensors, float32 input, weight and bias, min_rows <= rows <= max_rows, a shape where
it pays (:func:`fast_path_pays`: not one row through a small layer), no autograd graph being
recorded, not under tracing or torch.compile; otherwise it calls ``nn.Linear.forward`` itself.
How many threads a call uses is the op's own choice, by the layer's size and rows (small layers
stay on one thread). Outputs differ from torch's only by float rounding (the same products,
summed in another order). Restore before pickling a whole model (``torch.save(model)``): the
installed forwards and the attention's name would be pickled with it; a state_dict is
unaffected.
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass, field
from typing import Iterator

import torch
from torch import Tensor, nn

from specdecode import cpu_attention
from specdecode._ops import build_info, ops

__all__ = [
    "AVX512_MAX_ROWS",
    "DEFAULT_MAX_ROWS",
    "DEFAULT_MIN_ROWS",
    "FastPath",
    "ONE_ROW_MIN_WEIGHTS",
    "accelerate",
    "accelerated",
    "accelerated_layers",
    "can_accelerate",
    "default_max_rows",
    "eligible_layers",
    "fast_path_pays",
    "fast_path_report",
    "is_accelerated",
    "restore",
]

#: Most rows (tokens x batch) a call may have to take the fast path with the AVX2 and baseline
#: kernels; above it torch's GEMM wins there.
DEFAULT_MAX_ROWS = 32
#: The same with the AVX-512 kernels, which beat torch's GEMM at 64 rows on every layer of the
#: demo target and SmolLM2 (benchmarks/bench_cpu_forward.py --demo-layers: 1.04-1.74x on one
#: thread, 1.16-2.06x on two; AMD EPYC); at 128 rows by less (0.99-1.49x on one thread), so
#: larger calls stay on torch's GEMM.
AVX512_MAX_ROWS = 64
#: Fewest rows: one-token decode steps take the fast path too (benchmarks/bench_cpu_forward.py:
#: it beats torch's matrix-vector product there as well), on layers of ONE_ROW_MIN_WEIGHTS or more.
DEFAULT_MIN_ROWS = 1
#: Fewest weight elements (out x in features) for which one row takes the fast path: below it the
#: call is a few microseconds either way and torch's own is as fast (the demo draft's 96 x 96 ..
#: 256 x 96 layers: 0.94-0.96x of torch's time with the fast path at one row, 1 and 2 threads).
ONE_ROW_MIN_WEIGHTS = 1 << 16


def default_max_rows() -> int:
    """The ``max_rows`` :func:`accelerate` uses by default: :data:`AVX512_MAX_ROWS` where the
    kernels run AVX-512 (the widest set the CPU reports, or ``SPECDECODE_CPU_ISA``'s), else
    :data:`DEFAULT_MAX_ROWS`."""
    return AVX512_MAX_ROWS if build_info().get("cpu_isa") == "avx512" else DEFAULT_MAX_ROWS


def fast_path_pays(out_features: int, in_features: int, rows: int) -> bool:
    """Whether ``skinny_linear`` beats torch's ``F.linear`` for a call of ``rows`` rows through a
    layer of this shape: from two rows on always (1.1-4.1x measured on the demo pair's and SmolLM2's
    layers, 1 and 2 threads), one row only through layers of ONE_ROW_MIN_WEIGHTS weights or more.
    A pure function of the shape: the same answer for every call, whatever the data. (The thread
    count is the op's choice: it splits a layer over threads only when each gets enough work.)"""
    if rows >= 2:
        return True
    return rows == 1 and out_features * in_features >= ONE_ROW_MIN_WEIGHTS


class _SkinnyForward:
    """The ``forward`` installed on one ``nn.Linear``: the fast path when it applies, else the
    class's own forward. A small object (not a closure) so that copy.deepcopy and pickle of an
    accelerated model carry it along, pointing at the copied layer."""

    def __init__(self, module: nn.Linear, min_rows: int, max_rows: int) -> None:
        self.module = module
        self.min_rows = min_rows
        self.max_rows = max_rows

    def applies(self, input: Tensor) -> bool:
        """Whether a call with ``input`` takes the fast path (see the module docstring). The
        cheap, usually decisive checks come first: this runs on every call of the layer."""
        weight, bias = self.module.weight, self.module.bias
        if input.dtype != torch.float32 or weight.dtype != torch.float32 or not (input.is_cpu and weight.is_cpu):
            return False
        if type(input) is not Tensor or type(weight) not in _PLAIN or weight.layout != torch.strided:
            return False  # tensor subclasses (FakeTensor, DTensor, ...) keep their own dispatch
        if bias is not None and (bias.dtype != torch.float32 or not bias.is_cpu or type(bias) not in _PLAIN):
            return False
        if torch.is_grad_enabled() and (input.requires_grad or weight.requires_grad
                                        or (bias is not None and bias.requires_grad)):
            return False
        if torch.jit.is_tracing() or torch.compiler.is_compiling():
            return False
        if weight.dim() != 2 or input.dim() < 1 or not weight.is_contiguous():
            return False
        in_features = weight.shape[1]
        if in_features == 0 or input.shape[-1] != in_features:
            return False
        rows = input.numel() // in_features
        return self.min_rows <= rows <= self.max_rows and fast_path_pays(weight.shape[0], in_features, rows)

    def __call__(self, input: Tensor) -> Tensor:
        """``nn.Linear.forward`` with the skinny-matrix op for few rows.

        Shape:
            input [..., in_features] -> output [..., out_features]
        """
        module = self.module
        if self.applies(input):
            return _skinny_linear(input, module.weight, module.bias)
        return nn.Linear.forward(module, input)


_PLAIN = (Tensor, nn.Parameter)
_skinny_linear = ops.skinny_linear.default


def _installable(module: nn.Module) -> bool:
    """An ``nn.Linear`` whose forward is nn.Linear's own and has not been replaced on the
    instance (accelerate's offload hooks, another wrapper, or this fast path already)."""
    return (isinstance(module, nn.Linear) and type(module).forward is nn.Linear.forward
            and "forward" not in module.__dict__)


def eligible_layers(model: nn.Module) -> list[str]:
    """Names (as in ``named_modules``) of the layers :func:`accelerate` would install on now:
    plain ``nn.Linear`` modules (the LM head too, tied or not) with float32 weights on the CPU."""
    names = []
    for name, module in model.named_modules(remove_duplicate=True):
        if _installable(module) and module.weight.device.type == "cpu" and module.weight.dtype == torch.float32:
            names.append(name)
    return names


def accelerated_layers(model: nn.Module) -> list[str]:
    """Names of the layers of ``model`` that currently carry the fast forward."""
    return [name for name, module in model.named_modules(remove_duplicate=True)
            if isinstance(module.__dict__.get("forward"), _SkinnyForward)]


def is_accelerated(model: nn.Module) -> bool:
    """Whether any layer of ``model`` carries the fast forward, or its attention is the fast path's."""
    return (any(isinstance(m.__dict__.get("forward"), _SkinnyForward) for m in model.modules())
            or bool(cpu_attention.installed_configs(model)))


@dataclass
class FastPath:
    """What one :func:`accelerate` call installed; ``remove()`` (or leaving a ``with`` block)
    takes exactly that off again. Holds weak references only: it keeps no model alive."""

    layer_names: list[str]
    min_rows: int
    max_rows: int
    _layers: list[weakref.ref] = field(default_factory=list, repr=False)
    _attention_configs: list[weakref.ref] = field(default_factory=list, repr=False)

    @property
    def attention(self) -> bool:
        """Whether this call switched the model's attention to the fast path's."""
        return bool(self._attention_configs)

    def remove(self) -> int:
        """Deletes the fast forwards this call installed (those still installed) and puts
        ``"sdpa"`` back where it switched the attention; returns how many layers were restored."""
        removed = 0
        for ref in self._layers:
            module = ref()
            if module is not None and isinstance(module.__dict__.get("forward"), _SkinnyForward):
                del module.forward
                removed += 1
        self._layers = []
        cpu_attention.uninstall(self._attention_configs)
        self._attention_configs = []
        return removed

    def __enter__(self) -> FastPath:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.remove()


def accelerate(model: nn.Module, *, min_rows: int = DEFAULT_MIN_ROWS, max_rows: int | None = None,
               attention: bool = True) -> FastPath:
    """Installs the CPU fast path on every eligible layer of ``model`` (:func:`eligible_layers`)
    and returns the handle that removes it. Layers already accelerated are left as they are.

    ``min_rows`` / ``max_rows``: the row counts (tokens x batch of one call) that take the fast
    path; others run torch's own ``F.linear``; ``max_rows=None`` is :func:`default_max_rows`.
    ``attention``: also switch a model whose attention implementation is ``"sdpa"`` to the fast
    path's (:mod:`specdecode.cpu_attention`). The model may be moved to another device or dtype
    later: the fast forwards then fall back to torch by themselves.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    if max_rows is None:
        max_rows = default_max_rows()
    if not (isinstance(min_rows, int) and isinstance(max_rows, int) and 1 <= min_rows <= max_rows):
        raise ValueError(f"min_rows, max_rows: expected integers with 1 <= min_rows <= max_rows, "
                         f"got {min_rows!r}, {max_rows!r}")
    if not isinstance(attention, bool):
        raise TypeError(f"attention: expected a bool, got {type(attention).__name__}")
    names = eligible_layers(model)
    modules = dict(model.named_modules(remove_duplicate=True))
    handle = FastPath(names, min_rows, max_rows)
    for name in names:
        module = modules[name]
        module.forward = _SkinnyForward(module, min_rows, max_rows)
        handle._layers.append(weakref.ref(module))
    if attention:
        handle._attention_configs = cpu_attention.install(model)
    return handle


def restore(model: nn.Module) -> int:
    """Removes the fast forward from every layer of ``model`` (whichever call installed it) and
    puts ``"sdpa"`` back where the fast path's attention runs; returns how many layers were
    restored."""
    removed = 0
    for module in model.modules():
        if isinstance(module.__dict__.get("forward"), _SkinnyForward):
            del module.forward
            removed += 1
    cpu_attention.uninstall([weakref.ref(c) for c in cpu_attention.installed_configs(model)])
    return removed


def can_accelerate(model: nn.Module) -> tuple[bool, str]:
    """Whether turning the fast path on by default is safe and useful for ``model``, and why
    not: its parameters live on the CPU, the compiled op is there, and it has eligible layers.
    Where this says no, :func:`accelerate` would install nothing or nothing that runs."""
    if not torch._C._dispatch_has_kernel_for_dispatch_key("specdecode::skinny_linear", "CPU"):
        return False, "this build of specdecode has no skinny_linear CPU kernel"
    devices = {p.device.type for p in model.parameters()}
    if devices != {"cpu"}:
        return False, f"the model's parameters are on {', '.join(sorted(devices)) or 'no device'}, not only the CPU"
    if not eligible_layers(model):
        if is_accelerated(model):
            return False, "already accelerated"
        return False, "no plain nn.Linear layer with float32 weights"
    return True, "CPU float32 model with nn.Linear layers"


@contextlib.contextmanager
def accelerated(*models: nn.Module | None, enabled: bool | None = None) -> Iterator[list[FastPath]]:
    """The fast path on ``models`` for the duration of a ``with`` block, then exactly what was
    there before (layers accelerated by someone else stay accelerated).

    ``enabled``: None (the default) accelerates each model that :func:`can_accelerate` accepts
    (parameters all on the CPU, float32 nn.Linear layers), True accelerates every model's eligible
    layers whatever it says, False nothing. ``None`` entries are skipped, so an optional draft
    model can be passed as it is. Yields the handles installed.
    """
    handles: list[FastPath] = []
    try:
        if enabled is not False:
            for model in models:
                if model is not None and (enabled or can_accelerate(model)[0]):
                    handles.append(accelerate(model))
        yield handles
    finally:
        for handle in handles:
            handle.remove()


def fast_path_report() -> str:
    """One line for ``python -m specdecode.info``: the instruction set the fast path's kernels
    run with, whether its loop is parallel, and the rows it takes by default."""
    info = build_info()
    if "skinny_linear_parallel" not in info:
        return "not in this build"
    threads = (f"parallel over output features on {torch.get_num_threads()} torch threads"
               if info["skinny_linear_parallel"] else "one thread (built without OpenMP)")
    return (f"skinny_linear, {info.get('cpu_isa', '?')} kernels, {threads}; nn.Linear calls with "
            f"{DEFAULT_MIN_ROWS}..{default_max_rows()} float32 rows (one row: layers of {ONE_ROW_MIN_WEIGHTS} weights "
            f"or more) once specdecode.cpu.accelerate(model) is on")
