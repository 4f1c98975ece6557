"""Where a training run happens: the device and dtype of the target, the batch sizes sized for
that device, and the one-line errors for a device that is missing or full.

A GPU makes the target's data about 100 times faster than a small CPU (SmolLM2-135M: 17.9k
tokens/s at 512 prompts per batch on an H100 against ~150 on two CPU cores), but only when its
batches are large: :func:`data_batch_size` picks the largest power of two up to 512 whose
labelling forward fits in the free device memory, and :func:`loop_batch_size` 64 drafter
examples per step on a GPU (8 on the CPU), lowered by :func:`plan_batch_size` when a kind's
measured step would not fit in what the data stage left free (:mod:`.planning`). An explicit
batch size always wins over these.

One process runs every stage on one device, so what a stage leaves behind is released before
the next (:func:`release_memory`) and each stage's peak is measured on its own
(:func:`reset_peak_memory`, :func:`peak_memory_mib`).
"""

from __future__ import annotations

import gc
import resource
import sys
from contextlib import contextmanager
from typing import Any, Iterator

import torch

__all__ = ["DTYPES", "OutOfDeviceMemory", "check_device", "check_dtype", "cpu_data_batch", "data_batch_size",
           "free_memory_bytes", "loop_batch_size", "memory_error", "memory_errors", "peak_memory_mib", "place_target",
           "plan_batch_size", "release_memory", "reset_peak_memory"]

#: ``dtype`` names a run accepts (the target is cast to it; drafters are built in it).
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: Most prompts per data batch on a GPU (1024 generated 1.15x the tokens/s of 512 on the H200,
#: SmolLM2 in float32, 2026-11-28), and drafter examples per step.
MAX_DATA_BATCH = 1024
GPU_LOOP_BATCH = 64
CPU_LOOP_BATCH = 8
#: Share of the free device memory that a planned batch (data or training) may use.
MEMORY_SHARE = 0.8


class OutOfDeviceMemory(RuntimeError):
    """A stage of a training run ran out of device (or host) memory; the message names the
    stage and the setting to lower."""


def check_device(device: Any, *, present: bool = True) -> torch.device | None:
    """``device`` (None, a string such as ``"cpu"`` / ``"cuda"`` / ``"cuda:1"``, or a
    ``torch.device``) as a ``torch.device``; ``ValueError`` naming ``device`` when it is not a
    device name, or (``present``) when CUDA is asked for but torch finds no CUDA device (or not
    that one)."""
    if device is None:
        return None
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"device: expected a device name such as 'cpu' or 'cuda', got {type(device).__name__}")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise ValueError(f"device: expected a device name such as 'cpu' or 'cuda', got {device!r}") from None
    if dev.type == "cuda" and present:
        if not torch.cuda.is_available():
            built = f"CUDA {torch.version.cuda}" if torch.version.cuda else "no CUDA"
            raise ValueError(f"device: {str(device)!r} was asked for, but torch {torch.__version__} ({built}) finds "
                             "no CUDA device; run on a machine with a GPU or pass --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device: {str(device)!r} was asked for, but there are "
                             f"{torch.cuda.device_count()} CUDA devices")
    elif dev.type not in ("cpu", "cuda", "mps", "xpu"):
        raise ValueError(f"device: expected 'cpu' or 'cuda', got {device!r}")
    return dev


def check_dtype(dtype: Any) -> torch.dtype | None:
    """``dtype`` (None, a name of :data:`DTYPES` or a ``torch.dtype`` among them) as a
    ``torch.dtype``, or ``ValueError`` naming ``dtype``."""
    if dtype is None:
        return None
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    raise ValueError(f"dtype: expected one of {', '.join(DTYPES)}, got {dtype!r}")


def place_target(target: torch.nn.Module, device: torch.device | None, dtype: torch.dtype | None, *,
                 owned: bool) -> torch.nn.Module:
    """``target`` on ``device`` in ``dtype`` (None: where it is, as it is). A target the run
    loaded itself (``owned``) is moved; a model the caller passed is never moved or cast (that
    would change the caller's object): ``ValueError`` naming ``device`` / ``dtype`` when it is
    not already there."""
    param = next(target.parameters())
    if not owned:
        if device is not None and (param.device.type != device.type
                                   or (device.index is not None and param.device.index != device.index)):
            raise ValueError(f"device: the target is on {param.device}, not {device}; move it there first "
                             "(target.to(device)) or pass the target by name")
        if dtype is not None and param.dtype != dtype:
            raise ValueError(f"dtype: the target is {param.dtype}, not {dtype}; cast it first or pass the target "
                             "by name")
        return target
    if device is not None or dtype is not None:
        target = target.to(device=device, dtype=dtype)
    return target


def _device_of(target: torch.nn.Module) -> torch.device:
    return next(target.parameters()).device


