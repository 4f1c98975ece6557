"""Prompts beyond the templates (specdecode.training.widen, prompt_sources): the mix of sources,
self-instruct requests written by the target, multi-turn exchanges, code / prose / long
requests, the cache, and the benchmark's held-out prompts kept out of every source."""

from __future__ import annotations

import copy
import difflib
import json
import re

import pytest
import torch

import specdecode
import specdecode.training.widen as widen
from specdecode.prompt_sets import CHAT_PROMPT_SETS, PROMPT_SETS
from specdecode.training.data import GENERAL_PROMPTS, DataSettings, default_prompts
from specdecode.training.prompt_sources import (
    FOLLOW_UPS,
    code_requests,
    is_held_out,
    long_requests,
    near_copy,
    prose_requests,
    static_source,
)
from specdecode.training.prompts import chat_prompts, num_chat_prompts
from specdecode.training.widen import (
    PromptMix,
    mixed_prompts,
    multi_turn,
    parse_request,
    parse_requests,
    self_instruct,
)

SMALL = DataSettings(max_length=48, max_new_tokens=16, batch_size=4)
HELD_OUT = [p for half in CHAT_PROMPT_SETS.values() for p in half] + [
    p for name, prompts in PROMPT_SETS.items() if "-" in name for p in prompts]


@pytest.fixture(scope="module")
def demo():
    target, _, tokenizer = specdecode.load_demo_pair()
    return target, tokenizer


def _plain(text: str) -> str:
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


def _independent_near_copy(text: str, held: str) -> bool:
    """A second, independent test of near-copies: the held-out prompt's words inside the text, or
    the two texts' characters 90% alike (difflib: the same request up to a few letters)."""
    a, b = _plain(text), _plain(held)
    if b in a:
        return True
    alike = difflib.SequenceMatcher(None, a, b)  # the quick upper bounds first: most pairs end there
    return alike.real_quick_ratio() >= 0.9 and alike.quick_ratio() >= 0.9 and alike.ratio() >= 0.9


def test_no_held_out_prompt_or_near_copy_is_a_training_prompt():
    every = (chat_prompts(num_chat_prompts()) + list(GENERAL_PROMPTS) + code_requests() + prose_requests()
             + long_requests() + list(FOLLOW_UPS))
    assert len(every) > 2500
    for text in every:
        assert not is_held_out(text), text
        for held in HELD_OUT:
            assert not _independent_near_copy(text, held), (text, held)


def test_the_guard_catches_copies_and_near_copies_of_held_out_prompts():
    for held in HELD_OUT:
        assert is_held_out(held)
        assert is_held_out(held.upper().replace("?", "").replace(".", "!"))
        assert is_held_out(f"Please answer this: {held} Keep it short.")
    assert is_held_out("Tell me how a submarine dives and comes back up")  # plural, other function words
    assert is_held_out("Why do the leaves change their color in fall?")
    assert not is_held_out("What is the difference between a lake and a pond?")  # one template, another subject
    assert not near_copy("Explain photosynthesis simply.", "Explain recursion simply.")


def test_a_mix_is_parsed_counted_and_checked():
    mix = PromptMix.parse("templates=0.5,self-instruct=0.3,multi-turn=0.2")
    assert (mix.templates, mix.self_instruct, mix.multi_turn, mix.code) == (0.5, 0.3, 0.2, 0.0)
    assert PromptMix.parse(mix.text()) == mix
    counts = PromptMix(templates=1, code=1, prose=1).counts(10)
    assert sum(counts.values()) == 10 and counts["self_instruct"] == 0 and min(counts["code"], counts["prose"]) >= 3
    for bad in ("", "web=1", "templates=x", "templates", "templates=-1", "templates=0"):
        with pytest.raises(ValueError, match="prompt_mix"):
            PromptMix.parse(bad)
    with pytest.raises(ValueError, match="prompt_mix: code expected a number >= 0"):
        PromptMix(code=True)


def test_replies_are_parsed_into_one_request():
    assert parse_request("1. Write a haiku about rain.\n2. Another one") == "Write a haiku about rain."
    assert parse_request('  Request: "How do tides work on lakes?"') == "How do tides work on lakes?"
    assert parse_request("- Give me three tips for baking bread.") == "Give me three tips for baking bread."
    for junk in ("", "ok", "x = [1, 2, 3] + [4, 5, 6] * 7 // 8", " ".join(["word"] * 70)):
        assert parse_request(junk) is None
    reply = " How do I water a cactus?\n5. Write a haiku about rain.\nSome chatter here\n6. Name three fam"
    assert parse_requests(reply) == ["How do I water a cactus?", "Write a haiku about rain."]  # 6. was cut
    assert parse_requests(" Plan a trip to Oslo.\n5. Explain tides simply.") == ["Plan a trip to Oslo.",
                                                                                 "Explain tides simply."]


