"""Hierarchical drafting for a long context (TriForce-style) on SmolLM2-135M-Instruct (CPU, batch 1, T = 0).

    python benchmarks/bench_hierarchical.py --threads 1 --clock cpu
    python benchmarks/bench_hierarchical.py --quick                  # 1k context, 16 tokens, two windows

Rows: the target alone (Hugging Face ``generate``), prompt lookup (``NgramDrafter``), the target
over a partial KV cache as the drafter (``PartialCacheDrafter``: ``--sinks`` attention sinks plus
a recent window, for each of ``--windows``) and the hierarchy (a ``VerticalCascadeDrafter`` with
that partial-cache target as its draft and prompt lookup inside). The prompt is one chat turn: a
document of ``--context-tokens`` tokens of Python standard-library source read from this
machine's Python, then the request (``--task``: summarize it, or continue it). Every speculative
row's output is checked token for token against the target's own greedy output.

Columns: ``tok/call`` (new tokens after the first, the prefill's, per target verification call), ``accept`` (accepted / drafted
tokens), ``draft fwd/call`` (drafter forwards per verification call), ``c`` (the time of one
drafter forward, or of one step's drafting for a drafter without forwards, over that of one
target verification forward; decoding steps only, from the engine's statistics),
``decode tok/s`` (the new tokens after the first, over the decoding time: from the first
decoding step to the end, less the drafter's own prefill of the prompt) and its speedup over the
target alone, then ``e2e tok/s`` (the whole call, prefills included) and ``draft prefill s``.
``--clock cpu`` times this thread's CPU time (steadier on a shared machine), ``wall`` the wall
clock; ``c`` always comes from the engine's wall-clock statistics. The drafter's prefill is
taken as its first proposal's time less the median of its other proposals.
"""

from __future__ import annotations

import importlib
import inspect
import time
from pathlib import Path
from typing import Any, Callable

import torch

import specdecode
from specdecode.bench.harness import Column, base_parser, environment, format_table, median, write_results
from specdecode.drafters import NgramDrafter, PartialCacheDrafter, VerticalCascadeDrafter

SOURCES = ("textwrap", "shlex", "string", "fractions", "difflib", "argparse")
COLUMNS = [("tokens_per_call", "tok/call", "{:.2f}"), ("acceptance", "accept", "{:.2f}"),
           ("draft_forwards_per_call", "draft fwd/call", "{:.2f}"), ("c", "c", "{:.2f}"),
           ("decode_tok_per_s", "decode tok/s", "{:.2f}"), ("speedup", "speedup", "{:.2f}"),
           ("e2e_tok_per_s", "e2e tok/s", "{:.2f}"), ("draft_prefill_s", "draft prefill s", "{:.1f}")]
TASKS = {
    "summarize": "Summarize what the Python code above does, function by function.",
    "continue": "Continue the Python code above from where it stops.",
}


def long_prompt(tokenizer: Any, context_tokens: int, task: str) -> torch.Tensor:
    """A chat-templated prompt: ``context_tokens`` tokens of standard-library source, then the
    request. Returns ``[1, n]`` int64 ids, ``n >= context_tokens``."""
    text = ""
    for name in SOURCES:
        text += Path(inspect.getfile(importlib.import_module(name))).read_text()
        ids = tokenizer(text).input_ids
        if len(ids) >= context_tokens:
            break
    else:
        raise ValueError(f"context_tokens: the sources hold only {len(ids)} tokens, fewer than {context_tokens}")
    document = tokenizer.decode(ids[:context_tokens])
    messages = [{"role": "user", "content": f"{document}\n\n{TASKS[task]}"}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                         return_dict=True)["input_ids"]


class _Timed:
    """A drafter that delegates to ``inner`` and records this thread's clock at every proposal,
    and at the ``reset`` that ends a generation: what splits a run into prefill and decoding."""

    def __init__(self, inner: Any, clock: Callable[[], float]) -> None:
        self.inner, self.clock = inner, clock
        self.propose_times: list[float] = []
        self.first_step: float | None = None  # the clock when the first decoding step asked for drafts
        self.end: float | None = None  # the clock at the last reset (the generation's end)

    def reset(self) -> None:
        self.inner.reset()
        self.end = self.clock()

    def propose(self, state: Any, num_tokens: int) -> Any:
        start = self.clock()
        if self.first_step is None:
            self.first_step = start
        proposal = self.inner.propose(state, num_tokens)
        self.propose_times.append(self.clock() - start)
        return proposal

    def commit(self, update: Any) -> None:
        self.inner.commit(update)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def prefill(self) -> float:
        """The drafter's prefill: its first proposal less a typical one."""
        if len(self.propose_times) < 2:
            return 0.0
        return max(0.0, self.propose_times[0] - median(self.propose_times[1:]))


