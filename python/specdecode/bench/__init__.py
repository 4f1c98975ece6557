"""The benchmarks behind ``python -m specdecode bench``, one module per subject:

- :mod:`~specdecode.bench.generate`: end-to-end generation (``bench``): the target alone,
  Hugging Face assisted generation and specdecode, by rule, drafter, gamma and batch size;
- :mod:`~specdecode.bench.real_pair`: the real pair, SmolLM2-135M-Instruct on held-out chat
  requests (``bench --pair smollm2``): the target alone, HF prompt lookup, prompt lookup and
  trained drafters (``--drafter-dir``);
- :mod:`~specdecode.bench.trees`: token trees against chains (``bench --trees``);
- :mod:`~specdecode.bench.gpu`: the decode paths, eager, static, graphed and compiled, and Hugging
  Face's (``bench --device``, ``--preset gpu-session``), with its methods
  (:mod:`~specdecode.bench.gpu_methods`), pairs (:mod:`~specdecode.bench.gpu_pairs`), presets and
  the cost per call (:mod:`~specdecode.bench.gpu_plan`);
- :mod:`~specdecode.bench.harness`: what they share with the scripts in ``benchmarks/``: timing
  with warm-up and medians, tables that fit 100 columns, CSV/JSON results.

They use the library as a user would; only the command line (:mod:`specdecode.cli`) imports them.
"""
