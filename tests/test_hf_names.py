"""Hugging Face's own names and features through both entry points (issue 20, section 2):
``assistant_model``, ``prompt_lookup_num_tokens``, ``assistant_tokenizer`` + ``tokenizer``,
``stop_strings``, the generation arguments ``specdecode.generate`` now shares with
``custom_generate``, the ``scores`` / ``logits`` of ``return_dict_in_generate``, and the
arguments that cannot be honoured."""

from __future__ import annotations

import copy

import pytest
import torch
from test_drafter_tokenizer_bridge import WORDS, permutation, permuted_model, permuted_tokenizer, word_tokenizer
from test_generate_models import PAD, _one_thread, left_padded, make_model, make_pair  # noqa: F401

import specdecode
from specdecode import custom_generate

MAX_NEW = 14


def hf(target, ids, mask=None, **kwargs):
    kwargs.setdefault("max_new_tokens", MAX_NEW)
    kwargs.setdefault("pad_token_id", PAD)
    kwargs.setdefault("do_sample", False)
    return target.generate(ids, attention_mask=mask, **kwargs)


def plug(target, ids, mask=None, **kwargs):
    return hf(target, ids, mask, custom_generate=custom_generate, **kwargs)


def ours(target, draft, ids, mask=None, **kwargs):
    kwargs.setdefault("max_new_tokens", MAX_NEW)
    kwargs.setdefault("pad_token_id", PAD)
    return specdecode.generate(target, draft, ids, mask, **kwargs)


@pytest.fixture(scope="module")
def pair():
    return make_pair("llama")


@pytest.fixture(scope="module")
def batch():
    return left_padded([4, 7, 5], seed=3)


# ------------------------------------------------------------------ drafter names


def test_assistant_model_through_custom_generate(pair, batch):
    target, draft = pair
    ids, mask = batch
    want = hf(target, ids, mask)
    stats = specdecode.SpeculativeStats()
    got = plug(target, ids, mask, assistant_model=draft, num_draft_tokens=3, speculative_stats=stats)
    assert torch.equal(got, want)
    assert stats.drafter == "model" and stats.drafted_tokens > 0
    # HF's own assisted generation, same argument, same greedy output
    assert torch.equal(hf(target, ids[1:2], assistant_model=draft), plug(target, ids[1:2], assistant_model=draft))


def test_assistant_model_through_specdecode_generate(pair, batch):
    target, draft = pair
    ids, mask = batch
    out = specdecode.generate(target, input_ids=ids, attention_mask=mask, assistant_model=draft,
                              max_new_tokens=MAX_NEW, pad_token_id=PAD)
    assert torch.equal(out.sequences, hf(target, ids, mask))
    assert out.stats.drafter == "model"


def test_two_drafts_at_once_are_refused_naming_both(pair, batch):
    target, draft = pair
    ids, mask = batch
    with pytest.raises(ValueError, match="draft_model and assistant_model"):
        plug(target, ids, mask, draft_model=draft, assistant_model=draft)
    with pytest.raises(ValueError, match="draft and assistant_model"):
        ours(target, draft, ids, mask, assistant_model=draft)
    with pytest.raises(ValueError, match="draft and prompt_lookup_num_tokens"):
        ours(target, draft, ids, mask, prompt_lookup_num_tokens=3)
    with pytest.raises(ValueError, match="draft_model and prompt_lookup_num_tokens"):
        plug(target, ids, mask, draft_model=draft, prompt_lookup_num_tokens=3)
    with pytest.raises(TypeError, match="assistant_model"):
        ours(target, None, ids, mask, assistant_model=specdecode.NgramDrafter())
    with pytest.raises(ValueError, match="assistant_tokenizer"):
        ours(target, draft, ids, mask, assistant_tokenizer=word_tokenizer(WORDS))


def test_no_draft_names_the_hf_argument(pair, batch):
    target, _ = pair
    ids, mask = batch
    with pytest.raises(ValueError, match="assistant_model=draft"):
        plug(target, ids, mask)


