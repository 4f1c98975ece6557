"""The ``medusa`` and ``hydra`` kinds with ``head_tokens`` (a reduced head): the run keeps the ids
its data uses most, saves them and loads them back, continues with them (and refuses another
size), head 0's logits and the other heads' KL are the definition over the kept ids, head
accuracies rank target ids, and the command line's ``--head-tokens`` reaches exit, medusa and
hydra only."""

from __future__ import annotations

import argparse

import pytest
import torch
from test_generate_models import _one_thread, left_padded, make_model  # noqa: F401
from test_training_medusa import _examples, expected_extra, medusa_losses

import specdecode
from specdecode.training import hydra as hydra_kind
from specdecode.training import medusa as medusa_kind
from specdecode.training import train_drafter
from specdecode.training.command import _kind_options
from specdecode.training.data import DataSettings
from specdecode.training.loop import LoopSettings
from specdecode.training.losses import SubsetLogits
from specdecode.training.vocab import column_map, draft_vocabulary

SMALL = DataSettings(max_length=16, max_new_tokens=8, batch_size=4, top_k=16)
LOOP = LoopSettings(batch_size=4, warmup_steps=1)


def _run(kind, target, out, **options):
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 111, (4,), generator=g).tolist() for _ in range(6)]
    return train_drafter(kind, target, out, data=prompts, max_steps=2, progress=False, num_heads=2,
                         data_settings=SMALL, loop_settings=LOOP, **options)


@pytest.mark.parametrize("kind", ["medusa", "hydra"])
def test_a_run_keeps_the_most_used_ids_saves_and_continues_them(kind, tmp_path):
    target = make_model("llama", vocab=111, layers=2)
    result = _run(kind, target, tmp_path / "run", head_tokens=40)
    ids = result.drafter.heads.head_token_ids
    assert ids.numel() == 40 and torch.equal(ids, ids.sort().values)
    examples = [e for f in sorted((tmp_path / "run" / "data").glob("*/batch_*.pt")) for e in _examples(f)]
    assert len(examples) == 6 and result.record["training"]["val_examples"] == 0  # all six trained on
    assert torch.equal(ids, draft_vocabulary(examples, 111, 40).sort().values)  # the 40 they use most
    assert result.record["vocab"] == {"size": 40, "map": "head_token_ids (model.safetensors)"}
    assert result.record["training"]["options"]["head_tokens"] == 40
    loaded = specdecode.load_drafter(tmp_path / "run", target)
    assert torch.equal(loaded.heads.head_token_ids, ids) and loaded.describe()["head_tokens"] == 40
    batch, mask = left_padded([5, 2], vocab=111, seed=2)
    out = specdecode.generate(target, loaded, batch, mask, max_new_tokens=8)
    assert torch.equal(out.sequences, target.generate(batch, attention_mask=mask, max_new_tokens=8,
                                                      do_sample=False, pad_token_id=0))
    more = _run(kind, target, tmp_path / "more", init_from=str(tmp_path / "run"))
    assert torch.equal(more.drafter.heads.head_token_ids, ids)
    assert more.record["training"]["options"]["head_tokens"] == 40
    with pytest.raises(ValueError, match="init_from: .* head_tokens=40.* asks for head_tokens=30"):
        _run(kind, target, tmp_path / "other", init_from=str(tmp_path / "run"), head_tokens=30)


def test_reduced_losses_are_the_definition():
    """Head 0's logits are the full head's columns of the kept ids (as SubsetLogits); head i's KL
    is the definition with the target's probabilities of the kept ids and the head's softmax
    over them."""
    kept = torch.tensor([0, 3, 4, 7, 9, 11, 12, 20, 21, 25, 30, 31, 33, 36, 40, 41, 44, 45, 47, 49])
    target, built, feats, logits, extra = medusa_losses(kept)
    ids, mask = torch.zeros((2, 7), dtype=torch.long), torch.ones((2, 7), dtype=torch.long)
    with torch.no_grad():
        head = target.get_output_embeddings()
        per_head = head(built.model.heads(feats))[..., kept]  # [b, t, K, N]
        assert isinstance(logits, SubsetLogits) and torch.equal(logits.token_ids, kept)
        assert logits.column_of[kept].tolist() == list(range(20)) and int((logits.column_of >= 0).sum()) == 20
        torch.testing.assert_close(logits.logits[:, 1:], per_head[:, :-1, 0])
        log_p = torch.log_softmax(head(feats), -1)[..., kept]  # the kept ids' log-probabilities, not renormalized
        want = expected_extra(log_p, lambda r, t, i: per_head[r, t, i], ((0, 7), (1, 5)), 0.5)
        torch.testing.assert_close(extra, want, rtol=1e-4, atol=1e-5)
        hydra = hydra_kind.build(target, num_heads=2, head_tokens=20)
        hydra.model.heads.set_head_tokens(kept)
        assert isinstance(hydra_kind.forward(hydra.model, ids, mask, feats)[0], SubsetLogits)


def test_head_accuracies_rank_the_kept_ids(tmp_path):
    """With a reduced head, head i's rank-0 accuracy is how often the kept id of largest logit
    (the full head's logits outside the kept ids set to -inf) is the target's top-1 i + 1 ahead."""
    target = make_model("llama", vocab=111, layers=2)
    result = _run("medusa", target, tmp_path, head_tokens=30)
    examples = [e for f in sorted((tmp_path / "data").glob("*/batch_*.pt")) for e in _examples(f)]
    heads = result.drafter.heads
    acc = medusa_kind.head_accuracies(heads, target, examples, ranks=2)
    outside = torch.ones(111, dtype=torch.bool)
    outside[heads.head_token_ids] = False
    for i in range(2):
        hits = count = 0
        for e in examples:
            with torch.no_grad():
                logits = target.get_output_embeddings()(heads(e.features.to(heads.weight.dtype)))[:, i]
            top = logits.masked_fill(outside, float("-inf")).argmax(-1)
            n, lo = len(e.input_ids), max(e.start - 1 - i, 0)
            hits += int((top[lo: n - 1 - i] == e.top_ids[lo + 1 + i: n, 0]).sum())
            count += n - 1 - i - lo
        assert acc[i, 0].item() == pytest.approx(hits / count)


def test_the_command_line_flag_reaches_exit_medusa_and_hydra_only():
    args = argparse.Namespace(head_tokens=64)
    options = _kind_options(args, ["eagle", "medusa", "hydra", "exit"])
    assert options == {"eagle": {}, "medusa": {"head_tokens": 64}, "hydra": {"head_tokens": 64},
                       "exit": {"head_tokens": 64}}
    with pytest.raises(ValueError, match="head_tokens: only the exit, medusa and hydra kinds"):
        _kind_options(args, ["eagle", "draft"])
    with pytest.raises(ValueError, match="head_tokens: expected an int >= 1 or None"):
        medusa_kind.build(make_model("llama", vocab=111, layers=2), head_tokens=0)


def test_draft_vocabulary_is_the_most_frequent_ids_and_column_map_inverts_it():
    from specdecode.training.data import Example

    examples = [Example(torch.tensor([5, 5, 5, 2, 2, 9]), torch.zeros(6, 1), torch.tensor([[5], [2], [7], [7], [7], [7]]))]
    ids = draft_vocabulary(examples, 10, 4)
    assert ids.tolist() == [5, 7, 2, 9]
    assert column_map(ids, 10).tolist() == [-1, -1, 2, -1, -1, 0, -1, 1, -1, 3]
