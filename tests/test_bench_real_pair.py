"""``python -m specdecode bench --pair smollm2`` (specdecode.bench.real_pair) without SmolLM2: the
real pair's loader returns a tiny random Llama with a chat-template tokenizer, so the whole
command runs in seconds; the pieces (pooled statistics, prompts, drafter folders) on their own."""

from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from test_generate_models import BOS, EOS, PAD, _one_thread, make_model  # noqa: F401

import specdecode
from specdecode.bench import real_pair
from specdecode.prompt_sets import chat_prompt_set
from specdecode.engine.stats import SpeculativeStats


class ChatTokenizer:
    """A tokenizer with a chat template, enough for the benchmark: bytes of the request in ids
    3..102 between a header and the generation prompt."""

    pad_token_id = PAD
    eos_token_id = EOS

    def apply_chat_template(self, messages: list[dict[str, str]], *, add_generation_prompt: bool,
                            return_tensors: str, return_dict: bool) -> dict[str, torch.Tensor]:
        assert add_generation_prompt and return_tensors == "pt" and return_dict
        body = [3 + b % 100 for b in messages[0]["content"].encode()][:20]
        return {"input_ids": torch.tensor([[BOS, 110, *body, 111, PAD, 112]])}  # PAD inside, as SmolLM2's <|im_end|>


@pytest.fixture(scope="module")
def tiny_target() -> Any:
    return make_model("llama")


