"""Fuzz harness for every public op and Python entry point, run by ``test_robustness.py`` in a
subprocess (a segfault or abort then fails that test instead of killing pytest).

Contract checked on every call: it either returns a VALID result, or raises ``ValueError`` /
``TypeError``. Valid means: the documented shapes and dtype (int64) on the inputs' device;
for verification, ``0 <= accepted_len[b] <= num_draft_tokens[b]``, the first
``accepted_len[b]`` tokens are the drafts, the next is an id in ``[0, V)`` and the rest are
``-1``; for sampling, ids in ``[0, V)`` (the argmax at temperature 0). Meta tensors go through
the fake kernels, whose results are checked for shape and dtype only.

One other exception is legitimate, for direct ``torch.ops.specdecode.*`` calls only: torch
parses a call's Python arguments against the op schema before any specdecode code runs and
raises ``RuntimeError`` ("Expected a value of type ...") for a value of the wrong Python type or
an int beyond int64 (``SCHEMA_ERRORS``). The Python API checks types itself (TypeError).
Meta tensors are accepted everywhere: the ops' fake kernels and the Python API (which skips
its value checks on meta) return meta outputs of the right shapes.

Structure: one ``FuzzTarget`` per op / entry point = its corruptions (``breaks``), its
strategy (hypothesis draws a seed and at most one corruption; ``cases(rng, brk)`` builds the
case's details - sizes including B = 0 and V = 1, dtypes, ragged counts, non-contiguous layouts,
settings - from the seeded rng, and tensor values from a seeded torch generator, which keeps
generation fast), ``run`` (case -> the call) and ``check`` (case, result -> AssertionError if
invalid). A new op adds one case builder and one check (or reuses them) and appends its
target to ``TARGETS``. The case pieces and the verification ops' case builders live in
``fuzz_cases.py``; the sampling ones, the checks and the targets here.

    python tests/fuzz_ops.py                      # every target, the default number of calls
    python tests/fuzz_ops.py --scale 0.1 -t sample_logits_op
Hypothesis runs derandomized (a fixed seed per target), so a run is reproducible; the case
being run is written to ``--last-case`` before each call, so a crash can be replayed.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from fuzz_cases import (  # the case pieces and the verification cases
    BAD_DTYPES,
    FLOAT_DTYPES,
    VERIFY_BREAKS,
    Case,
    any_meta,
    layout,
    op_args,
    philox_pair,
    sampling_args,
    sampling_choices,
    tensor_values,
    to_meta,
    verify_api_cases,
    verify_logits_api_cases,
    verify_logits_op_cases,
    verify_logits_philox_op_cases,
    verify_probs_op_cases,
    verify_probs_philox_op_cases,
)
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import specdecode
from specdecode.sampling import SamplingParams, sample_logits

OPS = torch.ops.specdecode
ALLOWED = (ValueError, TypeError)
# torch's own parsing of a direct op call's arguments against the op schema raises RuntimeError
# for a Python value of the wrong type (or an int beyond int64) before any specdecode code runs;
# legitimate for direct torch.ops.specdecode.* calls only (the Python API checks types itself).
SCHEMA_ERRORS = ("Expected a value of type", "is missing value for argument")


def is_schema_error(exc: BaseException) -> bool:
    return type(exc) is RuntimeError and any(text in str(exc) for text in SCHEMA_ERRORS)


SAMPLE_BREAKS = [
    "dtype_bad", "ndim_1", "ndim_3", "vocab_zero",
    "uniforms_one", "uniforms_negative", "uniforms_nan", "uniforms_float32", "uniforms_shape", "uniforms_2d",
    "meta_all", "meta_logits", "meta_uniforms",
    "temperature_bad", "top_k_bad", "top_p_bad", "min_p_bad", "philox_bad", "python_type", "generator_bad",
    "uniforms_int64", "meta_none",
    "nan", "posinf", "neginf", "dead_row", "huge",
]

def sample_spec(rng: random.Random, brk: str) -> dict[str, Any]:
    """The details of one sampling case; ``brk`` is its one corruption (or 'none')."""
    return {
        "seed": rng.randint(0, 2**31 - 1),
        "B": rng.choice([0, 1, 1, 2, 4, 9]),
        "V": rng.choice([1, 1, 2, 5, 33, 1000]),
        "dtype": rng.choice(FLOAT_DTYPES),
        "ties": rng.choice([False, False, False, True]),
        "noncontiguous": rng.choice([False, False, True]),
        **sampling_choices(rng),
        "break": brk,
        "break_how": rng.randint(0, 3),
        "bad_dtype": rng.choice(BAD_DTYPES),
    }


def _sample_inputs(s: dict) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(s["seed"])
    brk = s["break"]
    B, V = s["B"], 0 if brk == "vocab_zero" else s["V"]
    shape = {"ndim_1": (V,), "ndim_3": (B, 1, V)}.get(brk, (B, V))
    dtype = s["bad_dtype"] if brk == "dtype_bad" else s["dtype"]
    special = brk if brk in ("nan", "posinf", "neginf", "dead_row", "huge") else ("ties" if s["ties"] else "none")
    logits = layout(tensor_values("logits", shape, dtype, gen, special), s["noncontiguous"])
    uniforms = torch.rand((B,), generator=gen, dtype=torch.float64)
    special_u = {"uniforms_one": 1.0, "uniforms_negative": -0.5, "uniforms_nan": math.nan}.get(brk)
    if special_u is not None and B:
        uniforms[s["break_how"] % B] = special_u
    elif brk == "uniforms_float32":
        uniforms = uniforms.float()
    elif brk == "uniforms_shape":
        uniforms = torch.rand((B + 1,), dtype=torch.float64)
    elif brk == "uniforms_2d":
        uniforms = uniforms[:, None]
    elif brk == "uniforms_int64":
        uniforms = uniforms.long()
    if brk in ("meta_all", "meta_logits"):
        logits = to_meta(logits)
    if brk in ("meta_all", "meta_uniforms"):
        uniforms = to_meta(uniforms)
    return logits, uniforms


def _sample_case(s: dict, logits: Any, args: tuple, kwargs: dict | None = None,
                 uniforms: Any = None) -> Case:
    if not isinstance(logits, torch.Tensor):  # rejected anyway
        return Case(args=args, kwargs=kwargs or {})
    if isinstance(args[0], torch.Tensor):
        logits = args[0]
    meta = any_meta(args) or (isinstance(uniforms, torch.Tensor) and uniforms.device.type == "meta")
    return Case(args=args, kwargs=kwargs or {}, batch=logits.shape[0] if logits.dim() else 0,
                vocab=logits.shape[-1] if logits.dim() else 0, logits=logits,
                greedy=sampling_args(s)[0] == 0.0, meta=meta, device=logits.device)


def sample_logits_op_cases(rng: random.Random, brk: str) -> Case:
    s = sample_spec(rng, brk)
    logits, uniforms = _sample_inputs(s)
    return _sample_case(s, logits, op_args(s, (logits, uniforms, *sampling_args(s))), uniforms=uniforms)


def sample_logits_philox_op_cases(rng: random.Random, brk: str) -> Case:
    s = sample_spec(rng, brk)
    logits, _ = _sample_inputs(s)
    return _sample_case(s, logits, op_args(s, (logits, *philox_pair(s), *sampling_args(s))))


def sample_logits_api_cases(rng: random.Random, brk: str) -> Case:
    s = sample_spec(rng, brk)
    logits, uniforms = _sample_inputs(s)
    how = rng.choice(["params"] * 8 + ["tuple", "none", "dict"])
    if s["break"] == "python_type":
        logits = [[0.0, 1.0]]  # not a tensor
    sampling: Any
    try:
        sampling = SamplingParams(*sampling_args(s))
    except ALLOWED:  # broken settings are rejected when the SamplingParams is built
        sampling = SamplingParams()
    if how == "tuple":
        sampling = sampling_args(s)
    elif how == "none":
        sampling = None
    elif how == "dict":
        sampling = {"temperature": 1.0}
    coins = rng.choice(["uniforms"] * 3 + ["generator", "default", "uniforms_and_generator"])
    kwargs: dict[str, Any] = {}
    if coins in ("uniforms", "uniforms_and_generator"):
        kwargs["uniforms"] = uniforms
    if coins in ("generator", "uniforms_and_generator"):
        kwargs["generator"] = torch.Generator().manual_seed(s["seed"])
    if s["break"] == "generator_bad":
        kwargs.pop("uniforms", None)
        kwargs["generator"] = ["gen", 5, torch.tensor(1), random.Random(0)][s["break_how"]]
    case = _sample_case(s, logits, (logits, sampling), kwargs, uniforms=kwargs.get("uniforms"))
    case.greedy = isinstance(sampling, SamplingParams) and sampling.is_greedy
    return case


# ------------------------------------------------------------------------------ checks


def check_verify_result(case: Case, result: Any) -> None:
    tokens, accepted_len = result
    B, gamma = case.batch, case.gamma
    assert isinstance(tokens, torch.Tensor) and isinstance(accepted_len, torch.Tensor), type(result)
    assert tuple(tokens.shape) == (B, gamma + 1), f"tokens shape {tuple(tokens.shape)}, expected {(B, gamma + 1)}"
    assert tuple(accepted_len.shape) == (B,), f"accepted_len shape {tuple(accepted_len.shape)}, expected {(B,)}"
    assert tokens.dtype == torch.int64 and accepted_len.dtype == torch.int64, (tokens.dtype, accepted_len.dtype)
    assert tokens.device == case.device and accepted_len.device == case.device, (tokens.device, case.device)
    if case.meta or tokens.device.type == "meta":
        return
    counts = case.num_draft if case.num_draft is not None else torch.full((B,), gamma)
    drafts = case.draft_tokens.long()
    for b in range(B):
        tau = int(accepted_len[b])
        assert 0 <= tau <= int(counts[b]) <= gamma, f"row {b}: accepted_len {tau}, num_draft_tokens {int(counts[b])}"
        row = tokens[b].tolist()
        assert row[:tau] == drafts[b, :tau].tolist(), f"row {b}: accepted tokens {row[:tau]} are not the drafts"
        assert 0 <= row[tau] < case.vocab, f"row {b}: emitted token {row[tau]} not in [0, {case.vocab})"
        assert all(t == -1 for t in row[tau + 1:]), f"row {b}: padding {row[tau + 1:]} is not -1"


def check_verify_output(case: Case, result: Any) -> None:
    assert isinstance(result, specdecode.VerifyOutput), type(result)
    check_verify_result(case, (result.tokens, result.accepted_len))


def check_sample_result(case: Case, result: Any) -> None:
    assert isinstance(result, torch.Tensor), type(result)
    assert tuple(result.shape) == (case.batch,), f"shape {tuple(result.shape)}, expected {(case.batch,)}"
    assert result.dtype == torch.int64, result.dtype
    assert result.device == case.device, (result.device, case.device)
    if case.meta or result.device.type == "meta":
        return
    assert bool(((result >= 0) & (result < case.vocab)).all()), f"ids {result.tolist()} not in [0, {case.vocab})"
    if case.greedy and case.batch:
        best = case.logits.float().argmax(-1)
        assert torch.equal(result, best), f"temperature 0: {result.tolist()} is not the argmax {best.tolist()}"


# ------------------------------------------------------------------------------ targets


@dataclass
class FuzzTarget:
    """One op or entry point under fuzz.

    ``breaks``: the corruptions its cases may carry (one per case, or none); ``cases(rng,
    brk)``: builds one Case (the target's strategy: hypothesis draws a seed and the break, the
    seeded ``rng`` the remaining details); ``run``: makes the call; ``check``: raises
    AssertionError when a returned result is invalid."""

    name: str
    breaks: list[str]
    cases: Callable[[random.Random, str], Case]
    run: Callable[[Case], Any]
    check: Callable[[Case, Any], None]
    direct_op: bool = False  # a torch.ops call: torch's schema-parsing RuntimeError is legitimate
    weight: float = 1.0  # share of the calls

    def strategy(self) -> st.SearchStrategy:
        """(seed, break): half of the draws carry no corruption."""
        return st.tuples(st.integers(0, 2**63 - 1), st.sampled_from(["none"] * len(self.breaks) + self.breaks))


TARGETS: list[FuzzTarget] = [
    FuzzTarget("verify_probs_op", VERIFY_BREAKS, verify_probs_op_cases, lambda c: OPS.verify_probs(*c.args),
               check_verify_result, direct_op=True),
    FuzzTarget("verify_logits_op", VERIFY_BREAKS, verify_logits_op_cases, lambda c: OPS.verify_logits(*c.args),
               check_verify_result, direct_op=True),
    FuzzTarget("verify_probs_philox_op", VERIFY_BREAKS, verify_probs_philox_op_cases,
               lambda c: OPS.verify_probs_philox(*c.args), check_verify_result, direct_op=True),
    FuzzTarget("verify_logits_philox_op", VERIFY_BREAKS, verify_logits_philox_op_cases,
               lambda c: OPS.verify_logits_philox(*c.args), check_verify_result, direct_op=True),
    FuzzTarget("sample_logits_op", SAMPLE_BREAKS, sample_logits_op_cases, lambda c: OPS.sample_logits(*c.args),
               check_sample_result, direct_op=True),
    FuzzTarget("sample_logits_philox_op", SAMPLE_BREAKS, sample_logits_philox_op_cases,
               lambda c: OPS.sample_logits_philox(*c.args), check_sample_result, direct_op=True),
    FuzzTarget("specdecode.verify", VERIFY_BREAKS, verify_api_cases,
               lambda c: specdecode.verify(*c.args, **c.kwargs), check_verify_output),
    FuzzTarget("specdecode.verify_logits", VERIFY_BREAKS, verify_logits_api_cases,
               lambda c: specdecode.verify_logits(*c.args, **c.kwargs), check_verify_output),
    FuzzTarget("specdecode.sampling.sample_logits", SAMPLE_BREAKS, sample_logits_api_cases,
               lambda c: sample_logits(*c.args, **c.kwargs), check_sample_result),
]


# ------------------------------------------------------------------------------ driver

# Calls per hypothesis example: hypothesis costs ~1 ms per example, a call far less, so each
# drawn (seed, break) runs this many cases (seeds seed:0, seed:1, ...).
CALLS_PER_EXAMPLE = 4


@dataclass
class Tally:
    calls: int = 0
    returned: int = 0
    rejected: dict = field(default_factory=dict)  # exception type name -> count
    failure: str | None = None


def fuzz_target(target: FuzzTarget, calls: int, last_case_fd: int | None) -> Tally:
    tally = Tally()

    def one_call(case: Case) -> None:
        if last_case_fd is not None:
            text = f"{target.name}: {case!r}\n".encode()
            os.ftruncate(last_case_fd, 0)
            os.pwrite(last_case_fd, text, 0)
        tally.calls += 1
        try:
            result = target.run(case)
        except ALLOWED as exc:
            name = type(exc).__name__
            tally.rejected[name] = tally.rejected.get(name, 0) + 1
            return
        except RuntimeError as exc:
            if not (target.direct_op and is_schema_error(exc)):
                raise AssertionError(f"{target.name}: RuntimeError (expected a result or ValueError / TypeError) "
                                     f"for {case!r}: {exc}") from exc
            tally.rejected["RuntimeError (schema parsing)"] = tally.rejected.get("RuntimeError (schema parsing)", 0) + 1
            return
        except Exception as exc:
            raise AssertionError(f"{target.name}: {type(exc).__name__} (expected a result or ValueError / "
                                 f"TypeError) for {case!r}: {exc}") from exc
        try:
            target.check(case, result)
        except AssertionError as exc:
            raise AssertionError(f"{target.name}: invalid result for {case!r}: {exc}") from exc
        tally.returned += 1

    @settings(max_examples=max(1, -(-calls // CALLS_PER_EXAMPLE)), derandomize=True, database=None, deadline=None,
              print_blob=False, suppress_health_check=list(HealthCheck), phases=[Phase.generate, Phase.shrink])
    @given(target.strategy())
    def body(drawn: tuple[int, str]) -> None:
        seed, brk = drawn
        for j in range(CALLS_PER_EXAMPLE):
            one_call(target.cases(random.Random(f"{seed}:{j}"), brk))

    try:
        body()
    except Exception:
        tally.failure = traceback.format_exc(limit=8)
    return tally


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=11000, help="total calls over all targets")
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies --calls")
    parser.add_argument("-t", "--target", action="append", help="only these targets (repeatable)")
    parser.add_argument("--last-case", default=None, help="file that holds the case being run (for crashes)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    targets = [t for t in TARGETS if not args.target or t.name in args.target]
    if not targets:
        parser.error(f"no such target; known: {[t.name for t in TARGETS]}")
    total_weight = sum(t.weight for t in targets)
    fd = os.open(args.last_case, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644) if args.last_case else None
    failures = 0
    total_calls = 0
    start = time.perf_counter()
    for target in targets:
        calls = max(1, round(args.calls * args.scale * target.weight / total_weight))
        t0 = time.perf_counter()
        tally = fuzz_target(target, calls, fd)
        total_calls += tally.calls
        rejected = ", ".join(f"{k} {v}" for k, v in sorted(tally.rejected.items())) or "none"
        print(f"{target.name:36s} calls {tally.calls:6d}  valid results {tally.returned:6d}  rejected: {rejected}"
              f"  ({time.perf_counter() - t0:.1f} s)", flush=True)
        if tally.failure:
            failures += 1
            print(f"FAILED {target.name}:\n{tally.failure}", flush=True)
    print(f"TOTAL calls {total_calls} targets {len(targets)} failures {failures} "
          f"({time.perf_counter() - start:.1f} s)", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
