"""``specdecode.sampling``: SamplingParams validation (the one greedy switch) and the compiled
``sample_logits`` op, which must draw from exactly the processed distribution verification reads."""

from __future__ import annotations

import pytest
import torch
from scipy import stats as scipy_stats

import specdecode  # noqa: F401
from specdecode.reference import process_logits, sample_inverse_cdf
from specdecode.sampling import SamplingParams, as_sampling_params, sample_logits

OPS = torch.ops.specdecode


@pytest.mark.parametrize(
    "kwargs, error, name",
    [
        (dict(temperature=-1.0), ValueError, "temperature"),
        (dict(temperature=float("inf")), ValueError, "temperature"),
        (dict(temperature="hot"), TypeError, "temperature"),
        (dict(top_k=-1), ValueError, "top_k"),
        (dict(top_k=2.5), TypeError, "top_k"),
        (dict(top_p=0.0), ValueError, "top_p"),
        (dict(top_p=1.5), ValueError, "top_p"),
        (dict(min_p=-0.1), ValueError, "min_p"),
        (dict(min_p=True), TypeError, "min_p"),
    ],
)
def test_sampling_params_rejects_bad_values(kwargs, error, name):
    with pytest.raises(error, match=name):
        SamplingParams(**kwargs)


def test_greedy_switch_and_generate_convention():
    assert SamplingParams(temperature=0).is_greedy
    assert not SamplingParams(temperature=0.5).is_greedy
    assert SamplingParams.from_generate_kwargs(do_sample=False, temperature=0.7).is_greedy
    params = SamplingParams.from_generate_kwargs(do_sample=True, temperature=0.7, top_k=None, top_p=0.9)
    assert params == SamplingParams(0.7, 0, 0.9, 0.0) and params.has_filters
    with pytest.raises(ValueError, match="temperature"):  # validated even when do_sample=False
        SamplingParams.from_generate_kwargs(do_sample=False, temperature=-2.0)
    with pytest.raises(ValueError, match="sampling"):
        as_sampling_params(SamplingParams(), temperature=0.5)


@pytest.mark.parametrize("V", [7, 111, 32000])
@pytest.mark.parametrize("B", [1, 3, 17])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sample_logits_equals_inverse_cdf_of_processed_distribution(V, B, dtype):
    gen = torch.Generator().manual_seed(V * 31 + B)
    logits = (3 * torch.randn(B, V, generator=gen)).to(dtype)
    u = torch.rand(B, dtype=torch.float64, generator=gen)
    for params in (SamplingParams(), SamplingParams(0.7, 5, 0.9, 0.02), SamplingParams(1.3, 0, 0.5, 0.0)):
        tokens = sample_logits(logits, params, uniforms=u)
        for b in range(B):
            q = process_logits(logits[b].double(), *params.op_args())
            expected = sample_inverse_cdf(q, float(u[b]))
            # float32 processing vs the float64 oracle: equal unless u sits within ~1e-6 of a boundary
            if int(tokens[b]) != expected:
                cdf = torch.cumsum(q, 0)
                assert float((cdf - u[b]).abs().min()) < 1e-5
            assert q[int(tokens[b])] > 0  # never a filtered-out token


def test_sample_logits_greedy_is_argmax_lowest_tie():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [5.0, 5.0, 5.0, 5.0]])
    assert sample_logits(logits, SamplingParams.greedy()).tolist() == [1, 0]


def test_sample_logits_law_matches_verify_q():
    """Chi-square: the tokens drawn by sample_logits follow the processed distribution q of
    docs/verification.md (temperature, top-k, top-p, min-p); no filtered-out token is ever drawn."""
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(1, 9, generator=gen) * 2
    params = SamplingParams(0.9, 6, 0.95, 0.0)
    n = 40000
    tokens = sample_logits(logits.expand(n, -1).contiguous(), params, generator=gen)
    q = process_logits(logits[0].double(), *params.op_args()).numpy()
    counts = torch.bincount(tokens, minlength=9).numpy()
    assert counts[q == 0].sum() == 0
    keep = q > 0
    assert scipy_stats.chisquare(counts[keep], q[keep] * n).pvalue > 1e-4


