"""Standardized sampling: one :class:`SamplingParams` for every layer, and drafting from logits.

Speculative decoding is lossless only if the draft token ``x`` is drawn from exactly the
distribution ``q`` that verification later reads. Both sides therefore process logits with the
same settings, in the same order (temperature, then top-k, then top-p, then min-p, each
renormalising) and with the same compiled code: :func:`sample_logits` draws with the kernels
the verification ops use to compute ``q``.

>>> import torch
>>> from specdecode.sampling import SamplingParams, sample_logits
>>> params = SamplingParams(temperature=0.8, top_p=0.9)
>>> logits = torch.randn(3, 111)
>>> sample_logits(logits, params, generator=torch.Generator().manual_seed(0)).shape
torch.Size([3])
>>> SamplingParams.greedy().is_greedy
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from specdecode._ops import ops

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


@dataclass(frozen=True)
class SamplingParams:
    """How logits become a distribution; applied identically to target and draft.

    ``temperature = 0`` is greedy decoding (the only switch for it in the library:
    :attr:`is_greedy`); ``top_k = 0``, ``top_p = 1`` and ``min_p = 0`` switch a filter off.
    Values are checked on construction: ``TypeError`` / ``ValueError`` name the field.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    def __post_init__(self) -> None:
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)):
            raise TypeError(f"temperature: expected a float, got {type(t).__name__}")
        if not (0.0 <= float(t) < math.inf):
            raise ValueError(f"temperature: expected a finite value >= 0 (0 = greedy), got {t}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int):
            raise TypeError(f"top_k: expected an int (0 = off), got {type(self.top_k).__name__}")
        if not 0 <= self.top_k < 2**63:
            raise ValueError(f"top_k: expected an int in [0, 2^63) (0 = off), got {self.top_k}")
        for name in ("top_p", "min_p"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{name}: expected a float, got {type(value).__name__}")
        if not (0.0 < float(self.top_p) <= 1.0):
            raise ValueError(f"top_p: expected a value in (0, 1] (1 = off), got {self.top_p}")
        if not (0.0 <= float(self.min_p) <= 1.0):
            raise ValueError(f"min_p: expected a value in [0, 1] (0 = off), got {self.min_p}")
        object.__setattr__(self, "temperature", float(t))
        object.__setattr__(self, "top_p", float(self.top_p))
        object.__setattr__(self, "min_p", float(self.min_p))

    @classmethod
    def greedy(cls) -> SamplingParams:
        """Temperature 0: argmax decoding (filters are irrelevant and switched off)."""
        return cls(temperature=0.0)

    @classmethod
    def from_generate_kwargs(cls, do_sample: bool = False, temperature: float | None = None,
                             top_k: int | None = None, top_p: float | None = None,
                             min_p: float | None = None) -> SamplingParams:
        """The ``model.generate`` convention: ``do_sample=False`` is greedy whatever the other
        values (which are still validated); ``None`` means the filter is off."""
        if not isinstance(do_sample, bool):
            raise TypeError(f"do_sample: expected a bool, got {do_sample!r}")
        params = cls(1.0 if temperature is None else temperature, 0 if top_k is None else top_k,
                     1.0 if top_p is None else top_p, 0.0 if min_p is None else min_p)
        return params if do_sample else cls.greedy()

    @property
    def is_greedy(self) -> bool:
        """True at temperature 0."""
        return self.temperature == 0.0

    @property
    def has_filters(self) -> bool:
        """True when top-k, top-p or min-p removes tokens."""
        return self.top_k > 0 or self.top_p < 1.0 or self.min_p > 0.0

    def op_args(self) -> tuple[float, int, float, float]:
        """``(temperature, top_k, top_p, min_p)`` as the compiled ops take them."""
        return (self.temperature, self.top_k, self.top_p, self.min_p)


def as_sampling_params(sampling: SamplingParams | None = None, **fields: Any) -> SamplingParams:
    """``sampling`` itself, or a :class:`SamplingParams` built from the keyword fields
    (``temperature``, ``top_k``, ``top_p``, ``min_p``); giving both is an error."""
    given = {k: v for k, v in fields.items() if v is not None}
    if sampling is None:
        return SamplingParams(**given)
    if not isinstance(sampling, SamplingParams):
        raise TypeError(f"sampling: expected a SamplingParams or None, got {type(sampling).__name__}")
    if given:
        raise ValueError(f"sampling: pass either sampling= or {sorted(given)}, not both")
    return sampling


def sample_logits(logits: Tensor, sampling: SamplingParams, *, generator: torch.Generator | None = None,
                  uniforms: Tensor | None = None) -> Tensor:
    """One token per row from the processed distribution of ``logits`` (argmax when greedy).

    Shape:
        logits: ``[B, V]`` float32 / float16 / bfloat16 / float64.
        uniforms: ``[B]`` float64 in [0, 1) or None — row b's inverse-CDF coin; None draws
            them from ``generator`` (on the generator's device, then moved to ``logits``').
        returns: ``[B]`` int64.

    The distribution is computed by the compiled code that verification uses (the op
    ``torch.ops.specdecode.sample_logits``), so it is exactly the ``q`` that a verify call
    given the same logits and ``sampling`` reads. NaN / ``+inf`` logits, or a row with no
    finite logit, raise ``ValueError``.
    """
    if not isinstance(logits, Tensor):
        raise TypeError(f"logits: expected a torch.Tensor of shape [B, V], got {type(logits).__name__}")
    if logits.dim() != 2:
        raise ValueError(f"logits: expected shape [B, V], got {tuple(logits.shape)}")
    if logits.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"logits: expected float32, float16, bfloat16 or float64, got {logits.dtype}")
    if not isinstance(sampling, SamplingParams):
        raise TypeError(f"sampling: expected a SamplingParams, got {type(sampling).__name__}")
    B = logits.shape[0]
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator: expected a torch.Generator or None, got {type(generator).__name__}")
    if uniforms is None:
        device = generator.device if generator is not None else logits.device
        uniforms = torch.rand(B, dtype=torch.float64, device=device, generator=generator).to(logits.device)
    else:
        if generator is not None:
            raise ValueError("uniforms: pass either generator or uniforms, not both")
        if not isinstance(uniforms, Tensor):
            raise TypeError(f"uniforms: expected a torch.Tensor of shape [B] = [{B}], got {type(uniforms).__name__}")
        if uniforms.dim() != 1 or uniforms.shape[0] != B:
            raise ValueError(f"uniforms: expected shape [B] = [{B}], got {tuple(uniforms.shape)}")
        if uniforms.dtype not in (torch.float32, torch.float64):
            raise TypeError(f"uniforms: expected float64 (or float32), got {uniforms.dtype}")
        if uniforms.device != logits.device:
            raise ValueError(f"uniforms: expected device {logits.device}, got {uniforms.device}")
        uniforms = uniforms.to(torch.float64)
        if uniforms.device.type != "meta" and bool(((uniforms < 0) | (uniforms >= 1) | uniforms.isnan()).any()):
            raise ValueError("uniforms: every value must lie in [0, 1)")
    return ops.sample_logits(logits, uniforms, *sampling.op_args())


def processed_probs(logits: Tensor, sampling: SamplingParams) -> Tensor:
    """The processed distribution of every logit row, as the compiled ops compute it.

    Shape:
        logits: ``[B, V]`` float32 / float16 / bfloat16 / float64.
        returns: ``[B, V]`` float64, rows summing to 1 (one-hot on the argmax when greedy).

    These are exactly the weights :func:`sample_logits` draws from and the verification ops
    read as ``p`` / ``q``; use them for draws no kernel covers (children drawn without
    replacement for a token tree) so that the drafted law stays the verified one.
    """
    if not isinstance(logits, Tensor):
        raise TypeError(f"logits: expected a torch.Tensor of shape [B, V], got {type(logits).__name__}")
    if not isinstance(sampling, SamplingParams):
        raise TypeError(f"sampling: expected a SamplingParams, got {type(sampling).__name__}")
    return ops.processed_probs(logits, *sampling.op_args())
