"""Phases compiled by ``torch.compile`` (Inductor): what ``decode_path="compiled"`` runs.

A *phase* (:mod:`specdecode.engine.graphs`) is a function of no arguments over persistent
buffers. Eagerly, the models' forwards launch a few dozen small kernels per layer (norms, rotary
embeddings, cache writes, masks, activations), and the commit phase a few dozen more for its
bookkeeping; replaying them as a CUDA graph removes the host work but keeps every launch.
:func:`compile_phase` compiles a phase whole with Inductor:

- **one graph per step** (:func:`in_sequence`: the step's phases as one function; one graph per
  phase when phase timings are asked for), traced whole (``fullgraph=True``: no break back to
  Python; what cannot be traced is an error naming the phase, see :class:`CompiledPhase`), so
  Inductor fuses the pointwise work and the reductions around each matrix product into a few
  kernels; matrix products, attention and specdecode's ops stay library calls;
- **static shapes** (``dynamic=False``): a layout fixes every shape, so nothing is traced for
  shapes it never sees;
- **one compilation per layout**: each phase of each layout is compiled from its own copy of the
  phase function's code object, so that the compiled code, its guards and its recompilation count
  belong to that layout, live as long as it (:mod:`specdecode.engine.static_layouts` keeps it for
  the next call) and never mix with another layout's. Tensors are the compiled code's inputs,
  read at every call (the models' parameters too): it holds no model and no buffer.

Nothing global is changed: the compile options are the ``torch.compile`` call's own.
:class:`~specdecode.engine.graphs.StepProgram` runs a phase eagerly once before it compiles it
(that first run makes the buffers a phase creates on first use, so the compiled code never sees
them missing), then calls the compiled phase, or on CUDA records it as a CUDA graph.
"""

from __future__ import annotations

import types
from typing import Callable

import torch


#: The ``torch.compile`` backend: Inductor. (``"aot_eager"`` traces the same graphs, with the same
#: guards and the same functionalised mutations, and runs them without generating code: the tests
#: check how each drafter kind traces with it, without a C++ compiler.)
BACKEND = "inductor"


class CompiledPhase:
    """A phase compiled by Inductor from its own copy of the function's code (see the module
    docstring). Calling it runs the compiled code, compiling it on the first call; a first call
    that cannot be compiled raises a ``RuntimeError`` naming the phase and
    ``decode_path='static'``."""

    def __init__(self, name: str, fn: Callable[[], object]) -> None:
        self.name = name
        code = fn.__code__.replace(co_name=f"{fn.__code__.co_name}_phase")
        own = types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)
        self._compiled = torch.compile(own, fullgraph=True, dynamic=False, backend=BACKEND)
        self._ready = False

    def __call__(self) -> object:
        if self._ready:
            return self._compiled()
        try:
            result = self._compiled()
        except Exception as exc:  # noqa: BLE001 - re-raised with what to do about it
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise RuntimeError(
                f"decode_path='compiled': torch.compile could not compile the {self.name} phase of the static step "
                f"({type(exc).__name__}: {first}); decode_path='static' runs the same step eagerly") from exc
        self._ready = True
        return result


def in_sequence(phases: list[tuple[str, Callable[[], None]]]) -> Callable[[], None]:
    """One phase that runs ``phases`` in order (a whole step: compiled as one function, Inductor
    fuses across the phases' boundaries too)."""
    functions = tuple(fn for _, fn in phases)

    def step() -> None:
        for fn in functions:
            fn()

    return step


def compile_phase(name: str, fn: Callable[[], object]) -> CompiledPhase:
    """``fn`` (a phase: no arguments, over persistent buffers) compiled by Inductor, its own
    compiled code for this layout (module docstring)."""
    return CompiledPhase(name, fn)
