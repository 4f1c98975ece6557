"""The CPU fast path (specdecode.cpu): the skinny_linear op agrees with torch at odd sizes, with
every instruction set, and rejects bad input by name; accelerate / restore leave a model exactly
as it was; greedy decoding is unchanged with the fast path on. No timing here (see
benchmarks/bench_cpu_forward.py)."""

from __future__ import annotations

import copy
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from test_generate_models import left_padded, make_model, make_pair

import specdecode
from specdecode import cpu

OP = torch.ops.specdecode.skinny_linear


def _case(M: int, K: int, N: int, seed: int = 0, weight_dtype: torch.dtype = torch.float32):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=gen)
    w = (torch.randn(N, K, generator=gen) / K ** 0.5).to(weight_dtype)
    b = torch.randn(N, generator=gen)
    return x, w, b


def _expected(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return F.linear(x.double(), w.double(), None if b is None else b.double()).float()


@pytest.mark.parametrize("M", [1, 2, 3, 17, 32, 45])
@pytest.mark.parametrize("K,N", [(7, 111), (111, 577), (577, 7), (16, 13), (1, 3)])
def test_matches_torch_at_odd_sizes(M, K, N):
    """Every row count (tails of the register blocks: 1, 2, 3, 17, 32, and 45 > 32, which the
    op computes too), reduction lengths that are not a multiple of any vector width, and
    output counts that are not a multiple of any block: within float rounding of float64."""
    x, w, b = _case(M, K, N, seed=M * 1000 + K)
    tol = dict(rtol=1e-5, atol=1e-5 * K ** 0.5)
    torch.testing.assert_close(OP(x, w, b), _expected(x, w, b), **tol)
    torch.testing.assert_close(OP(x, w, None), _expected(x, w, None), **tol)


@pytest.mark.parametrize("K,N", [(576, 1536), (1536, 576), (111, 7), (7, 576)])
def test_every_row_count_at_model_sizes(K, N):
    """Every row count from 1 to 32 (each register-block tail; one row without the software
    prefetch, two with it) at SmolLM2's layer sizes and odd ones: within float rounding of float64."""
    for M in range(1, 33):
        x, w, b = _case(M, K, N, seed=M)
        torch.testing.assert_close(OP(x, w, b), _expected(x, w, b), rtol=1e-5, atol=1e-5 * K ** 0.5)


def test_bfloat16_weights_widen_exactly():
    """bfloat16 weights: the same result as their exact float32 widening."""
    x, w, b = _case(5, 77, 41, weight_dtype=torch.bfloat16)
    torch.testing.assert_close(OP(x, w, b), _expected(x, w.float(), b), rtol=1e-5, atol=1e-5)


def test_leading_dimensions_non_contiguous_and_empty():
    """Like F.linear, input [..., K] gives [..., N] (rows: the leading dimensions together);
    strided inputs give the contiguous result; zero rows, outputs or K are fine."""
    x, w, b = _case(6, 40, 30)
    torch.testing.assert_close(OP(x.view(2, 3, 40), w, b), OP(x, w, b).view(2, 3, 30))
    torch.testing.assert_close(OP(x[0], w, b), OP(x[:1], w, b)[0])
    torch.testing.assert_close(OP(x.t().contiguous().t(), w.t().contiguous().t(), b), OP(x, w, b))
    assert OP(x[:, ::2], w[:, ::2], None).shape == (6, 30)
    assert OP(x[:0], w, b).shape == (0, 30)
    assert OP(x, w[:0], b[:0]).shape == (6, 0)
    torch.testing.assert_close(OP(x[:, :0], w[:, :0], b), b.expand(6, 30))


@pytest.mark.parametrize("isa", ["avx2", "baseline"])
def test_every_instruction_set(isa):
    """The kernels are compiled per instruction set and the widest the CPU runs is picked;
    SPECDECODE_CPU_ISA narrows it. Each narrower set runs the odd-size comparison in a fresh
    process (the choice is read once per process)."""
    script = (
        "import torch, specdecode\n"
        "import torch.nn.functional as F\n"
        "print(specdecode.build_info()['cpu_isa'])\n"
        "for M, K, N in [(1, 7, 111), (3, 111, 577), (17, 577, 7), (32, 33, 65), (1, 576, 1536), (2, 1536, 111),\n"
        "                (8, 576, 7), (16, 1536, 576)]:\n"
        "    g = torch.Generator().manual_seed(M)\n"
        "    x, w, b = torch.randn(M, K, generator=g), torch.randn(N, K, generator=g), torch.randn(N, generator=g)\n"
        "    ref = F.linear(x.double(), w.double(), b.double()).float()\n"
        "    torch.testing.assert_close(torch.ops.specdecode.skinny_linear(x, w, b), ref, rtol=1e-5, atol=1e-4)\n"
        "    wb = w.bfloat16()\n"
        "    ref = F.linear(x.double(), wb.double(), b.double()).float()\n"
        "    torch.testing.assert_close(torch.ops.specdecode.skinny_linear(x, wb, b), ref, rtol=1e-5, atol=1e-4)\n"
        "print('ok')\n")
    run_with_isa(isa, script)


def run_with_isa(isa: str, script: str) -> None:
    """Runs ``script`` in a fresh process with SPECDECODE_CPU_ISA=isa: it prints the chosen
    instruction set, then 'ok'. Skips where this CPU cannot run ``isa``."""
    run = subprocess.run([sys.executable, "-c", script], env={**os.environ, "SPECDECODE_CPU_ISA": isa},
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    chosen, verdict = run.stdout.split()
    if chosen != isa:
        pytest.skip(f"this CPU cannot run the {isa} kernels (it runs {chosen})")
    assert verdict == "ok"


BAD_INPUTS = [
    ("input", TypeError, lambda x, w, b: (x.double(), w, b)),
    ("weight", TypeError, lambda x, w, b: (x, w.half(), b)),
    ("weight", TypeError, lambda x, w, b: (x, w.long(), b)),
    ("bias", TypeError, lambda x, w, b: (x, w, b.double())),
    ("input", ValueError, lambda x, w, b: (x[0, 0], w, b)),
    ("weight", ValueError, lambda x, w, b: (x, w[:, :-1], b)),
    ("weight", ValueError, lambda x, w, b: (x, w[0], b)),
    ("bias", ValueError, lambda x, w, b: (x, w, b[:-1])),
    ("bias", ValueError, lambda x, w, b: (x, w, b[None])),
    ("weight", ValueError, lambda x, w, b: (x, w.to("meta"), b)),
    ("bias", ValueError, lambda x, w, b: (x, w, b.to("meta"))),
]


@pytest.mark.parametrize("name,error,make", BAD_INPUTS, ids=lambda v: v if isinstance(v, str) else None)
def test_bad_input_names_the_argument(name, error, make):
    """Wrong dtype, shape or device raise TypeError / ValueError naming the argument."""
    x, w, b = _case(3, 8, 5)
    with pytest.raises(error, match=name):
        OP(*make(x, w, b))
    with pytest.raises(TypeError, match="weight"):
        OP(x, None, b)


@pytest.mark.parametrize("M,K,N,bias,dtype", [(1, 7, 111, True, torch.float32), (17, 33, 9, False, torch.float32),
                                              (32, 16, 20, True, torch.bfloat16)])
def test_opcheck(M, K, N, bias, dtype):
    """opcheck: schema (no hidden mutation or aliasing), fake kernel, autograd registration and
    AOT dispatch with dynamic shapes."""
    x, w, b = _case(M, K, N, weight_dtype=dtype)
    torch.library.opcheck(OP.default, (x, w, b if bias else None))


# ------------------------------------------------------------------------------ install


def _snapshot(model: torch.nn.Module) -> dict:
    return {"state": {k: v.clone() for k, v in model.state_dict().items()},
            "dicts": {name: set(m.__dict__) for name, m in model.named_modules()},
            "params": [p.data_ptr() for p in model.parameters()]}


def test_install_and_restore_round_trip():
    """accelerate installs on every nn.Linear (the untied LM head included), changes outputs
    only by rounding, and remove / restore / leaving a with block put back exactly the model
    that was there: same state_dict, same instance attributes, same outputs bit for bit."""
    model = make_model("llama", vocab=97, hidden=40)
    ids, mask = left_padded([4, 6], vocab=97)
    before = _snapshot(model)
    with torch.no_grad():
        reference = model(ids, attention_mask=mask).logits
    linear_names = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    assert cpu.eligible_layers(model) == linear_names and "lm_head" in linear_names
    assert cpu.can_accelerate(model)[0]

    handle = cpu.accelerate(model)
    assert cpu.is_accelerated(model) and cpu.accelerated_layers(model) == linear_names
    assert cpu.accelerate(model).layer_names == []  # a second call finds nothing left to do
    with torch.no_grad():
        fast = model(ids, attention_mask=mask).logits
    torch.testing.assert_close(fast, reference, rtol=1e-5, atol=1e-5)
    assert torch.equal(fast.argmax(-1), reference.argmax(-1))
    assert handle.remove() == len(linear_names) and not cpu.is_accelerated(model)

    for undo in (cpu.restore, None):
        if undo is cpu.restore:
            cpu.accelerate(model)
            assert cpu.restore(model) == len(linear_names)
        else:
            with cpu.accelerate(model):
                assert cpu.is_accelerated(model)
        after = _snapshot(model)
        assert after["dicts"] == before["dicts"] and after["params"] == before["params"]
        assert all(torch.equal(after["state"][k], v) for k, v in before["state"].items())
        with torch.no_grad():
            assert torch.equal(model(ids, attention_mask=mask).logits, reference)


def test_tied_head_and_deepcopy():
    """A tied LM head (its weight is the embedding's) is accelerated without untying it; a deep
    copy of an accelerated model computes with its own (copied) layers."""
    model = make_model("gemma", vocab=64, hidden=24)
    assert model.lm_head.weight is model.get_input_embeddings().weight
    cpu.accelerate(model)
    assert "lm_head" in cpu.accelerated_layers(model)
    assert model.lm_head.weight is model.get_input_embeddings().weight
    twin = copy.deepcopy(model)
    assert twin.lm_head.forward.module is twin.lm_head
    with torch.no_grad():
        twin.lm_head.weight.mul_(0.0)
        x = torch.randn(3, 24)
        assert torch.count_nonzero(twin.lm_head(x)) == 0 and torch.count_nonzero(model.lm_head(x)) > 0
    cpu.restore(model)
    assert "forward" not in model.lm_head.__dict__


def test_falls_back_to_torch_where_not_safe():
    """Outside the fast path's conditions the layer is torch's own, bit for bit: more rows
    than max_rows, autograd recording, a float64 input (torch's own dtype error), float64
    layers (not eligible at all)."""
    layer = torch.nn.Linear(12, 7)
    x = torch.randn(5, 12)
    with torch.no_grad():
        plain = F.linear(x, layer.weight, layer.bias)
    cpu.accelerate(layer, max_rows=4)
    with torch.no_grad():
        assert torch.equal(layer(x), plain)  # 5 rows > max_rows
        torch.testing.assert_close(layer(x[:4]), plain[:4])  # fast path: equal to rounding
        with pytest.raises(RuntimeError):
            layer(x.double())
    out = layer(x[:3])  # grad enabled and weight.requires_grad: torch's path, differentiable
    assert out.grad_fn is not None
    out.sum().backward()
    assert layer.weight.grad is not None
    cpu.restore(layer)

    double = torch.nn.Linear(5, 3).double()
    assert cpu.eligible_layers(double) == [] and not cpu.can_accelerate(double)[0]
    with pytest.raises(ValueError, match="min_rows"):
        cpu.accelerate(layer, min_rows=0)
    with pytest.raises(TypeError, match="model"):
        cpu.accelerate("not a model")


def test_one_row_through_a_small_layer_stays_on_torch():
    """fast_path_pays is a function of the shape alone: one row takes the fast path only through
    layers of ONE_ROW_MIN_WEIGHTS weights or more, two rows and up always; a one-row call through a
    small layer is torch's own, bit for bit."""
    small, large = cpu.ONE_ROW_MIN_WEIGHTS // 256 - 1, cpu.ONE_ROW_MIN_WEIGHTS // 256
    assert not cpu.fast_path_pays(small, 256, 1) and cpu.fast_path_pays(large, 256, 1)
    assert all(cpu.fast_path_pays(7, 3, rows) for rows in (2, 6, 16, 32))
    layer = torch.nn.Linear(96, 96)
    x = torch.randn(3, 96)
    with torch.no_grad():
        plain = F.linear(x, layer.weight, layer.bias)
        with cpu.accelerate(layer):
            assert torch.equal(layer(x[:1]), F.linear(x[:1], layer.weight, layer.bias))  # one row: torch's
            torch.testing.assert_close(layer(x), plain)  # three rows: the fast path


def test_accelerated_context_decides_per_model():
    """cpu.accelerated(target, draft): installs where can_accelerate says yes (not on a float64
    model, skips None), removes on exit, even after an error, and leaves layers that were
    accelerated before the block as they were."""
    target, draft = make_pair("llama")
    other = torch.nn.Linear(4, 4).double()
    cpu.accelerate(draft)
    with pytest.raises(RuntimeError, match="inside"):
        with cpu.accelerated(target, draft, other, None) as handles:
            assert cpu.is_accelerated(target) and not cpu.is_accelerated(other)
            assert len(handles) == 1 and cpu.can_accelerate(draft) == (False, "already accelerated")
            raise RuntimeError("inside")
    assert not cpu.is_accelerated(target) and cpu.is_accelerated(draft)
    with cpu.accelerated(target, enabled=False):
        assert not cpu.is_accelerated(target)
    cpu.restore(draft)


def test_skips_replaced_forwards():
    """Layers whose forward was already replaced on the instance (offload hooks, wrappers) and
    nn.Linear subclasses with their own forward are left alone."""

    class Scaled(torch.nn.Linear):
        def forward(self, input):
            return super().forward(input) * 2

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), Scaled(4, 4), torch.nn.Linear(4, 4))
    model[2].forward = lambda input: input
    assert cpu.eligible_layers(model) == ["0"]


