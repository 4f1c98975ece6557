"""The target's continuations of prompts, the data stage's generations, on specdecode's own
decode path.

:func:`continue_prompts` samples each prompt's continuation from the target's plain law,
``softmax(logits / temperature)`` with no filter (argmax at temperature 0), through the static
decode path of :mod:`specdecode.engine.static_loop` with the target alone: ``"static"`` on the
CPU (static caches, every step decided by tensor operations, the CPU fast path of
:mod:`specdecode.cpu` for float32 targets), ``"graphed"`` on CUDA (the same steps recorded once as
CUDA graphs and replayed). The coins come from Philox counters seeded by a ``torch.Generator``
made from the batch's seed, so a batch's continuations are a function of its seed, whatever ran
before. The batch is left-padded to its longest prompt, or to ``width`` when given: the data stage
(:func:`specdecode.training.data.distill_examples`) passes one width and one row count for the
whole stage on CUDA, so that every batch reuses one static layout (its caches and graphs).

A target that the static path refuses (:mod:`specdecode.engine.static_checks`: sharded or
offloaded models, attention that ignores custom 4D masks, a build without the CUDA kernels,
devices other than the CPU and CUDA) is
continued by Hugging Face's ``target.generate`` instead, with a one-line warning that says why.
``decode_path="hf_generate"`` asks for that path (the baseline of
``benchmarks/bench_data_stage.py``); its sampling also uses the target's ``generation_config``
besides the temperature (repetition penalties and the like, when it sets any).

:func:`continue_and_label` makes the same continuations (the same tokens for the same seed) and
keeps what the decode steps computed on the way: the target's top-``k`` log-probabilities at
every new position and its hidden states at every position
(:class:`specdecode.engine.static_target.TargetOnly`), so that the data stage needs no second,
labelling forward. Each row is then the prompt and every new token but the last (whose own next
distribution was never computed), labelled from the last prompt position on.
"""

from __future__ import annotations

import warnings
from contextlib import nullcontext
from typing import Any, Sequence

import torch
from torch import Tensor

__all__ = ["DATA_DECODE_PATHS", "continue_and_label", "continue_prompts", "data_decode_path", "pad_id"]

#: The paths :func:`continue_prompts` takes: ``"auto"`` picks ``"graphed"`` on CUDA and
#: ``"static"`` on the CPU; ``"hf_generate"`` is Hugging Face's ``target.generate``.
DATA_DECODE_PATHS = ("auto", "static", "graphed", "hf_generate")


def pad_id(target: Any) -> int:
    """The id that pads the target's batches: its generation config's pad id, else its first
    EOS id, else its config's pad id, else 0."""
    config = target.generation_config
    for value in (config.pad_token_id, config.eos_token_id, target.config.pad_token_id):
        if isinstance(value, list):
            value = value[0] if value else None
        if value is not None:
            return int(value)
    return 0


def _eos_ids(target: Any) -> tuple[int, ...]:
    eos = target.generation_config.eos_token_id
    return tuple(int(i) for i in (eos if isinstance(eos, list) else [] if eos is None else [eos]))


def _device(target: Any) -> torch.device:
    return next(target.parameters()).device


def _engine_settings(target: Any, temperature: float, max_new_tokens: int, seed: int | None) -> Any:
    """The static engine's settings for the target's plain law (no filters, no processors)."""
    from specdecode.engine.schedules import make_schedule
    from specdecode.engine.settings import EngineSettings
    from specdecode.models.facts import vocab_rows
    from specdecode.sampling import SamplingParams

    sampling = SamplingParams.greedy() if temperature == 0 else SamplingParams(temperature=temperature)
    return EngineSettings(sampling=sampling, rule=None, max_new_tokens=max_new_tokens, pad_id=pad_id(target),
                          schedule=make_schedule("constant", 1, None), vocab_size=vocab_rows(target),
                          eos_ids=_eos_ids(target),
                          generator=None if seed is None else torch.Generator().manual_seed(seed))


def _refusal(target: Any, settings: Any, decode_path: str) -> str | None:
    """Why the static path cannot continue prompts of ``target`` (its one-line ``ValueError``
    message), or None."""
    from specdecode.engine.static_checks import check_static_path

    try:
        check_static_path(target, None, _engine_settings(target, settings.temperature, settings.max_new_tokens, None),
                          decode_path)
    except ValueError as exc:
        return str(exc)
    return None


