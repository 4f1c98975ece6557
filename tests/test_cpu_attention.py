"""The CPU fast path's attention (specdecode.cpu_attention): the skinny_attention op agrees with
scaled_dot_product_attention at odd sizes, with every instruction set, never lets what the
columns its mask rules out hold reach the output, and rejects bad input by name; the Hugging Face attention it installs
takes the op only where it applies, and greedy decoding is unchanged with it. No timing here
(see benchmarks/bench_cpu_attention.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_cpu_fast import run_with_isa
from test_generate_models import left_padded, make_model, make_pair

import specdecode
from specdecode import cpu, cpu_attention

OP = torch.ops.specdecode.skinny_attention
LOWEST = torch.finfo(torch.float32).min


def _case(B: int, H: int, Hkv: int, n: int, C: int, D: int, seed: int = 0, masked: float = 0.4,
          mask_heads: int = 1) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, n, D, generator=gen)
    k = torch.randn(B, Hkv, C, D, generator=gen)
    v = torch.randn(B, Hkv, C, D, generator=gen)
    mask = torch.randn(B, mask_heads, n, C, generator=gen) * 0.5  # an additive bias as well as a mask
    mask.masked_fill_(torch.rand(B, mask_heads, n, C, generator=gen) < masked, LOWEST)
    return q, k, v, mask


def _expected(q, k, v, mask, scale):
    """SDPA in float64, the key/value heads repeated for grouped queries."""
    group = q.shape[1] // k.shape[1]
    k2, v2 = k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    return F.scaled_dot_product_attention(q.double(), k2, v2, attn_mask=mask.double(), scale=scale).float()


@pytest.mark.parametrize("B", [1, 3, 17])
@pytest.mark.parametrize("H,Hkv", [(1, 1), (4, 4), (9, 3), (6, 2)])
@pytest.mark.parametrize("n", [1, 2, 7])
@pytest.mark.parametrize("C,D", [(1, 64), (5, 128), (111, 64), (194, 7), (33, 16), (13, 33)])
def test_matches_sdpa_at_odd_sizes(B, H, Hkv, n, C, D):
    """Batch rows, grouped heads, query counts, cache lengths that are not a multiple of the
    four-column block, and head sizes on the vector path (64, 128) and off it (7, 16, 33):
    within float rounding of float64 SDPA, with masked columns and an additive bias."""
    q, k, v, mask = _case(B, H, Hkv, n, C, D, seed=B * 100 + n * 10 + C)
    mask[..., 0] = 0.0  # every query attends to something (fully masked rows: their own test)
    torch.testing.assert_close(OP(q, k, v, mask, D ** -0.5), _expected(q, k, v, mask, D ** -0.5),
                               rtol=1e-5, atol=2e-6)


def test_boolean_masks_as_sdpa():
    """A boolean mask (True = attend, Transformers' own masks): SDPA's result at odd sizes, a row
    of only False gets zeros as SDPA's, and what the columns it rules out hold never reaches the
    output."""
    for B, H, Hkv, n, C, D in [(1, 9, 3, 5, 70, 64), (3, 4, 4, 1, 111, 128), (2, 6, 2, 7, 13, 33)]:
        q, k, v, additive = _case(B, H, Hkv, n, C, D, seed=C)
        mask = additive > LOWEST
        mask[..., 0] = True
        reference = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.2, enable_gqa=H != Hkv)
        torch.testing.assert_close(OP(q, k, v, mask, 0.2), reference, rtol=1e-5, atol=2e-6)
        mask[0, :, 0] = False
        unread = ~mask.any(2)[:, :, :, None]  # [B, 1, C, 1]: columns no query of the row attends
        out = OP(q, k.masked_fill(unread, float("nan")), v.masked_fill(unread, float("inf")), mask, 0.2)
        assert torch.equal(out[0, :, 0], torch.zeros_like(out[0, :, 0]))
        reference = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.2, enable_gqa=H != Hkv)
        torch.testing.assert_close(out, reference, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("shape", ["per_head", "broadcast_all", "one_query_row"])
def test_mask_shapes_broadcast(shape):
    """A mask per head [B, H, n, C], one for all rows and heads [1, 1, 1, C], and one query row
    for every query [B, 1, 1, C]: as SDPA broadcasts them."""
    B, H, Hkv, n, C, D = 3, 6, 2, 4, 50, 64
    heads = {"per_head": H, "broadcast_all": 1, "one_query_row": 1}[shape]
    q, k, v, mask = _case(B, H, Hkv, n, C, D, mask_heads=heads)
    if shape == "broadcast_all":
        mask = mask[:1, :, :1]
    elif shape == "one_query_row":
        mask = mask[:, :, :1]
    mask[..., 3] = 0.0
    torch.testing.assert_close(OP(q, k, v, mask, 0.3), _expected(q, k, v, mask.expand(B, -1, n, C), 0.3),
                               rtol=1e-5, atol=2e-6)


def test_fully_masked_rows_as_sdpa():
    """A query row with every column at the lowest float gets SDPA's uniform weights (the mean
    of the values); one with every column at -inf gets zeros, as SDPA's CPU kernel returns."""
    q, k, v, mask = _case(2, 4, 4, 3, 20, 64)
    mask[0, :, 1] = LOWEST
    mask[1, :, 2] = float("-inf")
    mask[:, :, 0, 5] = 0.0
    out = OP(q, k, v, mask, 0.125)
    torch.testing.assert_close(out[0, :, 1], v[0].mean(1), rtol=1e-5, atol=1e-6)
    assert torch.equal(out[1, :, 2], torch.zeros_like(out[1, :, 2]))
    reference = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.125)
    torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-5)


