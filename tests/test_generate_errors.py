"""Bad input to the generate loop fails early with a clear error naming the problem."""

from __future__ import annotations

import pytest
import torch
from test_generate_models import PAD, _one_thread, left_padded, make_model, make_pair  # noqa: F401

from specdecode import check_compatibility, custom_generate, generate


@pytest.fixture(scope="module")
def pair():
    return make_pair("llama")


def make_tokenizer(words):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["<pad>", "</s>", "<s>", "<unk>"] + words)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", eos_token="</s>",
                                   bos_token="<s>")


WORDS = [f"w{i}" for i in range(100)]


def run(pair, ids=None, mask=None, **kwargs):
    target, draft = pair
    if ids is None:
        ids, mask = left_padded([4, 6], seed=0)
    kwargs.setdefault("max_new_tokens", 4)
    return generate(target, draft, ids, mask, **kwargs)


# ------------------------------------------------------------------- tokenizers, vocabularies


def test_mismatched_tokenizers_are_refused(pair):
    target, draft = pair
    a, b = make_tokenizer(WORDS), make_tokenizer(list(reversed(WORDS)))
    with pytest.raises(ValueError, match="tokenizers differ"):
        run(pair, target_tokenizer=a, draft_tokenizer=b)
    with pytest.raises(ValueError, match="tokenizers differ"):
        ids, mask = left_padded([4, 6])
        target.generate(ids, attention_mask=mask, custom_generate=custom_generate, draft_model=draft,
                        target_tokenizer=a, draft_tokenizer=b, max_new_tokens=3, pad_token_id=PAD)
    # the same vocabulary in two objects is fine
    assert run(pair, target_tokenizer=a, draft_tokenizer=make_tokenizer(WORDS)).sequences.shape[0] == 2


def test_tokenizer_larger_than_the_shared_vocabulary_is_refused(pair):
    big = make_tokenizer([f"w{i}" for i in range(200)])
    with pytest.raises(ValueError, match="share only 128 ids"):
        run(pair, target_tokenizer=big, draft_tokenizer=big)


def test_incompatible_vocabularies_are_refused():
    target = make_model("llama", vocab=128)
    with pytest.raises(ValueError, match="vocabulary sizes differ"), pytest.warns(UserWarning, match="swapped"):
        check_compatibility(target, make_model("llama", vocab=1000, layers=1))
    other_eos = make_model("llama", vocab=128, layers=1)
    other_eos.config.eos_token_id = 5
    with pytest.raises(ValueError, match="eos_token_id differs"):
        check_compatibility(target, other_eos)
    other_bos = make_model("llama", vocab=128, layers=1)
    other_bos.config.bos_token_id = 7
    with pytest.raises(ValueError, match="bos_token_id differs"):
        check_compatibility(target, other_bos)
    # padding rows only: accepted, verification over the shared ids
    assert check_compatibility(target, make_model("llama", vocab=136, layers=1)) == 128


def test_models_on_the_meta_device_are_refused(pair):
    from test_generate_models import make_config
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(make_config("llama", layers=1))
    target, draft = pair
    ids, mask = left_padded([4, 6])
    with pytest.raises(ValueError, match="meta device"):
        generate(target, meta, ids, mask)
    with pytest.raises(ValueError, match="meta device"):
        generate(meta, draft, ids, mask)


def test_encoder_decoder_models_are_refused(pair):
    from transformers import T5Config, T5ForConditionalGeneration

    t5 = T5ForConditionalGeneration(T5Config(vocab_size=128, d_model=16, d_ff=32, num_layers=1, num_heads=2,
                                             d_kv=8, decoder_start_token_id=0))
    with pytest.raises(ValueError, match="decoder-only"):
        check_compatibility(t5, pair[1])


# ------------------------------------------------------------------------------ bad inputs


def test_padded_batch_without_attention_mask_is_refused(pair):
    ids, _ = left_padded([4, 6])
    with pytest.raises(ValueError, match="attention_mask"):
        run(pair, ids=ids, mask=None)


