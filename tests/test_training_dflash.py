"""The training kit's ``dflash`` kind: the training forward computes exactly what drafting
computes (a block at an anchor sees the context before it and its own block only), anchors lie
where the loss counts, the loss weighs block positions by its decay, a run saves and loads a
drafter whose greedy output is the target's with its rates by block position and rank in the
record, a saved drafter refuses another target and continues with ``init_from``, and bad
options are refused by name."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from test_drafters import hf_greedy
from test_generate_models import make_model

import specdecode
from specdecode.drafters import DFlashDrafter
from specdecode.drafters.dflash_model import block_mask, block_positions
from specdecode.training import dflash as dflash_kind
from specdecode.training import train_drafter
from specdecode.training.data import DataSettings
from specdecode.training.loop import LoopSettings
from specdecode.training.losses import PlacedLogits, placed_loss

SMALL = DataSettings(max_length=40, max_new_tokens=16, batch_size=4, top_k=16)
LOOP = LoopSettings(batch_size=4, lr=3e-3, warmup_steps=1)


def tiny_target(seed: int = 0, vocab: int = 111):
    return make_model("llama", seed=seed, vocab=vocab, layers=3)


def _features(target, ids: torch.Tensor, layers) -> torch.Tensor:
    hidden = target(ids, output_hidden_states=True).hidden_states
    return torch.cat([hidden[i] for i in layers], -1)


@torch.no_grad()
def test_training_blocks_equal_drafting_blocks():
    """Block logits from the training forward at anchor ``a`` equal the drafter's logits with the
    tokens before ``a`` committed and token ``a`` pending; a later token's feature changes nothing."""
    target = tiny_target()
    built = dflash_kind.build(target, block_size=5, num_layers=2, init_from_target=False)
    model = built.model
    with torch.no_grad():
        for p in model.dflash.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    ids = torch.randint(3, 111, (1, 12), generator=torch.Generator().manual_seed(1))
    feats = _features(target, ids, model.dflash.feature_layers)
    anchors = torch.tensor([[3, 7, 0]])
    logits, source, counts = dflash_kind._blocks(model, ids, torch.ones_like(ids), feats, anchors,
                                                 torch.ones_like(anchors, dtype=torch.bool))
    logits = logits.view(1, 3, 4, -1)
    assert source.view(3, 4)[0].tolist() == [3, 4, 5, 6] and bool(counts.all())
    changed = feats.clone()
    changed[:, 8:] += 1.0  # after every anchor's context (anchor 7 sees columns < 7)
    again = dflash_kind._blocks(model, ids, torch.ones_like(ids), changed, anchors,
                                torch.ones_like(anchors, dtype=torch.bool))[0].view(1, 3, 4, -1)
    torch.testing.assert_close(again, logits)
    dflash = model.dflash
    for n, a in enumerate(anchors[0].tolist()):
        context = dflash.context_keys_values(feats[:, :a], torch.arange(a)[None])
        tokens = ids[:, a:a + 1].expand(1, 5)
        is_mask = (torch.arange(5) > 0)[None]
        hidden = dflash(dflash.block_embeddings(target, tokens, is_mask), block_positions(torch.tensor([a]), 5),
                        context, block_mask(torch.ones((1, a), dtype=torch.bool), 5))
        want = target.get_output_embeddings()(hidden[:, 1:])
        torch.testing.assert_close(logits[0, n], want[0], rtol=1e-4, atol=1e-4)


