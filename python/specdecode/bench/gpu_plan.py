"""What a run of the decode-path benchmark measures besides tokens/s, and its presets.

**The cost per call from two lengths.** A generate call costs a fixed part (argument checks,
the layout lookup, buffer setup, the prefill, the final copy) plus one step's time per decoding
step. Timing the same method at two ``max_new_tokens`` (``--cost-lengths``, e.g. 64 and 256)
gives two points ``(steps, seconds)`` per call; the line through them has the per-step time as
its slope and the fixed cost per call as its intercept (:func:`call_cost`). Steps are the
decoding steps a call launched (target forwards after the prefill), from the engine's
statistics, so a chain's accepted drafts shorten the line, not the intercept.

**Presets** (``--preset NAME``) set several options at once; an option also given on the command
line keeps the given value, and ``--quick`` still shrinks the sizes (``--preset gpu-session
--quick`` is the CPU rehearsal of the GPU run: the demo pair, tiny sizes, no compiled methods).
``gpu-session`` is the run of ``scripts/gpu_session.sh`` on an H100 within 6 minutes
(:data:`PRESETS` has the values and the estimate they were chosen by).
"""

from __future__ import annotations

import argparse
from typing import Any, Sequence

from specdecode.bench.gpu_methods import COMPILED_METHODS, METHODS

#: Presets: option name (the ``argparse`` dest) -> value.
#:
#: ``gpu-session``: the 1B and SmolLM2 pairs, every method, batch 1 and 8, greedy, 2 prompts of
#: 64 new tokens at batch 1, 2 timed repeats; the compiled methods at batch 1 only (each layout
#: compiles for tens of seconds); the cost per call for the target graphed and the graphed chain
#: at 64 and 256 tokens; a greedy check of 8 demo prompts. Estimated on an H100 from the figures
#: of issue 40 (1B target graphed ~380 tok/s and SmolLM2 graphed ~253 tok/s at batch 1, Hugging
#: Face's eager loop ~40 tok/s, tens of seconds per compiled layout), not measured: loading and
#: the greedy check ~50 s; per pair at batch 1 the eager methods ~25 s, the graphed ones with
#: their time split, kernel counts and two-length costs ~30 s; at batch 8 ~25 s per pair; then
#: the six compiled layouts (three methods, two pairs) at ~30 s each: about 5.5 minutes in all.
#: The compiled methods run last and the results are written after every method, so a run
#: stopped at its time limit (scripts/gpu_session.sh: BENCH_S=360) loses at most the compiled
#: rows it had not finished.
PRESETS: dict[str, dict[str, Any]] = {
    "gpu-session": dict(pairs=["1b", "smollm2"], methods=list(METHODS), batch_sizes=[1, 8], temperatures=[0.0],
                        max_new_tokens=64, prompts_batch1=2, repeats=2, tree_nodes=16,
                        compiled_batch_sizes=[1], cost_lengths=[64, 256],
                        cost_methods=["target graphed", "graphed chain"], check_prompts=8, check_new_tokens=32,
                        no_plot=True),
}
#: What ``--quick`` caps (a CPU smoke run): option -> the largest value it keeps.
QUICK_CAPS = dict(max_new_tokens=6, max_prompt_tokens=16, prompts_batch1=1, check_prompts=2, check_batch=2,
                  check_new_tokens=6, tree_nodes=6)
#: The methods ``--cost-methods`` takes: specdecode's (their statistics count the steps).
COST_METHODS = tuple(m for m in METHODS if not m.endswith(("HF", "HF assisted", "HF static compiled")))
#: ``--quick``'s two lengths for the cost per call (kept apart so that the step counts differ).
QUICK_COST_LENGTHS = [4, 12]


def call_cost(short: tuple[float, float], long: tuple[float, float]) -> dict[str, float]:
    """The fixed cost per call and the time per step from two ``(steps per call, seconds per
    call)`` points of one method at two lengths: the line through them (``call_fixed_ms``: its
    intercept, ``step_ms``: its slope, both in milliseconds).

    Raises ``ValueError`` naming ``long`` when both points have the same number of steps (the
    line is not determined) or a value is negative."""
    (s1, t1), (s2, t2) = short, long
    for name, (steps, seconds) in (("short", short), ("long", long)):
        if steps < 0 or seconds < 0:
            raise ValueError(f"{name}: expected steps and seconds >= 0, got {(steps, seconds)!r}")
    if s1 == s2:
        raise ValueError(f"long: both lengths ran {s1:g} steps per call; the cost per call needs two step counts")
    step = (t2 - t1) / (s2 - s1)
    return {"call_fixed_ms": 1000 * (t1 - s1 * step), "step_ms": 1000 * step}


def given_options(parser: argparse.ArgumentParser, argv: Sequence[str]) -> set[str]:
    """The ``dest`` of every option that ``argv`` names (``--opt value`` or ``--opt=value``)."""
    words = {word.split("=", 1)[0] for word in argv if word.startswith("-")}
    return {action.dest for action in parser._actions if words & set(action.option_strings)}


def apply_options(args: argparse.Namespace, parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    """``--preset``'s values, then ``--quick``'s caps, on ``args``; options given on the command
    line are kept as given (``--quick`` still caps them). Exits through ``parser.error``, naming
    the option, for a combination ``argparse`` cannot check alone."""
    given = given_options(parser, argv)
    for dest, value in PRESETS.get(args.preset or "", {}).items():
        if dest not in given:
            setattr(args, dest, value)
    if args.quick:
        if "methods" not in given:
            args.methods = [m for m in args.methods if m not in COMPILED_METHODS]
        if "pairs" not in given:
            args.pairs = ["demo"]
        if "batch_sizes" not in given:
            args.batch_sizes = [1, 3]
        args.dtype = args.dtype or "float32"
        args.repeats = 1 if "repeats" not in given else args.repeats
        for dest, cap in QUICK_CAPS.items():
            setattr(args, dest, min(getattr(args, dest), cap))
        if args.cost_lengths and "cost_lengths" not in given:
            args.cost_lengths = list(QUICK_COST_LENGTHS)
    lengths = args.cost_lengths or []
    if lengths and (len(lengths) != 2 or lengths[0] == lengths[1]):
        parser.error(f"--cost-lengths: expected two different lengths (e.g. 64 256), got {lengths}")
    args.cost_methods = [m for m in args.cost_methods or [] if m in args.methods]
