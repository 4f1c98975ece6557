"""The training kit's ``medusa`` kind: training on the demo target lowers the loss and raises
head accuracies and acceptance on held-out prompts, the heads' losses read the right shifted
positions, save and load round-trip and refuse another target, bad options are refused."""

from __future__ import annotations

import pytest
import torch
from test_generate_models import _one_thread, left_padded, make_model  # noqa: F401

import specdecode
from specdecode.drafters.medusa import MedusaDrafter, MedusaHeads, sparse_tree
from specdecode.training import medusa as medusa_kind
from specdecode.training import train_drafter
from specdecode.training.data import DataSettings
from specdecode.training.loop import LoopSettings


@pytest.fixture(scope="module")
def demo_medusa(tmp_path_factory):
    """The demo target, its tokenizer, and three Medusa heads trained on it for 30 steps."""
    return train_on_demo("medusa", tmp_path_factory.mktemp("demo-medusa"))


def train_on_demo(kind: str, out):
    """The demo target, its tokenizer, the result of training three heads of ``kind`` on it for
    30 steps (16 prompts) into ``out``, and ``out``."""
    target, _, tokenizer = specdecode.load_demo_pair()
    result = train_drafter(kind, target, out, tokenizer=tokenizer, target_name="demo", max_steps=30,
                           num_prompts=16, num_heads=3,
                           data_settings=DataSettings(max_length=96, max_new_tokens=32, batch_size=8),
                           loop_settings=LoopSettings(batch_size=8, lr=3e-3, warmup_steps=5), progress=False)
    return target, tokenizer, result, out


def held_out(target, tokenizer):
    """Three held-out demo prompts, left-padded (the last 48 columns), and the target's greedy
    continuations of 24 tokens."""
    from specdecode.demo import demo_prompts

    tokenizer.padding_side = "left"
    batch = tokenizer(demo_prompts(3), return_tensors="pt", padding=True)
    ids, mask = batch.input_ids[:, -48:], batch.attention_mask[:, -48:]
    want = target.generate(ids, attention_mask=mask, max_new_tokens=24, do_sample=False,
                           pad_token_id=tokenizer.pad_token_id)
    return ids, mask, want


def accepted_on_held_out(target, tokenizer, drafters) -> list[int]:
    """Accepted drafts of each drafter on :func:`held_out` (3 per step), its output checked to be
    the target's greedy one."""
    ids, mask, want = held_out(target, tokenizer)
    accepted = []
    for drafter in drafters:
        out = specdecode.generate(target, drafter, ids, mask, num_draft_tokens=3, max_new_tokens=24,
                                  pad_token_id=tokenizer.pad_token_id)
        assert torch.equal(out.sequences, want[:, : out.sequences.shape[1]])
        accepted.append(out.stats.accepted_tokens)
    return accepted


def assert_training_helped(result, kind: str, target, tokenizer, untrained) -> None:
    """A 30-step run on the demo target: loss down, greedy acceptance up (the loop's validation
    estimates), and more drafts accepted on held-out prompts than ``untrained`` gets."""
    t = result.record["training"]
    assert result.record["kind"] == kind and result.record["layers"] == [-1]
    assert t["steps"] == 30 and t["after"]["loss"] < t["before"]["loss"]
    assert t["after"]["greedy_acceptance"] > t["before"]["greedy_acceptance"]
    accepted = accepted_on_held_out(target, tokenizer, (untrained, result.drafter))
    assert accepted[1] > accepted[0], accepted


def test_demo_training_lowers_the_loss_and_raises_acceptance(demo_medusa):
    target, tokenizer, result, _ = demo_medusa
    assert_training_helped(result, "medusa", target, tokenizer, MedusaDrafter(target, MedusaHeads(target, 3)))


def test_head_accuracies_and_a_sparse_tree(demo_medusa):
    target, _, result, out = demo_medusa
    examples = [e for f in sorted((out / "data").glob("*/batch_*.pt")) for e in _examples(f)][:8]
    acc = medusa_kind.head_accuracies(result.drafter.heads, target, examples, ranks=4)
    assert acc.shape == (3, 4) and bool((acc.sum(1) <= 1 + 1e-9).all())
    assert acc[0, 0] > acc[2, 0]  # the nearer head is the better one
    # the record's greedy acceptance by draft step (validation examples): head i is draft step i + 1
    t = result.record["training"]
    for when in ("before", "after"):
        by_step = t[when]["greedy_acceptance_by_step"]
        assert len(by_step) == 3 and all(0.0 <= a <= 1.0 for a in by_step)
    assert t["after"]["greedy_acceptance_by_step"][0] > t["before"]["greedy_acceptance_by_step"][0]
    choices = sparse_tree(acc, 6)
    drafter = MedusaDrafter(target, result.drafter.heads, tree=choices)
    ids = torch.tensor([[5, 17, 40, 99, 12]])
    got = specdecode.generate(target, drafter, ids, max_new_tokens=12)
    assert torch.equal(got.sequences, target.generate(ids, max_new_tokens=12, do_sample=False))


def _examples(path):
    from specdecode.training.data import Example

    return [Example(**row) for row in torch.load(path)]


def test_round_trip_and_target_check(demo_medusa):
    target, _, result, _ = demo_medusa
    assert_round_trip(result, target, MedusaDrafter)


