"""The training kit's ``eagle`` kind: the data carries the target's features, training on the
demo target lowers the loss and raises acceptance on held-out prompts, a reduced head keeps
its vocabulary through save and load, a saved drafter refuses another target, bad options are
refused."""

from __future__ import annotations

import math

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


def test_draft_vocabulary_is_the_most_frequent_ids():
    from specdecode.training.data import Example

    examples = [Example(torch.tensor([5, 5, 5, 2, 2, 9]), torch.zeros(6, 1), torch.tensor([[5], [2], [7], [7], [7], [7]]))]
    assert eagle_kind.draft_vocabulary(examples, 10, 4).tolist() == [5, 7, 2, 9]


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


def _step_one(target, model, ids, padded_from=None):
    """A right-padded batch's teacher-forced step 1 through a fresh KV cache: (mask, positions,
    feats, previous, embeds, hidden, cache). ``padded_from``: {row: first padded column}."""
    from specdecode.models import kv_cache

    mask = torch.ones_like(ids)
    for row, column in (padded_from or {}).items():
        mask[row, column:] = 0
    positions = (mask.cumsum(1) - 1).clamp_min(0)
    feats = target(ids, attention_mask=mask, output_hidden_states=True).hidden_states[-1]
    previous = torch.cat([torch.zeros_like(feats[:, :1]), feats[:, :-1]], 1)
    embeds = target.get_input_embeddings()(ids)
    cache = kv_cache.new_cache()
    hidden = model(previous, embeds, mask, positions, cache)
    return mask, positions, feats, previous, embeds, hidden, cache


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_unrolled_steps_are_what_drafting_computes(arch):
    """The training-time test's step c at position t equals drafting a chain: the drafter's
    cache fed positions 0..t-c+1 with the target's features, then c - 1 one-token steps, each
    reading the previous step's own prediction (and the true next token). Left padding is
    not used in training; a right-padded row's real positions are checked too."""
    from specdecode.models import kv_cache
    from specdecode.training.eagle import unrolled_steps

    target = make_model(arch, vocab=111, layers=2)
    model = eagle_kind.build(target, unroll=4).model.eagle
    ids = torch.randint(3, 111, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # row 1: 7 real positions, right padding
        mask, positions, _, previous, embeds, hidden, cache = _step_one(target, model, ids, {1: 7})
        steps = unrolled_steps(model, embeds, hidden, mask, positions, 4, cache)
        assert len(steps) == 3
        for row, length in ((0, 9), (1, 7)):
            for step in (2, 3, 4):
                for t in range(step - 1, length):
                    fed = t - step + 2  # positions 0..t-c+1 teacher-forced
                    own = kv_cache.new_cache()
                    out = model(previous[row:row + 1, :fed], embeds[row:row + 1, :fed], None,
                                positions[row:row + 1, :fed], own)[:, -1:]
                    for s in range(fed, t + 1):
                        out = model(out, embeds[row:row + 1, s:s + 1], None, positions[row:row + 1, s:s + 1], own)
                    torch.testing.assert_close(steps[step - 2][row, t], out[0, 0], rtol=1e-4, atol=1e-5)


def test_unrolled_steps_broken_mask_is_caught():
    """The same check rejects a step that also sees step 1's entry at its own position (the
    classic off-by-one of a training-time-test mask)."""
    from specdecode.models import kv_cache

    target = make_model("llama", vocab=111, layers=2)
    model = eagle_kind.build(target, unroll=2).model.eagle
    ids = torch.randint(3, 111, (1, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        mask, positions, _, previous, embeds, hidden, cache = _step_one(target, model, ids)
        i = torch.arange(6)
        allowed = torch.cat([(i[None, :] <= i[:, None])[None], (i[None, :] == i[:, None])[None]], 2)  # broken
        additive = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)[:, None]
        own_inputs = torch.cat([torch.zeros_like(hidden[:, :1]), hidden[:, :-1]], 1)
        broken = model(own_inputs, embeds, additive, positions, cache)
        own = kv_cache.new_cache()
        model(previous[:, :4], embeds[:, :4], None, positions[:, :4], own)
        step = model(hidden[:, 3:4], embeds[:, 4:5], None, positions[:, 4:5], own)
        assert not torch.allclose(broken[:, 4], step[:, 0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("unroll, draft_vocab_size", [(2, None), (4, 16)])
def test_unroll_trains_and_is_checked(tmp_path, unroll, draft_vocab_size):
    target = make_model("llama", vocab=111, layers=2)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 111, (4,), generator=g).tolist() for _ in range(4)]
    result = train_drafter("eagle", target, tmp_path, data=prompts, max_steps=2, progress=False, unroll=unroll,
                           draft_vocab_size=draft_vocab_size,
                           data_settings=DataSettings(max_length=16, max_new_tokens=8, batch_size=4, top_k=16),
                           loop_settings=LoopSettings(batch_size=4, warmup_steps=1))
    training = result.record["training"]
    assert training["steps"] == 2 and training["options"]["unroll"] == unroll
    assert all(math.isfinite(x) for x in training["losses"])
    # four examples: no validation split (the loop evaluates on the training examples), so no rates by step
    assert training["val_examples"] == 0 and "greedy_acceptance_by_step" not in training["after"]
    for bad in (0, 8, 2.5, True):
        with pytest.raises(ValueError, match="unroll"):
            eagle_kind.build(target, unroll=bad)
    with pytest.raises(ValueError, match="unroll"):
        eagle_kind.build(target, unroll=2, feature_layers=(0, -1))


def test_acceptance_by_step_counts_what_chain_drafting_proposes():
    """Each step's rate equals drafting a chain by hand at every counted position t (t >= start
    and t >= c - 1): the cache fed positions 0..t-c+1 with target features, then one-token steps
    on the drafter's own outputs, the draft's argmax against the target's top-1 at t."""
    from specdecode.models import kv_cache
    from specdecode.training.data import Example

    target = make_model("llama", vocab=111, layers=2)
    model = eagle_kind.build(target).model
    eagle, head = model.eagle, target.get_output_embeddings()
    g = torch.Generator().manual_seed(4)
    examples = []
    with torch.no_grad():
        for n, start in ((9, 2), (6, 0)):
            ids = torch.randint(3, 111, (n,), generator=g)
            feats = target(ids[None], output_hidden_states=True).hidden_states[-1][0]
            top = torch.randint(0, 111, (n, 2), generator=g, dtype=torch.int32)
            top[::2, 0] = head(eagle(torch.cat([torch.zeros_like(feats[:1]), feats[:-1]])[None],
                                     target.get_input_embeddings()(ids)[None], None,
                                     torch.arange(n)[None]))[0, ::2].argmax(-1).int()  # some agree
            examples.append(Example(input_ids=ids, top_logp=torch.zeros(n, 2, dtype=torch.float16), top_ids=top,
                                    start=start, features=feats.half()))
        want = []
        for step in (1, 2, 3):
            hits = count = 0
            for e in examples:
                feats = e.features.float()
                previous = torch.cat([torch.zeros_like(feats[:1]), feats[:-1]])[None]
                embeds = target.get_input_embeddings()(e.input_ids)[None]
                positions = torch.arange(len(e.input_ids))[None]
                for t in range(max(e.start, step - 1), len(e.input_ids)):
                    fed = t - step + 2
                    cache = kv_cache.new_cache()
                    out = eagle(previous[:, :fed], embeds[:, :fed], None, positions[:, :fed], cache)[:, -1:]
                    for s_ in range(fed, t + 1):
                        out = eagle(out, embeds[:, s_:s_ + 1], None, positions[:, s_:s_ + 1], cache)
                    hits += int(head(out)[0, 0].argmax() == e.top_ids[t, 0])
                    count += 1
            want.append(round(hits / count, 4))
    assert eagle_kind.acceptance_by_step(model, examples, batch_size=2, steps=3) == pytest.approx(want, abs=1e-4)
    assert 0 < want[0] < 1


def test_acceptance_by_step_refuses_bad_input():
    target = make_model("llama", vocab=111, layers=2)
    model = eagle_kind.build(target).model
    for bad in (0, 8, True, 2.0):
        with pytest.raises(ValueError, match="steps"):
            eagle_kind.acceptance_by_step(model, [], steps=bad)
    example = type("E", (), {"input_ids": torch.arange(3, 8), "top_logp": torch.zeros(5, 2),
                             "top_ids": torch.zeros(5, 2, dtype=torch.int32), "start": 1, "features": None})()
    with pytest.raises(ValueError, match="examples"):
        eagle_kind.acceptance_by_step(model, [example])


def test_unrolled_kl_of_a_reduced_head_is_the_full_vocabulary_kl():
    """The unrolled steps' KL over a reduced head's own ids equals the KL over the full
    vocabulary with -inf outside the head (ids it cannot propose left out)."""
    from specdecode.training.eagle import UNROLL_DECAY, _unrolled_loss, unrolled_steps
    from specdecode.models import kv_cache

    target = make_model("llama", vocab=111, layers=2)
    built = eagle_kind.build(target, unroll=3, draft_vocab_size=20)
    examples = [type("E", (), {"input_ids": torch.arange(40) % 111, "top_ids": torch.arange(120).view(40, 3) % 111,
                               "start": 0})()]
    eagle_kind.prepare(built, examples)
    eagle = built.model.eagle
    ids = torch.randint(3, 111, (2, 7), generator=torch.Generator().manual_seed(2))
    head = target.get_output_embeddings()
    with torch.no_grad():
        mask, positions, feats, previous, embeds, hidden, cache = _step_one(target, eagle, ids, {0: 5})
        got = _unrolled_loss(built.model, embeds, hidden, feats, mask, positions, head, cache)
        cache = kv_cache.new_cache()
        eagle(previous, embeds, mask, positions, cache)
        log_p = torch.log_softmax(head(feats).float(), -1)
        want = 0.0
        for step, out in enumerate(unrolled_steps(eagle, embeds, hidden, mask, positions, 3, cache), start=2):
            log_q = torch.log_softmax(eagle.logits(out, head, 111).float(), -1)
            kl = torch.where(torch.isneginf(log_q), torch.zeros_like(log_q), log_p.exp() * (log_p - log_q)).sum(-1)
            counted = mask.bool().clone()
            counted[:, : step - 1] = False
            want += UNROLL_DECAY ** (step - 2) * kl[counted].mean()
    torch.testing.assert_close(got, torch.as_tensor(want, dtype=torch.float32), rtol=1e-5, atol=1e-6)


def test_command_refuses_eagle_options_for_other_kinds():
    import argparse

    from specdecode.training.command import run_train

    base = dict(target="demo", out="unused", minutes=None, data=None, seed=0, max_steps=1, threads=None)
    with pytest.raises(ValueError, match="draft_vocab: only the eagle kind"):
        run_train(argparse.Namespace(kind="draft", draft_vocab=8, unroll=None, **base))
    with pytest.raises(ValueError, match="unroll: only the eagle kind"):
        run_train(argparse.Namespace(kind="draft", draft_vocab=None, unroll=2, **base))
    with pytest.raises(ValueError, match="freeze_head"):
        run_train(argparse.Namespace(kind="eagle", draft_vocab=None, unroll=None, freeze_head=True, **base))


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
    steps = specdecode.generate(target, chain, ids, max_new_tokens=12, eos_token_id=None)
    told = specdecode.generate(target, chain, ids, max_new_tokens=12, eos_token_id=None, num_draft_tokens=2)
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