def _fall_back(reason: str) -> str:
    warnings.warn(f"data: the target's continuations fall back to Hugging Face generate: {reason}", UserWarning,
                  stacklevel=3)
    return "hf_generate"


def data_decode_path(target: Any, settings: Any, decode_path: str = "auto") -> str:
    """The path :func:`continue_prompts` takes for ``target`` under ``settings`` (a
    :class:`~specdecode.training.data.DataSettings`): ``decode_path`` itself, or for ``"auto"``
    ``"graphed"`` on CUDA and ``"static"`` on the CPU; ``"hf_generate"`` (with a one-line warning
    that says why) where the static path refuses the target or its device."""
    if decode_path not in DATA_DECODE_PATHS:
        raise ValueError(f"decode_path: expected one of {DATA_DECODE_PATHS}, got {decode_path!r}")
    if decode_path == "hf_generate":
        return decode_path
    device = _device(target)
    if decode_path == "auto":
        if device.type not in ("cpu", "cuda"):
            return _fall_back(f"the static decode path runs on the CPU and CUDA, the target is on {device}")
        decode_path = "graphed" if device.type == "cuda" else "static"
    reason = _refusal(target, settings, decode_path)
    return decode_path if reason is None else _fall_back(reason)


def _check_prompts(prompts: Any) -> list[list[int]]:
    if not isinstance(prompts, Sequence) or isinstance(prompts, (str, bytes)) or len(prompts) == 0:
        raise ValueError(f"prompts: expected a non-empty list of token-id lists, got {type(prompts).__name__}")
    out = []
    for i, prompt in enumerate(prompts):
        if not isinstance(prompt, (list, tuple)) or not prompt or not all(
                isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt):
            raise ValueError(f"prompts[{i}]: expected a non-empty list of token ids (ints >= 0)")
        out.append(list(prompt))
    return out


