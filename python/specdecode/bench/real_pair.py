"""The real pair end to end: SmolLM2-135M-Instruct on held-out chat requests, the target alone
against Hugging Face prompt lookup and specdecode with prompt lookup and trained drafters.

    python -m specdecode bench --pair smollm2                          # 16 report prompts, T 0 and 1
    python -m specdecode bench --pair smollm2 --drafter-dir runs/smol-eagle runs/smol-medusa
    python -m specdecode bench --pair smollm2 --quick --threads 1 --clock cpu

Prompts: the chat requests of ``specdecode.prompt_sets.chat_prompt_set`` (``report``: 16
never looked at while tuning; ``tune``: the 4 settings were chosen on), each wrapped in the
tokenizer's chat template with the generation prompt, batch 1. EOS is off for every method, so
each generates exactly max_new_tokens per prompt.

Rows: the target alone through Hugging Face ``generate``, eager and through the CPU path of
--cpu-fast-path (the path specdecode's runs take: the speedup's baseline); HF prompt lookup
(``prompt_lookup_num_tokens`` = gamma, through that same CPU path); specdecode with
``NgramDrafter``; one row per --drafter-dir folder (any kind ``python -m specdecode train`` writes,
read with ``specdecode.load_drafter``; a tree drafter verifies with its lossless tree rule).
At temperature 0 every specdecode row's output is checked equal to the target's greedy output;
a difference stops the benchmark. At temperature 1 every method samples from the same seed and
from the whole distribution (no top-k filter on the HF rows either).

Columns: tokens per target call (block efficiency: new tokens per verification call),
acceptance rate, acceptance by position (the share of drafting steps that accepted draft
position i, over every prompt; by depth for trees), the cost ratio c (draft seconds per draft
call / target seconds per target call, prefill included, from the engine's statistics), tok/s
(median over --repeats), and the speedups against the target alone (fast path) and HF prompt
lookup.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from specdecode import cli_args
from specdecode import vocabulary as words
from specdecode.bench.harness import (CLOCKS, Column, add_run_options, base_parser, environment, finish_run_options,
                                      format_table, time_call, without_eos, write_results)

#: The name of the pair this benchmark runs (``--pair``).
PAIR = "smollm2"
TARGET_EAGER = "target alone, eager"
TARGET_FAST = "target alone, fast path"
HF_LOOKUP = "HF prompt lookup"
NGRAM = "specdecode ngram"
#: Defaults of a full run and of a --quick one; values given on the command line win over both.
FULL = dict(max_new_tokens=64, repeats=3)
QUICK = dict(num_prompts=4, max_new_tokens=32, repeats=1)


def names_real_pair(argv: Sequence[str]) -> bool:
    """Whether a ``bench`` command line asks for this benchmark (``--pair smollm2``)."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--pair")
    known, _ = pre.parse_known_args(list(argv))
    return known.pair == PAIR


def chat_ids(tokenizer: Any, text: str) -> torch.Tensor:
    """The ids ``[1, L]`` of one user request in ``tokenizer``'s chat template, generation
    prompt added (where the assistant's answer starts)."""
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                         return_tensors="pt", return_dict=True)["input_ids"]


def chat_prompts(tokenizer: Any, prompt_set: str, num_prompts: int | None = None) -> list[torch.Tensor]:
    """The first ``num_prompts`` (default: all) chat requests of ``prompt_set`` (``"tune"`` or
    ``"report"``) as ids ``[1, L]``."""
    from specdecode.prompt_sets import chat_prompt_set

    texts = chat_prompt_set(prompt_set)
    if num_prompts is not None and not 1 <= num_prompts <= len(texts):
        raise ValueError(f"num_prompts: the {prompt_set!r} chat set has {len(texts)} prompts, got {num_prompts}")
    return [chat_ids(tokenizer, t) for t in texts[:num_prompts]]


