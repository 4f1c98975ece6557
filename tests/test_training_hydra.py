"""The training kit's ``hydra`` kind: training on the demo target lowers the loss and raises
acceptance on held-out prompts, the heads' teacher-forced losses read the right tokens and
shifted positions, save and load round-trip and refuse another target, the command line takes
``--num-heads`` for it, bad options are refused."""

from __future__ import annotations

import argparse

import pytest
import torch
from test_generate_models import _one_thread, left_padded, make_model  # noqa: F401
from test_training_medusa import (
    assert_round_trip,
    assert_training_helped,
    expected_extra,
    held_out,
    train_on_demo,
)

import specdecode
from specdecode.drafters.hydra import HydraDrafter, HydraHeads
from specdecode.drafters.medusa import sparse_tree
from specdecode.training import hydra as hydra_kind
from specdecode.training import train_drafter
from specdecode.training.command import run_train
from specdecode.training.data import DataSettings
from specdecode.training.loop import LoopSettings


@pytest.fixture(scope="module")
def demo_hydra(tmp_path_factory):
    """The demo target, its tokenizer, and three Hydra heads trained on it for 30 steps."""
    return train_on_demo("hydra", tmp_path_factory.mktemp("demo-hydra"))


def test_demo_training_lowers_the_loss_and_raises_acceptance(demo_hydra):
    target, tokenizer, result, _ = demo_hydra
    assert_training_helped(result, "hydra", target, tokenizer, HydraDrafter(target, HydraHeads(target, 3)))


def test_head_accuracies_and_a_sparse_tree(demo_hydra):
    target, tokenizer, result, _ = demo_hydra
    ids, mask, want = held_out(target, tokenizer)
    rows = [w[m.bool()] for w, m in zip(want, torch.cat([mask, torch.ones_like(want[:, mask.shape[1]:])], 1))]
    starts = [int(m.sum()) for m in mask]
    acc = hydra_kind.head_accuracies(result.drafter.heads, target, rows, starts, ranks=4)
    assert acc.shape == (3, 4) and bool((acc.sum(1) <= 1 + 1e-9).all())
    untrained = hydra_kind.head_accuracies(HydraHeads(target, 3), target, rows, starts, ranks=4)
    assert acc.sum() > untrained.sum(), (acc, untrained)
    # the record's greedy acceptance by draft step (validation examples): head i is draft step i + 1
    t = result.record["training"]
    assert all(len(t[when]["greedy_acceptance_by_step"]) == 3 for when in ("before", "after"))
    assert t["after"]["greedy_acceptance_by_step"][0] > t["before"]["greedy_acceptance_by_step"][0]
    drafter = HydraDrafter(target, result.drafter.heads, tree=sparse_tree(acc, 6))
    got = specdecode.generate(target, drafter, ids, mask, max_new_tokens=24, pad_token_id=tokenizer.pad_token_id)
    assert torch.equal(got.sequences, want)


def test_round_trip_and_target_check(demo_hydra):
    target, _, result, _ = demo_hydra
    assert assert_round_trip(result, target, HydraDrafter).heads.head_layers == 2


def test_teacher_forced_losses_are_the_definition():
    """Head 0's returned logits at s read f_{s-1} and e(x_s); head i's KL compares its logits
    from f_t and e(x_{t+1}) .. e(x_{t+1+i}) with the target's distribution at t + 1 + i."""
    target = make_model("gpt2", vocab=50, layers=2, init=0.1)
    built = hydra_kind.build(target, num_heads=3, head_layers=2, head_decay=0.5)
    heads = built.model.heads
    with torch.no_grad():
        for p in heads.parameters():
            p.normal_(0, 0.2)
    ids = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    with torch.no_grad():
        feats = target(ids, output_hidden_states=True).hidden_states[-1]
        logits, extra = hydra_kind.forward(built.model, ids, mask, feats)
        head, embed = target.get_output_embeddings(), target.get_input_embeddings()

        def q(r, t, i):
            return head(heads(feats[r, t], embed(ids[r, t + 1: t + 2 + i]), i))

        assert not logits[:, 0].any()
        for r in (0, 1):
            for s in range(1, 7):
                torch.testing.assert_close(logits[r, s], q(r, s - 1, 0), rtol=1e-4, atol=1e-5)
        want = expected_extra(torch.log_softmax(head(feats), -1), q, ((0, 7), (1, 5)), 0.5)
        torch.testing.assert_close(extra, want, rtol=1e-4, atol=1e-5)
        # head accuracies: head i's rank-r token given the true earlier tokens, against y_{t+2+i}
        seq, start = ids[0], 3
        acc = hydra_kind.head_accuracies(heads, target, [seq], [start], ranks=2)
        want_acc = torch.zeros((3, 2), dtype=torch.float64)
        for i in range(3):
            positions = range(start - 1, 7 - 2 - i)
            for t in positions:
                top = q(0, t, i).topk(2).indices
                want_acc[i] += (top == seq[t + 2 + i]).double() / len(positions)
        torch.testing.assert_close(acc, want_acc)