def test_self_instruct_keeps_new_requests_and_drops_held_out_ones(demo, monkeypatch):
    target, tokenizer = demo
    held = CHAT_PROMPT_SETS["report"][0]
    replies = iter([f"1. {held}", "Why do leaves change colour in the fall?", "Plan a picnic for six people.",
                    "Plan a picnic for six people!", "}}", "Suggest a name for a pet snail."] * 4)
    seen = []

    def fake(target, tokenizer, prompts, settings, seed, desc, progress, deadline):
        seen.extend(tokenizer.decode(p) for p in prompts)
        return [next(replies) for _ in prompts]

    monkeypatch.setattr(widen, "_generate", fake)
    kept = self_instruct(target, tokenizer, 3, ["Explain tides.", "Write a poem."], SMALL, seed=1, progress=False)
    assert kept == ["Plan a picnic for six people.", "Suggest a name for a pet snail."]  # the 3rd never comes
    assert "List requests that people send to an AI assistant about" in seen[0]
    assert seen[0].endswith("\n3. Explain tides.\n4.") or seen[0].endswith("\n3. Write a poem.\n4.")


def test_the_real_self_instruct_and_multi_turn_run_on_the_target(demo):
    target, tokenizer = demo
    written = self_instruct(target, tokenizer, 2, list(GENERAL_PROMPTS), SMALL, seed=0, progress=False)
    assert len(written) <= 2 and all(isinstance(w, str) and not is_held_out(w) for w in written)
    chat = copy.deepcopy(tokenizer)
    chat.chat_template = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
                          "{% if add_generation_prompt %}<assistant>{% endif %}")
    exchanges = multi_turn(target, chat, ["Explain tides.", "Write a poem."], SMALL, seed=0, progress=False)
    assert len(exchanges) == 2
    text = chat.decode(exchanges[0])
    assert text.startswith("<user>Explain tides.\n<assistant>") and text.endswith("<assistant>")
    assert any(text.count(f) == 1 for f in FOLLOW_UPS) and text.count("<user>") == 2
    assert not getattr(tokenizer, "chat_template", None)  # the caller's tokenizer is not changed


def test_mixed_prompts_are_made_once_cached_and_seeded(demo, tmp_path, monkeypatch):
    target, tokenizer = demo
    mix = "templates=0.4,self-instruct=0.2,multi-turn=0.2,code=0.1,prose=0.1"
    prompts = mixed_prompts(target, tokenizer, "demo", 10, mix, SMALL, tmp_path, seed=3, progress=False)
    assert len(prompts) == 10
    record = json.loads(next(tmp_path.glob("prompts-*.json")).read_text())
    assert sum(record["made"].values()) == 10 and record["made"]["code"] == 1 and record["made"]["prose"] == 1
    assert record["made"]["multi-turn"] <= 2 and record["made"]["self-instruct"] <= 2  # templates make up the rest
    assert sum(isinstance(p, list) for p in prompts) == record["made"]["multi-turn"]  # exchanges are token ids
    monkeypatch.setattr(widen, "_generate", lambda *args: pytest.fail("the cached prompts are made again"))
    assert mixed_prompts(target, tokenizer, "demo", 10, PromptMix.parse(mix), SMALL, tmp_path, seed=3,
                         progress=False) == prompts
    assert static_source("code", 5, seed=1) == static_source("code", 5, seed=1) != static_source("code", 5, seed=2)
    with pytest.raises(ValueError, match="num_prompts"):
        mixed_prompts(target, tokenizer, "demo", 0, mix, SMALL, tmp_path)
    with pytest.raises(TypeError, match="prompt_mix"):
        mixed_prompts(target, tokenizer, "demo", 4, {"code": 1}, SMALL, tmp_path)


def test_a_run_with_a_prompt_mix_trains(demo, tmp_path):
    from specdecode.training import train_drafter
    from specdecode.training.loop import LoopSettings

    target, tokenizer = demo
    result = train_drafter("draft", target, tmp_path, tokenizer=tokenizer, target_name="demo", max_steps=1,
                           num_prompts=6, prompt_mix="templates=0.5,code=0.25,prose=0.25", data_settings=SMALL,
                           loop_settings=LoopSettings(batch_size=4), progress=False, num_layers=1)
    assert result.record["training"]["sequences"] == 6 and result.record["training"]["steps"] == 1
    assert default_prompts("demo", 2) == default_prompts("demo", 2)
    assert torch.is_tensor(result.drafter.lm_head.weight)