def load_drafters(folders: Sequence[str | Path], target: Any, *, tree: str | None = None,
                  num_nodes: Sequence[int] = (16,), tree_depth: int | None = None) -> dict[str, Any]:
    """Method name -> drafter: ``NgramDrafter`` first, then the trained drafter of each folder
    (``specdecode.load_drafter``, which raises ``ValueError`` naming ``target`` for a drafter
    trained for another model), named after its kind and folder. With ``tree`` (``"dynamic"``,
    ``"sequoia"``, ``"static"``), every trained drafter that drafts trees (``with_tree``) also
    gets one row per ``num_nodes`` with that tree, ``tree_depth`` deep at most."""
    from specdecode.drafters import NgramDrafter
    from specdecode.training.artifacts import load_drafter, read_record

    drafters: dict[str, Any] = {NGRAM: NgramDrafter()}
    seen: set[Path] = set()
    for folder in folders:
        if Path(folder).resolve() in seen:
            raise ValueError(f"drafter_dir: {str(folder)!r} is given twice")
        seen.add(Path(folder).resolve())
        kind = read_record(folder)["kind"]
        name = f"specdecode {kind} ({Path(folder).name})"
        name = name if name not in drafters else f"specdecode {kind} ({folder})"
        drafters[name] = load_drafter(folder, target)
        if tree is not None:
            depth = "" if tree_depth is None else f", depth {tree_depth}"
            for n in num_nodes:
                with_tree = _tree_drafter(drafters[name], tree, n, tree_depth)
                if with_tree is not None:
                    drafters[f"{name} {tree} tree {n}{depth}"] = with_tree
    return drafters


def _tree_drafter(drafter: Any, tree: str, num_nodes: int, tree_depth: int | None) -> Any:
    """``drafter`` drafting trees (a draft model through ``ModelDrafter``, a drafter through its
    ``with_tree``), or None for a kind that drafts its own shapes only (Medusa, Hydra, exit)."""
    from specdecode.drafters import ModelDrafter

    if isinstance(drafter, torch.nn.Module):
        drafter = ModelDrafter(drafter)
    if callable(getattr(drafter, "with_tree", None)):
        return drafter.with_tree(tree, num_nodes=num_nodes, tree_depth=tree_depth)
    return None


def speculative_row(stats: Sequence[Any]) -> dict[str, Any]:
    """The columns of one specdecode method from the statistics of its generations, pooled (sums
    over every prompt and run, then the ratios): tokens per target call (block efficiency: new
    tokens per verification call), acceptance rate, acceptance by position (accepted drafts at
    position i over the steps that drafted, summed over every generation before dividing: the
    share of steps accepting position i, which cannot rise with i; by depth for trees) and the
    cost ratio c (draft seconds per draft call / target seconds per target call, prefill included,
    as ``benchmarks/bench_eagle.py`` measures it)."""
    def total(field: str) -> float:
        return sum(getattr(s, field) for s in stats)

    def ratio(num: float, den: float) -> float:
        return num / den if den else 0.0

    depth = max((len(s.position_accepted) for s in stats), default=0)
    drafting = sum(s.position_drafted[0] for s in stats if s.position_drafted)  # steps that drafted
    by_position = [ratio(sum(s.position_accepted[i] for s in stats if i < len(s.position_accepted)), drafting)
                   for i in range(depth)]
    return {"tokens_per_call": ratio(total("new_tokens"), total("row_steps")),
            "acceptance_rate": ratio(total("accepted_tokens"), total("drafted_tokens")),
            "acceptance_by_position": [round(a, 4) for a in by_position],
            "cost_ratio": ratio(ratio(total("draft_time"), total("draft_calls")),
                                ratio(total("target_time"), total("target_calls")))}