@pytest.mark.parametrize("k", [2, 4])
def test_prompt_lookup_num_tokens_is_the_ngram_drafter(pair, k):
    target, _ = pair
    ids = torch.tensor([[5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7]])
    want = hf(target, ids, max_new_tokens=16)
    assert torch.equal(hf(target, ids, max_new_tokens=16, prompt_lookup_num_tokens=k), want)  # HF's own
    stats = specdecode.SpeculativeStats()
    assert torch.equal(plug(target, ids, max_new_tokens=16, prompt_lookup_num_tokens=k, speculative_stats=stats), want)
    assert stats.drafter == "ngram" and max(stats.num_draft_tokens_history) == k
    out = specdecode.generate(target, input_ids=ids, prompt_lookup_num_tokens=k, max_new_tokens=16, pad_token_id=PAD)
    assert torch.equal(out.sequences, want)
    assert out.stats.drafter == "ngram" and max(out.stats.num_draft_tokens_history) == k
    with pytest.raises(ValueError, match="num_draft_tokens and prompt_lookup_num_tokens"):
        ours(target, None, ids, prompt_lookup_num_tokens=k, num_draft_tokens=k + 1)


def test_assistant_tokenizer_and_tokenizer_are_the_tokenizer_bridge(pair):
    target, _ = pair
    tok = word_tokenizer(WORDS)
    perm = permutation(len(tok), 0, seed=3)
    draft, draft_tok = permuted_model(target, perm), permuted_tokenizer(tok, perm)
    ids, mask = left_padded([4, 6], seed=5)
    out = ours(target, None, ids, mask, assistant_model=draft, assistant_tokenizer=draft_tok, tokenizer=tok,
               max_new_tokens=10)
    assert torch.equal(out.sequences, hf(target, ids, mask, max_new_tokens=10))
    assert out.stats.drafter == specdecode.TokenizerBridgeDrafter.name and out.stats.accepted_tokens > 0
    # a direct call of the plug-in takes the same names
    seq = custom_generate(target, ids, generation_config=_prepared_config(target, ids, 10),
                          stopping_criteria=_length_criteria(ids, 10), attention_mask=mask, assistant_model=draft,
                          assistant_tokenizer=draft_tok, tokenizer=tok)
    assert torch.equal(seq, out.sequences)
    with pytest.raises(ValueError, match="tokenizer"):
        ours(target, None, ids, mask, assistant_model=draft, assistant_tokenizer=draft_tok)


def _prepared_config(target, ids, new):
    from transformers import GenerationConfig

    config = GenerationConfig(max_new_tokens=new, pad_token_id=PAD, do_sample=False)
    target._prepare_special_tokens(config, True, device=ids.device)
    config.max_length = ids.shape[1] + new
    return config


def _length_criteria(ids, new):
    from transformers import MaxLengthCriteria, StoppingCriteriaList

    return StoppingCriteriaList([MaxLengthCriteria(ids.shape[1] + new)])


# ------------------------------------------------------------------ stop strings


def test_stop_strings_with_tokenizer(pair):
    from transformers import StopStringCriteria

    target, draft = pair
    tok = word_tokenizer(WORDS[:-1] + ["abcdef"])  # StopStringCriteria encodes "abcdef" to read the vocabulary
    ids, mask = left_padded([5, 3], seed=7)
    full = hf(target, ids, mask, max_new_tokens=16)
    stop = tok.convert_ids_to_tokens(int(full[0, ids.shape[1] + 4]))  # row 0 stops after its 5th token
    want = hf(target, ids, mask, max_new_tokens=16, stop_strings=[stop], tokenizer=tok)
    assert want.shape[1] < full.shape[1] or not torch.equal(want, full)
    assert torch.equal(ours(target, draft, ids, mask, max_new_tokens=16, stop_strings=[stop], tokenizer=tok).sequences,
                       want)
    # model.generate drops `tokenizer` before calling a callable custom_generate; HF's own criterion works
    got = plug(target, ids, mask, max_new_tokens=16, assistant_model=draft,
               stopping_criteria=[StopStringCriteria(tok, [stop])])
    assert torch.equal(got, want)
    with pytest.raises(ValueError, match="tokenizer"):
        ours(target, draft, ids, mask, stop_strings=[stop])


# ------------------------------------------------------------------ scores and logits