def assert_round_trip(result, target, drafter_class):
    """The saved heads load back equal, as a ``drafter_class``, and refuse another target."""
    loaded = specdecode.load_drafter(result.path, target)
    assert isinstance(loaded, drafter_class) and loaded.heads.num_heads == 3
    want, got = result.drafter.heads.state_dict(), loaded.heads.state_dict()
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    other = make_model("llama", vocab=4096, layers=2)
    with pytest.raises(ValueError, match="target: the drafter in"):
        specdecode.load_drafter(result.path, other)
    return loaded


def medusa_losses(kept=None):
    """A GPT-2 target (V = 50), three Medusa heads of random weights (a reduced head over ``kept``
    when given), a batch of two rows of real lengths 7 and 5: the target, the built heads, the
    batch's last hidden states and what the kind's forward returns on them."""
    target = make_model("gpt2", vocab=50, layers=2, init=0.1)
    built = medusa_kind.build(target, num_heads=3, head_decay=0.5, head_tokens=None if kept is None else len(kept))
    if kept is not None:
        built.model.heads.set_head_tokens(kept)
    with torch.no_grad():
        built.model.heads.weight.normal_(0, 0.2)
    ids = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    with torch.no_grad():
        feats = target(ids, output_hidden_states=True).hidden_states[-1]
        return target, built, feats, *medusa_kind.forward(built.model, ids, mask, feats)


def test_shifted_losses_are_the_definition():
    """Head 0's returned logits at s read f_{s-1}; head i's KL compares its logits from f_t with
    the target's distribution at t + 1 + i."""
    target, built, feats, logits, extra = medusa_losses()
    with torch.no_grad():
        head = target.get_output_embeddings()
        per_head = head(built.model.heads(feats))  # [b, t, K, V]
        torch.testing.assert_close(logits[:, 1:], per_head[:, :-1, 0])
        assert not logits[:, 0].any()
        want = expected_extra(torch.log_softmax(head(feats), -1), lambda r, t, i: per_head[r, t, i],
                              ((0, 7), (1, 5)), 0.5)
        torch.testing.assert_close(extra, want, rtol=1e-4, atol=1e-5)


def expected_extra(log_p, q_logits, rows, decay: float, heads=(1, 2)):
    """The heads' extra loss by its definition: ``sum_i decay^i`` times the mean, over every row
    ``r`` of real length ``n`` and position ``t < n - 1 - i``, of the KL from the target's
    distribution at ``t + 1 + i`` (``log_p[r, t + 1 + i]``) to ``q_logits(r, t, i)``."""
    want = 0.0
    for i in heads:
        terms = []
        for r, n in rows:
            for t in range(n - 1 - i):
                p = log_p[r, t + 1 + i]
                terms.append((p.exp() * (p - torch.log_softmax(q_logits(r, t, i), -1))).sum())
        want += decay ** i * torch.stack(terms).mean()
    return want


def test_command_line_and_bad_options(tmp_path):
    import argparse

    from specdecode.training.command import run_train

    target = make_model("llama", vocab=111, layers=2)
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="num_heads"):
            medusa_kind.build(target, num_heads=bad)
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="head_decay"):
            medusa_kind.build(target, head_decay=bad)
    with pytest.raises(ValueError, match="features"):
        medusa_kind.forward(medusa_kind.build(target).model, torch.zeros((1, 3), dtype=torch.long),
                            torch.ones((1, 3), dtype=torch.long))
    base = dict(target="demo", out=str(tmp_path), minutes=None, data=None, seed=0, max_steps=1, threads=None,
                draft_vocab=None, unroll=None)
    with pytest.raises(ValueError, match="num_heads: only the medusa and hydra kinds"):
        run_train(argparse.Namespace(kind="draft", num_heads=2, **base))
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 111, (4,), generator=g).tolist() for _ in range(4)]
    result = train_drafter("medusa", target, tmp_path, data=prompts, max_steps=2, progress=False, num_heads=2,
                           data_settings=DataSettings(max_length=16, max_new_tokens=8, batch_size=4, top_k=16),
                           loop_settings=LoopSettings(batch_size=4, warmup_steps=1))
    assert result.record["training"]["options"]["num_heads"] == 2
    ids, mask = left_padded([5, 2], vocab=111, seed=2)
    out = specdecode.generate(target, specdecode.load_drafter(tmp_path, target), ids, mask, max_new_tokens=8)
    assert torch.equal(out.sequences, target.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False,
                                                      pad_token_id=0))


def test_the_train_command_reports_the_heads(demo_medusa, monkeypatch, capsys):
    import argparse

    import specdecode.training as kit
    from specdecode.training.command import run_train

    _, _, result, out = demo_medusa
    monkeypatch.setattr(kit, "train_drafter", lambda *args, **kwargs: result)
    run_train(argparse.Namespace(kind="medusa", target="demo", out=str(out), minutes=None, data=None, seed=0,
                                 max_steps=1, threads=None, draft_vocab=None, unroll=None, num_heads=3))
    n = sum(p.numel() for p in result.drafter.heads.parameters())
    assert f"drafter: medusa for demo -> {out} (target layers [-1], {n / 1e6:.2f}M parameters)" in capsys.readouterr().out
