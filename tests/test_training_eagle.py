"""The training kit's ``eagle`` kind: the data carries the target's features, training on the
demo target lowers the loss and raises acceptance on held-out prompts, a reduced head keeps
its vocabulary through save and load, a saved drafter refuses another target, bad options are
refused, a record's generation settings apply. The training-time test (``unroll``) and EAGLE-3
feature layers: ``test_training_eagle_unroll.py``."""

from __future__ import annotations

import pytest
import torch
from test_generate_models import PAD, _one_thread, left_padded, make_model  # noqa: F401

import specdecode
from specdecode.drafters.eagle import EagleDrafter
from specdecode.training import train_drafter
from specdecode.training import eagle as eagle_kind
from specdecode.training.data import DataSettings
from specdecode.training.loop import LoopSettings


@pytest.fixture(scope="module")
def demo_eagle(tmp_path_factory):
    """The demo target, its tokenizer, and an EAGLE drafter trained on it for 30 steps."""
    target, _, tokenizer = specdecode.load_demo_pair()
    out = tmp_path_factory.mktemp("demo-eagle")
    result = train_drafter("eagle", target, out, tokenizer=tokenizer, target_name="demo", max_steps=30, num_prompts=16,
                           data_settings=DataSettings(max_length=96, max_new_tokens=32, batch_size=8),
                           loop_settings=LoopSettings(batch_size=8, lr=3e-3, warmup_steps=5), progress=False)
    return target, tokenizer, result


def test_demo_training_lowers_the_loss_and_raises_acceptance(demo_eagle):
    from specdecode.demo import demo_prompts

    target, tokenizer, result = demo_eagle
    t = result.record["training"]
    assert result.record["kind"] == "eagle" and result.record["layers"] == [-1]
    assert t["steps"] == 30 and t["after"]["loss"] < t["before"]["loss"]
    assert t["after"]["greedy_acceptance"] > t["before"]["greedy_acceptance"]
    # greedy acceptance by draft step (validation): step 1 is the loop's own greedy acceptance
    for when in ("before", "after"):
        by_step = t[when]["greedy_acceptance_by_step"]
        assert len(by_step) == eagle_kind.MEASURED_STEPS and all(0.0 <= a <= 1.0 for a in by_step)
        assert by_step[0] == pytest.approx(t[when]["greedy_acceptance"], abs=1e-4)
    # In generation, on held-out prompts never trained on (the benchmark's), against the untrained drafter.
    tokenizer.padding_side = "left"
    batch = tokenizer(demo_prompts(3), return_tensors="pt", padding=True)
    ids, mask = batch.input_ids[:, -48:], batch.attention_mask[:, -48:]
    want = target.generate(ids, attention_mask=mask, max_new_tokens=24, do_sample=False,
                           pad_token_id=tokenizer.pad_token_id)
    untrained = EagleDrafter(target, eagle_kind.build(target).model.eagle)
    rates = []
    for drafter in (untrained, result.drafter):
        out = specdecode.generate(target, drafter, ids, mask, num_draft_tokens=4, max_new_tokens=24,
                                  pad_token_id=tokenizer.pad_token_id)
        assert torch.equal(out.sequences, want[:, : out.sequences.shape[1]])
        rates.append(out.stats.acceptance_rate)
    assert rates[1] > rates[0], rates


def test_round_trip_and_target_check(demo_eagle):
    target, _, result = demo_eagle
    loaded = specdecode.load_drafter(result.path, target)
    assert isinstance(loaded, EagleDrafter) and loaded.feature_layers == (-1,)
    want = result.drafter.model.state_dict()
    got = loaded.model.state_dict()
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    other = make_model("llama", vocab=4096, layers=2)
    with pytest.raises(ValueError, match="target: the drafter in"):
        specdecode.load_drafter(result.path, other)


