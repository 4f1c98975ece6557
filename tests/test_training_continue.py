"""Training that continues (``init_from`` / ``--init-from``) and the run's plan (``shares`` /
``--shares``, batch sizes from free memory), on the CPU with the demo target: a continued kind
starts from exactly the saved weights (a float16 copy too) and so below a fresh run's loss, its
record adds up the runs, a drafter of another kind, another target or another shape is refused,
an interrupted continued run resumes without counting twice; the time split and the memory plan
are checked as functions with made-up numbers (no timing, no GPU)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import specdecode
from specdecode.cli import main
from specdecode.training import list_kinds, train_drafter, train_drafters
from specdecode.training.continuing import continued_loop, parse_init_from
from specdecode.training.data import DataSettings
from specdecode.training.device import plan_batch_size
from specdecode.training.loop import LoopSettings
from specdecode.training.planning import (
    check_shares,
    default_shares,
    kind_seconds,
    parse_shares,
    plan_kind_batch,
    step_memory_line,
)

SMALL = DataSettings(max_length=40, max_new_tokens=16, batch_size=4, top_k=32)
LOOP = LoopSettings(batch_size=4, lr=3e-3, warmup_steps=1)
OPTIONS = {"eagle": {"draft_vocab_size": 100, "train_head": False}, "medusa": {"num_heads": 2},
           "hydra": {"num_heads": 2, "head_layers": 1}, "exit": {"exit_layer": 2, "head_tokens": 120},
           "draft": {"num_layers": 1}}
KINDS = ["eagle", "medusa", "hydra", "exit", "draft"]
GIB = 2**30


def _prompts(n: int = 8, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 400, (int(torch.randint(4, 10, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def _run(target, out: Path, steps: int, **settings):
    settings.setdefault("loop_settings", LOOP)
    return train_drafters(KINDS, target, out, data=_prompts(), max_steps=steps, data_settings=SMALL, progress=False,
                          target_name="demo", **settings)


def _record(folder: Path) -> dict:
    return json.loads((folder / "specdecode_drafter.json").read_text())


@pytest.fixture(scope="module")
def demo():
    target, _, tokenizer = specdecode.load_demo_pair()
    return target, tokenizer


@pytest.fixture(scope="module")
def first(demo, tmp_path_factory):
    """Every kind trained fresh for 6 steps, with its float16 copy."""
    root = tmp_path_factory.mktemp("first")
    _run(demo[0], root / "run", 6, kind_options=OPTIONS, export=root / "fp16")
    return root / "run", root / "fp16"


@pytest.fixture(scope="module")
def second(demo, first, tmp_path_factory):
    """Every kind continued from the first run's folders on the same data, for 4 steps."""
    run, _ = first
    out = tmp_path_factory.mktemp("second") / "run"
    _run(demo[0], out, 4, init_from={kind: run / kind for kind in KINDS})
    return out


def test_a_continued_kind_starts_from_the_saved_weights_below_a_fresh_start(first, second):
    run, _ = first
    for kind in KINDS:
        before, after = _record(run / kind)["training"], _record(second / kind)["training"]
        # same data, same weights: the continued run's first evaluation is the first run's last
        assert after["before"]["loss"] == pytest.approx(before["after"]["loss"], rel=1e-5), kind
        assert after["before"]["loss"] < before["before"]["loss"], kind
        assert after["losses"][0] < before["losses"][0], kind


def test_the_saved_options_come_from_the_folder(first, second):
    for kind in KINDS:
        record = _record(second / kind)
        for name, value in OPTIONS[kind].items():
            assert record["training"]["options"][name] == value, (kind, name)
    first_run, _ = first
    assert _record(second / "exit")["vocab"]["map"] == _record(first_run / "exit")["vocab"]["map"]
    eagle_first = load_file(str(first_run / "eagle" / "model.safetensors"))["draft_to_target"]
    assert torch.equal(load_file(str(second / "eagle" / "model.safetensors"))["draft_to_target"], eagle_first)


