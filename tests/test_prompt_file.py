"""Prompt files (specdecode.training.prompt_file, ``python -m specdecode prompts``): the widened
prompts made once, ahead of a run, read back as written, the benchmark's held-out prompts kept
out, a run given a file (or the one shipped for its target) asking the target for nothing
before its continuations, the shipped SmolLM2 file itself, and bad arguments."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

import specdecode
import specdecode.training.prompt_file as prompt_file
import specdecode.training.widen as widen
import specdecode.training.data as data_module
from specdecode.prompt_sets import CHAT_PROMPT_SETS
from specdecode.training.data import DataSettings
from specdecode.training.prompt_file import (
    PromptFile,
    held_out_record,
    read_header,
    read_prompt_file,
    shipped_prompt_file,
    write_prompt_file,
)
from specdecode.training.prompt_sources import code_requests, held_out_prompts, is_held_out, prose_requests
from specdecode.training.widen import conversation_ids, make_prompt_file, mixed_prompts

SMALL = DataSettings(max_length=48, max_new_tokens=16, batch_size=4)
EXCHANGE = [{"role": "user", "content": "Explain tides."}, {"role": "assistant", "content": "The moon pulls."},
            {"role": "user", "content": "Why is that?"}]
HEADER = {"target": {"name": "demo", "weights_hash": "sha256:0"}, "mix": "self-instruct=1,multi-turn=1", "seed": 0}


@pytest.fixture(scope="module")
def demo():
    target, _, tokenizer = specdecode.load_demo_pair()
    return target, tokenizer


def _made(tmp_path: Path, name: str = "p.jsonl.gz", **extra) -> Path:
    prompts = {"self-instruct": ["Plan a picnic for six people.", "Name three rivers in Peru."],
               "multi-turn": [EXCHANGE], **extra}
    return write_prompt_file(tmp_path / name, {**HEADER, "held_out": held_out_record()}, prompts)


def test_the_command_makes_a_prompt_file_on_the_demo_target(tmp_path, capsys):
    from specdecode.cli import main

    out = tmp_path / "sub" / "demo.jsonl.gz"
    main(["prompts", "--target", "demo", "--out", str(out), "--count", "6", "--batch-size", "4", "--threads", "1",
          "--mix", "self-instruct=1,multi-turn=1,code=0.5,prose=0.5", "--seed", "2"])
    printed = capsys.readouterr().out
    assert f"-> {out}" in printed and "--prompts" in printed
    made = read_prompt_file(out)
    header = made.header
    assert header["format"] == "specdecode-prompts" and header["target"]["name"] == "demo"
    assert header["target"]["weights_hash"].startswith("sha256:") and header["seed"] == 2
    assert header["asked"] == {"self-instruct": 2, "multi-turn": 2, "code": 1, "prose": 1}
    assert header["held_out"] == held_out_record() and header["held_out"]["prompts"] == len(held_out_prompts())
    assert header["counts"] == {name: len(items) for name, items in made.prompts.items()}
    assert len(made.prompts["multi-turn"]) == 2 and len(made.prompts.get("self-instruct", [])) <= 2
    for messages in made.prompts["multi-turn"]:  # the target's own first answer, then a follow-up
        assert [m["role"] for m in messages] == ["user", "assistant", "user"] and messages[1]["content"]
    assert made.prompts["code"][0] in code_requests() and made.prompts["prose"][0] in prose_requests()
    with gzip.open(out, "rt", encoding="utf-8") as lines:  # JSON lines: a header, then one prompt a line
        rows = [json.loads(line) for line in lines]
    assert rows[0] == header and len(rows) == 1 + sum(header["counts"].values())


def test_a_prompt_file_reads_back_as_written_and_its_bytes_depend_on_its_content_only(tmp_path):
    path = _made(tmp_path, code=["Explain this code:\n\n```python\nx = 1\n```"])
    first = path.read_bytes()
    made = read_prompt_file(path)
    assert isinstance(made, PromptFile) and made.path == path
    assert made.prompts == {"self-instruct": ["Plan a picnic for six people.", "Name three rivers in Peru."],
                            "multi-turn": [EXCHANGE], "code": ["Explain this code:\n\n```python\nx = 1\n```"]}
    assert made.header["counts"] == {"self-instruct": 2, "multi-turn": 1, "code": 1}
    assert read_header(path) == made.header
    assert _made(tmp_path, code=["Explain this code:\n\n```python\nx = 1\n```"]).read_bytes() == first
    assert [p.name for p in tmp_path.iterdir()] == ["p.jsonl.gz"]  # no temporary file left


def _rewrite(path: Path, edit) -> Path:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        lines = f.read().splitlines()
    bad = path.with_name(f"bad-{len(list(path.parent.glob('bad-*')))}.jsonl.gz")
    with gzip.open(bad, "wt", encoding="utf-8") as f:
        f.write("\n".join(edit(lines)) + "\n")
    return bad


def test_a_bad_prompt_file_is_refused_naming_prompts_and_the_line(tmp_path):
    path = _made(tmp_path)
    plain = tmp_path / "plain.jsonl.gz"
    plain.write_text("not gzip")
    cases = [
        (tmp_path / "p.jsonl", "ends with .jsonl.gz"),
        (tmp_path / "missing.jsonl.gz", "no such file"),
        (plain, "cannot be read as a prompt file"),
        (_rewrite(path, lambda ls: ['{"format": "other"}'] + ls[1:]), "is not a prompt file"),
        (_rewrite(path, lambda ls: [ls[0].replace('"version": 1', '"version": 9')] + ls[1:]), "version 9"),
        (_rewrite(path, lambda ls: ls[:-1]), "its header says"),  # cut short
        (_rewrite(path, lambda ls: ls + ['{"source": "web", "prompt": "x"}']), "line 5 is not a prompt"),
        (_rewrite(path, lambda ls: ls[:3] + [json.dumps({"source": "multi-turn", "messages": EXCHANGE[:2]})]),
         "line 4 is not a prompt"),  # an exchange that ends with the assistant's turn
        (_rewrite(path, lambda ls: ls[:1] + ['{"source": "self-instruct", "prompt": " "}'] + ls[2:]),
         "line 2 is not a prompt"),
    ]
    for bad, message in cases:
        with pytest.raises(ValueError, match="prompts: .*" + message.replace("(", r"\(")):
            read_prompt_file(bad)
    with pytest.raises(ValueError, match="out: a prompt file's name ends with .jsonl.gz"):
        write_prompt_file(tmp_path / "x.json", HEADER, {})
    with pytest.raises(ValueError, match="prompts: unknown sources"):
        write_prompt_file(tmp_path / "x.jsonl.gz", HEADER, {"web": ["x"]})


def test_the_held_out_prompts_are_kept_out_when_made_and_again_when_they_have_changed(demo, tmp_path, monkeypatch):
    target, tokenizer = demo
    held = CHAT_PROMPT_SETS["report"][0]
    replies = iter([f" {held}\n5. Plan a picnic for six people.", f" {held.upper()}\n5. Name three rivers in Peru."]
                   * 8)
    monkeypatch.setattr(widen, "_generate", lambda target, tokenizer, prompts, *args: [next(replies) for _ in prompts])
    path = make_prompt_file(target, tokenizer, tmp_path / "p.jsonl.gz", target_name="demo", mix="self-instruct=1",
                            count=2, settings=SMALL, progress=False)
    assert read_prompt_file(path).prompts == {"self-instruct": ["Plan a picnic for six people.",
                                                                "Name three rivers in Peru."]}
    # a file made against other held-out prompts is checked again when read: what the guard drops now goes
    stale = {**HEADER, "held_out": {**held_out_record(), "sha256": "0" * 64}}
    exchange = [{"role": "user", "content": f"Please: {held}"}, *EXCHANGE[1:]]
    path = write_prompt_file(tmp_path / "stale.jsonl.gz", stale, {"self-instruct": ["Plan a picnic.", held],
                                                                  "multi-turn": [EXCHANGE, exchange]})
    assert read_prompt_file(path).prompts == {"self-instruct": ["Plan a picnic."], "multi-turn": [EXCHANGE]}
    assert read_prompt_file(path).header["counts"] == {"self-instruct": 2, "multi-turn": 2}


def test_a_run_draws_from_the_file_and_asks_the_target_for_nothing_before_its_continuations(demo, tmp_path,
                                                                                             monkeypatch):
    from specdecode.training import train_drafter
    from specdecode.training.loop import LoopSettings

    target, tokenizer = demo
    path = _made(tmp_path)
    mix = "templates=0.5,self-instruct=0.25,multi-turn=0.25"
    for name in ("_generate", "self_instruct", "multi_turn", "multi_turn_messages"):
        monkeypatch.setattr(widen, name, lambda *a, **k: pytest.fail("the target was asked to widen the prompts"))
    prompts = mixed_prompts(target, tokenizer, "demo", 20, mix, SMALL, tmp_path / "cache", seed=1, progress=False,
                            prompts=path)
    assert len(prompts) == 20 and not (tmp_path / "cache").exists()  # nothing cached: the file is the cache
    assert sum(p in ("Plan a picnic for six people.", "Name three rivers in Peru.") for p in prompts) == 5
    assert sum(p == conversation_ids(tokenizer, EXCHANGE) for p in prompts) == 5  # repeated: the file holds one
    calls = []

    def counted(continued):
        def call(target_, batch, *args, **kwargs):
            calls.append(len(batch))
            return continued(target_, batch, *args, **kwargs)
        return call

    for name in ("continue_prompts", "continue_and_label"):  # labelled by the forward, or by the decode steps
        monkeypatch.setattr(data_module, name, counted(getattr(data_module, name)))
    result = train_drafter("draft", target, tmp_path / "run", tokenizer=tokenizer, target_name="demo", max_steps=1,
                           num_prompts=8, prompt_mix=mix, prompts=path, data_settings=SMALL,
                           loop_settings=LoopSettings(batch_size=4), progress=False, num_layers=1)
    assert result.record["training"]["sequences"] == 8
    assert calls == [4, 4]  # the two batches of continuations, nothing before them


def test_the_file_shipped_for_a_target_is_used_by_default(demo, tmp_path, monkeypatch):
    target, tokenizer = demo
    from specdecode.training.artifacts import target_fingerprint

    folder = tmp_path / "shipped"
    header = {**HEADER, "target": {"name": "demo", "weights_hash": target_fingerprint(target)},
              "held_out": held_out_record()}
    write_prompt_file(folder / "demo.jsonl.gz", header, {"self-instruct": ["Plan a picnic for six people."],
                                                         "multi-turn": [EXCHANGE]})
    monkeypatch.setattr(prompt_file, "_SHIPPED_FOLDER", folder)
    monkeypatch.setattr(prompt_file, "_SHIPPED", {"demo": "demo.jsonl.gz"})
    assert shipped_prompt_file("demo") == folder / "demo.jsonl.gz"
    assert shipped_prompt_file("a-folder", target_fingerprint(target)) == folder / "demo.jsonl.gz"  # by weights
    assert shipped_prompt_file("a-folder", "sha256:other") is None
    monkeypatch.setattr(widen, "_generate", lambda *a, **k: pytest.fail("the target was asked to widen the prompts"))
    for name in ("demo", "my-copy-of-demo"):
        prompts = mixed_prompts(target, tokenizer, name, 8, "templates=0.5,self-instruct=0.5", SMALL, tmp_path,
                                progress=False)
        assert prompts.count("Plan a picnic for six people.") == 4
    with pytest.raises(ValueError, match="prompts: .* holds no multi-turn prompts, which prompt_mix asks for"):
        mixed_prompts(target, tokenizer, "demo", 8, "multi-turn=1", SMALL, tmp_path, progress=False,
                      prompts=_made(tmp_path, name="one.jsonl.gz", **{"multi-turn": []}))


def test_the_prompts_option_is_checked_before_anything_is_made(demo, tmp_path):
    from specdecode.training import train_drafter, train_drafters

    target, tokenizer = demo
    path = _made(tmp_path)
    cases = [({"prompts": path}, "prompts: a prompt file is drawn from by prompt_mix's shares"),
             ({"prompts": path, "prompt_mix": "templates=1", "data": ["x"]}, "prompts: .* not used with data"),
             ({"prompts": tmp_path / "missing.jsonl.gz", "prompt_mix": "templates=1"}, "prompts: no such file"),
             ({"prompts": _made(tmp_path, name="si.jsonl.gz", **{"multi-turn": []}), "prompt_mix": "multi-turn=1"},
              "prompts: .* holds no multi-turn prompts")]
    for settings, message in cases:
        with pytest.raises(ValueError, match=message):
            train_drafter("draft", target, tmp_path / "run", tokenizer=tokenizer, **settings)
        with pytest.raises(ValueError, match=message):
            train_drafters(["draft"], target, tmp_path / "runs", tokenizer=tokenizer, **settings)
    with pytest.raises(TypeError, match="prompts: expected a prompt file path"):
        train_drafter("draft", target, tmp_path / "run", tokenizer=tokenizer, prompts=3, prompt_mix="templates=1")
    assert not (tmp_path / "run").exists() and not (tmp_path / "runs").exists()


def test_the_smollm2_prompt_file_ships_with_the_kit():
    """The shipped file: small, made by SmolLM2, thousands of requests and exchanges, and none of
    its user turns a held-out prompt or a near-copy, by the guard or by an independent measure."""
    from test_training_prompts import HELD_OUT, _independent_near_copy

    path = shipped_prompt_file("smollm2")
    assert path is not None and path.parent.parent == Path(specdecode.training.__file__).parent
    assert path.stat().st_size < 5 * 2**20
    made = read_prompt_file(path)
    assert made.header["target"]["name"] == "smollm2" and made.header["held_out"] == held_out_record()
    assert made.header["counts"]["self-instruct"] >= 1000 and made.header["counts"]["multi-turn"] >= 1000
    users = made.prompts["self-instruct"] + [m["content"] for ex in made.prompts["multi-turn"] for m in ex
                                             if m["role"] == "user"]
    assert len(set(made.prompts["self-instruct"])) == len(made.prompts["self-instruct"])
    for text in users:
        assert not is_held_out(text), text
        assert not any(_independent_near_copy(text, held) for held in HELD_OUT), text