def test_acceptance_by_step_is_each_heads_top_against_the_targets_top_1():
    """Step i + 1's rate: head i at s (feature f_s, tokens x_{s+1} .. x_{s+1+i}) against the
    target's top-1 at s + 1 + i, over the positions the loss counts (computed by hand here, with
    some agreements planted so the rates are neither 0 nor 1)."""
    from specdecode.training.data import Example

    target = make_model("llama", vocab=50, layers=2, init=0.1)
    built = hydra_kind.build(target, num_heads=3)
    heads, head, embed = built.model.heads, target.get_output_embeddings(), target.get_input_embeddings()
    g = torch.Generator().manual_seed(6)
    with torch.no_grad():
        for p in heads.parameters():
            p.normal_(0, 0.2, generator=g)
        examples = []
        for n, start in ((9, 3), (6, 0)):
            ids = torch.randint(0, 50, (n,), generator=g)
            feats = target(ids[None], output_hidden_states=True).hidden_states[-1][0]
            top = torch.randint(0, 50, (n, 2), generator=g, dtype=torch.int32)
            for s_ in range(0, n - 1, 2):  # plant head 0's choice at every other position
                top[s_ + 1, 0] = int(head(heads(feats[s_], embed(ids[s_ + 1: s_ + 2]), 0)).argmax())
            examples.append(Example(input_ids=ids, top_logp=torch.zeros(n, 2, dtype=torch.float16), top_ids=top,
                                    start=start, features=feats.half()))
        want = []
        for i in range(3):
            hits = count = 0
            for e in examples:
                feats, n = e.features.float(), len(e.input_ids)
                for s_ in range(max(e.start - 1 - i, 0), n - 1 - i):
                    q = head(heads(feats[s_], embed(e.input_ids[s_ + 1: s_ + 2 + i]), i))
                    hits += int(q.argmax() == e.top_ids[s_ + 1 + i, 0])
                    count += 1
            want.append(round(hits / count, 4))
        got = hydra_kind.acceptance_by_step(built.model, examples)
    assert got == pytest.approx(want, abs=1e-4) and 0 < want[0] < 1
    with pytest.raises(ValueError, match="examples"):
        hydra_kind.acceptance_by_step(built.model, [])


def test_bad_options_and_a_tiny_run(tmp_path):
    target = make_model("llama", vocab=111, layers=2)
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="num_heads"):
            hydra_kind.build(target, num_heads=bad)
        with pytest.raises(ValueError, match="head_layers"):
            hydra_kind.build(target, head_layers=bad)
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="head_decay"):
            hydra_kind.build(target, head_decay=bad)
    with pytest.raises(TypeError, match="target"):
        hydra_kind.build("target")
    with pytest.raises(ValueError, match="features: the hydra kind"):
        hydra_kind.forward(hydra_kind.build(target).model, torch.zeros((1, 3), dtype=torch.long),
                           torch.ones((1, 3), dtype=torch.long))
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 111, (4,), generator=g).tolist() for _ in range(4)]
    result = train_drafter("hydra", target, tmp_path, data=prompts, max_steps=2, progress=False, num_heads=2,
                           head_layers=2,
                           data_settings=DataSettings(max_length=16, max_new_tokens=8, batch_size=4, top_k=16),
                           loop_settings=LoopSettings(batch_size=4, warmup_steps=1))
    assert result.record["training"]["options"] == {"num_heads": 2, "head_layers": 2}
    loaded = specdecode.load_drafter(tmp_path, target)
    assert loaded.heads.num_heads == 2 and loaded.heads.head_layers == 2
    ids, mask = left_padded([5, 2], vocab=111, seed=2)
    out = specdecode.generate(target, loaded, ids, mask, max_new_tokens=8)
    assert torch.equal(out.sequences, target.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False,
                                                      pad_token_id=0))


def test_the_train_command_takes_num_heads(demo_hydra, monkeypatch, capsys, tmp_path):
    import specdecode.training as kit
    from specdecode.cli import main

    _, _, result, out = demo_hydra
    seen = {}

    def fake(kind, *args, **kwargs):
        seen.update(kind=kind, **kwargs)
        return result

    monkeypatch.setattr(kit, "train_drafter", fake)
    main(["train", "hydra", "--target", "demo", "--out", str(out), "--num-heads", "3", "--max-steps", "1"])
    assert seen["kind"] == "hydra" and seen["num_heads"] == 3
    n = sum(p.numel() for p in result.drafter.heads.parameters())
    printed = capsys.readouterr().out
    assert f"drafter: hydra for demo -> {out} (target layers [-1], {n / 1e6:.2f}M parameters)" in printed
    base = dict(target="demo", out=str(tmp_path), minutes=None, data=None, seed=0, max_steps=1, threads=None,
                draft_vocab=None, unroll=None)
    with pytest.raises(ValueError, match="num_heads: only the medusa and hydra kinds"):
        run_train(argparse.Namespace(kind="exit", num_heads=2, **base))
    with pytest.raises(ValueError, match="head_layers: only the hydra kind"):
        run_train(argparse.Namespace(kind="medusa", num_heads=2, head_layers=2, **base))