def test_records_add_up_over_runs_and_keep_their_own_numbers(demo, first, second, tmp_path):
    run, _ = first
    _run(demo[0], tmp_path / "third", 3, init_from=",".join(f"{kind}={second / kind}" for kind in KINDS))
    for kind in KINDS:
        one, two = _record(run / kind)["training"], _record(second / kind)["training"]
        three = _record(tmp_path / "third" / kind)["training"]
        assert one["totals"] == {"runs": 1, "steps": 6, "tokens": one["tokens"], "seconds": round(one["seconds"], 1)}
        assert "lineage" not in one and "init_from" not in one
        assert two["steps"] == 4 and two["init_from"] == str(run / kind)
        assert two["totals"]["runs"] == 2 and two["totals"]["steps"] == 10
        assert two["totals"]["tokens"] == one["tokens"] + two["tokens"]
        assert three["steps"] == 3 and three["totals"]["runs"] == 3 and three["totals"]["steps"] == 13
        assert three["totals"]["tokens"] == one["tokens"] + two["tokens"] + three["tokens"]
        assert [entry["steps"] for entry in three["lineage"]] == [6, 4]
        assert three["lineage"][1]["init_from"] == str(run / kind)
        assert "losses" not in three["lineage"][0]


def test_a_float16_copy_is_loaded_as_saved_into_float32(demo, first, tmp_path):
    target, _ = demo
    _, fp16 = first
    frozen = LoopSettings(batch_size=4, lr=0.0, warmup_steps=1)  # a step that changes nothing
    _run(target, tmp_path / "run", 1, init_from={kind: fp16 / kind for kind in KINDS}, loop_settings=frozen)
    for kind in KINDS:
        saved = load_file(str(fp16 / kind / "model.safetensors"))
        loaded = load_file(str(tmp_path / "run" / kind / "model.safetensors"))
        assert saved, kind
        for name, value in saved.items():
            want = value.float() if value.is_floating_point() else value
            assert loaded[name].dtype == (torch.float32 if value.is_floating_point() else value.dtype), (kind, name)
            assert torch.equal(loaded[name], want), (kind, name)
        drafter = specdecode.load_drafter(tmp_path / "run" / kind, target)
        assert drafter is not None


def test_an_interrupted_continued_run_resumes_and_counts_once(demo, first, tmp_path):
    target, _ = demo
    run, _ = first
    source = {"medusa": run / "medusa"}

    def stop_at_2(info):
        if info.step == 2:
            raise KeyboardInterrupt

    settings = dict(data=_prompts(), max_steps=4, data_settings=SMALL, progress=False, target_name="demo",
                    loop_settings=LoopSettings(batch_size=4, lr=3e-3, warmup_steps=1, checkpoint_every=1),
                    init_from=source)
    whole = train_drafters(["medusa"], target, tmp_path / "whole", **settings)["medusa"].record["training"]
    with pytest.raises(KeyboardInterrupt):
        train_drafters(["medusa"], target, tmp_path / "parts", callback=stop_at_2, **settings)
    parts = train_drafters(["medusa"], target, tmp_path / "parts", **settings)["medusa"].record["training"]
    assert parts["resumed_from"] == 2 and parts["steps"] == 4
    assert parts["totals"]["runs"] == 2 and parts["totals"]["steps"] == 6 + 4  # counted once
    assert parts["losses"] == whole["losses"] and parts["after"] == whole["after"]
    a = load_file(str(tmp_path / "whole" / "medusa" / "model.safetensors"))
    b = load_file(str(tmp_path / "parts" / "medusa" / "model.safetensors"))
    assert all(torch.equal(a[name], b[name]) for name in a)


def _copy_with(folder: Path, to: Path, **target_fields) -> Path:
    shutil.copytree(folder, to)
    record = _record(to)
    record["target"].update(target_fields)
    (to / "specdecode_drafter.json").write_text(json.dumps(record))
    return to


