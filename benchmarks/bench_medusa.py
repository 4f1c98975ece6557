"""Medusa and Hydra heads on the demo target side by side: per-head accuracy and tokens per
target call on held-out prompts, against the shipped draft model (batch 1, temperature 0).

    python -m specdecode train medusa --target demo --out runs/demo-medusa --minutes 4 --threads 1
    python -m specdecode train hydra --target demo --out runs/demo-hydra --minutes 4 --threads 1
    python benchmarks/bench_medusa.py --drafter-dir runs/demo-medusa --hydra-dir runs/demo-hydra --threads 1

Prompts: the demo corpus's held-out files (``demo_prompts()``): the first ``--num-prompts`` are
the evaluation set; the sparse tree's rank accuracies are measured on the last 8 (never in the
evaluation set). Per-head accuracy: on the target's greedy continuation ``y`` of each prompt,
how often head ``i``'s top-1 (top-5) token from ``f_t`` is ``y_{t+2+i}`` (for Hydra, given the
true ``y_{t+1} .. y_{t+1+i}``: teacher-forced, the rate at which a draft is right once the drafts
before it were). Tokens per target
call: new tokens / target decode forwards (the prefill not counted). Greedy output is checked
equal to the target's for every drafter and prompt.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch


def rank_accuracies(heads: Any, target: Any, sequences: list[torch.Tensor], starts: list[int], ranks: int
                    ) -> torch.Tensor:
    """``[K, ranks]``: how often head ``i``'s rank-``r`` token from ``f_t`` is ``y_{t+2+i}``, over
    every ``t >= start - 1`` of each greedy sequence ``y`` (the prompt's last token onwards; ranks
    among the ids of a reduced head when the heads have one)."""
    head = heads.output_head(target)
    hits = torch.zeros((heads.num_heads, ranks), dtype=torch.float64)
    counts = torch.zeros(heads.num_heads, dtype=torch.float64)
    with torch.no_grad():
        for seq, start in zip(sequences, starts):
            feats = target(seq[None], output_hidden_states=True).hidden_states[-1][0]
            top = head(heads(feats)).topk(ranks, -1).indices  # [T, K, ranks]
            n = seq.shape[0]
            for i in range(heads.num_heads):
                lo, hi = start - 1, n - 2 - i
                if hi <= lo:
                    continue
                hits[i] += (top[lo:hi, i] == seq[lo + 2 + i: n, None]).double().sum(0)
                counts[i] += hi - lo
    return hits / counts.clamp_min(1)[:, None]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drafter-dir", required=True, help="folder of a trained medusa drafter (demo target)")
    parser.add_argument("--hydra-dir", default=None, help="folder of a trained hydra drafter (demo target)")
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--tree-nodes", type=int, default=16, help="nodes of the sparse tree (root excluded)")
    parser.add_argument("--gamma", type=int, default=4, help="draft tokens per step of the shipped draft model")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    import specdecode
    from specdecode.demo import demo_prompts
    from specdecode.drafters.medusa import MedusaDrafter, sparse_tree

    target, draft_model, tokenizer = specdecode.load_demo_pair()
    pad = tokenizer.pad_token_id
    every = demo_prompts(93)
    encode = lambda text: tokenizer(text, return_tensors="pt").input_ids[:, -96:]  # noqa: E731
    evaluation = [encode(t) for t in every[: args.num_prompts]]
    tune = [encode(t) for t in every[-8:]]
    medusa = specdecode.load_drafter(args.drafter_dir, target)
    if not isinstance(medusa, MedusaDrafter):
        raise ValueError(f"drafter_dir: {args.drafter_dir!r} holds a {type(medusa).__name__}, not Medusa heads")

    def greedy(prompts: list[torch.Tensor]) -> list[torch.Tensor]:
        return [target.generate(p, attention_mask=torch.ones_like(p), do_sample=False, max_new_tokens=args.max_new_tokens,
                                pad_token_id=pad) for p in prompts]

    reference, tune_ref = greedy(evaluation), greedy(tune)
    sets = {"eval": ([r[0] for r in reference], [p.shape[1] for p in evaluation]),
            "tune": ([r[0] for r in tune_ref], [p.shape[1] for p in tune])}
    drafters = {f"draft model (shipped), gamma {args.gamma}": (specdecode.ModelDrafter(draft_model), args.gamma)}
    heads_drafters = [("medusa", medusa, lambda h, s, r: rank_accuracies(h, target, *sets[s], r))]
    if args.hydra_dir:
        from specdecode.drafters.hydra import HydraDrafter
        from specdecode.training.hydra import head_accuracies

        hydra = specdecode.load_drafter(args.hydra_dir, target)
        if not isinstance(hydra, HydraDrafter):
            raise ValueError(f"hydra_dir: {args.hydra_dir!r} holds a {type(hydra).__name__}, not Hydra heads")
        heads_drafters.append(("hydra", hydra, lambda h, s, r: head_accuracies(h, target, *sets[s], r)))
    for kind, chain, measure in heads_drafters:
        heads = chain.heads
        K = heads.num_heads
        with torch.no_grad():
            acc = measure(heads, "eval", 5)
            choices = sparse_tree(measure(heads, "tune", 8), args.tree_nodes)
        print(f"{kind}: {K} heads; per-head accuracy on {len(evaluation)} held-out prompts (head i drafts y_(t+2+i)):")
        for i in range(K):
            print(f"  head {i}: top-1 {acc[i, 0]:.3f}  top-5 {acc[i].sum():.3f}")
        print(f"  sparse tree ({len(choices)} nodes, from the tune prompts): {choices}")
        drafters[f"{kind} chain, {K} heads"] = (chain, K)
        drafters[f"{kind} sparse tree, {len(choices)} nodes"] = (type(chain)(target, heads, tree=choices), K)
    print(f"{'drafter':42s} {'tokens/target call':>19s} {'acceptance by position':>30s} {'seconds':>8s}")
    for name, (drafter, gamma) in drafters.items():
        new = calls = 0
        drafted = [0] * 8
        accepted = [0] * 8
        start = time.perf_counter()
        for p, want in zip(evaluation, reference):
            out = specdecode.generate(target, drafter, p, num_draft_tokens=gamma, max_new_tokens=args.max_new_tokens,
                                      pad_token_id=pad)
            assert torch.equal(out.sequences, want), name
            s = out.stats
            new += s.new_tokens
            calls += s.target_calls - s.target_prefill_calls
            for j, (d, a) in enumerate(zip(s.position_drafted, s.position_accepted)):
                drafted[j] += d
                accepted[j] += a
        seconds = time.perf_counter() - start
        # the share of drafting steps (pooled over the prompts) that accepted each position
        per_position = " ".join(f"{a / drafted[0]:.2f}" for a, d in zip(accepted, drafted) if d)
        print(f"{name:42s} {new / max(calls, 1):19.2f} {per_position:>30s} {seconds:8.1f}")


if __name__ == "__main__":
    main()