def drafters(target: Any, windows: list[int], sinks: int, inner_tokens: int) -> dict[str, Callable[[], Any]]:
    rows: dict[str, Callable[[], Any]] = {"n-grams": lambda: NgramDrafter()}
    for w in windows:
        rows[f"partial cache w{w}+{sinks}"] = lambda w=w: PartialCacheDrafter(target, window=w, num_sink_tokens=sinks)
    for w in windows:
        rows[f"hierarchy: w{w}+{sinks} + n-grams"] = lambda w=w: VerticalCascadeDrafter(
            PartialCacheDrafter(target, window=w, num_sink_tokens=sinks), NgramDrafter(), inner_tokens=inner_tokens)
    return rows


def main() -> None:
    parser = base_parser(__doc__.split("\n\n")[0], prog="bench_hierarchical.py")
    parser.add_argument("--context-tokens", type=int, default=4096, help="document tokens in the prompt")
    parser.add_argument("--task", choices=tuple(TASKS), default="summarize")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--gamma", type=int, default=4, help="num_draft_tokens")
    parser.add_argument("--windows", type=int, nargs="+", default=[256, 512], help="partial-cache windows")
    parser.add_argument("--sinks", type=int, default=4, help="attention sink tokens")
    parser.add_argument("--inner-tokens", type=int, default=4, help="n-gram guesses per hierarchy forward")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    args = parser.parse_args()
    if args.quick:
        args.context_tokens, args.max_new_tokens, args.windows = 1024, 16, [128, 256]
    torch.set_num_threads(args.threads)
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    repeats = args.repeats or 1
    from specdecode.training.targets import load_target

    target, tok = load_target("smollm2")
    ids = long_prompt(tok, args.context_tokens, args.task)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    n = args.max_new_tokens
    reference: list[torch.Tensor] = []

    def alone() -> dict[str, Any]:
        marks: list[float] = []

        class Marks:  # a Hugging Face streamer: the prompt first, then every new token
            def put(self, value: Any) -> None:
                marks.append(clock())

            def end(self) -> None:
                marks.append(clock())

        start = clock()
        out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                              pad_token_id=pad, streamer=Marks())
        total = clock() - start
        reference[:] = [out]
        new = out.shape[1] - ids.shape[1]
        return {"new": new, "total": total, "decode": marks[-1] - marks[1], "tokens_per_call": 1.0,
                "acceptance": float("nan"), "c": float("nan"), "draft_forwards_per_call": 0.0, "draft_prefill_s": 0.0}

    def speculative(make: Callable[[], Any]) -> Callable[[], dict[str, Any]]:
        def run() -> dict[str, Any]:
            drafter = _Timed(make(), clock)
            start = clock()
            out = specdecode.generate(target, drafter, ids, num_draft_tokens=args.gamma, max_new_tokens=n,
                                      pad_token_id=pad)
            total = clock() - start
            if not torch.equal(out.sequences, reference[0][:, : out.sequences.shape[1]]):
                raise AssertionError("greedy output differs from the target's own")
            s = out.stats
            prefill = drafter.prefill()
            calls = max(s.target_calls - s.target_prefill_calls, 1)
            forwards = s.draft_calls or calls  # a drafter without forwards: its time per step
            return {"new": out.sequences.shape[1] - ids.shape[1], "total": total,
                    "decode": drafter.end - drafter.first_step - prefill,
                    "tokens_per_call": (out.sequences.shape[1] - ids.shape[1] - 1) / calls,
                    "acceptance": s.acceptance_rate,
                    "c": (s.draft_time - s.draft_prefill_time) / forwards / max(
                        (s.target_time - s.target_prefill_time) / calls, 1e-9),
                    "draft_forwards_per_call": s.draft_calls / calls,
                    "draft_prefill_s": prefill}
        return run

    cases: dict[str, Callable[[], dict[str, Any]]] = {"target alone": alone}
    cases.update({name: speculative(make) for name, make in
                  drafters(target, args.windows, args.sinks, args.inner_tokens).items()})
    rows = []
    for name, fn in cases.items():
        runs = [fn() for _ in range(repeats)]
        pick = {k: median([r[k] for r in runs]) for k in ("total", "decode", "draft_prefill_s")}
        first = runs[0]
        rows.append({"drafter": name, "prompt_tokens": ids.shape[1], "new_tokens": first["new"],
                     "tokens_per_call": first["tokens_per_call"], "acceptance": first["acceptance"], "c": first["c"],
                     "draft_forwards_per_call": first["draft_forwards_per_call"],
                     "decode_tok_per_s": (first["new"] - 1) / pick["decode"],
                     "e2e_tok_per_s": first["new"] / pick["total"], "draft_prefill_s": pick["draft_prefill_s"]})
        print(f"{name}: {rows[-1]}", flush=True)
    base = rows[0]["decode_tok_per_s"]
    rows = [{**r, "speedup": r["decode_tok_per_s"] / base} for r in rows]
    columns = ["drafter", *(Column(key, label, fmt.format) for key, label, fmt in COLUMNS)]
    title = (f"SmolLM2-135M-Instruct, {ids.shape[1]}-token prompt ({args.task}), batch 1, T=0, gamma {args.gamma}, "
             f"{n} new tokens, {args.threads} thread(s), {args.clock} clock, median of {repeats}")
    print(format_table(rows, columns, title=title))
    write_results(args.out, "hierarchical", rows, {**environment(), **vars(args)})


if __name__ == "__main__":
    main()