def test_refused_sources(demo, first, tmp_path):
    target, _ = demo
    run, fp16 = first
    other = _copy_with(fp16 / "eagle", tmp_path / "other", name="smollm2", weights_hash="sha256:" + "0" * 64)
    for init_from, options, words in (
            ({"eagle": other}, {}, "was trained for 'smollm2'"),
            ({"eagle": run / "medusa"}, {}, "holds a 'medusa' drafter, not a 'eagle' one"),
            ({"eagle": tmp_path / "nowhere"}, {}, "is not a folder"),
            ({"eagle": tmp_path}, {}, "holds no trained drafter"),
            ({"eagle": run / "eagle"}, {"eagle": {"draft_vocab_size": 50}}, "draft_vocab_size=50"),
            ({"eagle": run / "eagle"}, {"eagle": {"train_head": True}}, "train_head=True"),
            ({"medusa": run / "medusa"}, {"medusa": {"num_heads": 3}}, "num_heads=3"),
            ({"exit": run / "exit"}, {"exit": {"exit_layer": 1}}, "exit_layer=1"),
            ({"draft": run / "draft"}, {"draft": {"num_layers": 2}}, "num_layers=2"),
            ({"hydra": run / "eagle"}, {}, "not a kind of this run"),
            (run / "eagle", {}, "one folder for a run of 2 kinds"),
            ("eagle=" + str(run / "eagle") + ",nonesuch=x", {}, "expected kinds among"),
            ({"eagle": tmp_path / "out" / "eagle"}, {}, "a folder this run writes")):
        (tmp_path / "out" / "eagle").mkdir(parents=True, exist_ok=True)
        with pytest.raises(ValueError, match="init_from") as info:
            train_drafters(["eagle", "medusa", *(["exit"] if "exit" in options else []),
                            *(["draft"] if "draft" in options else [])], target, tmp_path / "out",
                           data=_prompts(), max_steps=1, data_settings=SMALL, progress=False, init_from=init_from,
                           kind_options=options, loop_settings=LOOP)
        assert words in str(info.value), (init_from, str(info.value))
    assert not (tmp_path / "out" / "data").exists()  # refused before the data stage


def test_one_folder_for_one_kind_and_the_gentler_defaults(demo, first, tmp_path):
    target, _ = demo
    run, _ = first
    result = train_drafter("hydra", target, tmp_path / "hydra", data=_prompts(), max_steps=1, data_settings=SMALL,
                           progress=False, init_from=str(run / "hydra"), batch_size=4)
    t = result.record["training"]
    assert t["lr"] == pytest.approx(LoopSettings().lr / 3) and t["warmup_steps"] == 2
    assert t["options"] == {"num_heads": 2, "head_layers": 1, "head_tokens": None} and t["batch_size"] == 4
    assert t["memory"]["batch_plan"] == {"from": "batch_size", "batch_size": 4}
    gentle = continued_loop(LoopSettings(lr=3e-3, warmup_steps=50))
    assert gentle.lr == pytest.approx(1e-3) and gentle.warmup_steps == 10
    fresh = train_drafter("hydra", target, tmp_path / "fresh", data=_prompts(), max_steps=1, data_settings=SMALL,
                          progress=False, lr=2e-3, num_heads=2, head_layers=1)
    assert fresh.record["training"]["lr"] == 2e-3 and fresh.record["training"]["warmup_steps"] == 10
    assert fresh.record["training"]["batch_size"] == 8  # the CPU's default


def test_default_shares_give_eagle_the_largest():
    assert default_shares(KINDS) == pytest.approx({"eagle": 0.4, "medusa": 0.15, "hydra": 0.15, "exit": 0.15,
                                                   "draft": 0.15})
    assert default_shares(["medusa", "eagle", "draft"]) == pytest.approx({"medusa": 0.25, "eagle": 0.5, "draft": 0.25})
    assert default_shares(["eagle", "medusa"]) == pytest.approx({"eagle": 2 / 3, "medusa": 1 / 3})
    assert default_shares(["eagle"]) == {"eagle": 1.0}
    assert default_shares(["medusa", "draft"]) == {"medusa": 0.5, "draft": 0.5}
    for kinds in (KINDS, KINDS[:4], KINDS[:3], KINDS[:2]):
        shares = default_shares(kinds)
        assert sum(shares.values()) == pytest.approx(1.0)
        assert all(shares["eagle"] > value for kind, value in shares.items() if kind != "eagle")