def test_scores_and_logits_are_generates_per_token(pair):
    target, draft = pair
    ids, mask = left_padded([6, 3, 5], seed=11)
    full = hf(target, ids, mask)
    eos = int(full[1, ids.shape[1] + 3])  # row 1 ends early: finished rows are scored as generate does
    kwargs = dict(return_dict_in_generate=True, output_scores=True, output_logits=True, repetition_penalty=1.4,
                  eos_token_id=eos)
    want = hf(target, ids, mask, **kwargs)
    for got in (plug(target, ids, mask, assistant_model=draft, **kwargs),
                ours(target, draft, ids, mask, **kwargs)):
        assert torch.equal(got.sequences, want.sequences)
        assert len(got.scores) == len(want.scores) == got.sequences.shape[1] - ids.shape[1]
        assert len(got.logits) == len(want.logits)
        for mine, theirs in zip(got.scores, want.scores):
            assert mine.shape == theirs.shape and mine.dtype == theirs.dtype
            torch.testing.assert_close(mine, theirs, atol=1e-4, rtol=1e-4)
        for mine, theirs in zip(got.logits, want.logits):
            torch.testing.assert_close(mine, theirs, atol=1e-4, rtol=1e-4)
        assert got.stats.new_tokens > 0
    assert not torch.equal(want.scores[2], want.logits[2])  # processed vs raw: the penalty shows
    # without output_scores nothing is collected, as in generate
    out = plug(target, ids, mask, assistant_model=draft, return_dict_in_generate=True)
    assert out.scores is None and out.logits is None


def test_sampled_scores_carry_the_warpers(pair, batch):
    target, draft = pair
    ids, mask = batch
    out = ours(target, draft, ids, mask, do_sample=True, temperature=0.5, top_k=7, output_scores=True,
               output_logits=True, generator=torch.Generator().manual_seed(0))
    for score, raw in zip(out.scores, out.logits):
        assert (torch.isfinite(score).sum(1) == 7).all()
        kept = torch.isfinite(score)
        torch.testing.assert_close(score[kept], raw[kept] / 0.5)


# ------------------------------------------------------------------ one argument layer


def test_generation_config_is_honoured_and_not_modified(pair, batch):
    from transformers import GenerationConfig

    target, draft = pair
    ids, mask = batch
    config = GenerationConfig(max_new_tokens=9, repetition_penalty=1.5, no_repeat_ngram_size=2, pad_token_id=PAD)
    before = copy.deepcopy(config.to_dict())
    model_before = copy.deepcopy(target.generation_config.to_dict())
    want = target.generate(ids, attention_mask=mask, generation_config=config)
    got = specdecode.generate(target, draft, ids, mask, generation_config=config)
    assert torch.equal(got.sequences, want)
    assert torch.equal(target.generate(ids, attention_mask=mask, generation_config=config,
                                       custom_generate=custom_generate, assistant_model=draft), want)
    assert config.to_dict() == before and target.generation_config.to_dict() == model_before


@pytest.mark.parametrize("name,value,match", [
    ("num_beams", 2, "num_beams: beam search"),
    ("penalty_alpha", 0.6, "penalty_alpha: contrastive search"),
    ("output_attentions", True, "output_attentions: not collected"),
    ("output_hidden_states", True, "output_hidden_states: not collected"),
    ("guidance_scale", 1.5, "guidance_scale"),
])
def test_what_cannot_be_honoured_is_named(pair, batch, name, value, match):
    target, draft = pair
    ids, mask = batch
    extra = {"top_k": 4} if name == "penalty_alpha" else {}
    with pytest.raises(ValueError, match=match):
        ours(target, draft, ids, mask, **{name: value}, **extra)
    with pytest.raises(ValueError, match=match):
        plug(target, ids, mask, assistant_model=draft, return_dict_in_generate=True, **{name: value}, **extra)


def test_bad_generation_config_type_is_named(pair, batch):
    target, draft = pair
    ids, mask = batch
    with pytest.raises(TypeError, match="generation_config"):
        ours(target, draft, ids, mask, generation_config={"max_new_tokens": 3})
    with pytest.raises(TypeError, match="input_ids"):
        specdecode.generate(target, draft)