def test_data_carries_the_target_features_and_a_reduced_head_round_trips(tmp_path):
    target = make_model("gpt2", vocab=111, layers=2, init=0.08)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 111, (4,), generator=g).tolist() for _ in range(8)]
    result = train_drafter("eagle", target, tmp_path, data=prompts, max_steps=3, progress=False,
                           data_settings=DataSettings(max_length=24, max_new_tokens=12, batch_size=4, top_k=16),
                           loop_settings=LoopSettings(batch_size=4, warmup_steps=1), draft_vocab_size=40)
    assert result.record["vocab"]["size"] == 40
    batches = sorted((tmp_path / "data").glob("*/batch_*.pt"))
    row = torch.load(batches[0])[0]
    with torch.no_grad():
        hidden = target(row["input_ids"][None], output_hidden_states=True).hidden_states[-1][0]
    torch.testing.assert_close(row["features"].float(), hidden, rtol=2e-3, atol=2e-3)  # stored as float16
    loaded = specdecode.load_drafter(tmp_path, target)
    assert loaded.model.draft_vocab_size == 40
    assert torch.equal(loaded.model.draft_to_target, result.drafter.model.draft_to_target)
    ids, mask = left_padded([5, 2, 7], vocab=111, seed=2)
    out = specdecode.generate(target, loaded, ids, mask, num_draft_tokens=3, max_new_tokens=10)
    want = target.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=PAD)
    assert torch.equal(out.sequences, want)


def test_a_frozen_reduced_head_is_the_target_rows_and_is_not_saved(tmp_path):
    """train_head=False: the reduced head stays the target head's rows, the folder leaves it out,
    loading rebuilds it from the target, and a shared data cache is reused by a second run."""
    from safetensors.torch import load_file

    target = make_model("llama", vocab=111, layers=2, init=0.08)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 111, (4,), generator=g).tolist() for _ in range(8)]
    settings = dict(data=prompts, max_steps=2, progress=False, data_cache=tmp_path / "shared",
                    data_settings=DataSettings(max_length=24, max_new_tokens=12, batch_size=4, top_k=16),
                    loop_settings=LoopSettings(batch_size=4, warmup_steps=1), draft_vocab_size=30)
    result = train_drafter("eagle", target, tmp_path / "a", train_head=False, **settings)
    eagle = result.drafter.model
    assert torch.equal(eagle.lm_head.weight, target.get_output_embeddings().weight[eagle.draft_to_target])
    assert "lm_head.weight" not in load_file(str(tmp_path / "a" / "model.safetensors"))
    assert not (tmp_path / "a" / "data").exists() and sorted((tmp_path / "shared").glob("*/batch_*.pt"))
    loaded = specdecode.load_drafter(tmp_path / "a", target)
    assert torch.equal(loaded.model.lm_head.weight, eagle.lm_head.weight)
    ids, mask = left_padded([5, 2, 7], vocab=111, seed=4)
    out = specdecode.generate(target, loaded, ids, mask, num_draft_tokens=3, max_new_tokens=10)
    want = target.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=PAD)
    assert torch.equal(out.sequences, want)
    cached = sorted((tmp_path / "shared").glob("*/batch_*.pt"))
    stamps = [f.stat().st_mtime_ns for f in cached]
    second = train_drafter("eagle", target, tmp_path / "b", **settings)  # same data: read from the shared cache
    assert sorted((tmp_path / "shared").glob("*/batch_*.pt")) == cached  # no batch made again
    assert [f.stat().st_mtime_ns for f in cached] == stamps and not (tmp_path / "b" / "data").exists()
    trained = second.drafter.model.lm_head.weight
    assert not torch.equal(trained, target.get_output_embeddings().weight[second.drafter.model.draft_to_target])
    with pytest.raises(ValueError, match="train_head"):
        eagle_kind.build(target, train_head="no")
    with pytest.raises(TypeError, match="data_cache"):
        train_drafter("eagle", target, tmp_path / "c", **{**settings, "data_cache": 3})