@pytest.fixture(scope="module")
def drafter_dir(tiny_target: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ``draft`` drafter folder trained for two steps on ``tiny_target``."""
    from specdecode.training import train_drafter
    from specdecode.training.data import DataSettings
    from specdecode.training.loop import LoopSettings

    out = tmp_path_factory.mktemp("tiny-draft")
    prompts = [[3 + (7 * i + j) % 90 for j in range(6)] for i in range(8)]
    train_drafter("draft", tiny_target, out, data=prompts, max_steps=2, progress=False,
                  data_settings=DataSettings(max_length=24, max_new_tokens=8, batch_size=4, top_k=16),
                  loop_settings=LoopSettings(batch_size=4, lr=3e-3, warmup_steps=1))
    return out


@pytest.fixture
def tiny_smollm2(tiny_target: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """``load_target("smollm2")`` returns the tiny Llama and :class:`ChatTokenizer`."""
    import specdecode.training.targets as targets

    monkeypatch.setattr(targets, "load_target", lambda name: (tiny_target, ChatTokenizer()))
    return tiny_target


def _stats(**fields: Any) -> SpeculativeStats:
    return SpeculativeStats(**fields)


def test_speculative_row_pools_every_generation() -> None:
    a = _stats(new_tokens=12, row_steps=4, target_calls=5, target_prefill_calls=1, draft_calls=9, drafted_tokens=16,
               accepted_tokens=8, position_drafted=[4, 4, 4, 4], position_accepted=[3, 2, 2, 1], draft_time=1.0,
               draft_prefill_time=0.2, target_time=5.0, target_prefill_time=1.0)
    b = _stats(new_tokens=8, row_steps=6, target_calls=7, target_prefill_calls=1, draft_calls=7, drafted_tokens=12,
               accepted_tokens=2, position_drafted=[6, 6], position_accepted=[2, 0], draft_time=0.6,
               draft_prefill_time=0.1, target_time=7.0, target_prefill_time=1.0)
    row = real_pair.speculative_row([a, b])
    assert row["tokens_per_call"] == pytest.approx(20 / 10)
    assert row["acceptance_rate"] == pytest.approx(10 / 28)
    # pooled: accepted at each position over the 10 steps that drafted (accepted / drafted per
    # position would give 0.5 0.2 0.5 0.25, rising where only a's steps drafted that far)
    assert row["acceptance_by_position"] == [0.5, 0.2, 0.2, 0.1]
    assert row["cost_ratio"] == pytest.approx((1.6 / 16) / (12 / 12))
    assert real_pair.speculative_row([_stats()]) == {"tokens_per_call": 0.0, "acceptance_rate": 0.0,
                                                     "acceptance_by_position": [], "cost_ratio": 0.0}


def test_chat_prompts_and_the_pair_option() -> None:
    tok = ChatTokenizer()
    report = real_pair.chat_prompts(tok, "report")
    assert len(report) == len(chat_prompt_set("report")) == 16
    assert all(ids.shape[0] == 1 and ids[0, 0] == BOS and ids[0, -1] == 112 for ids in report)
    assert len(real_pair.chat_prompts(tok, "tune", 2)) == 2
    with pytest.raises(ValueError, match="num_prompts"):
        real_pair.chat_prompts(tok, "tune", 17)
    assert real_pair.names_real_pair(["--quick", "--pair", "smollm2"])
    assert real_pair.names_real_pair(["--pair=smollm2"])
    assert not real_pair.names_real_pair(["--pair", "demo", "--quick"]) and not real_pair.names_real_pair([])


def test_drafter_folders(tiny_target: Any, drafter_dir: Path, tmp_path: Path) -> None:
    drafters = real_pair.load_drafters([drafter_dir], tiny_target)
    assert list(drafters) == [real_pair.NGRAM, f"specdecode draft ({drafter_dir.name})"]
    with pytest.raises(ValueError, match="drafter_dir"):
        real_pair.load_drafters([drafter_dir, drafter_dir / ".." / drafter_dir.name], tiny_target)
    twin = tmp_path / "twin" / drafter_dir.name  # another folder of the same name: named by its path
    shutil.copytree(drafter_dir, twin)
    assert list(real_pair.load_drafters([drafter_dir, twin], tiny_target))[1:] == [
        f"specdecode draft ({drafter_dir.name})", f"specdecode draft ({twin})"]
    with_trees = real_pair.load_drafters([drafter_dir], tiny_target, tree="dynamic", num_nodes=[4, 6], tree_depth=2)
    assert list(with_trees)[2:] == [f"specdecode draft ({drafter_dir.name}) dynamic tree {n}, depth 2" for n in (4, 6)]
    assert [with_trees[name].tree.num_nodes for name in list(with_trees)[2:]] == [4, 6]
    with pytest.raises(ValueError, match="^target: .*trained for"):
        real_pair.load_drafters([drafter_dir], make_model("llama", seed=5))
    with pytest.raises(ValueError, match="^path: .*no trained drafter"):
        real_pair.load_drafters([tmp_path], tiny_target)


def test_measure_rows_and_greedy_check(tiny_target: Any) -> None:
    prompts = real_pair.chat_prompts(ChatTokenizer(), "tune", 2)
    config = tiny_target.generation_config
    rows = real_pair.measure(tiny_target, {real_pair.NGRAM: specdecode.NgramDrafter()}, prompts, temperatures=[0, 1],
                             num_draft_tokens=3, max_new_tokens=10, repeats=2)
    assert tiny_target.generation_config is config  # EOS is off only while measuring
    methods = [real_pair.TARGET_EAGER, real_pair.TARGET_FAST, real_pair.HF_LOOKUP, real_pair.NGRAM]
    assert [(r["temperature"], r["method"]) for r in rows] == [(t, m) for t in (0, 1) for m in methods]
    for row in rows:
        assert row["tokens"] == 2 * 10 and row["tok_per_s"] > 0  # EOS off: every prompt runs to the end
        if row["method"] == real_pair.TARGET_FAST:
            assert row["x_target"] == 1.0
        if row["method"] == real_pair.HF_LOOKUP:
            assert row["x_hf_lookup"] == 1.0
    spec = rows[3]
    assert spec["tokens_per_call"] >= 1.0 and 0.0 <= spec["acceptance_rate"] <= 1.0
    by_position = spec["acceptance_by_position"]
    assert len(by_position) <= 3 and spec["cost_ratio"] >= 0.0
    assert all(a >= b for a, b in zip(by_position, by_position[1:]))  # a share of steps cannot rise


def test_bench_pair_smollm2_end_to_end(tiny_smollm2: Any, drafter_dir: Path, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from specdecode.cli import main

    monkeypatch.setenv("COLUMNS", "100")  # the table's width (pytest-xdist's workers say 80): no wrapped names
    out = tmp_path / "res"
    main(["bench", "--pair", "smollm2", "--drafter-dir", str(drafter_dir), "--prompt-set", "tune", "--num-prompts",
          "2", "--max-new-tokens", "8", "--repeats", "1", "--threads", "1", "--clock", "cpu", "--out", str(out),
          "--tree", "dynamic", "--num-nodes", "4"])
    screen = capsys.readouterr().out
    assert "tune chat prompts (2), batch 1, gamma 4," in " ".join(screen.split())
    methods = ["target alone, eager", "target alone, fast path", "HF prompt lookup", "specdecode ngram",
               f"specdecode draft ({drafter_dir.name})", f"specdecode draft ({drafter_dir.name}) dynamic tree 4"]
    for method in methods[:-2]:
        assert re.findall(rf"^([01]) +{re.escape(method)} ", screen, flags=re.M) == ["0", "1"], method
    assert "specdecode draft" in screen  # a long name may wrap in its column
    assert "acceptance by position" in screen and "alpha by position" not in screen  # the guide's word
    rows = list(csv.DictReader((out / "bench_smollm2.csv").open()))
    assert [(r["temperature"], r["method"]) for r in rows] == [(t, m) for t in ("0.0", "1.0") for m in methods]
    meta = json.loads((out / "bench_smollm2.json").read_text())["meta"]
    assert meta["drafter_dirs"] == [str(drafter_dir)] and meta["num_prompts"] == 2


def test_a_drafter_for_another_target_is_refused(tiny_smollm2: Any, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from specdecode.cli import main
    from specdecode.training import train_drafter
    from specdecode.training.data import DataSettings
    from specdecode.training.loop import LoopSettings

    other = make_model("llama", seed=3)
    train_drafter("draft", other, tmp_path, data=[[5, 6, 7, 8]] * 4, max_steps=1, progress=False,
                  data_settings=DataSettings(max_length=16, max_new_tokens=4, batch_size=4, top_k=8),
                  loop_settings=LoopSettings(batch_size=4, warmup_steps=1))
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--pair", "smollm2", "--drafter-dir", str(tmp_path), "--threads", "1"])
    assert exit_info.value.code == 2
    assert "error: target: the drafter in" in capsys.readouterr().err


def test_drafter_dir_needs_the_real_pair(capsys: pytest.CaptureFixture[str]) -> None:
    from specdecode.pairs import load_command_pair

    with pytest.raises(ValueError, match="^drafter_dir: --drafter-dir goes with --pair smollm2"):
        load_command_pair("demo", drafter_dir="runs/x")
    with pytest.raises(ValueError, match="^pair: "):
        load_command_pair("gpt2")
    with pytest.raises(ValueError, match="^target_path: "):
        load_command_pair("benchmark", target_path="some/path")


@pytest.mark.parametrize("change, error, named", [
    (dict(repeats=0), ValueError, "repeats"),
    (dict(max_new_tokens=2.0), TypeError, "max_new_tokens"),
    (dict(num_draft_tokens=0), ValueError, "num_draft_tokens"),
    (dict(temperatures=[]), ValueError, "temperatures"),
    (dict(temperatures=[-1.0]), ValueError, "temperatures"),
    (dict(prompts=[]), ValueError, "prompts"),
    (dict(prompts=[torch.ones(2, 4, dtype=torch.long)]), ValueError, "prompts"),
    (dict(drafters=[1]), TypeError, "drafters"),
    (dict(drafters={"HF prompt lookup": None}), ValueError, "drafters"),
])
def test_measure_names_a_bad_argument(tiny_target: Any, change: dict[str, Any], error: type, named: str) -> None:
    args: dict[str, Any] = dict(drafters={}, prompts=[torch.tensor([[BOS, 5, 6]])], temperatures=[0],
                                num_draft_tokens=2, max_new_tokens=4, repeats=1)
    args.update(change)
    with pytest.raises(error, match=f"^{named}: "):
        real_pair.measure(tiny_target, **args)


def test_named_pairs_have_one_home(tiny_smollm2: Any, drafter_dir: Path) -> None:
    """``specdecode.load_pair`` and the command line's ``load_command_pair`` read the same pairs."""
    from specdecode.pairs import load_command_pair

    target, drafter, tokenizer = specdecode.load_pair("smollm2", drafter="ngram")
    assert target is tiny_smollm2 and isinstance(drafter, specdecode.NgramDrafter)
    assert isinstance(tokenizer, ChatTokenizer)
    target, drafter, _, description = load_command_pair("smollm2", drafter_dir=drafter_dir)
    assert target is tiny_smollm2 and type(drafter) is type(tiny_smollm2) and "SmolLM2-135M-Instruct" in description
    with pytest.raises(ValueError, match="^drafter: "):
        specdecode.load_pair("demo", drafter=drafter_dir)


@pytest.mark.parametrize("kind", ["eagle", "medusa", "exit"])
def test_every_drafter_kind_gets_a_row(kind: str, tiny_target: Any, tmp_path: Path) -> None:
    """A folder of any kind runs through the benchmark, greedy output checked at T=0."""
    from specdecode.training import train_drafter
    from specdecode.training.data import DataSettings
    from specdecode.training.loop import LoopSettings

    train_drafter(kind, tiny_target, tmp_path / kind, data=[[3 + i, 9, 4 + i, 7] for i in range(4)], max_steps=1,
                  progress=False, data_settings=DataSettings(max_length=16, max_new_tokens=6, batch_size=4, top_k=8),
                  loop_settings=LoopSettings(batch_size=4, warmup_steps=1))
    drafters = real_pair.load_drafters([tmp_path / kind], tiny_target, tree="dynamic", num_nodes=[5])
    name = f"specdecode {kind} ({kind})"
    names = [name] + [f"{name} dynamic tree 5"] * (kind in ("draft", "eagle", "exit"))  # kinds that draft any tree
    assert list(drafters)[1:] == names
    rows = real_pair.measure(tiny_target, {n: drafters[n] for n in names},
                             real_pair.chat_prompts(ChatTokenizer(), "tune", 1), temperatures=[0, 1],
                             num_draft_tokens=3, max_new_tokens=6)
    spec = [r for r in rows if r["method"] in names]
    assert len(spec) == 2 * len(names) and all(r["tokens"] == 6 and r["tokens_per_call"] >= 1.0 for r in spec)


def test_a_greedy_difference_stops_the_benchmark(tiny_smollm2: Any, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from specdecode.cli import main

    real_generate = specdecode.generate

    def off_by_one(*args: Any, **kwargs: Any) -> Any:  # a broken engine: the last token changed
        out = real_generate(*args, **kwargs)
        out.sequences[0, -1] = (out.sequences[0, -1] + 1) % 128
        return out

    monkeypatch.setattr(specdecode, "generate", off_by_one)
    with pytest.raises(RuntimeError, match="^specdecode ngram: greedy output differs"):
        real_pair.measure(tiny_smollm2, {real_pair.NGRAM: specdecode.NgramDrafter()},
                          real_pair.chat_prompts(ChatTokenizer(), "tune", 1), temperatures=[0], num_draft_tokens=2,
                          max_new_tokens=4)
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--pair", "smollm2", "--prompt-set", "tune", "--num-prompts", "1", "--max-new-tokens", "4",
              "--repeats", "1", "--temperatures", "0", "--threads", "1", "--out", "unused"])
    assert exit_info.value.code == 1
    assert "error: specdecode ngram: greedy output differs" in capsys.readouterr().err