def test_assistant_early_exit_is_the_layer_skip_drafter():
    target = make_model("llama", layers=3)
    ids = torch.tensor([[5, 9, 11, 4, 7]])
    want = hf(target, ids)
    assert torch.equal(hf(target, ids, assistant_early_exit=1), want)  # HF's own self-speculation
    stats = specdecode.SpeculativeStats()
    assert torch.equal(plug(target, ids, assistant_early_exit=1, speculative_stats=stats), want)
    assert stats.drafter == specdecode.LayerSkipDrafter.name
    out = specdecode.generate(target, input_ids=ids, assistant_early_exit=1, max_new_tokens=MAX_NEW, pad_token_id=PAD)
    assert torch.equal(out.sequences, want) and out.stats.drafter == specdecode.LayerSkipDrafter.name


def test_sampling_settings_of_a_generation_config_apply(pair, batch):
    from transformers import GenerationConfig

    target, draft = pair
    ids, mask = batch
    config = GenerationConfig(do_sample=True, temperature=0.7, top_k=5, max_new_tokens=6, pad_token_id=PAD)
    out = specdecode.generate(target, draft, ids, mask, generation_config=config, output_scores=True,
                              generator=torch.Generator().manual_seed(1))
    assert out.sequences.shape[1] == ids.shape[1] + 6
    assert all((torch.isfinite(s).sum(1) == 5).all() for s in out.scores)  # top_k=5 applied
    greedy = specdecode.generate(target, draft, ids, mask, generation_config=config, do_sample=False)
    assert torch.equal(greedy.sequences, hf(target, ids, mask, max_new_tokens=6))  # the keyword wins


def test_num_return_sequences(pair, batch):
    target, draft = pair
    ids, mask = batch
    out = ours(target, draft, ids, mask, do_sample=True, num_return_sequences=2, max_new_tokens=5,
               generator=torch.Generator().manual_seed(2))
    assert out.sequences.shape == (6, ids.shape[1] + 5)
    prompts = out.sequences[:, : ids.shape[1]]
    assert torch.equal(prompts[::2], ids) and torch.equal(prompts[1::2], ids)
    with pytest.raises(ValueError, match="num_return_sequences"):
        ours(target, draft, ids, mask, num_return_sequences=2)


class _Collect:
    def __init__(self):
        self.chunks, self.ended = [], 0

    def put(self, value):
        self.chunks.append(value.flatten().tolist())

    def end(self):
        self.ended += 1


def test_generates_streamer_reaches_the_plugin(pair):
    target, draft = pair
    ids = torch.tensor([[5, 9, 11, 4, 7]])
    plain, mine = _Collect(), _Collect()
    want = hf(target, ids, streamer=plain)
    got = plug(target, ids, assistant_model=draft, streamer=mine)
    assert torch.equal(got, want)
    assert mine.chunks[0] == plain.chunks[0] == ids[0].tolist()  # the prompt, once
    assert sum(mine.chunks[1:], []) == sum(plain.chunks[1:], []) == want[0, ids.shape[1]:].tolist()
    assert mine.ended == plain.ended == 1
    with pytest.raises(ValueError, match="streamer and speculative_streamer"):
        plug(target, ids, assistant_model=draft, streamer=_Collect(), speculative_streamer=_Collect())


@pytest.mark.parametrize("bad,error,match", [
    (dict(repetition_penalty=-1.0), ValueError, "repetition_penalty"),
    (dict(no_repeat_ngram_size=-2), ValueError, "no_repeat_ngram_size"),
    (dict(min_new_tokens=-1), ValueError, "min_new_tokens"),
    (dict(max_time="soon"), TypeError, "max_time"),
    (dict(typical_p=2.0, do_sample=True), ValueError, "typical_p"),
])
def test_bad_generation_values_are_named(pair, batch, bad, error, match):
    target, draft = pair
    ids, mask = batch
    with pytest.raises(error, match=match):
        ours(target, draft, ids, mask, **bad)
    if "repetition_penalty" not in bad:  # HF refuses that one itself, in its own words
        with pytest.raises(error, match=match):
            plug(target, ids, mask, assistant_model=draft, **bad)


def test_trees_name_the_processors_they_cannot_take(pair, batch):
    target, draft = pair
    ids, mask = batch
    with pytest.raises(ValueError, match="RepetitionPenaltyLogitsProcessor"):
        ours(target, draft, ids, mask, tree="dynamic", num_nodes=6, repetition_penalty=1.2)
    with pytest.raises(ValueError, match="RepetitionPenaltyLogitsProcessor"):
        plug(target, ids, mask, assistant_model=draft, tree="dynamic", num_nodes=6, repetition_penalty=1.2)