def _generations(target: Any, drafter: Any, prompts: list[torch.Tensor], method: str, temperature: float, *,
                 num_draft_tokens: int, max_new_tokens: int, seed: int, cpu_fast_path: bool | None,
                 pad_token_id: int) -> list[tuple[torch.Tensor, Any]]:
    """``(ids, stats)`` of one method on every prompt (stats None for the HF rows), sampling from
    ``seed``."""
    import specdecode

    common = dict(max_new_tokens=max_new_tokens, pad_token_id=pad_token_id, **cli_args.sampling(temperature))
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    outputs: list[tuple[torch.Tensor, Any]] = []
    for ids in prompts:
        if drafter is None:  # HF generate: always with the mask (SmolLM2's pad id <|im_end|> is in chat prompts)
            extra: dict[str, Any] = dict(prompt_lookup_num_tokens=num_draft_tokens) if method == HF_LOOKUP else {}
            with specdecode.cpu.accelerated(target, enabled=False if method == TARGET_EAGER else cpu_fast_path):
                outputs.append((target.generate(ids, attention_mask=torch.ones_like(ids), **common, **extra), None))
        else:
            out = specdecode.generate(target, drafter, ids, num_draft_tokens=num_draft_tokens, eos_token_id=None,
                                      cpu_fast_path=cpu_fast_path, generator=generator, **common)
            outputs.append((out.sequences, out.stats))
    return outputs


def measure(target: Any, drafters: dict[str, Any], prompts: list[torch.Tensor], *, temperatures: Sequence[float],
            num_draft_tokens: int, max_new_tokens: int, repeats: int = 1, seed: int = 0,
            clock: Callable[[], float] = time.perf_counter, cpu_fast_path: bool | None = None,
            pad_token_id: int = 0, progress: Callable[[], Any] | None = None) -> list[dict[str, Any]]:
    """One row per temperature and method: the target alone (eager, fast path), HF prompt lookup,
    then specdecode with each of ``drafters`` (name -> drafter, :func:`load_drafters`), every
    generation at batch 1 with EOS off. Each method runs once untimed (2 tokens), then
    ``repeats`` timed times by ``clock``; tok/s is the median. ``progress`` is called after each
    timed run.

    Raises ``RuntimeError`` naming the method when, at temperature 0, a specdecode method's
    output differs from the target's greedy output (the fast-path row's); ``ValueError`` /
    ``TypeError`` naming the argument for bad input."""
    from specdecode.integrations.hf.arguments import check_int

    for name, value in (("num_draft_tokens", num_draft_tokens), ("max_new_tokens", max_new_tokens),
                        ("repeats", repeats)):
        check_int(name, value, 1)
    if not isinstance(drafters, dict) or not all(isinstance(k, str) for k in drafters):
        raise TypeError(f"drafters: expected a dict of method name -> drafter, got {type(drafters).__name__}")
    taken = set(drafters) & {TARGET_EAGER, TARGET_FAST, HF_LOOKUP}
    if taken:
        raise ValueError(f"drafters: {sorted(taken)} name baseline rows; choose other method names")
    if not prompts or not all(isinstance(p, torch.Tensor) and p.dim() == 2 and p.shape[0] == 1 for p in prompts):
        raise ValueError("prompts: expected one or more id tensors of shape [1, L] (batch 1)")
    if not temperatures or any(isinstance(t, bool) or not isinstance(t, (int, float)) or t < 0
                               for t in temperatures):
        raise ValueError(f"temperatures: expected one or more numbers >= 0 (0 = greedy), got {temperatures!r}")
    config = target.generation_config
    try:
        return _measure(without_eos(target), drafters, prompts, temperatures, max_new_tokens, repeats, clock,
                        progress, dict(num_draft_tokens=num_draft_tokens, seed=seed, cpu_fast_path=cpu_fast_path,
                                       pad_token_id=pad_token_id))
    finally:
        target.generation_config = config


