"""Token trees vs chains on the demo pair (same as ``python -m specdecode bench --trees``); see
:mod:`specdecode.bench.trees` for what is measured.

    python benchmarks/bench_trees.py              # full table
    python benchmarks/bench_trees.py --quick      # smoke run
    python benchmarks/bench_trees.py --plot       # figure in bench_results/
"""

from specdecode.bench.trees import main

if __name__ == "__main__":
    main(prog="bench_trees.py")
