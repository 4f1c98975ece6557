"""specdecode.grouped_attention: grouped-query heads folded into the query axis, one SDPA call
over the cache as it is (what the data stage runs on CUDA; the function itself is device-free,
so it is checked here on the CPU): against float64 attention with the key/value heads repeated,
every mask form it takes, the calls it hands to Transformers' SDPA function unchanged, the
install block, and a grouped-query model's logits and the static path's greedy output."""

from __future__ import annotations

import pytest
import torch
from test_generate_models import PAD, left_padded, make_model, make_pair  # noqa: F401
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from specdecode import generate, grouped_attention
from specdecode.engine import static_loop
from specdecode.grouped_attention import ATTENTION_NAME, MAX_QUERIES, grouped_attention_applies, \
    grouped_sdpa_attention

LOWEST = torch.finfo(torch.float32).min


def _reference(query, key, value, mask, scale):
    """float64 attention with each key/value head repeated for its group: ``[B, n, H, D]``."""
    groups = query.shape[1] // key.shape[1]
    k = key.double().repeat_interleave(groups, 1)
    v = value.double().repeat_interleave(groups, 1)
    scores = query.double() @ k.transpose(-1, -2) * scale
    scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask.double()
    return (scores.softmax(-1) @ v).transpose(1, 2)


def _mask(kind, mask_batch, mask_queries, C, seed):
    gen = torch.Generator().manual_seed(seed)
    allowed = torch.rand(mask_batch, 1, mask_queries, C, generator=gen) < 0.7
    allowed[..., -1] = True  # every query attends somewhere
    if kind == "bool":
        return allowed
    fill = {"lowest": LOWEST, "-inf": float("-inf")}[kind]
    bias = torch.randn(mask_batch, 1, mask_queries, C, generator=gen) * 0.5
    return torch.where(allowed, bias, torch.full_like(bias, fill))


@pytest.mark.parametrize("B", [1, 3, 17])
@pytest.mark.parametrize("heads", [(4, 2), (9, 3), (6, 1)])
@pytest.mark.parametrize("n", [1, 2, 7])
@pytest.mark.parametrize("kind", ["lowest", "-inf", "bool"])
def test_equals_attention_with_repeated_heads(B, heads, n, kind):
    H, Hkv = heads
    C, D = 33, 16
    gen = torch.Generator().manual_seed(B * 100 + H * 10 + n)
    query = torch.randn(B, n, H, D, generator=gen).transpose(1, 2)  # a projection's strides
    key = torch.randn(B, Hkv, C, D, generator=gen)
    value = torch.randn(B, Hkv, C, D, generator=gen)
    for mask_batch in (1, B):
        for mask_queries in (1, n):
            mask = _mask(kind, mask_batch, mask_queries, C, seed=mask_batch + mask_queries)
            args = (query, key, value, mask)
            before = [t.clone() for t in args]
            assert grouped_attention_applies(*args)
            out, weights = grouped_sdpa_attention(None, *args, scaling=0.3)
            assert weights is None and out.shape == (B, n, H, D) and out.is_contiguous()
            torch.testing.assert_close(out.double(), _reference(*args, 0.3), atol=2e-5, rtol=2e-5)
            assert all(torch.equal(a, b) for a, b in zip(args, before))  # inputs unchanged


@pytest.mark.parametrize("case", ["no mask", "no groups", "per-head mask", "dropout", "too many queries",
                                  "mask dtype", "grad", "position bias"])
def test_other_calls_go_to_sdpa_unchanged(case):
    B, H, Hkv, n, C, D = 3, 4, 2, 2, 9, 8
    query = torch.randn(B, H, n, D)
    key, value = torch.randn(B, Hkv, C, D), torch.randn(B, Hkv, C, D)
    mask = _mask("lowest", B, n, C, seed=0)
    kwargs = {}
    if case == "no mask":
        mask = None
    elif case == "no groups":
        key, value = key.repeat_interleave(2, 1), value.repeat_interleave(2, 1)
    elif case == "per-head mask":
        mask = mask.expand(B, H, n, C).contiguous()
    elif case == "dropout":
        kwargs["dropout"] = 0.5
    elif case == "too many queries":
        query = torch.randn(B, H, MAX_QUERIES + 1, D)
        mask = _mask("lowest", B, MAX_QUERIES + 1, C, seed=0)
    elif case == "mask dtype":
        mask = mask.double()
    elif case == "grad":
        query.requires_grad_(True)
    elif case == "position bias":
        kwargs["position_bias"] = torch.zeros(1, H, n, C)
    assert not grouped_attention_applies(query, key, value, mask, **kwargs)
    if case in ("dropout", "position bias", "mask dtype"):
        return  # SDPA's function takes these its own way (random, or a mask it builds); the delegation is shown by the rest
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = H // key.shape[1], False
    torch.manual_seed(0)
    ours, _ = grouped_sdpa_attention(module, query, key, value, mask, **kwargs)
    torch.manual_seed(0)
    theirs, _ = sdpa_attention_forward(module, query, key, value, mask, **kwargs)
    assert torch.equal(ours, theirs)


def test_installed_switches_sdpa_configs_for_the_block():
    model = make_model("llama")
    eager = make_model("llama")
    eager.config._attn_implementation = "eager"
    with grouped_attention.installed(model) as switched, grouped_attention.installed(eager) as untouched:
        assert switched == 1 and untouched == 0
        assert model.config._attn_implementation == ATTENTION_NAME and eager.config._attn_implementation == "eager"
    assert model.config._attn_implementation == "sdpa"
    with pytest.raises(TypeError, match="model"):
        with grouped_attention.installed("llama"):
            pass


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral"])
def test_a_grouped_model_keeps_its_logits_and_the_static_path_its_greedy_output(arch, monkeypatch):
    folds = []
    applies = grouped_attention.grouped_attention_applies
    monkeypatch.setattr(grouped_attention, "grouped_attention_applies",
                        lambda *a, **k: folds.append(applies(*a, **k)) or folds[-1])
    target, _ = make_pair(arch)
    assert target.config.num_key_value_heads < target.config.num_attention_heads
    ids, mask = left_padded([5, 9, 2, 7], seed=1)
    with torch.no_grad():
        plain = target(ids, attention_mask=mask).logits
        want = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=12, pad_token_id=PAD)
        with grouped_attention.installed(target):
            folded = target(ids, attention_mask=mask).logits
    real = mask.bool()
    torch.testing.assert_close(folded[real], plain[real], atol=1e-5, rtol=1e-5)
    static_loop.clear_static_sessions()
    with grouped_attention.installed(target):
        got = generate(target, None, ids, mask, pad_token_id=PAD, decode_path="static", max_new_tokens=12)
    static_loop.clear_static_sessions()
    assert torch.equal(got.sequences, want)
    assert sum(folds) >= 12 * target.config.num_hidden_layers  # the steps were folded