# ------------------------------------------------------------------- greedy is unchanged


def test_greedy_generation_unchanged():
    """A tiny model's own greedy generate, and speculative generate with a draft, give the
    same tokens with the fast path on target and draft as without it."""
    target, draft = make_pair("llama")
    ids, mask = left_padded([5, 9], seed=3)
    kwargs = dict(max_new_tokens=16, pad_token_id=0)
    plain_hf = target.generate(ids, attention_mask=mask, do_sample=False, **kwargs)
    plain_spec = specdecode.generate(target, draft, ids, mask, num_draft_tokens=4, **kwargs).sequences
    with cpu.accelerate(target), cpu.accelerate(draft):
        fast_hf = target.generate(ids, attention_mask=mask, do_sample=False, **kwargs)
        fast_spec = specdecode.generate(target, draft, ids, mask, num_draft_tokens=4, **kwargs).sequences
    assert torch.equal(fast_hf, plain_hf) and torch.equal(fast_spec, plain_spec)
    assert torch.equal(plain_spec, plain_hf)


def test_demo_pair_greedy_unchanged():
    """The demo pair: speculative greedy decoding gives the same text with the fast path on."""
    target, draft, tokenizer = specdecode.load_demo_pair()
    ids = tokenizer("def add(a, b):\n", return_tensors="pt").input_ids
    plain = specdecode.generate(target, draft, ids, max_new_tokens=24, num_draft_tokens=5).sequences
    with cpu.accelerate(target), cpu.accelerate(draft):
        fast = specdecode.generate(target, draft, ids, max_new_tokens=24, num_draft_tokens=5).sequences
    assert torch.equal(fast, plain)


