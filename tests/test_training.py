"""The training kit (specdecode.training): a distilled ``draft`` drafter lowers its loss and raises
acceptance on the demo target; briefly trained drafters keep greedy output identical on several
architectures; the folder round trip, the target check, resuming and the ``train`` command."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_generate_models import PAD, _one_thread, left_padded, make_model  # noqa: F401

import specdecode
from specdecode.training import StepInfo, list_kinds, train_drafter
from specdecode.training.artifacts import target_fingerprint
from specdecode.training.data import DataSettings, default_prompts
from specdecode.training.loop import LoopSettings

SMALL = DataSettings(max_length=24, max_new_tokens=12, batch_size=4, top_k=32)


def _random_prompts(n: int, vocab: int = 128, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (int(torch.randint(3, 8, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def _train_small(target, out: Path, steps: int = 4, **kwargs):
    return train_drafter("draft", target, out, data=_random_prompts(8), max_steps=steps, data_settings=SMALL,
                         loop_settings=kwargs.pop("loop_settings", LoopSettings(batch_size=4, lr=3e-3, warmup_steps=2)),
                         progress=False, **kwargs)


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """The demo target, its tokenizer, and a draft drafter distilled from it for 20 steps (32
    prompts: 3 of them validate)."""
    target, _, tokenizer = specdecode.load_demo_pair()
    out = tmp_path_factory.mktemp("demo-draft")
    result = train_drafter("draft", target, out, tokenizer=tokenizer, target_name="demo", max_steps=20, num_prompts=32,
                           data_settings=DataSettings(max_length=96, max_new_tokens=32, batch_size=8),
                           loop_settings=LoopSettings(batch_size=8, lr=2e-3, warmup_steps=5), progress=False)
    return target, tokenizer, result


def test_kinds():
    assert list_kinds() == ["dflash", "draft", "eagle", "exit", "hydra", "medusa"]
    with pytest.raises(ValueError, match="kind: expected one of dflash, draft, eagle, exit, hydra, medusa"):
        train_drafter("nonesuch", torch.nn.Linear(2, 2), "unused")


def test_demo_training_lowers_the_loss_and_raises_acceptance(demo_run):
    from specdecode.demo import demo_prompts
    from specdecode.demo.acceptance import estimate_acceptance
    from specdecode.training import draft as draft_kind

    target, tokenizer, result = demo_run
    t = result.record["training"]
    assert t["steps"] == 20 and t["data"] == "target generations"
    assert t["after"]["loss"] < t["before"]["loss"]
    assert sum(t["losses"][-5:]) < sum(t["losses"][:5])
    assert t["after"]["greedy_acceptance"] >= t["before"]["greedy_acceptance"]  # 3 validation examples
    assert t["peak_memory_mib"] > 0
    # On held-out prompts never trained on (the benchmark's), against the untrained initialisation.
    untrained = draft_kind.build(target, layers=result.record["layers"]).model
    prompts = demo_prompts(4)
    before = estimate_acceptance(target, untrained, tokenizer, prompts, max_new_tokens=32).alpha
    after = estimate_acceptance(target, result.drafter, tokenizer, prompts, max_new_tokens=32).alpha
    print(f"greedy acceptance on held-out prompts: {before:.3f} -> {after:.3f}")
    assert after > before, (before, after)


def test_round_trip_and_target_check(demo_run, tmp_path):
    from transformers import AutoModelForCausalLM

    target, tokenizer, result = demo_run
    loaded = specdecode.load_drafter(result.path, target)
    ids = tokenizer("def f(x):\n    return", return_tensors="pt").input_ids
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, result.drafter(ids).logits)
    plain = AutoModelForCausalLM.from_pretrained(result.path)  # a plain Hugging Face model
    assert plain.config.num_hidden_layers == len(result.record["layers"]) == 1
    record = result.record
    assert record["kind"] == "draft" and record["target"]["name"] == "demo"
    assert record["target"]["weights_hash"] == target_fingerprint(target)
    assert record["vocab"] == {"size": 4096, "map": None}

    other = make_model("llama")
    with pytest.raises(ValueError, match="target: the drafter in .* was trained for 'demo'"):
        specdecode.load_drafter(result.path, other)
    changed = specdecode.load_demo_pair()[0]
    with torch.no_grad():
        changed.model.layers[3].mlp.down_proj.weight.mul_(1.01)
    with pytest.raises(ValueError, match="target:"):
        specdecode.load_drafter(result.path, changed)
    with pytest.raises(ValueError, match="path: .* holds no trained drafter"):
        specdecode.load_drafter(tmp_path, target)


def test_training_leaves_the_target_alone_and_raises_no_deprecation(tmp_path):
    from test_transformers_warnings import deprecations

    target = make_model("llama")
    before = {k: v.clone() for k, v in target.state_dict().items()}
    flags = [p.requires_grad for p in target.parameters()]
    with deprecations() as found:
        _train_small(target, tmp_path, steps=2)
        specdecode.load_drafter(tmp_path, target)
    assert found == []
    assert all(torch.equal(before[k], v) for k, v in target.state_dict().items())
    assert [p.requires_grad for p in target.parameters()] == flags and not target.training


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2", "opt"])
def test_greedy_identity_with_trained_drafters(arch, tmp_path):
    target = make_model(arch)
    result = _train_small(target, tmp_path)
    draft = specdecode.load_drafter(tmp_path, target)
    assert type(draft) is type(target) and len(result.record["layers"]) == 1
    ids, mask = left_padded([5, 9, 3], seed=2)
    want = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=16, pad_token_id=PAD)
    for rule in ("token", "block"):
        out = specdecode.generate(target, draft, ids, mask, num_draft_tokens=3, rule=rule, max_new_tokens=16,
                                  pad_token_id=PAD)
        assert torch.equal(out.sequences, want), (arch, rule)
    if arch == "llama":  # a proposal is only a proposal: sampling runs too
        sampled = specdecode.generate(target, draft, ids, mask, do_sample=True, max_new_tokens=8, pad_token_id=PAD,
                                      generator=torch.Generator().manual_seed(0))
        assert sampled.sequences.shape == (3, 9 + 8)


def test_interrupted_run_resumes_to_the_same_weights(tmp_path):
    target = make_model("llama")
    settings = LoopSettings(batch_size=4, lr=3e-3, warmup_steps=2, checkpoint_every=2)
    whole = _train_small(target, tmp_path / "whole", steps=6, loop_settings=settings)

    def stop_at_3(info: StepInfo) -> None:
        if info.step == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _train_small(target, tmp_path / "parts", steps=6, loop_settings=settings, callback=stop_at_3)
    resumed = _train_small(target, tmp_path / "parts", steps=6, loop_settings=settings)
    assert resumed.record["training"]["resumed_from"] == 3
    assert resumed.record["training"]["losses"] == whole.record["training"]["losses"]
    a, b = whole.drafter.state_dict(), resumed.drafter.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_bad_arguments(tmp_path):
    target = make_model("llama")
    for kwargs, name in (({"minutes": 0}, "minutes"), ({"seed": -1}, "seed"), ({"max_steps": 0}, "max_steps"),
                         ({"loss": "l2"}, "loss"), ({"layers": [5]}, "layers"), ({"data": []}, "data"),
                         ({"data": ["text"]}, "tokenizer")):
        kwargs.setdefault("data", _random_prompts(2))
        with pytest.raises((ValueError, TypeError), match=name):
            train_drafter("draft", target, tmp_path, max_steps=kwargs.pop("max_steps", 1), progress=False, **kwargs)
    with pytest.raises(ValueError, match="tokenizer"):
        train_drafter("draft", target, tmp_path, max_steps=1, progress=False)


def test_default_demo_prompts_are_not_the_held_out_ones():
    from specdecode.demo import demo_prompts

    prompts = default_prompts("demo", 64)
    assert len(set(prompts)) == 64 and not set(prompts) & set(demo_prompts())
    assert default_prompts("demo", 8, seed=1) == default_prompts("demo", 8, seed=1)


def test_default_chat_prompts_are_many_and_not_the_benchmark_ones():
    from specdecode.prompt_sets import CHAT_PROMPT_SETS
    from specdecode.training.prompts import chat_prompts, num_chat_prompts

    prompts = default_prompts("smollm2", 1000, seed=2)
    assert len(set(prompts)) == 1000 and prompts == default_prompts("smollm2", 1000, seed=2)
    every = set(default_prompts("smollm2", num_chat_prompts() + 100))
    for half in CHAT_PROMPT_SETS.values():
        assert not every & set(half)
    assert len(set(chat_prompts(num_chat_prompts()))) == num_chat_prompts() > 1500
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="count"):
            chat_prompts(bad)


def test_train_command(tmp_path, capsys):
    from specdecode.cli import main

    for argv, name in ((["train", "nonesuch"], "kind"), (["train", "draft", "--target", "nowhere"], "--target"),
                       (["train", "draft", "--minutes", "-1"], "--minutes"), (["train", "draft", "--data", "/no"],
                                                                              "--data")):
        with pytest.raises(SystemExit) as exc:
            main([*argv, *(["--target", "demo"] if "--target" not in argv else []), "--out", str(tmp_path)])
        assert exc.value.code == 2
        assert name in capsys.readouterr().err
    text = tmp_path / "code.py"
    text.write_text("def add(a, b):\n    return a + b\n\n\nclass Point:\n    x: int = 0\n    y: int = 0\n" * 8)
    out = tmp_path / "run"
    main(["train", "draft", "--target", "demo", "--out", str(out), "--data", str(text), "--max-steps", "3",
          "--threads", "1"])
    printed = capsys.readouterr().out
    assert "training: 3 steps" in printed and "greedy acceptance" in printed and "peak memory" in printed
    assert (out / "model.safetensors").is_file() and (out / "specdecode_drafter.json").is_file()


def test_target_fingerprint():
    model = make_model("llama")
    big = torch.nn.Module()
    big.weight = torch.nn.Parameter(torch.arange(2**24 + 3, dtype=torch.float32))  # float32 cannot index it all
    assert target_fingerprint(big) == target_fingerprint(big) != target_fingerprint(model)
    assert target_fingerprint(model) == target_fingerprint(make_model("llama"))
    assert target_fingerprint(model.to(torch.bfloat16)) == target_fingerprint(make_model("llama"))
    with torch.no_grad():
        model.lm_head.weight[0, 0] += 1.0
    assert target_fingerprint(model) != target_fingerprint(make_model("llama"))


def test_time_budget_bounds_the_run(tmp_path):
    target = make_model("llama")
    result = train_drafter("draft", target, tmp_path, data=_random_prompts(8), minutes=0.05, data_settings=SMALL,
                           loop_settings=LoopSettings(batch_size=4), progress=False)
    t = result.record["training"]
    assert t["steps"] >= 1 and t["horizon"] is not None and t["steps"] <= t["horizon"]
    assert t["total_seconds"] < 30  # 3 s asked; evaluation and saving come after the budget


def test_smollm2_needs_its_wheel(monkeypatch):
    from specdecode.training import targets

    import specdecode.model_files as model_files

    monkeypatch.setattr(model_files.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match="python -m specdecode install-models smollm2"):
        targets.check_target_name("smollm2")


def test_data_files(tmp_path, demo_run):
    from specdecode.training.data import token_sequences

    _, tokenizer, _ = demo_run
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "def add(a, b):\\n"}\n"import os\\n"\n\n')
    sequences, continue_them = token_sequences(prompts, tokenizer, 64)
    assert continue_them and sequences == [tokenizer("def add(a, b):\n").input_ids, tokenizer("import os\n").input_ids]
    repeated, _ = token_sequences(["a", "b", "a"], tokenizer, 64)  # each distinct text encoded once
    assert repeated == [tokenizer("a").input_ids, tokenizer("b").input_ids, tokenizer("a").input_ids]
    assert repeated[0] is not repeated[2]  # separate lists all the same
    text = tmp_path / "text.py"
    text.write_text("x = 1\n" * 200)
    windows, continue_them = token_sequences(text, tokenizer, 64)
    assert not continue_them and len(windows) > 1 and all(2 <= len(w) <= 64 for w in windows)


def test_labels_in_groups_equal_one_forward(demo_run):
    """The labelling forward in groups of similar length (data.LABEL_GROUPS) keeps the examples'
    order and gives what one forward over the whole right-padded batch gives, up to float16
    rounding of the log-probs."""
    from specdecode.training import data

    target, _, _ = demo_run
    gen = torch.Generator().manual_seed(0)
    lengths = [7, 31, 2, 19, 31, 11, 5]
    sequences = [torch.randint(0, 200, (n,), generator=gen).tolist() for n in lengths]
    starts = [n // 2 for n in lengths]
    grouped = data.label_sequences(target, sequences, starts, 8, (-1,))
    whole = data._label_forward(target, sequences, starts, 8, (-1,))
    assert [e.input_ids.tolist() for e in grouped] == sequences and [e.start for e in grouped] == starts
    for a, b in zip(grouped, whole):
        torch.testing.assert_close(a.top_logp.float(), b.top_logp.float(), atol=2e-2, rtol=0)
        torch.testing.assert_close(a.features.float(), b.features.float(), atol=2e-2, rtol=1e-2)
        assert (a.top_ids[:, 0] == b.top_ids[:, 0]).float().mean() > 0.9


def _flag_during_run_loop(monkeypatch, device: str) -> bool:
    from specdecode.training import loop

    seen = []
    monkeypatch.setattr(loop, "_run_loop", lambda *args, **kwargs: seen.append(torch.backends.cuda.matmul.allow_tf32))
    model = torch.nn.Linear(2, 2).to(device)
    loop.run_loop(model, {}, None, [], [], Path("."), LoopSettings(), run_key="k", max_steps=1, deadline=None)
    return seen[0]


def test_tf32_is_on_for_the_training_steps_on_cuda_only(monkeypatch):
    from specdecode.training import loop

    flag = torch.backends.cuda.matmul
    before = flag.allow_tf32
    flag.allow_tf32 = False
    try:
        with loop._matmuls(torch.device("cuda"), True):
            assert flag.allow_tf32
        assert not flag.allow_tf32  # restored: the target's own forwards never run in TF32
        for device, tf32 in ((torch.device("cuda"), False), (torch.device("cpu"), True)):
            with loop._matmuls(device, tf32):
                assert not flag.allow_tf32
        assert _flag_during_run_loop(monkeypatch, "cpu") is False and not flag.allow_tf32
        if torch.cuda.is_available():
            assert _flag_during_run_loop(monkeypatch, "cuda") is True and not flag.allow_tf32
    finally:
        flag.allow_tf32 = before


@pytest.mark.parametrize("n, batch_size", [(7, 3), (5, 11), (111, 17)])
def test_batch_indices_follow_the_seeded_epoch_permutations(n, batch_size):
    # the definition: position pos of the stream is permutation(epoch)[offset], one seeded
    # permutation per epoch; the loop's cache of permutations must not change it
    from specdecode.training.loop import _batch_indices

    def definition(step):
        out = []
        for pos in range(step * batch_size, (step + 1) * batch_size):
            epoch, offset = divmod(pos, n)
            perm = torch.randperm(n, generator=torch.Generator().manual_seed(4 * 1_000_003 + epoch))
            out.append(int(perm[offset]))
        return out

    orders: dict = {}
    for step in range(9):
        assert _batch_indices(step, batch_size, n, 4, orders) == definition(step)
        assert len(orders) <= 1 + batch_size // n + 1
    assert _batch_indices(3, batch_size, n, 4) == definition(3)  # a resumed run starts anywhere