def test_shares_are_weights_over_every_kind_of_the_run():
    assert check_shares("eagle=2,medusa=1", ["eagle", "medusa"]) == pytest.approx({"eagle": 2 / 3, "medusa": 1 / 3})
    assert check_shares({"medusa": 0.5, "eagle": 0.5}, ["eagle", "medusa"]) == {"eagle": 0.5, "medusa": 0.5}
    assert list(check_shares({"medusa": 1, "eagle": 3}, ["eagle", "medusa"])) == ["eagle", "medusa"]
    assert check_shares(None, KINDS) == default_shares(KINDS)
    assert parse_shares("eagle=0.5, medusa=0.25,") == {"eagle": 0.5, "medusa": 0.25}
    for shares, words in (("eagle=0.5,nonesuch=0.5", "expected kinds among"), ("eagle=-1,medusa=1", "> 0"),
                          ("eagle=0,medusa=0", "> 0"), ("eagle=x,medusa=1", "must be a number"),
                          ("eagle", "KIND=SHARE"), ("", "at least one"), ("eagle=1,eagle=2", "named twice"),
                          ("eagle=1", "missing: medusa"), ("eagle=1,medusa=1,draft=1", "draft not among"),
                          ({"eagle": True, "medusa": 1}, "> 0"), ({"eagle": float("nan"), "medusa": 1}, "> 0")):
        with pytest.raises(ValueError, match="shares") as info:
            check_shares(shares, ["eagle", "medusa"])
        assert words in str(info.value), (shares, str(info.value))
    with pytest.raises(TypeError, match="shares"):
        check_shares(["eagle"], ["eagle"])


def test_kind_seconds_split_what_is_left_by_share():
    shares = [0.4, 0.15, 0.15, 0.15, 0.15]
    assert kind_seconds(shares, 0, 300.0) == pytest.approx(120.0)
    assert kind_seconds(shares, 1, 180.0) == pytest.approx(45.0)
    assert kind_seconds(shares, 4, 45.0) == pytest.approx(45.0)  # the last kind gets what is left
    # a kind that stopped early leaves its time to the later ones, in their proportions
    assert kind_seconds(shares, 1, 280.0) == pytest.approx(70.0)
    assert kind_seconds([0.5, 0.25, 0.25], 1, 100.0) == pytest.approx(50.0)
    # equal shares: an equal part of what is left, as before shares existed
    assert [kind_seconds([1.0] * 4, i, 120.0) for i in range(4)] == pytest.approx([30.0, 40.0, 60.0, 120.0])
    assert kind_seconds(shares, 2, -5.0) == 0.0


