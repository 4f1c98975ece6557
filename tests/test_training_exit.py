"""The ``exit`` training kind (specdecode.training.exit): on the demo target a short seeded run
lowers the loss and keeps greedy output identical; the saved folder loads back with the same
logits (full and reduced heads); another target is refused; the target is never modified (no
gradient reaches it); the cached layer features equal the target's own; the command refuses the
exit options for other kinds."""

from __future__ import annotations

import argparse

import pytest
import torch
from test_generate_models import _one_thread, left_padded, make_model  # noqa: F401

import specdecode
from specdecode.drafters import ExitAdapterDrafter
from specdecode.training import exit as exit_kind
from specdecode.training import train_drafter
from specdecode.training.artifacts import write_record
from specdecode.training.data import DataSettings
from specdecode.training.loop import LoopSettings


@pytest.fixture(scope="module")
def demo_exit(tmp_path_factory):
    """The demo target, its tokenizer, a copy of its weights, and an exit adapter at layer 2 of
    6 with a 1024-token head, trained for 15 steps."""
    target, _, tokenizer = specdecode.load_demo_pair()
    before = {name: p.detach().clone() for name, p in target.named_parameters()}
    out = tmp_path_factory.mktemp("demo-exit")
    result = train_drafter("exit", target, out, tokenizer=tokenizer, target_name="demo", max_steps=15, num_prompts=8,
                           data_settings=DataSettings(max_length=96, max_new_tokens=32, batch_size=8),
                           loop_settings=LoopSettings(batch_size=8, lr=3e-3, warmup_steps=3), progress=False,
                           exit_layer=2, head_tokens=1024)
    return target, tokenizer, before, result


def test_training_lowers_the_loss_and_keeps_greedy_output(demo_exit):
    from specdecode.demo import demo_prompts

    target, tokenizer, _, result = demo_exit
    t = result.record["training"]
    assert t["steps"] == 15 and t["after"]["loss"] < t["before"]["loss"]
    assert sum(t["losses"][-4:]) < sum(t["losses"][:4])
    assert result.record["exit"] == {"exit_layer": 2, "adapter": "layer", "head_tokens": 1024}
    assert result.record["layers"] == [0, 1] and len(result.record["vocab"]["map"]) == 1024
    drafter = result.drafter
    assert isinstance(drafter, ExitAdapterDrafter)
    tokenizer.padding_side = "left"
    batch = tokenizer(demo_prompts(3), return_tensors="pt", padding=True)
    ids, mask = batch.input_ids[:, -40:], batch.attention_mask[:, -40:]
    want = target.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False,
                           pad_token_id=tokenizer.pad_token_id)
    out = specdecode.generate(target, drafter, ids, mask, num_draft_tokens=3, max_new_tokens=16,
                              pad_token_id=tokenizer.pad_token_id)
    assert torch.equal(out.sequences, want[:, : out.sequences.shape[1]]) and out.stats.accepted_tokens > 0


def test_the_target_is_never_modified(demo_exit):
    target, _, before, _ = demo_exit
    for name, param in target.named_parameters():
        assert param.grad is None, name
        assert torch.equal(param, before[name]), name


def test_load_drafter_round_trip_and_target_check(demo_exit):
    target, tokenizer, _, result = demo_exit
    loaded = specdecode.load_drafter(result.path, target)
    assert torch.equal(loaded.adapter.head_token_ids, torch.tensor(result.record["vocab"]["map"]))
    ids = tokenizer("def f(x):\n    return", return_tensors="pt").input_ids
    with torch.no_grad():
        assert torch.equal(loaded.model(ids).logits, result.drafter.model(ids).logits)
    other = make_model("llama", layers=6)
    with pytest.raises(ValueError, match="target: the drafter in .* was trained for 'demo'"):
        specdecode.load_drafter(result.path, other)


@pytest.mark.parametrize("kind", ["layer", "linear"])
def test_save_and_load_give_the_same_logits(tmp_path, kind):
    target = make_model("gpt2", layers=3, init=0.08)
    built = exit_kind.build(target, exit_layer=1, adapter=kind)
    with torch.no_grad():
        for param in built.params.values():
            param.add_(0.05 * torch.randn_like(param))
    built.model.adapter.set_head_tokens(torch.arange(10, 90))
    exit_kind.save(built.model, tmp_path)
    write_record(tmp_path, {"kind": "exit"})
    loaded = exit_kind.load(tmp_path, target, {})
    direct = ExitAdapterDrafter(target, built.model.adapter)
    ids = left_padded([7], seed=1)[0]
    with torch.no_grad():
        assert torch.equal(loaded.model(ids).logits, direct.model(ids).logits)
    assert not any(p.requires_grad for p in loaded.adapter.parameters())


def test_cached_features_are_the_targets_layer_output():
    target = make_model("qwen2", layers=3)
    built = exit_kind.build(target, exit_layer=2)
    ids, mask = left_padded([5, 8], seed=2)
    ids, mask = ids.flip(1), mask.flip(1)  # right padding, as training batches are
    features = built.model.layer_features(ids, mask)
    with torch.no_grad():
        hidden = target(ids, attention_mask=mask, output_hidden_states=True).hidden_states[2]
    for row, n in enumerate(mask.sum(1).tolist()):
        torch.testing.assert_close(features[row, :n], hidden[row, :n], rtol=1e-5, atol=1e-5)
    assert torch.equal(built.model.layer_features(ids, mask), features)  # read back from the cache


def test_bad_options_are_refused():
    from specdecode.training.command import run_train

    target = make_model("llama", layers=3)
    with pytest.raises(ValueError, match=r"exit_layer: expected an int in \[1, 2\]"):
        exit_kind.build(target, exit_layer=3)
    with pytest.raises(ValueError, match="head_tokens"):
        exit_kind.build(target, exit_layer=1, head_tokens=0)
    args = argparse.Namespace(kind="draft", target="demo", out="unused", minutes=None, data=None, seed=0,
                              max_steps=None, threads=None, layer=3, adapter=None, head_tokens=None)
    with pytest.raises(ValueError, match="kind: --layer only apply to the 'exit' kind"):
        run_train(args)
