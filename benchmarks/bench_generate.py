"""End-to-end generation benchmark (same as ``python -m specdecode bench``); see
:mod:`specdecode.bench.generate` for what is measured.

    python benchmarks/bench_generate.py              # full table (cost-realistic pair)
    python benchmarks/bench_generate.py --quick      # smoke run
    python benchmarks/bench_generate.py --plot       # figures in bench_results/
"""

from specdecode.bench.generate import main

if __name__ == "__main__":
    main(prog="bench_generate.py")