def test_bad_attention_masks_are_refused(pair):
    ids, mask = left_padded([4, 6])
    with pytest.raises(ValueError, match="padding_side='left'"):
        run(pair, ids=ids, mask=mask.flip(1))
    with pytest.raises(ValueError, match="shape"):
        run(pair, ids=ids, mask=mask[:, 1:])
    with pytest.raises(ValueError, match="0 or 1"):
        run(pair, ids=ids, mask=mask * 2)


def test_bad_input_ids_are_refused(pair):
    with pytest.raises(ValueError, match="shape"):
        run(pair, ids=torch.tensor([3, 4, 5]))
    with pytest.raises(ValueError, match=r"\[0, 128\)"):
        run(pair, ids=torch.tensor([[3, 4, 500]]))
    with pytest.raises(TypeError, match="integer"):
        run(pair, ids=torch.tensor([[3.0, 4.0]]))


@pytest.mark.parametrize("value", [0, -3])
def test_max_new_tokens_must_be_positive(pair, value):
    with pytest.raises(ValueError, match="max_new_tokens"):
        run(pair, max_new_tokens=value)


@pytest.mark.parametrize("value", [0, -1])
def test_num_draft_tokens_must_be_at_least_one(pair, value):
    with pytest.raises(ValueError, match="num_draft_tokens"):
        run(pair, num_draft_tokens=value)
    target, draft = pair
    ids, mask = left_padded([4, 6])
    with pytest.raises(ValueError, match="num_draft_tokens"):
        target.generate(ids, attention_mask=mask, custom_generate=custom_generate, draft_model=draft,
                        num_draft_tokens=value, max_new_tokens=3, pad_token_id=PAD)


def test_unknown_rule_and_rule_options_are_refused(pair):
    with pytest.raises(ValueError, match="unknown rule 'nope'"):
        run(pair, rule="nope")
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        run(pair, rule="typical", bogus=1)
    with pytest.raises(TypeError, match="'max_new_token'; did you mean 'max_new_tokens'"):
        run(pair, max_new_token=8)
    with pytest.raises(TypeError, match="did you mean 'epsilon'"):
        run(pair, rule="typical", epsilom=0.1)


def test_bad_sampling_settings_are_refused(pair):
    with pytest.raises(ValueError, match="temperature"):
        run(pair, do_sample=True, temperature=-1.0)
    with pytest.raises(ValueError, match="top_p"):
        run(pair, do_sample=True, top_p=0.0)
    with pytest.raises(TypeError, match="do_sample"):
        run(pair, do_sample="yes")


def test_other_bad_options_are_refused(pair):
    with pytest.raises(ValueError, match="draft_schedule"):
        run(pair, draft_schedule="fast")
    with pytest.raises(ValueError, match="batch size 1"):
        run(pair, streamer=object())
    with pytest.raises(TypeError, match="generator"):
        run(pair, generator=123)
    with pytest.raises(ValueError, match="max_num_draft_tokens"):
        run(pair, num_draft_tokens=8, max_num_draft_tokens=4)


def test_plugin_without_draft_model_is_refused(pair):
    target, _ = pair
    ids, mask = left_padded([4, 6])
    with pytest.raises(ValueError, match="draft_model"):
        target.generate(ids, attention_mask=mask, custom_generate=custom_generate, max_new_tokens=3,
                        pad_token_id=PAD)


def test_draft_larger_than_target_gets_a_warning(pair):
    target, draft = pair
    with pytest.warns(UserWarning, match="more parameters"):
        check_compatibility(draft, target)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_compatibility(target, draft)  # the right order: silent


def test_plugin_refuses_a_prefilled_cache_under_either_name():
    """generate hands the cache to the plug-in under the installed release's name (``cache``
    from transformers 5.24, ``past_key_values`` before): a pre-filled one is refused either way."""
    from specdecode.models import cache_keyword, cache_kwargs, new_cache, returned_cache

    target, draft = make_pair("llama")
    ids = torch.tensor([[3, 4, 5]])
    filled = returned_cache(target(input_ids=ids[:, :2], **cache_kwargs(target, new_cache())))
    keyword = cache_keyword(target)
    with pytest.raises(ValueError, match=f"{keyword}: a pre-filled cache"):
        target.generate(ids, attention_mask=torch.ones_like(ids), custom_generate=custom_generate,
                        draft_model=draft, max_new_tokens=3, do_sample=False, pad_token_id=0,
                        **{keyword: filled})
