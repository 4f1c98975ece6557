"""The training kit on a GPU: every kind trains on a target that lives on CUDA (the kit trains on
the target's device), its drafter loads back onto that device, and greedy generation with it is
the target's own greedy output; a bfloat16 target trains too (the dtype a 1B-8B target runs in);
one process trains every kind with each kind's batch planned from the free memory (a measured
step that changes nothing), and continues them from their saved folders.
Every test skips without a CUDA device (checked when it runs, never at import)."""

from __future__ import annotations

import pytest
import torch
from test_generate_models import PAD, left_padded, make_model

import specdecode
from specdecode.training import kind_module, train_drafter, train_drafters
from specdecode.training.data import DataSettings, Example
from specdecode.training.loop import LoopSettings
from specdecode.training.planning import measure_step

SMALL = DataSettings(max_length=24, max_new_tokens=12, batch_size=4, top_k=16)
LOOP = LoopSettings(batch_size=4, lr=3e-3, warmup_steps=1)
KIND_OPTIONS = {"draft": {}, "eagle": {"draft_vocab_size": 60}, "exit": {"exit_layer": 1},
                "medusa": {"num_heads": 2}, "hydra": {"num_heads": 2}}


@pytest.fixture
def cuda() -> torch.device:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    return torch.device("cuda")


def _prompts(n: int, vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (5,), generator=g).tolist() for _ in range(n)]


@pytest.mark.cuda
@pytest.mark.parametrize("kind", sorted(KIND_OPTIONS))
def test_every_kind_trains_on_the_gpu_and_keeps_greedy_output(kind, cuda, tmp_path):
    target = make_model("llama", vocab=111, layers=2, init=0.08).to(cuda)
    result = train_drafter(kind, target, tmp_path, data=_prompts(8, 111), max_steps=3, progress=False,
                           data_settings=SMALL, loop_settings=LOOP, **KIND_OPTIONS[kind])
    assert result.record["training"]["steps"] == 3
    assert {p.device.type for p in target.parameters()} == {cuda.type}
    drafter = specdecode.load_drafter(tmp_path, target)
    ids, mask = left_padded([5, 2, 7], vocab=111, seed=2)
    ids, mask = ids.to(cuda), mask.to(cuda)
    want = target.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=PAD)
    out = specdecode.generate(target, drafter, ids, mask, max_new_tokens=10, pad_token_id=PAD)
    assert out.sequences.device.type == cuda.type
    assert torch.equal(out.sequences, want), kind


@pytest.mark.cuda
def test_a_bfloat16_target_trains_an_eagle_drafter(cuda, tmp_path):
    target = make_model("llama", vocab=111, layers=2, init=0.08).to(cuda, torch.bfloat16)
    result = train_drafter("eagle", target, tmp_path, data=_prompts(8, 111, seed=1), max_steps=3, progress=False,
                           data_settings=SMALL, loop_settings=LOOP)
    losses = result.record["training"]["losses"]
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))
    assert result.record["training"]["peak_memory_mib"] > 0
    drafter = specdecode.load_drafter(tmp_path, target)
    ids, mask = left_padded([6, 4], vocab=111, seed=3)
    out = specdecode.generate(target, drafter, ids.to(cuda), mask.to(cuda), max_new_tokens=8, pad_token_id=PAD)
    assert out.sequences.shape == (2, 6 + 8)


@pytest.mark.cuda
def test_measuring_a_step_changes_nothing(cuda):
    target = make_model("llama", vocab=111, layers=2, init=0.08).to(cuda)
    module = kind_module("draft")
    built = module.build(target, num_layers=1)
    g = torch.Generator().manual_seed(0)
    examples = [Example(torch.randint(3, 111, (n,), generator=g), torch.randn(n, 16, generator=g).half(),
                        torch.randint(0, 111, (n, 16), generator=g).int()) for n in (12, 20, 16)]
    before = {name: p.detach().clone() for name, p in built.params.items()}
    fixed, per_example = measure_step(built.model, built.params, module.forward, examples, cuda)
    assert per_example > 0 and fixed >= 0
    assert all(torch.equal(p, before[name]) and p.grad is None for name, p in built.params.items())


@pytest.mark.cuda
def test_one_process_plans_every_kind_and_continues_them(cuda, tmp_path):
    target = make_model("llama", vocab=111, layers=4, init=0.08).to(cuda)
    kinds = ["eagle", "medusa", "hydra", "exit", "draft"]
    options = {"eagle": {"draft_vocab_size": 60}, "exit": {"exit_layer": 1}, "medusa": {"num_heads": 2},
               "hydra": {"num_heads": 2}, "draft": {"num_layers": 1}}
    settings = dict(data=_prompts(16, 111), max_steps=2, progress=False, data_settings=SMALL)
    first = train_drafters(kinds, target, tmp_path / "a", kind_options=options, **settings)
    for kind, result in first.items():
        t = result.record["training"]
        plan = t["memory"]["batch_plan"]
        assert plan["from"] == "free memory" and plan["batch_size"] == 64, (kind, plan)  # a tiny model fits
        assert plan["free_mib"] > 0 and t["memory"]["free_after_data_mib"] > 0 and t["memory"]["data_peak_mib"] > 0
        assert 0 < t["memory"]["train_peak_mib"] == t["peak_memory_mib"]
        assert t["lr"] == LoopSettings().lr and t["warmup_steps"] == 50
    second = train_drafters(kinds, target, tmp_path / "b", init_from={kind: tmp_path / "a" / kind for kind in kinds},
                            **settings)
    for kind, result in second.items():
        t = result.record["training"]
        assert t["totals"]["runs"] == 2 and t["totals"]["steps"] == 4 and t["warmup_steps"] == 10
        assert t["before"]["loss"] == pytest.approx(first[kind].record["training"]["after"]["loss"], rel=1e-4)
        ids, mask = left_padded([5, 2], vocab=111, seed=4)
        ids, mask = ids.to(cuda), mask.to(cuda)
        want = target.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=PAD)
        drafter = specdecode.load_drafter(tmp_path / "b" / kind, target)
        out = specdecode.generate(target, drafter, ids, mask, max_new_tokens=8, pad_token_id=PAD)
        assert torch.equal(out.sequences, want), kind