def test_the_shipped_drafter_is_the_default(tiny_smollm2: Any, drafter_dir: Path, monkeypatch: Any) -> None:
    """``load_pair("smollm2")`` loads the drafter that ships for the pair; prompt lookup where none does."""
    from specdecode import pairs

    monkeypatch.setattr(pairs, "shipped_drafter_dir", lambda name: drafter_dir)
    _, drafter, _ = specdecode.load_pair("smollm2")
    assert type(drafter) is type(tiny_smollm2)
    monkeypatch.setattr(pairs, "shipped_drafter_dir", lambda name: None)
    assert isinstance(specdecode.load_pair("smollm2")[1], specdecode.NgramDrafter)


def test_the_shipped_drafter_folder_names_its_target() -> None:
    """What ships in the package: half-precision weights of at most 10 MB and a record naming
    SmolLM2 with its weights hash (so load_drafter refuses any other target)."""
    import json

    from specdecode.pairs import shipped_drafter_dir

    folder = shipped_drafter_dir("smollm2")
    if folder is None:
        pytest.skip("no drafter ships for smollm2")
    record = json.loads((folder / "specdecode_drafter.json").read_text())
    assert record["target"]["name"] == "smollm2" and record["target"]["weights_hash"]
    assert (folder / "model.safetensors").stat().st_size <= 10_000_000
    assert not (folder / "checkpoint.pt").exists() and not (folder / "data").exists()
    from specdecode.training.artifacts import GENERATION_KEYS

    generation = record.get("generation", {})
    assert set(generation) <= {*GENERATION_KEYS, "sampling"}  # settings load_drafter applies
    assert set(generation.get("sampling", {})) <= set(GENERATION_KEYS)
