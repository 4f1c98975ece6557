"""Lookahead decoding on SmolLM2-135M-Instruct: against the target alone and Hugging Face prompt
lookup, on prompts that ask to edit or repeat given code and on chat prompts.

Two prompt sets, disjoint: ``tune`` (the window, n-gram size and candidates were chosen on it)
and ``report`` (never looked at while choosing: the numbers to quote). Greedy (T = 0), batch 1,
chat template applied, EOS disabled so every method makes exactly --max-new-tokens tokens. Each
method's tokens/s is the median of --repeats runs per prompt set, timed with the thread's CPU
time at one thread (--clock cpu: other processes on the shared machine disturb it far less).
Every method runs its target forwards through specdecode's CPU fast path (the baselines too),
so ratios show the speculative gain alone; "target alone, eager" is the reference without it.

    python benchmarks/bench_lookahead.py                      # report set
    python benchmarks/bench_lookahead.py --prompt-set tune    # the set the settings came from
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch

import specdecode
from specdecode.bench.harness import base_parser, environment, format_table, median, write_results

CODE = '''def mean(values):
    total = 0
    for v in values:
        total = total + v
    return total / len(values)


def variance(values):
    m = mean(values)
    total = 0
    for v in values:
        total = total + (v - m) ** 2
    return total / len(values)
'''

CODE_2 = '''class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        if not self.items:
            raise IndexError("pop from an empty stack")
        return self.items.pop()

    def peek(self):
        return self.items[-1]
'''

PROMPTS: dict[str, dict[str, list[str]]] = {
    "tune": {
        "code": [f"Rename the variable `total` to `acc` in this code and print the whole result:\n\n{CODE}",
                 f"Add a docstring to every method of this class and repeat the full code:\n\n{CODE_2}"],
        "chat": ["What are three tips for staying focused while studying?",
                 "Explain what a rainbow is to a child."],
    },
    "report": {
        "code": [f"Rewrite this code with type hints on every function, and show all of it:\n\n{CODE}",
                 f"Rename the class `Stack` to `LifoStack` and print the complete code:\n\n{CODE_2}",
                 f"Copy this code exactly, then add a function `std` that returns the square root of the "
                 f"variance:\n\n{CODE}",
                 f"Change every method of this class to log its name before running, and give the full "
                 f"code:\n\n{CODE_2}"],
        "chat": ["Write a short poem about the sea.",
                 "How do I make a good cup of tea?",
                 "Give me a list of healthy breakfast ideas.",
                 "Why is the sky blue? Answer in two sentences."],
    },
}


#: What --configs may add after WINDOWxNGRAM, in order, separated by colons.
SETTINGS: list[tuple[str, Callable[[str], Any]]] = [("min_pool_gain", float), ("context_depth", int),
                                                    ("explore_every", int), ("context_candidates", int),
                                                    ("occurrence", str)]


def clock_for(name: str) -> Callable[[], float]:
    return time.thread_time if name == "cpu" else time.perf_counter


def main() -> None:
    parser = base_parser(__doc__, prog="python benchmarks/bench_lookahead.py")
    parser.add_argument("--prompt-set", choices=sorted(PROMPTS), default="report")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--clock", choices=["cpu", "wall"], default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--configs", nargs="*", default=["2x2:0.6:10:32:1:first", "4x3"],
                        help="Lookahead settings WINDOWxNGRAM[:MIN_POOL_GAIN[:CONTEXT_DEPTH[:EXPLORE_EVERY[:CONTEXT_CANDIDATES[:OCCURRENCE]]]]] "
                             "(default: 2x2:0.6:10:32:1:first, chosen on --prompt-set tune, and 4x3)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.clock == "cpu" and args.threads != 1:
        parser.error("--clock cpu measures one thread: use it with --threads 1")
    clock = clock_for(args.clock)

    from specdecode.training.targets import load_target

    target, tokenizer = load_target("smollm2")
    target.generation_config.eos_token_id = None
    new = args.max_new_tokens
    block_efficiency: dict[str, list[float]] = {}

    def hf(**kwargs: Any) -> Callable[[torch.Tensor], torch.Tensor]:
        # an explicit mask: without one, transformers takes every pad_token_id in the prompt for
        # padding, and SmolLM2's pad id is <|im_end|>, which every chat prompt holds
        return lambda ids: target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                                           do_sample=False, **kwargs)

    def ours(name: str, make: Callable[[], Any], **kwargs: Any) -> Callable[[torch.Tensor], torch.Tensor]:
        def run(ids: torch.Tensor) -> torch.Tensor:
            out = specdecode.generate(target, make(), ids, max_new_tokens=new, **kwargs)
            block_efficiency.setdefault(name, []).append(out.stats.block_efficiency)
            return out.sequences
        return run

    methods: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        "target alone, eager": hf(),
        "target alone": hf(),
        "HF prompt lookup": hf(prompt_lookup_num_tokens=10),
        "specdecode ngram": ours("specdecode ngram", specdecode.NgramDrafter),
        "specdecode ngram, first occurrence": ours("specdecode ngram, first occurrence",
                                                   lambda: specdecode.NgramDrafter(occurrence="first")),
        "specdecode jacobi 4": ours("specdecode jacobi 4", lambda: specdecode.JacobiDrafter(4), num_draft_tokens=4),
    }
    for config in args.configs:
        shape, *rest = config.split(":")
        window, ngram = (int(v) for v in shape.split("x"))
        options = {key: kind(value) for (key, kind), value in zip(SETTINGS, rest)}
        name = f"specdecode lookahead {config}"
        methods[name] = ours(name, lambda w=window, n=ngram, o=options: specdecode.LookaheadDrafter(
            window=w, ngram=n, **o))

    rows: list[dict[str, Any]] = []
    for kind, prompts in PROMPTS[args.prompt_set].items():
        encoded = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                                 return_tensors="pt", return_dict=True)["input_ids"] for p in prompts]
        times: dict[str, list[float]] = {}
        outputs: dict[str, list[torch.Tensor]] = {}
        for _ in range(args.repeats or 1):
            for name, run in methods.items():
                with torch.no_grad(), specdecode.cpu.accelerated(target, enabled=not name.endswith("eager")):
                    start = clock()
                    outputs[name] = [run(ids) for ids in encoded]
                    times.setdefault(name, []).append(clock() - start)
        base = median(times["target alone"])
        for name in methods:
            same = all(torch.equal(a, b) for a, b in zip(outputs[name], outputs["target alone, eager"]))
            row = {"prompts": kind, "method": name, "tok/s": new * len(prompts) / median(times[name]),
                   "vs target alone": base / median(times[name]),
                   "vs HF lookup": median(times["HF prompt lookup"]) / median(times[name]),
                   "greedy identical": "yes" if same else "NO"}
            if name in block_efficiency:
                row["tokens/call"] = median(block_efficiency[name][-len(prompts):])
                block_efficiency[name].clear()
            rows.append(row)
    print(f"SmolLM2-135M-Instruct, prompt set {args.prompt_set!r}, {new} new tokens, T = 0, batch 1, "
          f"{args.threads} thread(s), {args.clock} clock")
    print(format_table(rows, ["prompts", "method", "tok/s", "vs target alone", "vs HF lookup", "tokens/call",
                              "greedy identical"]))
    write_results(args.out, f"bench_lookahead_{args.prompt_set}", rows, environment())


if __name__ == "__main__":
    main()