def test_anchors_lie_where_the_loss_counts_and_weights_decay():
    target = tiny_target()
    built = dflash_kind.build(target, block_size=4, decay_gamma=2.0)
    ids = torch.randint(3, 111, (3, 20), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[2, 15:] = 0
    counted = torch.zeros_like(ids, dtype=torch.bool)
    counted[:, 6:] = True
    counted &= mask.bool()
    with torch.no_grad():
        out = dflash_kind.forward(built.model, ids, mask, _features(target, ids, built.feature_layers), counted)
    assert isinstance(out, PlacedLogits) and out.logits.shape[:2] == out.source.shape == out.counted.shape
    anchors = (out.source.view(3, -1, 3)[:, :, 0])
    valid = out.counted.view(3, -1, 3)[:, :, 0]
    assert bool((anchors[valid] >= 6).all()) and bool((anchors[2][valid[2]] < 15).all())
    assert int(valid[0].sum()) == (2 * 14 + 2) // 3  # about two blocks per block length of counted positions
    torch.testing.assert_close(out.weights[0, :3], torch.exp(-torch.arange(3.0) / 2.0))
    same = dflash_kind.forward(built.model, ids, mask, _features(target, ids, built.feature_layers), counted)
    assert torch.equal(same.source, out.source)  # anchors are a function of the batch
    top = torch.randn(3, 20, 4).log_softmax(-1).sort(-1, descending=True).values
    metrics = placed_loss(out, top, torch.randint(0, 111, (3, 20, 4)), counted)
    assert metrics.positions == int(out.counted.sum()) and metrics.loss.isfinite()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    target = tiny_target(seed=3)
    out = tmp_path_factory.mktemp("dflash")
    data = [torch.randint(3, 111, (int(n),), generator=torch.Generator().manual_seed(int(n))) for n in range(4, 28)]
    result = train_drafter("dflash", target, out, data=data, max_steps=4, data_settings=SMALL, loop_settings=LOOP,
                           progress=False, target_name="tiny", block_size=5, num_layers=1, draft_vocab_size=80)
    return target, out, result, data


def test_a_run_saves_a_drafter_with_its_rates(trained, tmp_path):
    target, out, result, _ = trained
    record = json.loads((out / "specdecode_drafter.json").read_text())
    assert record["kind"] == "dflash" and record["block_size"] == 5 and record["vocab"]["size"] == 80
    t = record["training"]
    assert t["steps"] == 4 and len(t["after"]["greedy_acceptance_by_step"]) == 4
    assert len(record["rank_rates"]) == 4 and len(record["rank_rates"][0]) == dflash_kind.MEASURED_RANKS
    drafter = specdecode.load_drafter(out, target)
    assert isinstance(drafter, DFlashDrafter) and drafter.rank_rates == record["rank_rates"]
    assert drafter.model.draft_vocab_size == 80 and isinstance(result.drafter, DFlashDrafter)
    ids = torch.randint(3, 111, (1, 7), generator=torch.Generator().manual_seed(5))
    for path in ("eager", "static"):
        out_ids = specdecode.generate(target, drafter, ids, max_new_tokens=12, decode_path=path).sequences
        assert torch.equal(out_ids, hf_greedy(target, ids, max_new_tokens=12))
    # the measured rank rates make a sparse tree, through generate's tree= and a record's generation settings
    sparse = specdecode.generate(target, drafter, ids, max_new_tokens=12, tree="sparse", num_nodes=6)
    assert torch.equal(sparse.sequences, hf_greedy(target, ids, max_new_tokens=12))
    assert sparse.stats.tree_rule == "deterministic"
    assert len(drafter.with_tree("sparse", num_nodes=6, tree_depth=2).choices) == 5
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    record["generation"] = {"tree": "sparse", "num_nodes": 6}
    (copy / "specdecode_drafter.json").write_text(json.dumps(record))
    assert len(specdecode.load_drafter(copy, target).choices) == 5
    with pytest.raises(ValueError, match="tree: 'sparse' needs measured rank rates"):
        DFlashDrafter(target, drafter.model).with_tree("sparse")
    with pytest.raises(ValueError, match="tree: a DFlashDrafter drafts 'sparse'"):
        drafter.with_tree("dynamic")


def test_a_saved_drafter_refuses_another_target_and_continues(trained, tmp_path):
    target, out, _, data = trained
    with pytest.raises(ValueError, match="target: the drafter"):
        specdecode.load_drafter(out, tiny_target(seed=9))
    more = train_drafter("dflash", target, tmp_path / "more", data=data, max_steps=2, data_settings=SMALL,
                         loop_settings=LOOP, progress=False, target_name="tiny", init_from=out)
    record = more.record
    assert record["block_size"] == 5 and record["vocab"]["size"] == 80
    saved = json.loads((out / dflash_kind.CONFIG_FILE).read_text())
    assert json.loads((tmp_path / "more" / dflash_kind.CONFIG_FILE).read_text()) == saved


def test_bad_options_are_refused():
    target = tiny_target()
    for name, value in (("block_size", 1), ("block_size", 2.0), ("num_layers", 0), ("target_layer_ids", [3]),
                        ("target_layer_ids", [0, 0]), ("draft_vocab_size", 0), ("decay_gamma", 0),
                        ("num_anchors", 0), ("init_from_target", "yes")):
        with pytest.raises(ValueError, match=name):
            dflash_kind.build(target, **{name: value})
    built = dflash_kind.build(target, block_size=4)
    with pytest.raises(ValueError, match="features"):
        dflash_kind.forward(built.model, torch.ones((1, 4), dtype=torch.long), torch.ones((1, 4), dtype=torch.long))


def test_cli_flags(tmp_path, capsys):
    from specdecode.cli import main

    with pytest.raises(SystemExit):
        main(["train", "dflash", "--target", "demo", "--out", str(tmp_path), "--block-size", "1"])
    assert "block_size" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", "eagle", "--target", "demo", "--out", str(tmp_path), "--block-size", "4"])
    assert "block_size: only the dflash kind" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", "dflash", "--target", "demo", "--out", str(tmp_path), "--target-layers", "1,x"])
    assert "target_layer_ids" in capsys.readouterr().err
