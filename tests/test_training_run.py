"""Several drafter kinds in one training run (specdecode.training.train_drafters and
``python -m specdecode train KIND [KIND ...]``): one labelled-data cache, a time budget split
across the kinds, half-precision copies that load back and keep greedy output, batch sizes
sized for the device, and one-line errors for a missing device or a full one. All on the CPU
with the demo target (tiny data, a few steps)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import specdecode
from specdecode.cli import main
from specdecode.training import list_kinds, train_drafter, train_drafters
from specdecode.training.data import DataSettings
from specdecode.training.device import (
    MAX_DATA_BATCH,
    OutOfDeviceMemory,
    check_device,
    check_dtype,
    data_batch_size,
    memory_error,
)
from specdecode.training.loop import LoopSettings

TINY = ["--num-prompts", "8", "--max-length", "48", "--max-new-tokens", "16", "--data-batch-size", "4",
        "--batch-size", "4", "--threads", "1"]
MIB16 = 16 * 2**20


@pytest.fixture(scope="module")
def demo():
    target, _, tokenizer = specdecode.load_demo_pair()
    return target, tokenizer


@pytest.fixture(scope="module")
def every_kind(tmp_path_factory):
    """``train eagle medusa hydra exit draft dflash --target demo`` with --export, 2 steps each."""
    root = tmp_path_factory.mktemp("run")
    out, export = root / "run", root / "export"
    main(["train", "eagle", "medusa", "hydra", "exit", "draft", "dflash", "--target", "demo", "--out", str(out),
          "--export", str(export), "--max-steps", "2", "--num-layers", "1", "--block-size", "4", *TINY])
    return out, export


def test_every_kind_trains_from_one_data_cache(every_kind, capsys):
    out, _ = every_kind
    caches = [p for p in (out / "data").iterdir() if p.is_dir()]
    assert len(caches) == 1  # labelled once, with the features the feature kinds read
    records = {kind: json.loads((out / kind / "specdecode_drafter.json").read_text()) for kind in list_kinds()}
    first = records["eagle"]["training"]
    for kind, record in records.items():
        t = record["training"]
        assert record["kind"] == kind and record["target"]["name"] == "demo" and t["steps"] == 2
        assert t["kinds_in_run"] == ["eagle", "medusa", "hydra", "exit", "draft", "dflash"]
        assert (t["sequences"], t["data_seconds"], t["tokens"]) == (first["sequences"], first["data_seconds"],
                                                                    first["tokens"])
        assert t["device"] == "cpu" and t["data_batch_size"] == 4


def test_exported_drafters_are_half_precision_small_and_keep_greedy_output(every_kind, demo):
    _, export = every_kind
    target, tokenizer = demo
    ids = tokenizer("def mean(values):\n", return_tensors="pt").input_ids
    want = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=10, do_sample=False)
    files = [p for p in export.rglob("*") if p.is_file()]
    assert all(p.stat().st_size < MIB16 for p in files)
    for kind in list_kinds():
        folder = export / kind
        record = json.loads((folder / "specdecode_drafter.json").read_text())
        assert record["target"]["name"] == "demo" and record["target"]["weights_hash"].startswith("sha256:")
        weights = load_file(str(folder / "model.safetensors"))
        assert {v.dtype for v in weights.values() if v.is_floating_point()} == {torch.float16}
        assert not (folder / "checkpoint.pt").exists() and not (folder / "progress.json").exists()
        drafter = specdecode.load_drafter(folder, target)
        out = specdecode.generate(target, drafter, ids, max_new_tokens=10)
        assert torch.equal(out.sequences, want), kind
    draft = json.loads((export / "draft" / "specdecode_drafter.json").read_text())
    assert "model.embed_tokens.weight" in draft["from_target"]  # the frozen embedding is the target's
    assert "model.embed_tokens.weight" not in load_file(str(export / "draft" / "model.safetensors"))


def test_a_slim_draft_copy_is_the_trained_model_in_half_precision(every_kind, demo):
    out, export = every_kind
    target, _ = demo
    trained = specdecode.load_drafter(out / "draft", target).state_dict()
    shipped = specdecode.load_drafter(export / "draft", target).state_dict()
    assert sorted(trained) == sorted(shipped)
    for name, value in shipped.items():
        torch.testing.assert_close(value, trained[name].half().float(), rtol=0, atol=0)


def test_kinds_flag_and_kind_flags(tmp_path, capsys):
    for argv, words in (
            (["train", "eagle", "--kinds", "medusa"], "not both"),
            (["train", "--kinds", "eagle,eagle"], "each kind once"),
            (["train", "--kinds", "eagle,nonesuch"], "--kinds"),
            (["train"], "at least one drafter kind"),
            (["train", "eagle", "medusa", "--num-layers", "2"], "num_layers: only the draft and dflash kinds"),
            (["train", "draft", "medusa", "--layer", "2"], "--layer only apply to the 'exit' kind"),
            (["train", "eagle", "--device", "tpu"], "--device"),
            (["train", "eagle", "--dtype", "int8"], "--dtype"),
            (["train", "eagle", "medusa", "--data-cache", str(tmp_path)], "data_cache"),
            (["train", "eagle", "--prompt-mix", "templates=1,web=1"], "prompt_mix"),
            (["train", "eagle", "--max-new-tokens", "64", "--max-length", "32"], "max_new_tokens")):
        with pytest.raises(SystemExit) as exc:
            main([*argv, "--target", "demo", "--out", str(tmp_path / "x")])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and words in err, (argv, err)
        assert len(err.strip().splitlines()[-1]) > 0 and "Traceback" not in err


def test_cuda_asked_for_but_missing_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exc:
        main(["train", "eagle", "--target", "demo", "--out", str(tmp_path), "--device", "cuda"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "finds no CUDA device" in err and "--device cpu" in err
    assert len([line for line in err.splitlines() if line.strip()]) == 1 and err.startswith(
        "python -m specdecode train: error: device: 'cuda' was asked for")
    with pytest.raises(ValueError, match="device: 'cuda' was asked for"):
        check_device("cuda")


def test_out_of_memory_is_one_line_naming_what_to_lower(tmp_path, capsys, monkeypatch):
    import specdecode.training.runner as runner

    def full(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 18.00 GiB (GPU 0; 79.10 GiB total)\nmore")

    monkeypatch.setattr(runner, "distill_examples", full)
    with pytest.raises(SystemExit) as exc:
        main(["train", "eagle", "medusa", "--target", "demo", "--out", str(tmp_path), *TINY])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 1 and "out of memory in the data stage (4 prompts per batch)" in err[-1]
    assert "--data-batch-size" in err[-1] and "Traceback" not in "\n".join(err)
    assert memory_error(ValueError("out of memory"), "x", "y") is None
    assert isinstance(memory_error(RuntimeError("DefaultCPUAllocator: can't allocate memory"), "x", "y"),
                      OutOfDeviceMemory)


def test_batch_sizes_follow_the_device(demo, monkeypatch):
    import specdecode.training.device as device

    target, _ = demo
    assert data_batch_size(target, 192) == specdecode.cpu.default_max_rows() in (32, 64)
    monkeypatch.setattr(device, "_device_of", lambda model: torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev=None: (80 * 2**30, 80 * 2**30))
    assert data_batch_size(target, 192) == MAX_DATA_BATCH
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev=None: (2**26, 80 * 2**30))
    small = data_batch_size(target, 192)
    assert 1 <= small < MAX_DATA_BATCH and small & (small - 1) == 0
    # the decode steps' labels need no second forward's logits at every position: more prompts fit
    decoded = data_batch_size(target, 192, decode_labels=True, num_feature_layers=2)
    assert small < decoded <= MAX_DATA_BATCH and decoded & (decoded - 1) == 0
    assert device.loop_batch_size(torch.device("cuda")) == 64 and device.loop_batch_size(torch.device("cpu")) == 8


def test_a_passed_target_is_never_moved_or_cast(demo, tmp_path):
    target, tokenizer = demo
    before = next(target.parameters()).dtype
    with pytest.raises(ValueError, match="dtype: the target is torch.float32, not torch.bfloat16"):
        train_drafter("draft", target, tmp_path, tokenizer=tokenizer, dtype="bfloat16", max_steps=1, progress=False)
    assert next(target.parameters()).dtype == before
    with pytest.raises(ValueError, match="dtype: expected one of float32"):
        check_dtype("int8")
    with pytest.raises(TypeError, match="device"):
        check_device(3)


def test_a_time_budget_is_split_across_the_kinds(demo, tmp_path):
    target, tokenizer = demo
    results = train_drafters(["medusa", "draft"], target, tmp_path, tokenizer=tokenizer, target_name="demo",
                             minutes=0.25, data_minutes=0.05, num_prompts=8, progress=False,
                             data_settings=DataSettings(max_length=48, max_new_tokens=16),
                             loop_settings=LoopSettings(batch_size=4), kind_options={"draft": {"num_layers": 1}})
    t = {kind: r.record["training"] for kind, r in results.items()}
    assert all(v["steps"] >= 1 and v["horizon"] is not None for v in t.values())
    assert t["draft"]["data_batch_size"] == specdecode.cpu.default_max_rows()  # no batch size given: the CPU's
    assert t["draft"]["total_seconds"] < 60  # 15 s asked; evaluation and saving come after it
    assert results["draft"].path == tmp_path / "draft" and results["draft"].export is None
    with pytest.raises(ValueError, match="kind_options: options for kinds not in this run: exit"):
        train_drafters(["draft"], target, tmp_path, kind_options={"exit": {}})
    with pytest.raises(TypeError, match="unexpected keyword 'data_cache'"):
        train_drafters(["draft"], target, tmp_path, data_cache=tmp_path)
    with pytest.raises(ValueError, match="data_minutes: must be less than minutes"):
        train_drafters(["draft"], target, tmp_path, minutes=1, data_minutes=2)
    with pytest.raises(TypeError, match="kinds"):
        train_drafters("draft", target, tmp_path)


def test_a_target_named_with_a_dtype_is_cast(tmp_path):
    result = train_drafter("draft", "demo", tmp_path, dtype="bfloat16", max_steps=1, num_prompts=4, progress=False,
                           data_settings=DataSettings(max_length=32, max_new_tokens=8, batch_size=4),
                           loop_settings=LoopSettings(batch_size=4), num_layers=1)
    assert result.record["training"]["dtype"] == "torch.bfloat16"
    assert next(result.drafter.parameters()).dtype == torch.bfloat16


@pytest.fixture
def cuda() -> torch.device:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    return torch.device("cuda")


@pytest.mark.cuda
def test_every_kind_in_one_run_on_the_gpu(cuda, tmp_path, capsys):
    """The command a GPU session runs, on the demo target: every kind, --device cuda, --export."""
    main(["train", "eagle", "medusa", "hydra", "exit", "draft", "dflash", "--target", "demo", "--device", "cuda",
          "--out", str(tmp_path / "run"), "--export", str(tmp_path / "fp16"), "--max-steps", "2", "--num-layers", "1",
          "--num-prompts", "8", "--max-length", "48", "--max-new-tokens", "16"])
    target, _, tokenizer = specdecode.load_demo_pair()
    target = target.to(cuda)
    ids = tokenizer("def mean(values):\n", return_tensors="pt").input_ids.to(cuda)
    want = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False)
    for kind in list_kinds():
        record = json.loads((tmp_path / "run" / kind / "specdecode_drafter.json").read_text())
        assert record["training"]["device"].startswith("cuda") and record["training"]["data_batch_size"] >= 8
        drafter = specdecode.load_drafter(tmp_path / "fp16" / kind, target)
        assert torch.equal(specdecode.generate(target, drafter, ids, max_new_tokens=8).sequences, want), kind


def test_data_batch_plan_follows_the_path_the_data_will_take(demo, monkeypatch):
    """The batch planner assumes the decode steps' labels only where the static path will run:
    a target it refuses is continued by HF generate and labelled by a second forward, whose
    memory the plan must then count (and the planner itself warns nothing)."""
    import warnings

    import specdecode.training.runner as runner

    target, _ = demo
    seen = []
    monkeypatch.setattr(runner, "data_batch_size", lambda *a, **k: seen.append(k["decode_labels"]) or 16)
    spec = runner.RunSpec()
    assert runner._data_settings(target, spec, (-1,)).batch_size == 16 and seen == [True]

    def refused(target, settings, decode_path="auto"):
        warnings.warn("data: the target's continuations fall back to Hugging Face generate: test", UserWarning)
        return "hf_generate"

    monkeypatch.setattr(runner, "data_decode_path", refused)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        runner._data_settings(target, spec, (-1,))
    assert seen == [True, False]
    runner._data_settings(target, runner.RunSpec(data_settings=DataSettings(labels="forward")), None)
    assert seen == [True, False, False]
