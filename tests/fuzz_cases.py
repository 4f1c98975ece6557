"""The case builders of the fuzz harness (``fuzz_ops.py``): the pieces every case is made of
(sizes, dtypes, tensor values with special entries, non-contiguous layouts, wrong shapes, meta
tensors), and the verification ops' and entry points' case builders with their corruptions
(``VERIFY_BREAKS``). Each builder takes a seeded ``random.Random`` and at most one corruption
and returns a ``Case``; tensor values come from a seeded torch generator.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

import torch

FLOAT_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
BAD_DTYPES = [torch.int64, torch.int32, torch.bool, torch.complex64, torch.uint8]
RULES = ["token", "block", "greedy", "typical", "top_beta"]
BAD_RULES = ["", "TOKEN", "tokens", "nope", "greedy ", "top-beta"]
WEIRD_FLOATS = [math.nan, math.inf, -math.inf, -1.0, 0.0, 1.0, 1.5, 1e300, -1e-300]


# ------------------------------------------------------------------------------ case pieces


@dataclass
class Case:
    """What one call is made of. ``args`` / ``kwargs`` are the call's arguments; the other
    fields tell the check what a valid result looks like."""

    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    batch: int = 0
    gamma: int = 0
    vocab: int = 0
    num_draft: torch.Tensor | None = None  # [B] effective draft counts (None: all gamma)
    draft_tokens: torch.Tensor | None = None
    logits: torch.Tensor | None = None  # sampling: the logits (argmax check at temperature 0)
    greedy: bool = False
    meta: bool = False  # a meta tensor among the inputs: only shapes / dtypes are checked
    device: torch.device = torch.device("cpu")

    def __repr__(self) -> str:
        def short(v: Any) -> str:
            if isinstance(v, torch.Tensor):
                return f"Tensor({tuple(v.shape)}, {v.dtype}, {v.device}, contiguous={v.is_contiguous()})"
            return repr(v)

        args = ", ".join(short(a) for a in self.args)
        kwargs = ", ".join(f"{k}={short(v)}" for k, v in self.kwargs.items())
        return f"Case({args}; {kwargs})"


def tensor_values(kind: str, shape: tuple, dtype: torch.dtype, gen: torch.Generator, special: str) -> torch.Tensor:
    """A float tensor of ``shape``: logits (``kind == 'logits'``) or probabilities, with an
    optional special value planted (NaN, +-inf, an all -inf / all-zero row, negatives)."""
    base = torch.randn(shape, generator=gen, dtype=torch.float64) * 3.0
    if kind == "probs":
        base = torch.softmax(base, -1)
    numel = base.numel()
    if numel and special != "none":
        flat = base.view(-1)
        where = int(torch.randint(0, numel, (1,), generator=gen))
        if special == "nan":
            flat[where] = math.nan
        elif special == "posinf":
            flat[where] = math.inf
        elif special == "neginf":
            flat[where] = -math.inf
        elif special == "dead_row":  # a whole row without mass
            rows = base.view(-1, shape[-1])
            rows[where % rows.shape[0]] = -math.inf if kind == "logits" else 0.0
        elif special == "negative":
            flat[where] = -0.25
        elif special == "huge":
            flat[where] = 1e30 if kind == "logits" else 2.0
        elif special == "ties":  # many exact ties
            base = base.round()
    if dtype.is_floating_point:
        return base.to(dtype)
    if dtype.is_complex:
        return base.to(dtype)
    return base.abs().floor().to(dtype)


def layout(t: torch.Tensor, noncontiguous: bool) -> torch.Tensor:
    """The same values in a non-contiguous tensor (a strided view into a bigger buffer)."""
    if not noncontiguous or t.dim() == 0 or t.numel() == 0:
        return t
    wide = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype, device=t.device)
    wide[..., ::2] = t
    return wide[..., ::2]


def any_meta(args: tuple) -> bool:
    return any(isinstance(a, torch.Tensor) and a.device.type == "meta" for a in args)


def to_meta(t: Any) -> Any:
    return torch.empty(t.shape, dtype=t.dtype, device="meta") if isinstance(t, torch.Tensor) else t


def _wrong_shape(t: torch.Tensor, how: int) -> torch.Tensor:
    if how == 0:
        return t[None]  # one dimension too many
    if how == 1:
        return t.reshape(-1) if t.dim() > 1 else t.reshape(1, -1)  # one too few / too many
    if how == 2:  # first dimension off by one
        return torch.cat([t, t[:1]], 0) if t.shape[0] else torch.zeros((1, *t.shape[1:]), dtype=t.dtype)
    extra = torch.zeros((*t.shape[:-1], 1), dtype=t.dtype)  # last dimension off by one
    return torch.cat([t, extra], -1) if t.dim() else t


# Each verification case draws one "spec": valid sizes, dtypes and settings (edge sizes such as
# B = 0, V = 1 and ragged counts included), plus at most ONE corruption ("break"), so that about
# half of the calls are valid and reach the kernels, and every rejection has a single cause.
VERIFY_BREAKS = [
    "dtype_bad", "draft_dtype_other", "draft_dtype_bad", "no_draft",
    "tokens_too_big", "tokens_negative", "tokens_huge", "tokens_int32", "tokens_float",
    "counts_negative", "counts_too_big", "counts_int32", "counts_shape",
    "uniforms_one", "uniforms_negative", "uniforms_nan", "uniforms_float32", "uniforms_shape",
    "shape_target", "shape_draft", "shape_tokens", "shape_uniforms", "gamma_zero",
    "meta_all", "meta_target", "meta_draft", "meta_tokens", "meta_counts", "meta_uniforms",
    "rule_bad", "params_short", "params_long", "params_weird",
    "temperature_bad", "top_k_bad", "top_p_bad", "min_p_bad", "philox_bad", "python_type", "generator_bad",
    "meta_none", "nan", "posinf", "neginf", "dead_row", "negative", "huge",
]


def sampling_choices(rng: random.Random) -> dict[str, Any]:
    """A case's sampling settings (temperature, top-k, top-p, min-p), extreme values included:
    the same draws for the verification and the sampling cases."""
    return {
        "temperature": rng.choice([1.0, 1.0, 0.7, 0.0, 2.5, 1e-6, 1e-40, 1e30]),
        "top_k": rng.choice([0, 0, 0, 1, 3, 10**9]),
        "top_p": rng.choice([1.0, 1.0, 1.0, 0.9, 0.3]),
        "min_p": rng.choice([0.0, 0.0, 0.0, 0.1, 1.0]),
    }


def verify_spec(rng: random.Random, brk: str) -> dict[str, Any]:
    """The details of one verification case; ``brk`` is its one corruption (or 'none')."""
    return {
        "seed": rng.randint(0, 2**31 - 1),
        "B": rng.choice([0, 1, 1, 2, 3, 5]),
        "gamma": rng.choice([1, 1, 2, 3, 5]),
        "V": rng.choice([1, 1, 2, 3, 7, 33, 300]),
        "dtype": rng.choice(FLOAT_DTYPES),
        "counts": rng.choice(["none", "full", "ragged", "ragged"]),
        "special_in": rng.choice(["target", "draft"]),
        "ties": rng.choice([False, False, False, True]),
        "noncontiguous": rng.choice([False, False, True]),
        "rule": rng.choice(RULES),
        "params": rng.choice(["default", "default", "custom"]),
        **sampling_choices(rng),
        "break": brk,
        "break_how": rng.randint(0, 3),
        "weird": rng.choice(WEIRD_FLOATS),
        "bad_rule": rng.choice(BAD_RULES),
        "bad_dtype": rng.choice(BAD_DTYPES),
    }


def sampling_args(s: dict) -> tuple[float, int, float, float]:
    """(temperature, top_k, top_p, min_p), one of them broken if the spec says so."""
    temperature, top_k, top_p, min_p = s["temperature"], s["top_k"], s["top_p"], s["min_p"]
    how = s["break_how"]
    if s["break"] == "temperature_bad":
        temperature = [-1.0, math.inf, math.nan, -0.0 - 1e-300][how]
    elif s["break"] == "top_k_bad":
        top_k = [-1, -(2**40), 2**70, -2][how]
    elif s["break"] == "top_p_bad":
        top_p = [0.0, 1.5, math.nan, -0.5][how]
    elif s["break"] == "min_p_bad":
        min_p = [-0.1, 1.5, math.nan, math.inf][how]
    return temperature, top_k, top_p, min_p


def _rule_name(s: dict) -> str:
    return s["bad_rule"] if s["break"] == "rule_bad" else s["rule"]


def _rule_params(s: dict) -> list[float]:
    """The op's rule_params for the spec's rule (custom values, or one broken list)."""
    rule = s["rule"]
    default = {"typical": [0.09, 0.3, 0.0], "top_beta": [2.0, 0.5]}.get(rule, [])
    custom = {"typical": [0.2, 0.5, 1.0], "top_beta": [1.0, 0.0]}.get(rule, [])
    if s["break"] == "params_short":
        return default[:-1] if default else []
    if s["break"] == "params_long":
        return default + [1.0]
    if s["break"] == "params_weird":
        return [s["weird"]] * len(default) if default else [s["weird"]]
    return custom if s["params"] == "custom" else default


def _rule_options(s: dict) -> dict[str, Any]:
    """The Python API's keyword options for the spec's rule (possibly broken)."""
    rule, weird = s["rule"], s["weird"]
    if s["break"] == "params_weird":
        return {"typical": {"epsilon": weird}, "top_beta": {"beta": weird}}.get(rule, {"epsilon": weird})
    if s["break"] == "params_short":
        return {"top_beta": {"beta": 0}, "typical": {"delta": -1.0}}.get(rule, {"tolerance": 1.0})
    if s["break"] == "params_long":
        return {"no_such_option": 1}
    if s["params"] == "custom":
        return {"typical": {"epsilon": 0.2, "sample_correction": True}, "top_beta": {"beta": 3, "tolerance": 0.5}}.get(
            rule, {})
    return {}


@dataclass
class Inputs:
    """The tensors of one verification call, after every requested corruption."""

    target: torch.Tensor
    draft: torch.Tensor | None
    tokens: torch.Tensor
    counts: torch.Tensor | None
    uniforms: torch.Tensor | None
    B: int
    gamma: int
    V: int
    meta: bool
    use_generator: bool


def _verify_inputs(s: dict, kind: str) -> Inputs:
    gen = torch.Generator().manual_seed(s["seed"])
    brk, how = s["break"], s["break_how"]
    B, V = s["B"], s["V"]
    gamma = 0 if brk == "gamma_zero" else s["gamma"]
    dtype = s["bad_dtype"] if brk == "dtype_bad" else s["dtype"]
    special = brk if brk in ("nan", "posinf", "neginf", "dead_row", "negative", "huge") else "none"
    special = "ties" if special == "none" and s["ties"] else special
    target = tensor_values(kind, (B, gamma + 1, V), dtype, gen, special if s["special_in"] == "target" else "none")
    draft_dtype = {"draft_dtype_other": torch.float64 if dtype != torch.float64 else torch.float32,
                   "draft_dtype_bad": s["bad_dtype"]}.get(brk, dtype)
    draft = tensor_values(kind, (B, gamma, V), draft_dtype, gen, special if s["special_in"] == "draft" else "none")
    draft = None if brk == "no_draft" else draft
    tokens = torch.randint(0, V, (B, gamma), generator=gen)
    if tokens.numel():
        if brk == "tokens_too_big":
            tokens[-1, 0] = V
        elif brk == "tokens_negative":
            tokens[0, -1] = -1
        elif brk == "tokens_huge":
            tokens[0, 0] = 2**62
    if brk == "tokens_int32":
        tokens = tokens.int()
    elif brk == "tokens_float":
        tokens = tokens.float()
    counts: torch.Tensor | None = None
    if s["counts"] == "full":
        counts = torch.full((B,), gamma)
    elif s["counts"] == "ragged":
        counts = torch.randint(0, gamma + 1, (B,), generator=gen)
    if brk.startswith("counts_"):
        counts = torch.full((B,), gamma) if counts is None else counts
        if brk == "counts_negative" and B:
            counts[-1] = -1
        elif brk == "counts_too_big" and B:
            counts[0] = gamma + 1
        elif brk == "counts_int32":
            counts = counts.int()
        elif brk == "counts_shape":
            counts = torch.full((B + 1,), gamma)
    uniforms: torch.Tensor | None = torch.rand((B, gamma + 1), generator=gen, dtype=torch.float64)
    special_u = {"uniforms_one": 1.0, "uniforms_negative": -0.5, "uniforms_nan": math.nan}.get(brk)
    if special_u is not None and uniforms.numel():
        uniforms[0, how % (gamma + 1)] = special_u
    elif brk == "uniforms_float32":
        uniforms = uniforms.float()
    elif brk == "uniforms_shape":
        uniforms = uniforms[:, :-1]
    if brk == "shape_target":
        target = _wrong_shape(target, how)
    elif brk == "shape_draft" and draft is not None:
        draft = _wrong_shape(draft, how)
    elif brk == "shape_tokens":
        tokens = _wrong_shape(tokens, how)
    elif brk == "shape_uniforms":
        uniforms = _wrong_shape(uniforms, how)
    nc = s["noncontiguous"]
    target, tokens = layout(target, nc), layout(tokens, nc)
    draft = layout(draft, nc) if draft is not None else None
    uniforms = layout(uniforms, nc)
    meta = brk[5:] if brk.startswith("meta_") else "none"
    if meta in ("all", "target"):
        target = to_meta(target)
    if meta in ("all", "draft"):
        draft = to_meta(draft)
    if meta in ("all", "tokens"):
        tokens = to_meta(tokens)
    if meta in ("all", "counts"):
        counts = to_meta(counts if counts is not None else torch.full((B,), gamma))
    if meta in ("all", "uniforms"):
        uniforms = to_meta(uniforms)
    return Inputs(target, draft, tokens, counts, uniforms, B, gamma, V, meta != "none", False)


def philox_pair(s: dict) -> tuple[Any, Any]:
    seed, offset = torch.tensor([s["seed"]]), torch.tensor([s["break_how"]])
    if s["break"] != "philox_bad":
        return seed, offset
    how = s["bad_philox"] if "bad_philox" in s else ["int32", "two", "empty", "meta"][s["break_how"]]
    if how == "int32":
        seed = seed.int()
    elif how == "two":
        offset = torch.tensor([1, 2])
    elif how == "empty":
        seed = torch.tensor([], dtype=torch.int64)
    elif how == "meta":
        seed, offset = to_meta(seed), to_meta(offset)
    elif how == "float":
        offset = offset.double()
    elif how == "python_int":
        seed = 5
    return seed, offset


def _verify_case(s: dict, inputs: Inputs, args: tuple, kwargs: dict | None = None) -> Case:
    counts = inputs.counts
    effective = None
    if isinstance(counts, torch.Tensor) and counts.device.type == "cpu" and counts.dim() == 1:
        effective = counts.long()
    first = args[0] if isinstance(args[0], torch.Tensor) else inputs.target
    return Case(args=args, kwargs=kwargs or {}, batch=inputs.B, gamma=inputs.gamma, vocab=inputs.V,
                num_draft=effective, draft_tokens=inputs.tokens, meta=inputs.meta or any_meta(args),
                device=first.device)


# ------------------------------------------------------------------------------ strategies
# One per target: each maps a drawn spec to the arguments of one call.


WRONG_PYTHON_VALUES = ["1", None, 2**70, [1.0, "x"], 1.5, object()]


def op_args(s: dict, args: tuple) -> tuple:
    """A direct op call's arguments; the "python_type" break puts a value of a wrong Python type
    (or an int that overflows int64) in one position, which torch's schema parsing rejects."""
    if s["break"] == "meta_none":  # the fake kernel's checks: all meta, one tensor None
        args = tuple(to_meta(a) for a in args)
        tensor_positions = [k for k, a in enumerate(args) if isinstance(a, torch.Tensor)]
        position = tensor_positions[s["seed"] % len(tensor_positions)]
        return args[:position] + (None,) + args[position + 1:]
    if s["break"] != "python_type":
        return args
    position = s["seed"] % len(args)
    value = WRONG_PYTHON_VALUES[s["break_how"] + (s["seed"] // 7) % 3]
    return args[:position] + (value,) + args[position + 1:]


def _op_counts_and_coins(i: Inputs) -> tuple[torch.Tensor, torch.Tensor]:
    """The ops take num_draft_tokens and uniforms as tensors: fill in the defaults."""
    if i.counts is None:
        i.counts = torch.full((i.B,), i.gamma)
    return i.counts, i.uniforms


def verify_probs_op_cases(rng: random.Random, brk: str) -> Case:
    s = verify_spec(rng, brk)
    i = _verify_inputs(s, "probs")
    counts, uniforms = _op_counts_and_coins(i)
    return _verify_case(s, i, op_args(s, (i.target, i.draft, i.tokens, counts, uniforms, _rule_name(s),
                                          _rule_params(s))))


def verify_logits_op_cases(rng: random.Random, brk: str) -> Case:
    s = verify_spec(rng, brk)
    i = _verify_inputs(s, "logits")
    counts, uniforms = _op_counts_and_coins(i)
    return _verify_case(s, i, op_args(s, (i.target, i.draft, i.tokens, counts, uniforms, *sampling_args(s),
                                          _rule_name(s), _rule_params(s))))


def verify_probs_philox_op_cases(rng: random.Random, brk: str) -> Case:
    s = verify_spec(rng, brk)
    i = _verify_inputs(s, "probs")
    counts, _ = _op_counts_and_coins(i)
    return _verify_case(s, i, op_args(s, (i.target, i.draft, i.tokens, counts, *philox_pair(s), _rule_name(s),
                                          _rule_params(s))))


def verify_logits_philox_op_cases(rng: random.Random, brk: str) -> Case:
    s = verify_spec(rng, brk)
    i = _verify_inputs(s, "logits")
    counts, _ = _op_counts_and_coins(i)
    return _verify_case(s, i, op_args(s, (i.target, i.draft, i.tokens, counts, *philox_pair(s),
                                          *sampling_args(s), _rule_name(s), _rule_params(s))))


COIN_SOURCES = ["uniforms"] * 4 + ["generator", "default", "philox", "uniforms_and_generator", "philox_and_uniforms"]


def _api_kwargs(s: dict, i: Inputs, coins: str) -> dict[str, Any]:
    """Keyword arguments of specdecode.verify / verify_logits: rule, options, counts, coins."""
    kwargs: dict[str, Any] = {"rule": _rule_name(s), **_rule_options(s)}
    if i.counts is not None:
        kwargs["num_draft_tokens"] = i.counts
    if coins in ("uniforms", "uniforms_and_generator", "philox_and_uniforms"):
        kwargs["uniforms"] = i.uniforms
    if coins in ("generator", "uniforms_and_generator"):
        kwargs["generator"] = torch.Generator().manual_seed(s["seed"])
    if s["break"] == "generator_bad":
        kwargs.pop("uniforms", None)
        kwargs["generator"] = ["gen", 5, torch.tensor(1), random.Random(0)][s["break_how"]]
    if coins in ("philox", "philox_and_uniforms"):
        kwargs["philox_seed"], kwargs["philox_offset"] = philox_pair(s)
    return kwargs


def verify_api_cases(rng: random.Random, brk: str) -> Case:
    s = verify_spec(rng, brk)
    i = _verify_inputs(s, "probs")
    kwargs = _api_kwargs(s, i, rng.choice(COIN_SOURCES))
    kwargs["validate"] = rng.choice([True, True, False])
    return _verify_case(s, i, (i.target, i.draft, i.tokens), kwargs)


def verify_logits_api_cases(rng: random.Random, brk: str) -> Case:
    s = verify_spec(rng, brk)
    i = _verify_inputs(s, "logits")
    kwargs = _api_kwargs(s, i, rng.choice(COIN_SOURCES))
    temperature, top_k, top_p, min_p = sampling_args(s)
    kwargs.update(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    if s["break"] == "none" and rng.randint(0, 9) == 0:  # a wrong Python type for one setting
        kwargs[rng.choice(["temperature", "top_k", "top_p", "min_p"])] = rng.choice(
            ["1", None, True, [1], torch.tensor(1.0)])
    return _verify_case(s, i, (i.target, i.draft, i.tokens), kwargs)
