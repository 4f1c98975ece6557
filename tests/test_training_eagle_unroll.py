"""The ``eagle`` kind's training-time test (``unroll``) and EAGLE-3 feature layers: every
unrolled step equals chain drafting (a leaky mask rejected), the unrolled KL reads the target's
own distribution (a reduced head's ids; several layers: the last one's columns, a variant
reading another layer rejected), runs train and record the rates by step, which equal chains
drafted by hand, and bad options are refused."""

from __future__ import annotations

import math

import pytest
import torch
from test_generate_models import _one_thread, make_model  # noqa: F401

from specdecode.training import eagle as eagle_kind
from specdecode.training import train_drafter
from specdecode.training.data import DataSettings
from specdecode.training.loop import LoopSettings


def _step_one(target, model, ids, padded_from=None):
    """A right-padded batch's teacher-forced step 1 through a fresh KV cache: (mask, positions,
    feats, previous, embeds, hidden, cache). ``padded_from``: {row: first padded column}."""
    from specdecode.models import kv_cache

    mask = torch.ones_like(ids)
    for row, column in (padded_from or {}).items():
        mask[row, column:] = 0
    positions = (mask.cumsum(1) - 1).clamp_min(0)
    states = target(ids, attention_mask=mask, output_hidden_states=True).hidden_states
    feats = torch.cat([states[i] for i in model.feature_layers], -1)
    previous = model.input_features(torch.cat([torch.zeros_like(feats[:, :1]), feats[:, :-1]], 1))
    embeds = target.get_input_embeddings()(ids)
    cache = kv_cache.new_cache()
    hidden = model(previous, embeds, mask, positions, cache)
    return mask, positions, feats, previous, embeds, hidden, cache


@pytest.mark.parametrize("arch, feature_layers", [("qwen2", (-1,)), ("llama", (-1,)), ("llama", (1, 0, -1))])
def test_unrolled_steps_are_what_drafting_computes(arch, feature_layers):
    """The training-time test's step c at position t equals drafting a chain: the drafter's
    cache fed positions 0..t-c+1 with the target's features (several layers: projected), then
    c - 1 one-token steps, each reading the previous step's own prediction (and the true next
    token). Left padding is not used in training; a right-padded row's real positions are
    checked too."""
    from specdecode.models import kv_cache
    from specdecode.training.eagle import unrolled_steps

    target = make_model(arch, vocab=111, layers=2)
    model = eagle_kind.build(target, unroll=4, feature_layers=feature_layers).model.eagle
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


@pytest.mark.parametrize("unroll, draft_vocab_size, feature_layers", [(2, None, (-1,)), (4, 16, (-1,)),
                                                                     (3, None, (1, -1))])
def test_unroll_trains_and_is_checked(tmp_path, unroll, draft_vocab_size, feature_layers):
    target = make_model("llama", vocab=111, layers=2)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 111, (4,), generator=g).tolist() for _ in range(4)]
    result = train_drafter("eagle", target, tmp_path, data=prompts, max_steps=2, progress=False, unroll=unroll,
                           draft_vocab_size=draft_vocab_size, feature_layers=feature_layers,
                           data_settings=DataSettings(max_length=16, max_new_tokens=8, batch_size=4, top_k=16),
                           loop_settings=LoopSettings(batch_size=4, warmup_steps=1))
    training = result.record["training"]
    assert training["steps"] == 2 and training["options"]["unroll"] == unroll
    assert list(training["options"]["feature_layers"]) == list(feature_layers)
    assert all(math.isfinite(x) for x in training["losses"])
    # four examples: no validation split (the loop evaluates on the training examples), so no rates by step
    assert training["val_examples"] == 0 and "greedy_acceptance_by_step" not in training["after"]
    for bad in (0, 8, 2.5, True):
        with pytest.raises(ValueError, match="unroll"):
            eagle_kind.build(target, unroll=bad)
    with pytest.raises(ValueError, match="unroll: .*include -1 in feature_layers"):
        eagle_kind.build(target, unroll=2, feature_layers=(0, 1))  # no last hidden state: no target distribution
    for layers in ((0, -1), (2, 0)):  # -1 or its positive twin (2 decoder layers: index 2 is the last)
        assert eagle_kind.build(target, unroll=2, feature_layers=layers).model.unroll == 2


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


@pytest.mark.parametrize("broken", [False, True])
def test_unrolled_kl_with_several_layers_reads_the_last_ones_columns(broken, monkeypatch):
    """EAGLE-3 features (several layers, the last not first): the unrolled KL is against the
    target's own distribution (its head on the last hidden state). A variant that reads the
    first layer's columns instead is rejected by the same check."""
    from specdecode.models import kv_cache
    from specdecode.training import eagle as module
    from specdecode.training.eagle import UNROLL_DECAY, _unrolled_loss, unrolled_steps

    if broken:
        monkeypatch.setattr(module, "last_layer_slot", lambda target, layers: 0)
    target = make_model("llama", vocab=111, layers=2)
    built = eagle_kind.build(target, unroll=3, feature_layers=(1, -1))
    eagle, head = built.model.eagle, target.get_output_embeddings()
    ids = torch.randint(3, 111, (2, 7), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        mask, positions, feats, previous, embeds, hidden, cache = _step_one(target, eagle, ids, {1: 6})
        got = _unrolled_loss(built.model, embeds, hidden, feats, mask, positions, head, cache)
        log_p = torch.log_softmax(target(ids, attention_mask=mask).logits.float(), -1)  # the target's own
        cache = kv_cache.new_cache()
        eagle(previous, embeds, mask, positions, cache)
        want = 0.0
        for step, out in enumerate(unrolled_steps(eagle, embeds, hidden, mask, positions, 3, cache), start=2):
            log_q = torch.log_softmax(head(out).float(), -1)
            kl = (log_p.exp() * (log_p - log_q)).sum(-1)
            counted = mask.bool().clone()
            counted[:, : step - 1] = False
            want += UNROLL_DECAY ** (step - 2) * kl[counted].mean()
    close = torch.allclose(got, torch.as_tensor(want, dtype=torch.float32), rtol=1e-4, atol=1e-5)
    assert close != broken


def test_command_feature_layers():
    """``--feature-layers 1,-1`` reaches the eagle kind's build options; bad lists name the flag."""
    import argparse

    from specdecode.training.command import _feature_layers, _kind_options

    args = argparse.Namespace(feature_layers=_feature_layers(" 1, -1"), unroll=2)
    assert _kind_options(args, ["eagle", "medusa"]) == {"eagle": {"feature_layers": (1, -1), "unroll": 2},
                                                        "medusa": {}}
    for bad in ("1,a", "2,2", ""):
        with pytest.raises(ValueError, match="feature_layers"):
            _feature_layers(bad)