def test_sample_logits_bad_input():
    with pytest.raises(ValueError, match="logits"):
        sample_logits(torch.randn(3), SamplingParams())
    with pytest.raises(TypeError, match="logits"):
        sample_logits(torch.zeros(2, 3, dtype=torch.long), SamplingParams())
    with pytest.raises(ValueError, match="uniforms"):
        sample_logits(torch.randn(2, 3), SamplingParams(), uniforms=torch.rand(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="logits"):
        sample_logits(torch.tensor([[0.0, float("nan")]]), SamplingParams())
    with pytest.raises(ValueError, match="logits"):
        sample_logits(torch.full((1, 4), float("-inf")), SamplingParams())
    # direct op calls never crash: ValueError / TypeError
    with pytest.raises(TypeError, match="uniforms"):
        OPS.sample_logits(torch.randn(2, 3), torch.rand(2), 1.0, 0, 1.0, 0.0)
    with pytest.raises(ValueError, match="logits"):
        OPS.sample_logits(torch.randn(2, 0), torch.rand(2, dtype=torch.float64), 1.0, 0, 1.0, 0.0)


def test_sample_logits_philox_is_deterministic():
    logits = torch.randn(4, 50)
    a = OPS.sample_logits_philox(logits, torch.tensor([7]), torch.tensor([3]), 1.0, 0, 1.0, 0.0)
    b = OPS.sample_logits_philox(logits, torch.tensor([7]), torch.tensor([3]), 1.0, 0, 1.0, 0.0)
    assert torch.equal(a, b)


@pytest.mark.parametrize("philox", [False, True])
def test_opcheck_sample_logits(philox):
    logits = torch.randn(3, 17)
    if philox:
        args = (logits, torch.tensor([1]), torch.tensor([2]), 0.8, 4, 0.9, 0.0)
        torch.library.opcheck(OPS.sample_logits_philox.default, args)
    else:
        args = (logits, torch.rand(3, dtype=torch.float64), 0.8, 4, 0.9, 0.0)
        torch.library.opcheck(OPS.sample_logits.default, args)


@pytest.mark.parametrize("V", [7, 111, 32000])
def test_processed_probs_is_the_distribution_sample_logits_draws_from(V):
    from specdecode.sampling import processed_probs

    gen = torch.Generator().manual_seed(V)
    logits = 2 * torch.randn(3, V, generator=gen)
    for params in (SamplingParams(), SamplingParams(0.6, 9, 0.85, 0.01), SamplingParams.greedy()):
        probs = processed_probs(logits, params)
        assert probs.dtype == torch.float64 and probs.shape == (3, V)
        assert torch.allclose(probs.sum(1), torch.ones(3, dtype=torch.float64), atol=1e-12)
        expected = process_logits(logits.double(), *params.op_args())
        assert float((probs - expected).abs().max()) < 1e-6
        assert torch.equal(probs > 0, expected > 0)  # the same support, exactly
        u = torch.rand(3, dtype=torch.float64, generator=gen)
        drawn = sample_logits(logits, params, uniforms=u)
        for b in range(3):
            assert probs[b, int(drawn[b])] > 0


def test_opcheck_processed_probs_and_bad_input():
    from specdecode.sampling import processed_probs

    torch.library.opcheck(OPS.processed_probs.default, (torch.randn(3, 11), 0.9, 3, 0.8, 0.0))
    with pytest.raises(ValueError, match="logits"):
        processed_probs(torch.randn(4), SamplingParams())
    with pytest.raises(ValueError, match="logits"):
        processed_probs(torch.tensor([[float("nan"), 0.0]]), SamplingParams())
    with pytest.raises(TypeError, match="sampling"):
        processed_probs(torch.randn(2, 3), 0.5)
