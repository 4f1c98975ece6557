"""Training labels from the decode steps (:func:`specdecode.training.continuations.continue_and_label`,
:class:`specdecode.engine.static_target.TargetOnly`): the continuations' own steps keep the
target's top-k log-probabilities and hidden states, so the data stage runs no second forward.

- the labels equal those of the labelling forward over the finished sequences
  (:func:`specdecode.training.data.label_sequences`), position by position: llama, gpt2 and qwen2,
  batches of 1, 3 and 17 left-padded prompts, greedy and sampled, one and two feature layers,
  extra padding columns and rows; three broken variants the same comparison rejects (labels
  one column late, log-probabilities of the tempered logits, the features of the wrong layer);
- the tokens are those of :func:`continue_prompts` for the same seed, minus the last new token;
  a row that ends on EOS is labelled up to the position that predicts its EOS;
- the data stage takes them on the static path, and a drafter's draft vocabulary counts the
  labels from ``start`` on only (the positions before carry zeros);
- bad arguments are refused naming them.
"""

from __future__ import annotations

import pytest
import torch
from test_generate_models import _one_thread, make_model  # noqa: F401
from test_training_data_path import _fresh_sessions, _prompts  # noqa: F401 (an autouse fixture)

import specdecode.engine.static_target as static_target
import specdecode.training.continuations as continuations
from specdecode.training.continuations import continue_and_label, continue_prompts
from specdecode.training.data import DataSettings, DataStats, Example, distill_examples, label_sequences
from specdecode.training.vocab import draft_vocabulary


def _mismatch(rows: list[dict], reference: list[Example]) -> str | None:
    """Why the decode-step labels differ from the labelling forward's (None: they agree up to
    float16 rounding): the same tokens, start, features and top-k log-probabilities (the ids
    where the log-probabilities are apart)."""
    for i, (row, ref) in enumerate(zip(rows, reference)):
        n, start = len(row["input_ids"]), row["start"]
        if row["input_ids"].tolist() != ref.input_ids[:n].tolist() or start != ref.start:
            return f"row {i}: tokens or start"
        if row["features"] is not None and not torch.allclose(row["features"].float(), ref.features[:n].float(),
                                                               atol=2e-3, rtol=2e-3):
            return f"row {i}: features"
        ours, theirs = row["top_logp"][start:].float(), ref.top_logp[start:n].float()
        if not torch.allclose(ours, theirs, atol=2e-3, rtol=2e-3):
            return f"row {i}: log-probabilities"
        apart = torch.ones_like(ours, dtype=torch.bool)
        apart[:, 1:] &= (ours[:, :-1] - ours[:, 1:]) > 1e-2
        apart[:, :-1] &= (ours[:, :-1] - ours[:, 1:]) > 1e-2
        if not torch.equal(row["top_ids"][start:][apart], ref.top_ids[start:n][apart]):
            return f"row {i}: token ids"
        if row["top_logp"][:start].any() or row["top_ids"][:start].any():
            return f"row {i}: labels before start"
    return None


def _compare(target, prompts, settings, seed=5, **shape) -> str | None:
    rows = continue_and_label(target, prompts, settings, seed, **shape)
    sequences = continue_prompts(target, prompts, settings, seed, **shape)
    if [r["input_ids"].tolist() for r in rows] != [s[:-1] for s in sequences]:
        return "not the continuations minus their last token"
    starts = [len(p) - 1 for p in prompts]
    reference = label_sequences(target, sequences, starts, settings.top_k, settings.feature_layers)
    return _mismatch(rows, reference)


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2"])
@pytest.mark.parametrize("batch", [1, 3, 17])
def test_decode_labels_equal_the_labelling_forward(arch, batch):
    target = make_model(arch, vocab=111, init=0.08, seed=batch)
    target.generation_config.eos_token_id = None
    prompts = _prompts([1 + (5 * i) % 11 for i in range(batch)], 111, seed=batch)
    for temperature, layers in ((0.0, (-1,)), (0.7, (1, -1))):
        settings = DataSettings(max_new_tokens=9, temperature=temperature, batch_size=batch, top_k=16,
                                feature_layers=layers)
        assert _compare(target, prompts, settings) is None
    assert _compare(target, prompts, settings, width=14, rows=batch + 2) is None  # padding columns and rows