def data_batch_size(target: torch.nn.Module, max_length: int, *, decode_labels: bool = False,
                    num_feature_layers: int = 1, top_k: int = 64) -> int:
    """Prompts per data batch for ``target`` where it is: :func:`cpu_data_batch` on the CPU; on
    a GPU the largest power of two up to :data:`MAX_DATA_BATCH` whose memory fits in 80% of the
    free device memory, ``max_length`` positions per prompt:

    - labelled by a second forward (``decode_labels`` False): that forward's logits, their
      float32 log-softmax and the hidden states (SmolLM2-135M in float32 on an 80 GB GPU: 512,
      which the reference run used at a 38 GB peak);
    - labelled by the decode steps (the graphed path's continuations of prompts): the static
      caches (keys and values), the features of ``num_feature_layers`` layers and the top
      ``top_k`` labels at every column, the prefill's hidden states of every layer, and one
      step's logits with their float32 copies (SmolLM2 in float32: about 25 MB a prompt, 1024 on
      an 80 GB GPU, 512 on a 24 GB one)."""
    device = _device_of(target)
    if device.type != "cuda":
        return cpu_data_batch()
    free, _ = torch.cuda.mem_get_info(device)
    config = target.config
    vocab = int(target.get_output_embeddings().weight.shape[0])
    layers = int(getattr(config, "num_hidden_layers", 1)) + 1
    hidden = int(getattr(config, "hidden_size", 0))
    item = next(target.parameters()).element_size()
    if decode_labels:
        heads = int(getattr(config, "num_attention_heads", 1))
        kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(config, "head_dim", None) or hidden // max(heads, 1))
        capacity = max_length + 32  # the prompt block and the capacity are rounded up
        column = 2 * (layers - 1) * kv_heads * head_dim * item + num_feature_layers * hidden * item + 12 * top_k
        per_prompt = capacity * column + max_length * layers * hidden * item + vocab * (item + 12)
    else:
        logits = item + 4 + (0 if item == 4 else 4)  # the logits, their float32 copy (unless float32), the log-softmax
        per_prompt = max_length * (vocab * logits + layers * hidden * item)
    return plan_batch_size(free, 0, per_prompt, largest=MAX_DATA_BATCH)


def cpu_data_batch() -> int:
    """Prompts per data batch on the CPU: the most rows the CPU fast path takes in one forward
    (:func:`specdecode.cpu.default_max_rows`: 64 where its kernels run AVX-512, else 32). Past it
    the static path's lead over HF ``generate`` falls; up to it a larger batch is faster: the demo
    target's whole data stage made 2,736 tokens/s at 64 prompts against 2,362 at 32 on an AVX-512
    CPU (2.57x and 2.38x the stage through HF ``generate``; SmolLM2's continuations 336 against 296,
    `benchmarks/bench_data_stage.py --batch-size 32 64`, 2026-11-29)."""
    from specdecode.cpu import default_max_rows

    return default_max_rows()


def loop_batch_size(device: torch.device) -> int:
    """Drafter examples per optimizer step: :data:`GPU_LOOP_BATCH` on a GPU, else :data:`CPU_LOOP_BATCH`."""
    return GPU_LOOP_BATCH if device.type == "cuda" else CPU_LOOP_BATCH


def plan_batch_size(free_bytes: float, fixed_bytes: float, per_item_bytes: float, *, largest: int,
                    share: float = MEMORY_SHARE) -> int:
    """The largest power of two ``b <= largest`` with ``fixed_bytes + b * per_item_bytes`` at
    most ``share`` of ``free_bytes`` (at least 1: a batch that cannot fit at all is left for
    the out-of-memory error to name). Pure arithmetic, so a plan can be checked anywhere."""
    for name, value in (("free_bytes", free_bytes), ("fixed_bytes", fixed_bytes), ("per_item_bytes", per_item_bytes)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ValueError(f"{name}: expected a number >= 0, got {value!r}")
    if isinstance(largest, bool) or not isinstance(largest, int) or largest < 1:
        raise ValueError(f"largest: expected an int >= 1, got {largest!r}")
    size = 1 << (largest.bit_length() - 1)
    while size > 1 and fixed_bytes + size * per_item_bytes > share * free_bytes:
        size //= 2
    return size


def free_memory_bytes(device: torch.device) -> int | None:
    """Free memory of a CUDA ``device`` in bytes (``torch.cuda.mem_get_info``), None elsewhere."""
    if device.type != "cuda":
        return None
    return int(torch.cuda.mem_get_info(device)[0])


def release_memory(device: torch.device) -> None:
    """Give back what a finished stage left on ``device``: the static decode path's kept
    layouts (caches, buffers, CUDA graphs), unreachable objects, and on a GPU the blocks the
    caching allocator keeps (``torch.cuda.empty_cache``), so the next stage plans with them free."""
    from specdecode.engine import clear_static_sessions

    clear_static_sessions()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def reset_peak_memory(device: torch.device) -> None:
    """Start measuring a new stage's peak on a CUDA ``device`` (the host's peak, the process's
    resident-set high-water mark, cannot be reset: on the CPU each stage reports the peak so far)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_mib(device: torch.device | None = None) -> float:
    """Peak memory in MiB: ``torch.cuda.max_memory_allocated`` for a CUDA device (since the
    last :func:`reset_peak_memory`), else the resident set size of this process on the host
    (``getrusage``)."""
    if device is not None and device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 2**10  # bytes on macOS, KiB on Linux


def memory_error(exc: BaseException, stage: str, hint: str) -> OutOfDeviceMemory | None:
    """An :class:`OutOfDeviceMemory` naming ``stage`` and ``hint`` (what to lower) when ``exc``
    is torch running out of device or host memory, else None."""
    oom = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
    text = str(exc)
    if not (isinstance(exc, oom) or (isinstance(exc, RuntimeError) and ("out of memory" in text
                                                                         or "can't allocate memory" in text))):
        return None
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return OutOfDeviceMemory(f"out of memory in {stage} ({first[:120]}); {hint}")


@contextmanager
def memory_errors(stage: str, hint: str) -> Iterator[None]:
    """Runs its block, turning torch running out of memory into :class:`OutOfDeviceMemory`
    naming ``stage`` and ``hint`` (:func:`memory_error`); other errors pass through."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - only memory errors are translated
        error = memory_error(exc, stage, hint)
        if error is None:
            raise
        raise error from exc
