"""Kernels (aten operations) per phase of one static-path step: a chain, a fixed tree and
EAGLE-2 dynamic trees, for the demo pair's draft model and a small EAGLE drafter; see
:mod:`specdecode.bench.kernels` for what is counted.

    python benchmarks/bench_tree_kernels.py             # counts and CPU time per step ratios
    python benchmarks/bench_tree_kernels.py --names     # also the bookkeeping kernels by name
"""

from specdecode.bench.kernels import main

if __name__ == "__main__":
    main(prog="bench_tree_kernels.py")
