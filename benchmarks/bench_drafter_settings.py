r"""Choose a trained drafter's generation settings for SmolLM2 on one prompt set, report them on
another: tokens per target call and tokens/s of every (drafter, setting) against Hugging Face's
own ``target.generate`` and HF prompt lookup, every method interleaved prompt by prompt.

    # tune: the 16 prompts the settings are chosen on (4 until 2026-11-28)
    python benchmarks/bench_drafter_settings.py --prompt-set tune --drafter-dir runs/eagle \
        --settings chain:4 dynamic:6:3 dynamic:10:5 dynamic:16:6 --repeats 3
    # report: the 16 held-out prompts, never looked at while tuning
    python benchmarks/bench_drafter_settings.py --prompt-set report --drafter-dir runs/eagle \
        --settings chain:4 dynamic:10:5 --repeats 3 --temperatures 0 1

A setting is ``chain:K`` (a chain of K draft tokens), ``dynamic:N:D`` (an EAGLE-2 dynamic tree
of N nodes, root included, at most D deep) or, for Medusa heads, ``sparse:N`` (Medusa's sparse
tree of N rank paths, from the heads' rank accuracies measured on ``--calibration-data``: a data
cache of the training kit, e.g. ``runs/ttt/data``, whose prompts are none of the benchmark's;
never on the prompt sets themselves):

    python benchmarks/bench_drafter_settings.py --prompt-set tune --drafter-dir runs/gpu/medusa \
        --settings chain:3 sparse:16 sparse:32 --calibration-data runs/ttt/data --repeats 1

Per repeat and per prompt, every method runs once,
in the same order, so that a slow minute of a shared machine hits every method alike; a method's
time is the sum over the prompts of one repeat, and the table shows its median over repeats.
EOS is off: every method makes exactly ``--max-new-tokens`` tokens per prompt. At temperature 0
every specdecode row must equal the target's greedy output (checked, a mismatch stops the run);
at temperature T > 0 every method samples the whole distribution (``top_k=0``).

Columns: ``tok/call`` (new tokens per verification call, pooled over prompts), ``tok/s``
(median), ``x_hf`` (over ``HF target.generate``, Hugging Face with no specdecode code on its
path) and ``x_lookup`` (over ``HF prompt lookup``, ``prompt_lookup_num_tokens`` = --lookup-tokens).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

HF = "HF target.generate"
LOOKUP = "HF prompt lookup"


def parse_setting(text: str) -> dict[str, Any]:
    """``chain:K`` or ``dynamic:N:D`` as ``specdecode.generate`` keywords, ``sparse:N`` as
    ``{"sparse_nodes": N}`` (``ValueError`` else)."""
    parts = text.split(":")
    try:
        if parts[0] == "chain" and len(parts) == 2:
            return {"tree": None, "num_draft_tokens": int(parts[1])}
        if parts[0] == "dynamic" and len(parts) == 3:
            return {"tree": "dynamic", "num_nodes": int(parts[1]), "tree_depth": int(parts[2])}
        if parts[0] == "sparse" and len(parts) == 2:
            return {"sparse_nodes": int(parts[1])}
    except ValueError:
        pass
    raise ValueError(f"settings: expected chain:K, dynamic:N:D or sparse:N, got {text!r}")


def rank_accuracies(drafter: Any, target: Any, calibration: str | None) -> torch.Tensor:
    """``[K, 8]``: how often each Medusa head's rank-r token is the target's, over the first 512
    examples of the data cache ``calibration`` (``ValueError`` for other drafters or no data)."""
    import glob

    from specdecode.drafters.medusa import MedusaDrafter
    from specdecode.training.data import Example
    from specdecode.training.medusa import head_accuracies

    if not isinstance(drafter, MedusaDrafter):
        raise ValueError(f"sparse:N is for Medusa heads, not {type(drafter).__name__}")
    if calibration is None:
        raise ValueError("sparse:N needs --calibration-data (a data cache folder of the training kit)")
    files = sorted(glob.glob(f"{calibration}/**/batch_*.pt", recursive=True))
    examples = [Example(**row) for f in files for row in torch.load(f)][:512]
    if not examples:
        raise ValueError(f"calibration_data: no batch_*.pt under {calibration}")
    return head_accuracies(drafter.heads, target, examples)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt-set", choices=["tune", "report"], required=True)
    parser.add_argument("--drafter-dir", nargs="+", required=True, help="trained drafter folders")
    parser.add_argument("--settings", nargs="+", required=True, help="chain:K, dynamic:N:D or sparse:N")
    parser.add_argument("--calibration-data", default=None,
                        help="sparse:N: a data cache folder whose examples give the heads' rank accuracies")
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0])
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--num-prompts", type=int, default=None, help="the first N prompts of the set")
    parser.add_argument("--lookup-tokens", type=int, default=4, help="HF prompt lookup's prompt_lookup_num_tokens")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="bench_results")
    args = parser.parse_args(argv)
    settings = {s: parse_setting(s) for s in args.settings}

    import specdecode
    from specdecode.bench.real_pair import chat_prompts
    from specdecode.cli_args import sampling
    from specdecode.drafters.medusa import MedusaDrafter, sparse_tree
    from specdecode.training.artifacts import load_drafter

    torch.set_num_threads(args.threads)
    target, _, tok = specdecode.load_pair("smollm2", drafter="ngram")
    target.generation_config.eos_token_id = None
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    prompts = chat_prompts(tok, args.prompt_set, args.num_prompts)
    drafters = {folder: load_drafter(folder, target) for folder in args.drafter_dir}
    methods: list[tuple[str, Any]] = [(HF, None), (LOOKUP, None)]
    for folder, drafter in drafters.items():
        accuracies = None  # measured once per drafter, at its first sparse:N setting
        for name, kw in settings.items():
            how = (drafter, kw)
            if "sparse_nodes" in kw:
                try:
                    accuracies = (rank_accuracies(drafter, target, args.calibration_data) if accuracies is None
                                  else accuracies)
                except ValueError as exc:
                    parser.error(f"settings: {Path(folder).name} {name}: {exc}")
                how = (MedusaDrafter(target, drafter.heads, tree=sparse_tree(accuracies, kw["sparse_nodes"])), {})
            methods.append((f"{Path(folder).name} {name}", how))
    for name, (drafter, kw) in methods[2:]:  # a setting a drafter refuses stops the run before it starts
        try:
            specdecode.generate(target, drafter, prompts[0], max_new_tokens=2, pad_token_id=pad, **kw)
        except ValueError as exc:
            parser.error(f"settings: {name}: {exc}")
    rows = []
    for temperature in args.temperatures:
        common = dict(max_new_tokens=args.max_new_tokens, pad_token_id=pad, **sampling(temperature))
        seconds = {name: [0.0] * args.repeats for name, _ in methods}
        calls = {name: 0 for name, _ in methods}
        greedy: dict[int, torch.Tensor] = {}
        bar = tqdm(total=(1 + args.repeats) * len(prompts), unit="prompt",
                   desc=f"T={temperature}: prompts x rounds (the first round warms up)")
        for repeat in range(-1, args.repeats):  # repeat -1: a warm-up, not timed
            for p, ids in enumerate(prompts):
                for name, how in methods:
                    torch.manual_seed(args.seed + p)
                    start = time.perf_counter()
                    if how is None:
                        extra = {"prompt_lookup_num_tokens": args.lookup_tokens} if name == LOOKUP else {}
                        with specdecode.cpu.accelerated(target, enabled=False):
                            out_ids = target.generate(ids, attention_mask=torch.ones_like(ids), **common, **extra)
                        stats = None
                    else:
                        drafter, kw = how
                        out = specdecode.generate(target, drafter, ids, eos_token_id=None, **common, **kw,
                                                  generator=torch.Generator().manual_seed(args.seed + p))
                        out_ids, stats = out.sequences, out.stats
                    elapsed = time.perf_counter() - start
                    if repeat < 0:
                        if temperature == 0 and name == HF:
                            greedy[p] = out_ids
                        if temperature == 0 and stats is not None and not torch.equal(out_ids, greedy[p]):
                            raise SystemExit(f"{name}: greedy output differs from the target's on prompt {p}")
                        if stats is not None:
                            calls[name] += stats.row_steps
                        continue
                    seconds[name][repeat] += elapsed
                bar.update(1)
        bar.close()
        tokens = args.max_new_tokens * len(prompts)
        base = {n: statistics.median(seconds[n]) for n in (HF, LOOKUP)}
        for name, how in methods:
            t = statistics.median(seconds[name])
            rows.append({"temperature": temperature, "method": name,
                         "tok/call": round(tokens / calls[name], 3) if how is not None else None,
                         "tok/s": round(tokens / t, 2), "x_hf": round(base[HF] / t, 3),
                         "x_lookup": round(base[LOOKUP] / t, 3)})
    title = (f"SmolLM2-135M-Instruct, {args.prompt_set} chat prompts ({len(prompts)}), batch 1, "
             f"{args.max_new_tokens} new tokens, {args.threads} threads, median of {args.repeats}, interleaved")
    print(title)
    print(f"{'T':>4} {'method':<40} {'tok/call':>8} {'tok/s':>8} {'x_hf':>7} {'x_lookup':>8}")
    for r in rows:
        tpc = "-" if r["tok/call"] is None else f"{r['tok/call']:.2f}"
        print(f"{r['temperature']:>4} {r['method']:<40} {tpc:>8} {r['tok/s']:>8.2f} {r['x_hf']:>7.2f} {r['x_lookup']:>8.2f}")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    path = Path(args.out) / f"bench_drafter_settings_{args.prompt_set}.json"
    path.write_text(json.dumps({"title": title, "args": vars(args), "rows": rows}, indent=1) + "\n")
    print(f"wrote {path}")
    return rows


if __name__ == "__main__":
    main()