def _left_padded(prompts: list[list[int]], pad: int, width: int, rows: int) -> tuple[Tensor, Tensor]:
    """``(input_ids, attention_mask)`` ``[rows, width]``: the prompts left-padded, then copies of
    the first prompt up to ``rows`` (their continuations are dropped)."""
    ids = torch.full((rows, width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row in range(rows):
        prompt = prompts[row] if row < len(prompts) else prompts[0]
        ids[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = 1
    return ids, mask


def _static_generate(target: Any, ids: Tensor, mask: Tensor, settings: Any, decode_path: str,
                     seed: int, drafter: Any = None) -> Tensor:
    from specdecode import cpu, grouped_attention
    from specdecode.engine.static_loop import StaticEngine, TargetOnly

    engine_settings = _engine_settings(target, settings.temperature, settings.max_new_tokens, seed)
    on_gpu = _device(target).type == "cuda"  # grouped heads without copying the cache (the CPU has its own op)
    with cpu.accelerated(target), (grouped_attention.installed(target) if on_gpu else nullcontext()):
        engine = StaticEngine(target, TargetOnly() if drafter is None else drafter, engine_settings,
                              decode_path=decode_path)
        return engine.generate(ids, mask)


def _hf_generate(target: Any, ids: Tensor, mask: Tensor, settings: Any, seed: int) -> Tensor:
    device = _device(target)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        sampling = (dict(do_sample=True, temperature=settings.temperature, top_k=0, top_p=1.0)
                    if settings.temperature > 0 else dict(do_sample=False))
        return target.generate(ids.to(device), attention_mask=mask.to(device),
                               max_new_tokens=settings.max_new_tokens, pad_token_id=pad_id(target), **sampling)


@torch.no_grad()
def continue_prompts(target: Any, prompts: list[list[int]], settings: Any, batch_seed: int, *,
                     decode_path: str = "auto", width: int | None = None,
                     rows: int | None = None) -> list[list[int]]:
    """The prompts followed by the target's continuations, sampled from its plain law at
    ``settings.temperature`` (argmax at 0) for up to ``settings.max_new_tokens`` tokens, each
    cut after its first EOS; seeded by ``batch_seed`` alone.

    ``settings``: a :class:`~specdecode.training.data.DataSettings`. ``decode_path``: one of
    :data:`DATA_DECODE_PATHS` (see the module docstring; a refused static path falls back to
    ``"hf_generate"`` with a warning). ``width`` / ``rows``: left-pad the batch to at least
    ``width`` columns and ``rows`` rows (extra rows repeat the first prompt and are dropped), so
    that batches of one stage share a static layout. ``prompts`` is not modified.
    """
    prompts, path, ids, mask, width = _batch(target, prompts, settings, batch_seed, decode_path, width, rows)
    if path == "hf_generate":
        out = _hf_generate(target, ids, mask, settings, batch_seed)
    else:
        out = _static_generate(target, ids, mask, settings, path, batch_seed)
    eos_ids = set(_eos_ids(target))
    result = []
    for row, prompt in enumerate(prompts):
        new = out[row, width:].tolist()
        cut = next((i + 1 for i, t in enumerate(new) if t in eos_ids), len(new))
        result.append(prompt + new[:cut])
    return result


@torch.no_grad()
def continue_and_label(target: Any, prompts: list[list[int]], settings: Any, batch_seed: int, *,
                       decode_path: str = "auto", width: int | None = None,
                       rows: int | None = None) -> list[dict[str, Any]] | None:
    """The continuations of :func:`continue_prompts` (the same tokens for the same seed) with the
    labels their decode steps computed: per prompt, the fields of
    :class:`specdecode.training.data.Example` (``input_ids``: the prompt and every new token
    but the last; ``top_logp`` / ``top_ids``: the target's top ``settings.top_k``
    log-probabilities from the last prompt position on, zeros before; ``features``: its hidden
    states at ``settings.feature_layers``, or None; ``start``: the last prompt position).
    Returns None where the continuations take Hugging Face's ``generate`` (the caller labels
    them with a forward of its own). Arguments as :func:`continue_prompts`.

    Shape:
        per row: ``input_ids`` ``[t]`` int64; ``top_logp`` ``[t, k]`` float16; ``top_ids``
        ``[t, k]`` int32; ``features`` ``[t, F]`` float16 or None.

    Example::

        settings = DataSettings(max_new_tokens=96, temperature=0.7, top_k=64, feature_layers=(-1,))
        rows = continue_and_label(target, [[1, 2, 3], [4, 5]], settings, batch_seed=0)
        examples = [Example(**row) for row in rows]
    """
    from specdecode.engine.static_target import TargetOnly

    prompts, path, ids, mask, _ = _batch(target, prompts, settings, batch_seed, decode_path, width, rows)
    if path == "hf_generate":
        return None
    labeller = TargetOnly(feature_layers=settings.feature_layers, label_top_k=settings.top_k)
    _static_generate(target, ids, mask, settings, path, batch_seed, labeller)
    return labeller.labelled_rows(len(prompts))


def _batch(target: Any, prompts: Any, settings: Any, batch_seed: Any, decode_path: str, width: Any,
           rows: Any) -> tuple[list[list[int]], str, Tensor, Tensor, int]:
    """The checked prompts, the path taken, the left-padded ``(input_ids, attention_mask)`` and
    their width."""
    prompts = _check_prompts(prompts)
    if not all(hasattr(settings, name) for name in ("temperature", "max_new_tokens")):
        raise TypeError(f"settings: expected a DataSettings, got {type(settings).__name__}")
    if isinstance(batch_seed, bool) or not isinstance(batch_seed, int):
        raise TypeError(f"batch_seed: expected an int, got {type(batch_seed).__name__}")
    longest = max(len(p) for p in prompts)
    width = longest if width is None else width
    rows = len(prompts) if rows is None else rows
    if isinstance(width, bool) or not isinstance(width, int) or width < longest:
        raise ValueError(f"width: expected an int >= the longest prompt ({longest}), got {width!r}")
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < len(prompts):
        raise ValueError(f"rows: expected an int >= the number of prompts ({len(prompts)}), got {rows!r}")
    path = data_decode_path(target, settings, decode_path)
    ids, mask = _left_padded(prompts, pad_id(target), width, rows)
    return prompts, path, ids, mask, width