def _measure(target: Any, drafters: dict[str, Any], prompts: list[torch.Tensor], temperatures: Sequence[float],
             max_new_tokens: int, repeats: int, clock: Callable[[], float], progress: Callable[[], Any] | None,
             options: dict[str, Any]) -> list[dict[str, Any]]:
    """:func:`measure` on a target whose EOS is off."""
    methods: dict[str, Any] = {TARGET_EAGER: None, TARGET_FAST: None, HF_LOOKUP: None, **drafters}
    rows: list[dict[str, Any]] = []
    for temperature in temperatures:
        reference: list[torch.Tensor] = []
        for method, drafter in methods.items():
            _generations(target, drafter, prompts, method, temperature, max_new_tokens=2, **options)  # warm-up
            runs: list[list[tuple[torch.Tensor, Any]]] = []

            def once(method: str = method, drafter: Any = drafter) -> None:
                runs.append(_generations(target, drafter, prompts, method, temperature,
                                         max_new_tokens=max_new_tokens, **options))
                if progress is not None:
                    progress()

            times = time_call(once, repeats=repeats, warmup=0, clock=clock)
            counts = [sum(ids.shape[1] - p.shape[1] for (ids, _), p in zip(run, prompts)) for run in runs]
            row: dict[str, Any] = {"temperature": temperature, "method": method, "tokens": counts[0],
                                   "tok_per_s": statistics.median(n / t for n, t in zip(counts, times))}
            if method in (TARGET_EAGER, TARGET_FAST):
                row["tokens_per_call"] = 1.0
                if method == TARGET_FAST:
                    reference = [ids for ids, _ in runs[0]]
            elif drafter is not None:
                if temperature == 0 and any(not torch.equal(ids, want) for run in runs
                                            for (ids, _), want in zip(run, reference)):
                    raise RuntimeError(f"{method}: greedy output differs from the target's own greedy generate")
                row.update(speculative_row([stats for run in runs for _, stats in run]))
            rows.append(row)
        base = {r["method"]: r["tok_per_s"] for r in rows if r["temperature"] == temperature}
        for row in rows[-len(methods):]:
            row["x_target"] = row["tok_per_s"] / base[TARGET_FAST]
            row["x_hf_lookup"] = row["tok_per_s"] / base[HF_LOOKUP]
    return rows