def test_labels_without_features_and_a_vocabulary_under_k():
    target = make_model("llama", vocab=7, init=0.3, seed=2)
    target.generation_config.eos_token_id = None
    settings = DataSettings(max_new_tokens=6, temperature=0.7, batch_size=3, top_k=64)
    rows = continue_and_label(target, _prompts([2, 4, 3], 7, seed=3), settings, 0)
    assert all(r["features"] is None and r["top_ids"].shape[-1] == 7 for r in rows)
    assert _compare(target, _prompts([2, 4, 3], 7, seed=3), settings) is None


def _late_labels(state, logits, top_k):  # one column late: the next token's slot
    logp, ids = static_target.label_buffers(state, top_k)
    values, top = torch.log_softmax(logits.float(), -1).topk(logp.shape[-1], -1)
    columns = (state.lengths + 1).clamp_max(state.capacity - 1)[:, None, None].expand(-1, 1, logp.shape[-1])
    logp.scatter_(1, columns, values[:, None])
    ids.scatter_(1, columns, top[:, None])


def _tempered_labels(state, logits, top_k):  # the sampling law's log-probabilities, not the target's
    original_record(state, logits / 0.7, top_k)


original_record = static_target.record_labels


@pytest.mark.parametrize("broken", ["late", "tempered", "wrong layer"])
def test_broken_labels_fail_the_same_comparison(broken, monkeypatch):
    target = make_model("llama", vocab=111, init=0.08, seed=4)
    target.generation_config.eos_token_id = None
    prompts = _prompts([3, 7, 5], 111, seed=4)
    settings = DataSettings(max_new_tokens=9, temperature=0.7, batch_size=3, top_k=16, feature_layers=(-1,))
    if broken == "wrong layer":
        monkeypatch.setattr(static_target.TargetOnly, "__init__", _wrong_layer_init)
    else:
        monkeypatch.setattr(static_target, "record_labels", _late_labels if broken == "late" else _tempered_labels)
    assert _compare(target, prompts, settings) is not None


_init = static_target.TargetOnly.__init__


def _wrong_layer_init(self, feature_layers=None, label_top_k=None):
    _init(self, None if feature_layers is None else tuple(i - 1 for i in feature_layers), label_top_k)


def test_a_row_ending_on_eos_is_labelled_up_to_its_eos():
    target = make_model("llama", vocab=40, init=0.08, seed=5)
    target.generation_config.eos_token_id = None
    prompts = [[7, 8], [9], [11, 12, 13]]
    settings = DataSettings(max_new_tokens=10, temperature=0.0, batch_size=3, top_k=5)
    free = continue_prompts(target, prompts, settings, 0)
    eos = free[0][len(prompts[0]) + 3]
    target.generation_config.eos_token_id = eos  # row 0 ends at its fourth new token
    rows = continue_and_label(target, prompts, settings, 0)
    row = rows[0]
    assert row["input_ids"].tolist() == free[0][: len(prompts[0]) + 3]
    assert int(row["top_ids"][-1, 0]) == eos  # the last position predicts the EOS
    assert _compare(target, prompts, settings) is None


def test_the_data_stage_takes_the_decode_labels(tmp_path, monkeypatch):
    target = make_model("llama", vocab=60, init=0.08, seed=6)
    settings = DataSettings(max_length=16, max_new_tokens=6, batch_size=3, top_k=8, temperature=0.7,
                            feature_layers=(-1,))
    sequences = _prompts([3, 5, 2, 7, 4], 60, seed=7)
    forwards = []
    monkeypatch.setattr("specdecode.training.data.label_sequences", lambda *args: forwards.append(args))
    stats = DataStats()
    examples, _ = distill_examples(target, sequences, True, settings, tmp_path, "hash", stats=stats, progress=False)
    assert forwards == []  # no labelling forward
    assert [e.start for e in examples] == [len(s) - 1 for s in sequences]
    assert all(e.features is not None and e.features.shape == (len(e.input_ids), target.config.hidden_size)
               for e in examples)
    assert stats.labelled_tokens == sum(len(e.input_ids) for e in examples)