def test_batch_sizes_planned_from_made_up_free_memory():
    # 80% of 80 GiB is 64 GiB: 1 GiB fixed and 1 GiB per example leave room for 63, so 32
    assert plan_batch_size(80 * GIB, GIB, GIB, largest=64) == 32
    assert plan_batch_size(80 * GIB, 0, GIB / 4, largest=64) == 64  # capped at the largest
    assert plan_batch_size(80 * GIB, 0, GIB / 4, largest=48) == 32  # a power of two at most the largest
    assert plan_batch_size(GIB, 2 * GIB, GIB, largest=64) == 1  # nothing fits: the OOM error will say so
    assert plan_batch_size(10 * GIB, 0, GIB, largest=64, share=1.0) == 8
    for args, name in (((-1, 0, 1), "free_bytes"), ((1, -1, 1), "fixed_bytes"), ((1, 0, "x"), "per_item_bytes")):
        with pytest.raises(ValueError, match=name):
            plan_batch_size(*args, largest=8)
    with pytest.raises(ValueError, match="largest"):
        plan_batch_size(1, 0, 1, largest=0)
    assert step_memory_line([1, 2], [3.0 * GIB, 5.0 * GIB]) == (GIB, 2 * GIB)
    assert step_memory_line([1, 2], [3.0, 2.0]) == (3.0, 0.0)  # memory never shrinks with the batch
    params = {"w": torch.nn.Parameter(torch.zeros(GIB // 16, dtype=torch.float32, device="meta"))}  # 256 MiB
    plan = plan_kind_batch(40 * GIB, GIB, GIB, params, cached_bytes=7 * GIB)
    # 32 GiB of room: 1 fixed + 0.5 optimizer (two 256 MiB states) + 7 cached + 16 examples of 1 GiB
    assert plan["batch_size"] == 16 and plan["optimizer_mib"] == 512.0 and plan["cached_mib"] == 7168.0
    assert plan["free_mib"] == 40960.0 and plan["from"] == "free memory"


def test_parse_init_from():
    assert parse_init_from("runs/eagle") == Path("runs/eagle")
    assert parse_init_from("eagle=runs/a, medusa=runs/b") == {"eagle": Path("runs/a"), "medusa": Path("runs/b")}
    for text, words in (("nonesuch=x", "expected kinds among"), ("eagle=", "KIND=DIR"), ("", "drafter folder"),
                        ("eagle=a,eagle=b", "named twice")):
        with pytest.raises(ValueError, match="init_from") as info:
            parse_init_from(text)
        assert words in str(info.value)


def test_command_line_flags(first, tmp_path, capsys):
    run, fp16 = first
    for argv, words in (
            (["train", "eagle", "--init-from", "nonesuch=x"], "init_from: expected kinds among"),
            (["train", "eagle", "--init-from", str(tmp_path / "nowhere")], "init_from: no such folder"),
            (["train", "eagle", "medusa", "--init-from", f"draft={run / 'draft'}"],
             "'draft' is not a kind of this run"),
            (["train", "eagle", "medusa", "--init-from", str(run / "eagle")], "one folder for a run of 2 kinds"),
            (["train", "eagle", "--shares", "eagle=-1"], "shares: eagle's share must be a number > 0"),
            (["train", "eagle", "--shares", "web=1"], "shares: expected kinds among"),
            (["train", "eagle", "medusa", "--minutes", "1", "--shares", "eagle=1"], "missing: medusa"),
            (["train", "eagle", "--shares", "eagle=1"], "shares: they split a time budget"),
            (["train", "eagle", "--lr", "0"], "lr: expected a number > 0")):
        with pytest.raises(SystemExit) as exc:
            main([*argv, "--target", "demo", "--out", str(tmp_path / "x"), "--threads", "1"])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and words in err, (argv, err)
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "x").exists()


def test_command_line_continues_a_shipped_copy(first, tmp_path, capsys):
    _, fp16 = first
    main(["train", "eagle", "medusa", "--target", "demo", "--out", str(tmp_path / "run"), "--max-steps", "2",
          "--num-prompts", "8", "--max-length", "40", "--max-new-tokens", "16", "--data-batch-size", "4",
          "--batch-size", "4", "--threads", "1", "--minutes", "5", "--shares", "eagle=3,medusa=1",
          "--init-from", f"eagle={fp16 / 'eagle'},medusa={fp16 / 'medusa'}"])
    out = capsys.readouterr().out
    assert f"continued from {fp16 / 'eagle'}: 2 runs in all, 8 steps" in out
    record = _record(tmp_path / "run" / "eagle")["training"]
    assert record["time_shares"] == {"eagle": 0.75, "medusa": 0.25}
    assert record["memory"]["batch_plan"]["from"] == "batch_size" and record["memory"]["data_peak_mib"] > 0
    assert set(list_kinds()) >= set(record["kinds_in_run"])