def test_masked_columns_are_not_read():
    """Keys and values of masked columns (the lowest float or -inf) may hold anything, NaN
    included: the output is that of the attended columns alone."""
    B, H, n, C, D = 3, 4, 2, 70, 64
    q, k, v, mask = _case(B, H, H, n, C, D, masked=0.0)
    mask[:, :, :, 40:] = LOWEST
    mask[:, :, :, :6] = float("-inf")
    poisoned_k, poisoned_v = k.clone(), v.clone()
    for t in (poisoned_k, poisoned_v):
        t[:, :, 40:] = float("nan")
        t[:, :, :6] = float("inf")
    out = OP(q, poisoned_k, poisoned_v, mask, D ** -0.5)
    expected = _expected(q[..., :], k[:, :, 6:40], v[:, :, 6:40], mask[..., 6:40], D ** -0.5)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=2e-6)


def test_strided_inputs_and_empty_shapes():
    """Keys and values that are views of a larger tensor (a static cache's stacked layers), a
    query transposed from [B, n, H, D] (as attention layers make it), and rows whose last
    dimension is strided (copied once) give the contiguous inputs' result; empty shapes are fine."""
    q, k, v, mask = _case(2, 4, 2, 3, 30, 64)
    mask[..., 0] = 0.0
    want = OP(q, k, v, mask, 0.2)
    stacked = torch.stack([torch.randn_like(k), k, v])
    q_view = q.transpose(1, 2).contiguous().transpose(1, 2)
    torch.testing.assert_close(OP(q_view, stacked[1], stacked[2], mask, 0.2), want)
    wide = torch.stack([k, torch.zeros_like(k)], -1).flatten(-2)[..., ::2]  # last-dim stride 2
    torch.testing.assert_close(OP(q, wide, v, mask, 0.2), want)
    assert OP(q[:0], k[:0], v[:0], mask[:0], 0.2).shape == (0, 4, 3, 64)
    assert torch.equal(OP(q, k[:, :, :0], v[:, :, :0], mask[..., :0], 0.2), torch.zeros(2, 4, 3, 64))


@pytest.mark.parametrize("isa", ["avx2", "baseline"])
def test_every_instruction_set(isa):
    """SPECDECODE_CPU_ISA narrows the kernels' instruction set (read once per process): each
    narrower set runs the comparison in a fresh process."""
    script = (
        "import torch, specdecode\n"
        "import torch.nn.functional as F\n"
        "print(specdecode.build_info()['cpu_isa'])\n"
        "for B, H, Hkv, n, C, D in [(3, 4, 4, 1, 111, 64), (2, 9, 3, 5, 33, 128), (1, 6, 2, 7, 13, 33)]:\n"
        "    g = torch.Generator().manual_seed(C)\n"
        "    q, k, v = torch.randn(B, H, n, D, generator=g), torch.randn(B, Hkv, C, D, generator=g), "
        "torch.randn(B, Hkv, C, D, generator=g)\n"
        "    m = torch.zeros(B, 1, n, C).masked_fill_(torch.rand(B, 1, n, C, generator=g) < 0.4, "
        "torch.finfo(torch.float32).min)\n"
        "    m[..., 0] = 0\n"
        "    r = H // Hkv\n"
        "    ref = F.scaled_dot_product_attention(q.double(), k.double().repeat_interleave(r, 1), "
        "v.double().repeat_interleave(r, 1), attn_mask=m.double(), scale=0.125).float()\n"
        "    torch.testing.assert_close(torch.ops.specdecode.skinny_attention(q, k, v, m, 0.125), ref, "
        "rtol=1e-5, atol=2e-6)\n"
        "print('ok')\n")
    run_with_isa(isa, script)


