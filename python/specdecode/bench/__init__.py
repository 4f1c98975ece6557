"""The benchmarks behind ``python -m specdecode bench``, one module per subject:

- :mod:`~specdecode.bench.generate`: end-to-end generation (``bench``): the target alone,
  Hugging Face assisted generation and specdecode, by rule, drafter, gamma and batch size;
- :mod:`~specdecode.bench.trees`: token trees against chains (``bench --trees``);
- :mod:`~specdecode.bench.gpu`: the decode paths, eager, static and graphed (``bench --device``);
- :mod:`~specdecode.bench.harness`: what they share with the scripts in ``benchmarks/``: timing
  with warm-up and medians, tables that fit 100 columns, CSV/JSON results.

They use the library as a user would; only the command line (:mod:`specdecode.cli`) imports them.
"""