def report(rows: list[dict[str, Any]], title: str) -> str:
    """The benchmark's screen: one table, then what the columns mean."""
    import textwrap

    from specdecode.bench.harness import table_width

    columns = [Column("temperature", "T", lambda v: f"{v:g}"), Column("method"),
               Column("tokens_per_call", "tokens\nper call", words.tokens),
               Column("acceptance_rate", "accept-\nance", words.rate),
               Column("acceptance_by_position", words.ACCEPTANCE_BY_POSITION.name, words.rates),
               Column("cost_ratio", "c", words.cost), Column("tok_per_s", "tok/s", words.per_second),
               Column("x_target", "vs\ntarget", words.speedup),
               Column("x_hf_lookup", "vs HF\nlookup", words.speedup)]
    notes = (f"tokens per call: {words.BLOCK_EFFICIENCY.name}, {words.BLOCK_EFFICIENCY.definition}. acceptance: "
             f"{words.ACCEPTANCE_RATE.definition}. {words.ACCEPTANCE_BY_POSITION.name}: "
             f"{words.ACCEPTANCE_BY_POSITION.definition}, over every prompt (by depth for trees). c: seconds "
             "per draft call / seconds per target call (prefill included), measured in the generation. vs "
             "target, vs HF lookup: tok/s over the target alone through the same CPU path (fast path row), and "
             "over HF prompt lookup.")
    if any(r["temperature"] == 0 for r in rows):
        notes += (" At T=0 every specdecode row's output was checked equal to the target's own greedy output "
                  "(identical).")
    return format_table(rows, columns, title=title) + "\n\n" + textwrap.fill(notes, width=table_width())


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The options of ``python -m specdecode bench --pair smollm2``."""
    parser = base_parser(__doc__, prog=prog,
                         quick_help=f"a shorter run: {QUICK['num_prompts']} prompts, {QUICK['max_new_tokens']} new "
                                    f"tokens, {QUICK['repeats']} timed run per case",
                         repeats_help=f"timed runs per case, median reported (default: {FULL['repeats']}; "
                                      f"--quick: {QUICK['repeats']})")
    parser.add_argument("--pair", choices=[PAIR], default=PAIR,
                        help="SmolLM2-135M-Instruct (python -m specdecode install-models smollm2; nothing is downloaded)")
    parser.add_argument("--drafter-dir", nargs="+", action="extend", metavar="DIR",
                        help="folders of drafters trained with `python -m specdecode train KIND --target smollm2`, "
                             "one row each")
    parser.add_argument("--tree", choices=["dynamic", "sequoia", "static"],
                        help="also run each trained drafter that drafts trees with this tree builder (one more row "
                             "per --num-nodes)")
    parser.add_argument("--num-nodes", type=cli_args.int_at_least("num_nodes", 2), nargs="+", default=[16],
                        help="with --tree: tree sizes, root included (default: 16)")
    parser.add_argument("--tree-depth", type=cli_args.int_at_least("tree_depth", 1),
                        help="with --tree: the deepest draft (default: the builder's)")
    parser.add_argument("--prompt-set", choices=["report", "tune"], default="report",
                        help="held-out chat requests: 'report' (16, never tuned on) or 'tune' (16)")
    parser.add_argument("--num-prompts", type=cli_args.int_at_least("num_prompts", 1),
                        help=f"the first N prompts of the set (default: all; --quick: {QUICK['num_prompts']})")
    add_run_options(parser, FULL, QUICK, gamma=4, gamma_users="specdecode and HF prompt lookup")
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> list[dict[str, Any]]:
    """``python -m specdecode bench --pair smollm2``: check the options, load, measure, print and
    write ``bench_smollm2.csv`` / ``.json`` to --out."""
    from tqdm.auto import tqdm

    from specdecode.prompt_sets import chat_prompt_set
    from specdecode.pairs import load_command_pair

    parser = build_parser(prog)
    args = parser.parse_args(argv)
    finish_run_options(parser, args, FULL, QUICK)
    available = len(chat_prompt_set(args.prompt_set))
    if args.num_prompts is not None and args.num_prompts > available:
        parser.error(f"argument --num-prompts: num_prompts: the {args.prompt_set!r} set has {available} prompts")
    torch.manual_seed(args.seed)
    try:
        target, _, tokenizer, description = load_command_pair(PAIR, drafter_dir="ngram")  # rows: its own
        drafters = load_drafters(args.drafter_dir or [], target, tree=args.tree, num_nodes=args.num_nodes,
                                 tree_depth=args.tree_depth)
    except (ValueError, TypeError) as exc:  # what only the models can tell (a drafter for another target)
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    prompts = chat_prompts(tokenizer, args.prompt_set, args.num_prompts)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    title = (f"{description}: {args.prompt_set} chat prompts ({len(prompts)}), batch 1, gamma {args.num_draft_tokens}, "
             f"{args.max_new_tokens} new tokens, median of {args.repeats}, clock {args.clock}, threads "
             f"{torch.get_num_threads()}, cpu fast path {args.cpu_fast_path}")
    bar = tqdm(total=len(args.temperatures) * (3 + len(drafters)) * args.repeats, desc="bench", unit="run",
               leave=False)
    try:
        rows = measure(target, drafters, prompts, temperatures=args.temperatures,
                       num_draft_tokens=args.num_draft_tokens, max_new_tokens=args.max_new_tokens,
                       repeats=args.repeats, seed=args.seed, clock=CLOCKS[args.clock],
                       cpu_fast_path=cli_args.cpu_fast_path(args), pad_token_id=pad, progress=lambda: bar.update(1))
    except RuntimeError as exc:  # a greedy mismatch: loudly, and no table
        bar.close()
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    bar.close()
    print(report(rows, title))
    meta = {**environment(), "clock": args.clock, "pair": description, "prompt_set": args.prompt_set,
            "num_prompts": len(prompts), "drafter_dirs": args.drafter_dir or [], "args": vars(args)}
    csv_path, json_path = write_results(args.out, "bench_smollm2", rows, meta)
    print(f"wrote {csv_path} and {json_path}")
    return rows


if __name__ == "__main__":
    main()