BAD_INPUTS = [
    ("query", TypeError, lambda q, k, v, m: (q.double(), k, v, m)),
    ("key", TypeError, lambda q, k, v, m: (q, k.half(), v, m)),
    ("value", TypeError, lambda q, k, v, m: (q, k, v.bfloat16(), m)),
    ("attn_mask", TypeError, lambda q, k, v, m: (q, k, v, m.half())),
    ("attn_mask", TypeError, lambda q, k, v, m: (q, k, v, (m > 0).to(torch.uint8))),
    ("query", ValueError, lambda q, k, v, m: (q[0], k, v, m)),
    ("key", ValueError, lambda q, k, v, m: (q, k[..., :-1], v, m)),
    ("key", ValueError, lambda q, k, v, m: (q, k[:1], v[:1], m)),
    ("key", ValueError, lambda q, k, v, m: (q, torch.cat([k, k[:, :1]], 1), torch.cat([v, v[:, :1]], 1), m)),
    ("value", ValueError, lambda q, k, v, m: (q, k, v[:, :, :-1], m)),
    ("attn_mask", ValueError, lambda q, k, v, m: (q, k, v, m[..., :-1])),
    ("attn_mask", ValueError, lambda q, k, v, m: (q, k, v, m.expand(2, 3, 4, 9)[:, :2])),
    ("attn_mask", ValueError, lambda q, k, v, m: (q, k, v, m[0])),
    ("key", ValueError, lambda q, k, v, m: (q, k.to("meta"), v, m)),
    ("attn_mask", ValueError, lambda q, k, v, m: (q, k, v, m.to("meta"))),
]


@pytest.mark.parametrize("name,error,make", BAD_INPUTS, ids=lambda v: v if isinstance(v, str) else None)
def test_bad_input_names_the_argument(name, error, make):
    """Wrong dtype, shape or device raise TypeError / ValueError naming the argument."""
    q, k, v, m = _case(2, 6, 3, 4, 9, 16)
    with pytest.raises(error, match=name):
        OP(*make(q, k, v, m), 0.25)
    with pytest.raises(TypeError, match="value"):
        OP(q, k, None, m, 0.25)
    with pytest.raises(ValueError, match="scale"):
        OP(q, k, v, m, float("nan"))


@pytest.mark.parametrize("B,H,Hkv,n,C,D,boolean", [(1, 4, 4, 1, 17, 64, False), (3, 6, 2, 5, 9, 7, False),
                                                   (2, 6, 3, 4, 11, 64, True)])
def test_opcheck(B, H, Hkv, n, C, D, boolean):
    """opcheck: schema (no hidden mutation or aliasing), fake kernel, autograd registration and
    AOT dispatch with dynamic shapes."""
    q, k, v, m = _case(B, H, Hkv, n, C, D)
    m[..., 0] = 0.0
    torch.library.opcheck(OP.default, (q, k, v, m > LOWEST if boolean else m, 0.5))


def test_inputs_unchanged():
    """Nothing the caller passed is modified."""
    q, k, v, m = _case(2, 4, 2, 3, 21, 64)
    before = [t.clone() for t in (q, k, v, m)]
    OP(q, k, v, m, 0.125)
    assert all(torch.equal(a, b) for a, b in zip((q, k, v, m), before))


# ------------------------------------------------------------ the Hugging Face attention


class _Counter:
    def __init__(self, monkeypatch):
        self.calls = 0
        real = cpu_attention._skinny_attention

        def counted(*args):
            self.calls += 1
            return real(*args)

        monkeypatch.setattr(cpu_attention, "_skinny_attention", counted)


def test_applies_only_where_safe(monkeypatch):
    """The op runs for a float32 CPU call with an additive or boolean mask and few queries; no
    mask, dropout, more than MAX_QUERIES queries, an autograd graph or float64 go to SDPA, with
    the same result."""
    counter = _Counter(monkeypatch)
    module = torch.nn.Module()
    module.num_key_value_groups = 2  # what SDPA's wrapper reads to repeat the key/value heads
    q, k, v, m = _case(2, 4, 2, 3, 40, 64)
    m[..., 0] = 0.0
    want = _expected(q, k, v, m, 0.125).transpose(1, 2)
    out, weights = cpu_attention.skinny_sdpa_attention(module, q, k, v, m, scaling=0.125)
    assert counter.calls == 1 and weights is None
    torch.testing.assert_close(out, want, rtol=1e-5, atol=2e-6)
    out, _ = cpu_attention.skinny_sdpa_attention(module, q, k, v, m > LOWEST, scaling=0.125)
    assert counter.calls == 2
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=m > LOWEST, scale=0.125, enable_gqa=True)
    torch.testing.assert_close(out, want.transpose(1, 2), rtol=1e-5, atol=2e-6)
    for args, kwargs in [((q, k, v, None), {}), ((q, k, v, m), {"dropout": 0.1}),
                         ((q.double(), k.double(), v.double(), m.double()), {}),
                         ((q.repeat(1, 1, 22, 1), k, v, m.repeat(1, 1, 22, 1)), {}),
                         ((q.clone().requires_grad_(), k, v, m), {})]:
        before = counter.calls
        torch.manual_seed(0)
        cpu_attention.skinny_sdpa_attention(module, *args, scaling=0.125, **kwargs)
        assert counter.calls == before, kwargs or [a.dtype if a is not None else None for a in args]


