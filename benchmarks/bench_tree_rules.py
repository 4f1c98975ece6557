"""Tree rules compared by exact enumeration: acceptance at one node with k drafts (k = 2..4) and
expected accepted length on small trees, for ``specinfer``, ``rrs`` and the rules whose
reference is a Python row function (``traversal``, ``traversal_iid``, ``gbv``, ``spectr``,
``spechub``), each with
the drafting scheme it is lossless for; then the same trees verified with the same coins.

Every number in the first two tables is exact (Fractions: every draft draw and every coin
enumerated, with the test suite's own enumeration code, ``tests/tree_law_utils.py``), averaged
over synthetic target/draft tables of mixed kinds (random, sparse, one-hot, peaked,
near-uniform rows; drafts equal to, close to or independent of the target). The last table
runs ``specdecode.verify_tree`` on 20000 drafted trees with one set of coins shared by the two
rules compared.

    python benchmarks/bench_tree_rules.py            # the tables of docs/trees.md
    python benchmarks/bench_tree_rules.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import itertools
import sys
from fractions import Fraction
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import tree_law_utils as tlu  # noqa: E402
import tree_stat_utils as tsu  # noqa: E402

import specdecode  # noqa: E402
from specdecode.trees.multipath import gbv_row  # noqa: E402
from specdecode.trees.reference import rrs_node, specinfer_node  # noqa: E402
from specdecode.trees.transport import spechub_node  # noqa: E402
from specdecode.trees.traversal import traversal_row  # noqa: E402

#: rule -> (row function, drafting scheme)
RULES = {
    "specinfer": (tlu.node_rule_as_row(specinfer_node), "iid"),
    "rrs": (tlu.node_rule_as_row(rrs_node), "without_replacement"),
    "spectr": (tlu.node_rule_as_row(tlu.memoized_spectr_node()), "iid"),
    "spechub": (tlu.node_rule_as_row(spechub_node), "hub"),
    "traversal_iid": (partial(traversal_row, replacement=True), "iid"),
    "traversal": (partial(traversal_row, replacement=False), "without_replacement"),
    "gbv": (gbv_row, "iid"),
}
FULL_SUPPORT = ("close", "near_uniform", "independent", "equal")


def expected(tables, shape, rule: str) -> Fraction:
    row, scheme = RULES[rule]
    return tsu.expected_accepted(tlu.whole_tree_law(tables, shape, row, scheme))


def hit_probability(q, k: int, subset: set[int], scheme: str) -> Fraction:
    """P(at least one of k drafts of ``scheme`` lies in ``subset``)."""
    return sum((prob for drawn, prob in tlu.scheme_draws(scheme)(q, k) if subset & set(drawn)), Fraction(0))


def transport_bound(p, q, k: int, scheme: str) -> Fraction:
    """The best acceptance any verification can reach with these k drafts (optimal transport
    with membership cost): ``min_T P(a draft in T) + p(outside T)`` over token sets T."""
    V = len(p)
    best = Fraction(1)
    for size in range(V + 1):
        for subset in itertools.combinations(range(V), size):
            s = set(subset)
            best = min(best, hit_probability(q, k, s, scheme) + sum(p[x] for x in range(V) if x not in s))
    return best


def table_one_node(V: int, seeds: range) -> None:
    rules = ["specinfer", "rrs", "spectr", "spechub", "gbv", "traversal"]
    print(f"\n### Acceptance probability at one node with k drafts (V = {V}, mean of {len(seeds)} tables)\n")
    print("| k | " + " | ".join(rules) + " | OT bound, i.i.d. | OT bound, w/o repl. |")
    print("|---" * (len(rules) + 3) + "|")
    for k in (2, 3, 4):
        sums = dict.fromkeys(rules + ["bound_iid", "bound_wor"], Fraction(0))
        for seed in seeds:
            tables = tsu.ExactTables(V, seed, draft_relations=FULL_SUPPORT)
            shape = tsu.branching_shape([k])
            for rule in rules:
                sums[rule] += expected(tables, shape if rule != "gbv" else tlu.paths_shape(k, 1), rule)
            p, q = tables.p(()), tables.q(())
            sums["bound_iid"] += transport_bound(p, q, k, "iid")
            sums["bound_wor"] += transport_bound(p, q, k, "without_replacement")
        n = len(seeds)
        cells = [f"{float(sums[r]) / n:.4f}" for r in rules + ["bound_iid", "bound_wor"]]
        print(f"| {k} | " + " | ".join(cells) + " |")


def table_trees(V: int, seeds: range) -> None:
    shapes = {
        "chain 3": (tsu.chain_shape(3), True),
        "2 x 2 (7 nodes)": (tsu.branching_shape([2, 2]), False),
        "1 x 3 (5 nodes)": (tsu.branching_shape([1, 3]), False),
        "2 paths x 2 (5 nodes)": (tlu.paths_shape(2, 2), True),
        "3 paths x 2 (7 nodes)": (tlu.paths_shape(3, 2), True),
        "2 paths x 3 (7 nodes)": (tlu.paths_shape(2, 3), True),
    }
    rules = ["specinfer", "rrs", "spectr", "spechub", "traversal_iid", "traversal", "gbv"]
    print(f"\n### Expected accepted draft tokens per tree (V = {V}, mean of {len(seeds)} tables; "
          "each rule on trees drafted by its own scheme)\n")
    print("| shape | " + " | ".join(rules) + " | gbv < specinfer | traversal < rrs |")
    print("|---" * (len(rules) + 3) + "|")
    for name, (shape, paths) in shapes.items():
        sums = dict.fromkeys(rules, Fraction(0))
        gbv_losses = traversal_losses = 0
        for seed in seeds:
            tables = tsu.ExactTables(V, seed, draft_relations=FULL_SUPPORT)
            values = {rule: expected(tables, shape, rule) for rule in rules if rule != "gbv" or paths}
            for rule, value in values.items():
                sums[rule] += value
            gbv_losses += paths and values["gbv"] < values["specinfer"]
            traversal_losses += values["traversal"] < values["rrs"]
        n = len(seeds)
        cells = [f"{float(sums[r]) / n:.4f}" if (r != "gbv" or paths) else "–" for r in rules]
        gbv_cell = f"{gbv_losses} / {n}" if paths else "–"
        print(f"| {name} | " + " | ".join(cells) + f" | {gbv_cell} | {traversal_losses} / {n} |")


def same_coins_exact(V: int, seeds: range) -> None:
    """Both rules verify the same drafted trees with the same coins, enumerated exactly (every
    coin kept as an interval that the two rules' questions split)."""
    print(f"\n### Same trees, same coins, exactly (V = {V}, mean over {len(seeds)} tables)\n")
    print("| trees | rule A vs rule B | P(A accepts fewer) | P(same) | P(A accepts more) |")
    print("|---|---|---|---|---|")
    cases = [
        ("chain 3, i.i.d.", tsu.chain_shape(3), "traversal_iid", "specinfer"),
        ("2 x 2, without replacement", tsu.branching_shape([2, 2]), "traversal", "rrs"),
        ("2 x 2, i.i.d.", tsu.branching_shape([2, 2]), "traversal_iid", "specinfer"),
        ("2 paths x 2, i.i.d.", tlu.paths_shape(2, 2), "gbv", "specinfer"),
        ("2 paths x 2, i.i.d.", tlu.paths_shape(2, 2), "gbv", "traversal_iid"),
        ("3 x 1, i.i.d.", tsu.branching_shape([3, 1]), "spectr", "specinfer"),
    ]
    for label, shape, a, b in cases:
        total = dict.fromkeys(("fewer", "same", "more"), Fraction(0))
        for seed in seeds:
            tables = tsu.ExactTables(V, seed, draft_relations=FULL_SUPPORT)
            result = tlu.same_coin_comparison(tables, shape, RULES[a][0], RULES[b][0], RULES[a][1])
            for key in total:
                total[key] += result[key]
        n = len(seeds)
        print(f"| {label} | {a} vs {b} | {float(total['fewer']) / n:.4f} | {float(total['same']) / n:.4f} | "
              f"{float(total['more']) / n:.4f} |")


def same_coins(n: int) -> None:
    """The same comparison through ``specdecode.verify_tree`` on drafted batches."""
    print(f"\n### Same trees, same coins, through specdecode.verify_tree ({n} trees, V = 4, one table)\n")
    print("| trees | rule A vs rule B | A accepts fewer | same | A accepts more | mean tokens A | mean tokens B |")
    print("|---|---|---|---|---|---|---|")
    exact = tsu.ExactTables(4, 11, target_kinds=("random", "peaked", "near_uniform", "sparse"),
                            draft_relations=("close", "near_uniform"))
    cases = [
        ("2 x 2, without replacement", tsu.branching_shape([2, 2]), "without_replacement", "traversal", "rrs"),
        ("2 x 2, i.i.d.", tsu.branching_shape([2, 2]), "iid", "traversal_iid", "specinfer"),
        ("3 paths x 2, i.i.d.", tlu.paths_shape(3, 2), "iid", "gbv", "specinfer"),
        ("3 paths x 2, i.i.d.", tlu.paths_shape(3, 2), "iid", "spectr", "specinfer"),
    ]
    for label, shape, scheme, a, b in cases:
        tables = exact.as_prefix_tables(tsu.shape_depth(shape))
        gen = torch.Generator().manual_seed(0)
        tree, p, q = tsu.draft_tree_batch(tables, shape, scheme, n, gen)
        coins = torch.rand(tree.batch_size, tree.max_nodes, generator=gen, dtype=torch.float64)
        la = specdecode.verify_tree(p.log(), q.log(), tree, rule=a, temperature=1.0, uniforms=coins).accepted_len
        lb = specdecode.verify_tree(p.log(), q.log(), tree, rule=b, temperature=1.0, uniforms=coins).accepted_len
        fewer, same, more = (float((la < lb).double().mean()), float((la == lb).double().mean()),
                             float((la > lb).double().mean()))
        print(f"| {label} | {a} vs {b} | {fewer:.3f} | {same:.3f} | {more:.3f} | "
              f"{float(la.double().mean()) + 1:.4f} | {float(lb.double().mean()) + 1:.4f} |")


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench_tree_rules.py", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few tables, small batches (smoke run)")
    args = parser.parse_args()
    seeds = range(4) if args.quick else range(40)
    table_one_node(4, seeds)
    table_trees(3, range(3) if args.quick else range(20))
    same_coins_exact(3, range(3) if args.quick else range(20))
    same_coins(2000 if args.quick else 20000)


if __name__ == "__main__":
    main()
