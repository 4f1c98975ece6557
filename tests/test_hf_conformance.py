"""Conformance: the same Hugging Face generation arguments through ``target.generate`` (plain),
``target.generate(custom_generate=specdecode.custom_generate)`` and ``specdecode.generate``
give the same greedy tokens, on several architectures (tiny random float32 models), batch 1
and a left-padded batch whose rows finish at different steps."""

from __future__ import annotations

import pytest
import torch
from test_drafter_tokenizer_bridge import WORDS, word_tokenizer
from test_generate_models import PAD, _one_thread, left_padded, make_pair  # noqa: F401

import specdecode

ARCHS = ["llama", "gpt2", "qwen2"]
MAX_NEW = 12


@pytest.fixture(scope="module", params=ARCHS)
def setup(request):
    target, draft = make_pair(request.param)
    ids, mask = left_padded([5, 8, 3], seed=21)
    plain = target.generate(ids, attention_mask=mask, max_new_tokens=MAX_NEW, do_sample=False, pad_token_id=PAD)
    new = plain[:, ids.shape[1]:]
    return target, draft, ids, mask, new


def _cases(new: torch.Tensor) -> dict[str, dict]:
    """Generation arguments built from the plain greedy output, so that each one changes it."""
    from transformers import GenerationConfig

    early = int(new[0, 2])  # a token row 0 emits early: an EOS, a bad word
    return {
        "defaults": {},
        "repetition_penalty": {"repetition_penalty": 1.5},
        "no_repeat_ngram_size": {"no_repeat_ngram_size": 2},
        "bad_words_ids": {"bad_words_ids": [[early], [int(new[1, 0]), int(new[1, 1])]]},
        "eos_token_id": {"eos_token_id": early},
        "min_new_tokens": {"eos_token_id": early, "min_new_tokens": 6},
        "max_length": {"max_length": 8 + 5, "max_new_tokens": None},
        "generation_config": {"generation_config": GenerationConfig(max_new_tokens=7, repetition_penalty=1.3,
                                                                    pad_token_id=PAD, do_sample=False),
                              "max_new_tokens": None, "pad_token_id": None, "do_sample": None},
        "prompt_lookup_num_tokens": {"prompt_lookup_num_tokens": 3, "draft": None},
        "return_dict_in_generate": {"return_dict_in_generate": True, "output_scores": True},
    }


CASES = ["defaults", "repetition_penalty", "no_repeat_ngram_size", "bad_words_ids", "eos_token_id", "min_new_tokens",
         "max_length", "generation_config", "prompt_lookup_num_tokens", "return_dict_in_generate"]


def _three_ways(target, draft, ids, mask, case: dict):
    kwargs = {"max_new_tokens": MAX_NEW, "pad_token_id": PAD, "do_sample": False, **case}
    use_draft = kwargs.pop("draft", draft)
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    plain_kwargs = dict(kwargs)
    if ids.shape[0] > 1:  # HF's prompt lookup (assisted generation) runs batch 1 only; greedy, it changes nothing
        plain_kwargs.pop("prompt_lookup_num_tokens", None)
    plain = target.generate(ids, attention_mask=mask, **plain_kwargs)
    plugin_draft = {} if use_draft is None else {"assistant_model": use_draft}
    plugin = target.generate(ids, attention_mask=mask, custom_generate=specdecode.custom_generate,
                             num_draft_tokens=3, **plugin_draft, **kwargs)
    ours = specdecode.generate(target, use_draft, ids, mask, **kwargs)
    return plain, plugin, ours


def _sequences(out):
    return out if isinstance(out, torch.Tensor) else out.sequences


@pytest.mark.parametrize("name", CASES)
def test_same_greedy_tokens_three_ways(setup, name):
    target, draft, ids, mask, new = setup
    case = _cases(new)[name]
    for rows in (slice(0, 3), slice(1, 2)):
        m = mask[rows]
        m = None if bool(m.all()) else m
        plain, plugin, ours = _three_ways(target, draft, ids[rows], m, case)
        assert torch.equal(_sequences(plugin), _sequences(plain)), (name, rows)
        assert torch.equal(ours.sequences, _sequences(plain)), (name, rows)
        if case.get("output_scores"):
            assert len(plugin.scores) == len(ours.scores) == len(plain.scores)
            for a, b, c in zip(plugin.scores, ours.scores, plain.scores):
                torch.testing.assert_close(a, c, atol=1e-4, rtol=1e-4)
                torch.testing.assert_close(b, c, atol=1e-4, rtol=1e-4)


def test_cases_change_the_output(setup):
    """Every case but the defaults changes the plain output, so agreeing is not trivial."""
    target, draft, ids, mask, new = setup
    base = target.generate(ids, attention_mask=mask, max_new_tokens=MAX_NEW, do_sample=False, pad_token_id=PAD)
    cases = _cases(new)
    for name in ("repetition_penalty", "no_repeat_ngram_size", "bad_words_ids", "eos_token_id", "min_new_tokens",
                 "max_length", "generation_config"):
        plain, _, _ = _three_ways(target, draft, ids, mask, cases[name])
        assert not torch.equal(plain, base), name


def test_stop_strings_three_ways(setup):
    """``stop_strings`` + ``tokenizer``: plain and ``specdecode.generate`` take them as is; through
    ``custom_generate`` transformers drops ``tokenizer``, so HF's own criterion carries them."""
    from transformers import StopStringCriteria

    target, draft, ids, mask, new = setup
    tok = word_tokenizer(WORDS[:-1] + ["abcdef"])
    stop = tok.convert_ids_to_tokens(int(new[0, 3]))
    kwargs = dict(max_new_tokens=MAX_NEW, pad_token_id=PAD, do_sample=False)
    plain = target.generate(ids, attention_mask=mask, stop_strings=[stop], tokenizer=tok, **kwargs)
    ours = specdecode.generate(target, draft, ids, mask, stop_strings=[stop], tokenizer=tok, **kwargs)
    plugin = target.generate(ids, attention_mask=mask, custom_generate=specdecode.custom_generate,
                             assistant_model=draft, stopping_criteria=[StopStringCriteria(tok, [stop])], **kwargs)
    assert torch.equal(ours.sequences, plain) and torch.equal(plugin, plain)