def test_install_switches_sdpa_and_restores():
    """accelerate switches an SDPA model's attention to the fast path's and its handle, restore
    and leaving a with block put "sdpa" back; attention=False and eager models are left alone."""
    model = make_model("llama", vocab=97, hidden=40)
    assert model.config._attn_implementation == "sdpa"
    handle = cpu.accelerate(model)
    assert handle.attention and model.config._attn_implementation == cpu_attention.ATTENTION_NAME
    assert cpu.is_accelerated(model)
    handle.remove()
    assert model.config._attn_implementation == "sdpa" and not cpu.is_accelerated(model)
    cpu.accelerate(model)
    cpu.restore(model)
    assert model.config._attn_implementation == "sdpa"
    with cpu.accelerate(model, attention=False) as handle:
        assert not handle.attention and model.config._attn_implementation == "sdpa"
    with pytest.raises(TypeError, match="attention"):
        cpu.accelerate(model, attention="yes")
    eager = make_model("llama", vocab=97, hidden=40)
    eager.config._attn_implementation = "eager"
    with cpu.accelerate(eager) as handle:
        assert not handle.attention and eager.config._attn_implementation == "eager"


def test_default_max_rows_follows_the_instruction_set():
    """64 rows with the AVX-512 kernels, 32 with the others."""
    isa = specdecode.build_info()["cpu_isa"]
    assert cpu.default_max_rows() == (cpu.AVX512_MAX_ROWS if isa == "avx512" else cpu.DEFAULT_MAX_ROWS)
    assert cpu.accelerate(torch.nn.Linear(4, 4)).max_rows == cpu.default_max_rows()


def test_static_path_takes_the_op_and_keeps_greedy(monkeypatch):
    """The static decode path (additive masks) and the default, dynamic-cache path (Transformers'
    boolean masks) with the fast path on run their verification forwards' attention through the
    op and make the target's own greedy tokens, prompts of different lengths (left padding:
    masked columns) included; Hugging Face generate under the fast path is unchanged too."""
    counter = _Counter(monkeypatch)
    target, draft = make_pair("llama")
    ids, mask = left_padded([5, 9, 3], seed=4)
    kwargs = dict(max_new_tokens=12, pad_token_id=0)
    want = target.generate(ids, attention_mask=mask, do_sample=False, **kwargs)
    for num_draft_tokens in (1, 4):
        out = specdecode.generate(target, draft, ids, mask,
                                  num_draft_tokens=num_draft_tokens, decode_path="static", cpu_fast_path=True,
                                  **kwargs).sequences
        assert torch.equal(out, want)
    assert counter.calls > 0
    before = counter.calls
    out = specdecode.generate(target, draft, ids, mask, num_draft_tokens=4, cpu_fast_path=True, **kwargs).sequences
    assert torch.equal(out, want) and counter.calls > before  # the dynamic-cache path: boolean masks
    with cpu.accelerated(target, enabled=True):
        assert torch.equal(target.generate(ids, attention_mask=mask, do_sample=False, **kwargs), want)
    assert target.config._attn_implementation == "sdpa"


def test_a_model_that_branches_on_the_name_keeps_sdpa():
    """Falcon's attention compares its implementation's name with "sdpa" itself; under another
    name it would add a boolean mask as if additive (no longer causal). Its attention stays
    SDPA (the linear layers still take the fast path), and generation stays exact."""
    import transformers as tf

    import specdecode
    from specdecode.drafters import NgramDrafter

    torch.manual_seed(0)
    config = tf.FalconConfig(vocab_size=96, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                             alibi=False, new_decoder_architecture=False, pad_token_id=0)
    model = tf.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.15)
    model.generation_config.eos_token_id = None
    with specdecode.cpu.accelerated(model):
        assert model.config._attn_implementation == "sdpa"
    ids = torch.randint(3, 96, (1, 12), generator=torch.Generator().manual_seed(1))
    want = model.generate(ids, do_sample=False, max_new_tokens=16, pad_token_id=0)
    out = specdecode.generate(model, NgramDrafter(), ids, max_new_tokens=16, eos_token_id=[], pad_token_id=0,
                              cpu_fast_path=True)
    assert torch.equal(out.sequences, want)