def test_bad_options_are_refused(tmp_path):
    target = make_model("llama", vocab=111, layers=2)
    for bad in (0, 112, 2.5, True):
        with pytest.raises(ValueError, match="draft_vocab_size"):
            eagle_kind.build(target, draft_vocab_size=bad)
    with pytest.raises(ValueError, match="feature_weight"):
        eagle_kind.build(target, feature_weight=-1)
    with pytest.raises(ValueError, match="feature_layers"):
        eagle_kind.build(target, feature_layers=(3,))
    with pytest.raises(ValueError, match="features"):
        eagle_kind.forward(eagle_kind.build(target).model, torch.zeros((1, 3), dtype=torch.long),
                           torch.ones((1, 3), dtype=torch.long))


def test_command_refuses_eagle_options_for_other_kinds():
    import argparse

    from specdecode.training.command import run_train

    base = dict(target="demo", out="unused", minutes=None, data=None, seed=0, max_steps=1, threads=None)
    with pytest.raises(ValueError, match="draft_vocab: only the eagle and dflash kinds"):
        run_train(argparse.Namespace(kind="draft", draft_vocab=8, unroll=None, **base))
    with pytest.raises(ValueError, match="unroll: only the eagle kind"):
        run_train(argparse.Namespace(kind="draft", draft_vocab=None, unroll=2, **base))
    with pytest.raises(ValueError, match="freeze_head"):
        run_train(argparse.Namespace(kind="eagle", draft_vocab=None, unroll=None, freeze_head=True, **base))
    with pytest.raises(ValueError, match="feature_layers: only the eagle kind"):
        run_train(argparse.Namespace(kind="medusa", draft_vocab=None, unroll=None, feature_layers=(1, -1), **base))


def test_generation_settings_in_the_record(demo_eagle, tmp_path):
    """A record's ``"generation"`` entry: load_drafter returns the drafter with that tree and
    draft length; generate uses the length unless told another; bad entries name the path."""
    import json
    import shutil

    from specdecode.trees.builders import DynamicTree

    target, tokenizer, result = demo_eagle
    folder = tmp_path / "with-settings"
    shutil.copytree(result.path, folder)
    record_file = folder / "specdecode_drafter.json"
    record = json.loads(record_file.read_text())

    def write(generation):
        record_file.write_text(json.dumps({**record, "generation": generation}))

    ids = tokenizer(["def parse(text):\n"], return_tensors="pt").input_ids
    write({"num_draft_tokens": 2})
    chain = specdecode.load_drafter(folder, target)
    assert chain.tree is None and chain.default_num_draft_tokens == 2
    steps = specdecode.generate(target, chain, ids, max_new_tokens=12, eos_token_id=None, draft_schedule="constant")
    told = specdecode.generate(target, chain, ids, max_new_tokens=12, eos_token_id=None, num_draft_tokens=2,
                               draft_schedule="constant")
    assert steps.stats.drafted_tokens == told.stats.drafted_tokens
    assert torch.equal(steps.sequences, told.sequences)
    longer = specdecode.generate(target, chain, ids, max_new_tokens=12, eos_token_id=None, num_draft_tokens=4)
    assert len(longer.stats.position_drafted) == 4 and len(steps.stats.position_drafted) == 2
    write({"num_draft_tokens": 3, "tree": "dynamic", "num_nodes": 6, "tree_depth": 3})
    tree = specdecode.load_drafter(folder, target)
    assert isinstance(tree.tree, DynamicTree) and (tree.tree.num_nodes, tree.tree.max_depth) == (6, 3)
    out = specdecode.generate(target, tree, ids, max_new_tokens=12, eos_token_id=None)
    assert torch.equal(out.sequences, steps.sequences)  # greedy: the target's own output either way
    for bad, named in [({"num_draft_tokens": 0}, "num_draft_tokens"), ({"gamma": 2}, "keys"),
                       ({"num_nodes": 6}, "go with tree"), ({"tree": "bushy"}, "tree"),
                       ({"sampling": {"gamma": 2}}, "sampling"), ({"sampling": 2}, "sampling"),
                       ({"sampling": {"num_draft_tokens": 0}}, "num_draft_tokens")]:
        write(bad)
        with pytest.raises(ValueError, match=named):
            specdecode.load_drafter(folder, target)