def test_demo_pair_tree_greedy_unchanged():
    """A 16-node tree (a 16-token verification forward through the fast path's widest blocks):
    the same greedy text with the fast path on as off."""
    target, draft, tokenizer = specdecode.load_demo_pair()
    ids = tokenizer("def add(a, b):\n", return_tensors="pt").input_ids
    kwargs = dict(max_new_tokens=24, tree="dynamic", num_nodes=16)
    plain = specdecode.generate(target, draft, ids, cpu_fast_path=False, **kwargs).sequences
    fast = specdecode.generate(target, draft, ids, cpu_fast_path=True, **kwargs).sequences
    assert torch.equal(fast, plain)


def test_report_names_the_path():
    """python -m specdecode.info says which path the fast path runs."""
    from specdecode.info import build_report

    assert "skinny_linear" in cpu.fast_path_report()
    assert "CPU fast path: skinny_linear" in build_report()


def test_generate_option_installs_for_the_call_only():
    """``cpu_fast_path`` of specdecode.generate and custom_generate: on for the call, the models
    unchanged afterwards, greedy output equal to the target's own; a non-bool is a TypeError."""
    from test_generate_models import PAD, left_padded, make_pair

    target, draft = make_pair("llama")
    ids, mask = left_padded([4, 7], seed=9)
    want = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=10, pad_token_id=PAD)
    for enabled in (None, True, False):
        out = specdecode.generate(target, draft, ids, mask, max_new_tokens=10, pad_token_id=PAD, cpu_fast_path=enabled)
        assert torch.equal(out.sequences, want)
        assert not specdecode.cpu.is_accelerated(target) and not specdecode.cpu.is_accelerated(draft)
    seq = target.generate(ids, attention_mask=mask, custom_generate=specdecode.custom_generate, draft_model=draft,
                          max_new_tokens=10, do_sample=False, pad_token_id=PAD, cpu_fast_path=True)
    assert torch.equal(seq, want) and not specdecode.cpu.is_accelerated(target)
    with pytest.raises(TypeError, match="cpu_fast_path"):
        specdecode.generate(target, draft, ids, mask, max_new_tokens=2, pad_token_id=PAD, cpu_fast_path="yes")
