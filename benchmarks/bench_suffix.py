r"""Repeated requests on SmolLM2 (the same chat prompt sampled several times, as self-consistency
voting or reinforcement-learning rollouts do): ``SuffixDrafter``, which remembers every earlier
generation, against Hugging Face's ``target.generate`` and its prompt lookup, specdecode's prompt
lookup (``NgramDrafter``) and the shipped EAGLE drafter, every method interleaved request by request.

    # tune: choose the suffix settings on the tune prompts
    python benchmarks/bench_suffix.py --prompt-set tune --num-prompts 8 --samples 4 \
        --settings chain:6 chain:10 chain:10:0.2 trie:16
    # report: the held-out prompts, never looked at while tuning
    python benchmarks/bench_suffix.py --prompt-set report --samples 4 --settings chain:10
    # one structured task over many inputs, each once, greedy (tune and report people disjoint)
    python benchmarks/bench_suffix.py --workload records --prompt-set tune --samples 1 --temperature 0

For every prompt of the set, in order, ``--samples`` generations at ``--temperature`` (sample ``s``
of prompt ``p`` seeded ``seed + 100 p + s``); per request every method runs once, in the same order,
so that a slow minute of a shared machine hits every method alike. Each suffix setting is one
drafter for the whole run: by a prompt's second sample it has the first (and every earlier
prompt's samples) in its corpus. The run is made once (a method's time is its sum over the
requests; the drafters' memory makes a repeat a different experiment); one request on a prompt
outside both sets warms every method up first. EOS is off: every request makes exactly
``--max-new-tokens`` tokens. At temperature 0 every specdecode row must equal the target's greedy
output (checked, a mismatch stops the run).

A setting is ``chain:K[:P[:F]]`` (a chain of at most K tokens) or ``trie:N[:P[:F]]`` (a trie of at
most N nodes, root included, 8 deep), ``P`` the ``min_token_prob`` (default 0.1) and ``F`` the
``max_spec_factor`` (default 1.0); ``fallback:K:P:F:M`` is the suffix chain where it gives at least
``M`` tokens, the shipped EAGLE drafter's own chain elsewhere (``FallbackDrafter``).

Columns: ``tok/call`` (new tokens per verification round of the target, over all requests),
``first`` / ``later`` (the same over each prompt's first sample / its later ones), ``tok/s``, ``x_hf``
(over ``HF target.generate``) and ``x_lookup`` (over ``HF prompt lookup``).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch
from tqdm.auto import tqdm

HF = "HF target.generate"
LOOKUP = "HF prompt lookup"

# --workload records: one structured task over many inputs (specdecode.prompt_sets.record_prompt_set)


def parse_setting(text: str) -> dict[str, Any]:
    """``chain:K[:P[:F]]``, ``trie:N[:P[:F]]`` or ``fallback:K:P:F:M`` as ``SuffixDrafter`` arguments
    plus ``num_draft_tokens`` (and ``min_tokens`` for a fallback); ``ValueError`` else."""
    parts = text.split(":")
    try:
        if parts[0] in ("chain", "trie") and 2 <= len(parts) <= 4 or parts[0] == "fallback" and len(parts) == 5:
            size = int(parts[1])
            kw: dict[str, Any] = {"min_token_prob": float(parts[2]) if len(parts) > 2 else 0.1,
                                  "max_spec_factor": float(parts[3]) if len(parts) > 3 else 1.0}
            if parts[0] == "chain":
                return {**kw, "num_draft_tokens": size}
            if parts[0] == "fallback":
                return {**kw, "num_draft_tokens": size, "min_tokens": int(parts[4])}
            return {**kw, "num_nodes": size, "num_draft_tokens": None}
    except ValueError:
        pass
    raise ValueError(f"settings: expected chain:K[:P[:F]], trie:N[:P[:F]] or fallback:K:P:F:M, got {text!r}")


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt-set", choices=["tune", "report"], required=True)
    parser.add_argument("--settings", nargs="+", default=["chain:10"], help="chain:K[:P[:F]] or trie:N[:P[:F]]")
    parser.add_argument("--workload", choices=["chat", "records"], default="chat",
                        help="chat: the chat prompt set; records: one JSON-record task over many people")
    parser.add_argument("--samples", type=int, default=4, help="requests per prompt")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--num-prompts", type=int, default=None, help="the first N prompts of the set")
    parser.add_argument("--lookup-tokens", type=int, default=4, help="HF prompt lookup's prompt_lookup_num_tokens")
    parser.add_argument("--no-eagle", action="store_true", help="leave the shipped EAGLE drafter out")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="bench_results")
    args = parser.parse_args(argv)
    try:
        settings = {s: parse_setting(s) for s in args.settings}
    except ValueError as exc:
        parser.error(str(exc))

    import specdecode
    from specdecode.bench.harness import environment, format_table, write_results
    from specdecode.bench.real_pair import chat_ids, chat_prompts
    from specdecode.prompt_sets import record_prompt_set
    from specdecode.cli_args import sampling
    from specdecode.drafters import FallbackDrafter

    torch.set_num_threads(args.threads)
    target, eagle, tok = specdecode.load_pair("smollm2")
    target.generation_config.eos_token_id = None
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    if args.workload == "chat":
        prompts = chat_prompts(tok, args.prompt_set, args.num_prompts)
    else:
        prompts = [chat_ids(tok, text) for text in record_prompt_set(args.prompt_set)[: args.num_prompts]]
    warm = chat_ids(tok, "Say hello.")
    methods: list[tuple[str, Any, dict[str, Any]]] = [(HF, None, {}), (LOOKUP, None, {}),
                                                      ("ngram chain:4", specdecode.NgramDrafter(),
                                                       {"num_draft_tokens": 4})]
    if not args.no_eagle:
        methods.append(("eagle (shipped defaults)", eagle, {}))
    for name, kw in settings.items():
        kw = dict(kw)
        k = kw.pop("num_draft_tokens")
        min_tokens = kw.pop("min_tokens", None)
        drafter = specdecode.SuffixDrafter(**kw)
        if min_tokens is not None:  # the suffix chain where it is confident, the shipped EAGLE elsewhere
            drafter = FallbackDrafter(drafter, eagle, min_tokens=min_tokens)
        methods.append((f"suffix {name}" if min_tokens is None else f"suffix+eagle {name}", drafter,
                        {} if k is None else {"num_draft_tokens": k}))
    common = dict(max_new_tokens=args.max_new_tokens, pad_token_id=pad, **sampling(args.temperature))
    seconds = {name: 0.0 for name, _, _ in methods}
    calls = {name: [0, 0] for name, _, _ in methods}  # target calls on first samples, on later ones
    requests = [(p, s) for p in range(len(prompts)) for s in range(args.samples)]
    bar = tqdm(total=1 + len(requests), unit="request", desc=f"T={args.temperature}: requests (the first warms up)")
    for index, (p, s) in enumerate([(-1, 0)] + requests):
        ids = warm if p < 0 else prompts[p]
        seed = args.seed + 100 * p + s
        greedy = None
        for name, drafter, kw in methods:
            torch.manual_seed(seed)
            start = time.perf_counter()
            if drafter is None:
                extra = {"prompt_lookup_num_tokens": args.lookup_tokens} if name == LOOKUP else {}
                with specdecode.cpu.accelerated(target, enabled=False):
                    out_ids = target.generate(ids, attention_mask=torch.ones_like(ids), **common, **extra)
                stats = None
            else:
                out = specdecode.generate(target, drafter, ids, eos_token_id=None, **common, **kw,
                                          generator=torch.Generator().manual_seed(seed))
                out_ids, stats = out.sequences, out.stats
            elapsed = time.perf_counter() - start
            if args.temperature == 0:
                greedy = out_ids if name == HF else greedy
                if stats is not None and not torch.equal(out_ids, greedy):
                    raise SystemExit(f"{name}: greedy output differs from the target's on prompt {p}")
            if index == 0:
                suffix = drafter.first if isinstance(drafter, FallbackDrafter) else drafter
                if isinstance(suffix, specdecode.SuffixDrafter):
                    suffix.corpus.clear()  # the warm-up request is not part of the experiment
                continue
            seconds[name] += elapsed
            if stats is not None:
                calls[name][s > 0] += stats.row_steps
        bar.update(1)
    bar.close()
    rows = []
    tokens = args.max_new_tokens * len(requests)
    firsts = args.max_new_tokens * len(prompts)
    for name, drafter, _ in methods:
        first, later = calls[name]
        rows.append({"method": name, "tok/call": round(tokens / (first + later), 3) if drafter is not None else None,
                     "first": round(firsts / first, 3) if drafter is not None else None,
                     "later": round((tokens - firsts) / later, 3) if drafter is not None and later else None,
                     "tok/s": round(tokens / seconds[name], 2), "x_hf": round(seconds[HF] / seconds[name], 3),
                     "x_lookup": round(seconds[LOOKUP] / seconds[name], 3)})
    title = (f"SmolLM2-135M-Instruct, {args.prompt_set} {args.workload} prompts ({len(prompts)}) x {args.samples} "
             f"samples, "
             f"T = {args.temperature}, batch 1, {args.max_new_tokens} new tokens, {args.threads} threads, "
             f"one interleaved run")
    print(format_table(rows, ["method", "tok/call", "first", "later", "tok/s", "x_hf", "x_lookup"], title=title))
    _, path = write_results(args.out, f"bench_suffix_{args.workload}_{args.prompt_set}", rows,
                            {"title": title, "args": vars(args), **environment()})
    print(f"wrote {path}")
    return rows


if __name__ == "__main__":
    main()