def test_sampling_settings_in_the_record(demo_eagle, tmp_path):
    """A record's ``"generation"`` ``"sampling"`` entry: generate drafts a chain of 3 when it
    samples and the 6-node tree greedily; tree= given by the caller, or a copy made with
    with_tree, holds at every temperature; the loaded drafter is left as it was."""
    import json
    import shutil

    from specdecode.trees.builders import DynamicTree

    target, tokenizer, result = demo_eagle
    folder = tmp_path / "with-sampling"
    shutil.copytree(result.path, folder)
    record_file = folder / "specdecode_drafter.json"
    record = json.loads(record_file.read_text())
    record["generation"] = {"num_draft_tokens": 2, "tree": "dynamic", "num_nodes": 6, "tree_depth": 3,
                            "sampling": {"tree": None, "num_draft_tokens": 3}}
    record_file.write_text(json.dumps(record))
    drafter = specdecode.load_drafter(folder, target)
    assert isinstance(drafter.tree, DynamicTree) and drafter.default_num_draft_tokens == 2
    sampled = drafter.for_sampling()
    assert sampled.tree is None and sampled.default_num_draft_tokens == 3 and sampled.sampling_drafter is None
    assert sampled.model is drafter.model
    ids = tokenizer(["def parse(text):\n"], return_tensors="pt").input_ids
    greedy = specdecode.generate(target, drafter, ids, max_new_tokens=12, eos_token_id=None)
    assert greedy.stats.tree_rule != ""
    hot = specdecode.generate(target, drafter, ids, max_new_tokens=12, eos_token_id=None, do_sample=True,
                              generator=torch.Generator().manual_seed(0))
    assert hot.stats.tree_rule == "" and len(hot.stats.position_drafted) == 3
    told = specdecode.generate(target, drafter, ids, max_new_tokens=12, eos_token_id=None, do_sample=True,
                               tree="static", num_nodes=5, generator=torch.Generator().manual_seed(0))
    assert told.stats.tree_rule != ""
    stats = specdecode.SpeculativeStats()  # the plug-in for model.generate reads the same entry
    target.generate(ids, attention_mask=torch.ones_like(ids), custom_generate=specdecode.custom_generate,
                    draft_model=drafter, do_sample=True, max_new_tokens=8, speculative_stats=stats)
    assert stats.tree_rule == "" and len(stats.position_drafted) == 3
    assert drafter.with_tree("dynamic", num_nodes=4).for_sampling().tree is not None
    assert isinstance(drafter.tree, DynamicTree) and drafter.sampling_drafter is sampled


def test_export_writes_half_weights_and_generation_settings(demo_eagle, tmp_path, monkeypatch):
    """scripts/export_drafter.py: float16 weights, the same drafter up to that rounding, and the
    generation settings given on its command line in the copy's record."""
    import importlib.util
    from pathlib import Path

    from safetensors.torch import load_file

    target, _, result = demo_eagle
    script = Path(__file__).resolve().parents[1] / "scripts" / "export_drafter.py"
    spec = importlib.util.spec_from_file_location("export_drafter", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "shipped"
    monkeypatch.setattr("sys.argv", ["export_drafter.py", str(result.path), str(out), "--num-draft-tokens", "2",
                                     "--tree", "dynamic", "--num-nodes", "6", "--tree-depth", "3",
                                     "--sampling-tree", "none", "--sampling-num-draft-tokens", "3"])
    module.main()
    assert {t.dtype for t in load_file(str(out / "model.safetensors")).values() if t.is_floating_point()} == {
        torch.float16}
    assert not (out / "progress.json").exists()
    shipped = specdecode.load_drafter(out, target)
    assert shipped.default_num_draft_tokens == 2 and (shipped.tree.num_nodes, shipped.tree.max_depth) == (6, 3)
    assert shipped.for_sampling().tree is None and shipped.for_sampling().default_num_draft_tokens == 3
    trained = result.drafter.model.state_dict()
    for name, value in shipped.model.state_dict().items():
        torch.testing.assert_close(value, trained[name].to(torch.float16).to(value.dtype), rtol=0, atol=0)