def test_the_draft_vocabulary_counts_labels_from_start():
    ids = torch.tensor([5, 6, 7, 8])
    zeros = torch.zeros((4, 2), dtype=torch.int32)
    top = zeros.clone()
    top[2:, 0] = 9
    example = Example(ids, zeros.half(), top, start=2)
    vocabulary = draft_vocabulary([example] * 3, vocab_size=12, size=5)
    assert vocabulary.tolist() == [9, 5, 6, 7, 8]  # the zeros before start do not count (else 0 would lead)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="label_top_k"):
        static_target.TargetOnly(label_top_k=0)
    with pytest.raises(ValueError, match="label_top_k"):
        static_target.TargetOnly(label_top_k=True)
    with pytest.raises(RuntimeError, match="labelled_rows"):
        static_target.TargetOnly(label_top_k=4).labelled_rows(1)
    with pytest.raises(ValueError, match="num_rows"):
        static_target.TargetOnly(label_top_k=4).labelled_rows(-1)
    target = make_model("llama", vocab=30, seed=8)
    with pytest.raises(ValueError, match="prompts"):
        continue_and_label(target, [], DataSettings(max_new_tokens=2, batch_size=1), 0)
    labeller = static_target.TargetOnly(label_top_k=4)
    continuations._static_generate(target, torch.tensor([[3, 4]]), torch.ones(1, 2, dtype=torch.long),
                                   DataSettings(max_new_tokens=2, batch_size=1), "static", 0, labeller)
    with pytest.raises(ValueError, match="num_rows: the generation had 1 rows, asked for 2"):
        labeller.labelled_rows(2)
    with pytest.raises(ValueError, match="feature_layers"):
        continue_and_label(target, [[3, 4]], DataSettings(max_new_tokens=2, batch_size=1, feature_layers=(99,)), 0)


@pytest.mark.cuda
def test_graphed_labels_equal_the_labelling_forward():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    target = make_model("llama", vocab=111, init=0.08, seed=9).to("cuda")
    target.generation_config.eos_token_id = None
    prompts = _prompts([3, 7, 5, 1], 111, seed=9)
    settings = DataSettings(max_new_tokens=9, temperature=0.7, batch_size=4, top_k=16, feature_layers=(-1,))
    assert _compare(target, prompts, settings, width=16, rows=6) is None


def test_the_labelling_forward_on_request(tmp_path, monkeypatch):
    import argparse

    import specdecode.training.data as data
    from specdecode.training.command import _run_settings, train_parser

    target = make_model("llama", vocab=60, init=0.08, seed=10)
    settings = DataSettings(max_length=16, max_new_tokens=6, batch_size=3, top_k=8, temperature=0.7, labels="forward")
    sequences = _prompts([3, 5, 2, 7], 60, seed=11)
    forwards = []
    real = data.label_sequences
    monkeypatch.setattr(data, "label_sequences", lambda *args: forwards.append(1) or real(*args))
    examples, _ = distill_examples(target, sequences, True, settings, tmp_path, "hash", progress=False)
    assert len(forwards) == 2  # one labelling forward per batch
    whole = [s for i in (0, 3) for s in continue_prompts(target, sequences[i:i + 3], settings, i // 3)]
    assert [e.input_ids.tolist() for e in examples] == whole  # the whole continuations, the last token too
    with pytest.raises(ValueError, match="labels"):
        DataSettings(labels="both")
    sub = argparse.ArgumentParser().add_subparsers()
    args = train_parser(sub).parse_args(["draft", "--target", "demo", "--out", str(tmp_path), "--data-labels",
                                         "forward"])
    assert _run_settings(args)["data_settings"].labels == "forward"
