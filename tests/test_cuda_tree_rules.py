"""The tree rules whose reference is a Python row function (traversal, gbv, spectr, spechub) on
the GPU, beside tests/test_cuda.py (whose agreement tests cover them through TREE_RULES): gbv's
CPU vs CUDA agreement on rows of K paths, and the chi-square law tests of
tests/test_tree_python_rules.py through the CUDA op. Skipped without a CUDA device.
"""

from __future__ import annotations

import pytest
import torch
from cuda_agreement import PATH_RULES, assert_tree_agree, paths_logit_inputs
from test_cuda import DTYPES, TREE_SAMPLINGS, VOCABS, _run_both_tree, cuda  # noqa: F401 (the fixture)

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("V", VOCABS[:3])
def test_cpu_cuda_agree_gbv(cuda, V, dtype):  # noqa: F811
    """verify_tree with gbv on rows of K paths of one length (ragged K and L)."""
    inputs = paths_logit_inputs(17, V, dtype, seed=V)
    for sampling in TREE_SAMPLINGS:
        for rule, params in PATH_RULES:
            cpu, gpu = _run_both_tree(rule, params, sampling, *inputs, cuda)
            assert_tree_agree(rule, params, cpu, gpu, *inputs, sampling)


def test_row_function_rules_keep_the_target_law_on_gpu(cuda):  # noqa: F811
    """The chi-square tests of tests/test_tree_python_rules.py (traversal, gbv, spechub, spectr
    on trees drafted by their schemes) through the CUDA op."""
    import test_tree_python_rules as tpr

    for rule, scheme, shape in tpr.LAW_CASES:
        fit = tpr.law_fit(rule, scheme, shape, device=cuda)
        assert fit.pvalue > 1e-4, f"{rule}: {fit}"
