"""The 1B-class benchmark target (:mod:`specdecode.demo.widen`): the widening preserves the
trained target's function (checked at a small scale: a 1B model is too big for a CPU test),
the 1B configuration really has >= 1e9 parameters (counted on the meta device), and bad sizes
are refused."""

from __future__ import annotations

import pytest
import torch

from specdecode.demo import BENCHMARK_SIZES, demo_prompts, load_benchmark_pair, load_demo_pair
from specdecode.demo.widen import BENCHMARK_1B, count_parameters, widen_model, widened_config


@pytest.fixture(scope="module")
def demo():
    return load_demo_pair()


@pytest.mark.parametrize("kv_heads", [4, 8])
def test_widening_preserves_the_function(demo, kv_heads):
    target, _, tok = demo
    before = {k: v.clone() for k, v in target.state_dict().items()}
    wide = widen_model(target, hidden_size=512, num_attention_heads=8, num_key_value_heads=kv_heads,
                       intermediate_size=1024, num_hidden_layers=9, seed=3)
    assert all(torch.equal(v, target.state_dict()[k]) for k, v in before.items())  # the original is untouched
    cfg = wide.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim) == (512, 9, kv_heads, 64)
    assert cfg.rms_norm_eps == pytest.approx(target.config.rms_norm_eps / 2)
    assert sum(p.numel() for p in wide.parameters()) > 3 * sum(p.numel() for p in target.parameters())
    ids = tok(demo_prompts(3), return_tensors="pt", padding=True, padding_side="left")
    with torch.no_grad():
        a, b = target(**ids).logits, wide(**ids).logits
    real = ids.attention_mask.bool()
    assert torch.allclose(a[real], b[real], atol=1e-4, rtol=1e-5)
    greedy = dict(max_new_tokens=16, do_sample=False, pad_token_id=0)
    assert torch.equal(target.generate(**ids, **greedy), wide.generate(**ids, **greedy))
    # the new weights are really there (random), not zeros that would make the compute trivial
    layer = wide.model.layers[1]  # a pass-through layer (trained layers sit at 0, 2, 3, ...)
    assert layer.self_attn.q_proj.weight.abs().sum() > 0 and layer.mlp.up_proj.weight.abs().sum() > 0
    assert layer.self_attn.o_proj.weight.abs().sum() == 0 and layer.mlp.down_proj.weight.abs().sum() == 0


def test_widened_model_on_the_static_path(demo):
    import specdecode

    target, draft, tok = demo
    wide = widen_model(target, hidden_size=512, num_attention_heads=8, num_key_value_heads=4,
                       intermediate_size=768, num_hidden_layers=7)
    ids = tok(demo_prompts(2), return_tensors="pt", padding=True, padding_side="left")
    ref = target.generate(**ids, max_new_tokens=12, do_sample=False, pad_token_id=0)
    out = specdecode.generate(wide, draft, ids.input_ids, ids.attention_mask, num_draft_tokens=4, max_new_tokens=12,
                              pad_token_id=0, decode_path="static")
    assert torch.equal(out.sequences, ref)


def test_the_1b_configuration_has_a_billion_parameters(demo):
    target = demo[0]
    cfg = widened_config(target.config, **BENCHMARK_1B)
    n = count_parameters(cfg)
    assert 1.0e9 <= n < 1.1e9
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads,
            cfg.intermediate_size, cfg.head_dim, cfg.vocab_size) == (2048, 16, 32, 8, 8704, 64, 4096)
    assert cfg.widened_from["hidden_size"] == 256 and cfg.rms_norm_eps == pytest.approx(1e-5 / 8)
    assert "1b" in BENCHMARK_SIZES


def test_bad_sizes_are_refused(demo):
    target = demo[0]
    base = dict(hidden_size=512, num_attention_heads=8, num_key_value_heads=4, intermediate_size=1024,
                num_hidden_layers=8)
    for name, value in (("hidden_size", 128), ("num_attention_heads", 2), ("num_key_value_heads", 2),
                        ("intermediate_size", 100), ("num_hidden_layers", 3), ("hidden_size", 512.0)):
        with pytest.raises(ValueError, match=name):
            widened_config(target.config, **{**base, name: value})
    with pytest.raises(ValueError, match="num_attention_heads"):
        widened_config(target.config, **{**base, "num_attention_heads": 12, "num_key_value_heads": 8})
    with pytest.raises(ValueError, match="size"):
        load_benchmark_pair(size="7b")
