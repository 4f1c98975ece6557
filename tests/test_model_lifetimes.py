"""Facts and layouts kept about a model live and die with that model.

- The mask probe (:func:`specdecode.models.facts.accepts_custom_4d_mask`) answers for the model
  it probed only: a new model that takes a freed model's ``id()`` is probed afresh (the reuse is
  forced, not hoped for), and a model whose attention implementation changes is probed again.
- The static decode path's kept layouts hold neither the target nor the draft: deleting either
  frees it (checked with weak references), and a freed draft's layouts are dropped.
- A kept layout is reused only while its models' parameters are the same, unchanged tensors.
- The cache keyword (``cache`` / ``past_key_values``) is decided per model class, from the
  signatures along its MRO.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from test_generate_models import PAD, _one_thread, left_padded, make_pair  # noqa: F401

import specdecode
import specdecode.engine.static_layouts as static_layouts
import specdecode.engine.static_loop as static_loop
from specdecode.models import cache_io, facts


class IgnoresMasks(torch.nn.Module):
    """Wraps a causal LM and drops its attention mask: custom 4D masks are not honoured."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.config = inner.config

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.inner.get_input_embeddings()

    def forward(self, *args, **kwargs):
        kwargs["attention_mask"] = None
        return self.inner(*args, **kwargs)


def test_probe_is_not_inherited_through_a_reused_id():
    """Build models one after another, each freed before the next, alternately honouring custom
    masks (their forward is the target's) and ignoring them, until a new model takes the id of a
    freed one that answered the other way: its answer must be its own."""
    target, _ = make_pair("llama")
    answered_at: dict[int, bool] = {}
    for i in range(400):
        model = IgnoresMasks(target)
        honours = i % 2 == 0
        if honours:
            model.forward = target.forward
        address = id(model)
        reused = answered_at.get(address)
        assert facts.accepts_custom_4d_mask(model) == honours
        if reused is not None and reused != honours:
            if not honours:
                with pytest.raises(ValueError, match="custom 4D attention mask"):
                    facts.check_tree_attention(model)
            return
        answered_at[address] = honours
        del model
    pytest.skip("no id was reused by a model of the other kind in 400 models")


def test_probe_runs_once_per_model_and_again_for_a_new_one(monkeypatch):
    calls = []
    probe = facts._probe_tree_attention
    monkeypatch.setattr(facts, "_probe_tree_attention", lambda model: calls.append(model) or probe(model))
    first, _ = make_pair("gpt2")
    assert facts.accepts_custom_4d_mask(first) and facts.accepts_custom_4d_mask(first)
    assert len(calls) == 1
    second, _ = make_pair("gpt2")
    facts.accepts_custom_4d_mask(second)
    assert len(calls) == 2 and calls[1] is second


def test_probe_follows_the_attention_implementation():
    target, _ = make_pair("llama")
    assert facts.accepts_custom_4d_mask(target)
    before = target.config._attn_implementation
    target.config._attn_implementation = "eager" if before != "eager" else "sdpa"
    try:
        assert facts.accepts_custom_4d_mask(target)
        assert len(facts._TREE_MASK_SUPPORT[target]) == 2
    finally:
        target.config._attn_implementation = before


def test_probe_table_forgets_freed_models():
    target, _ = make_pair("qwen2")
    gc.collect()
    before = len(facts._TREE_MASK_SUPPORT)
    facts.accepts_custom_4d_mask(target)
    assert len(facts._TREE_MASK_SUPPORT) == before + 1
    ref = weakref.ref(target)
    del target
    gc.collect()
    assert ref() is None  # the table does not keep the model alive
    assert len(facts._TREE_MASK_SUPPORT) == before  # and its entry left with it


def _static(target, draft, **kwargs):
    ids, mask = left_padded([4, 6], seed=3)
    return specdecode.generate(target, draft, ids, mask, decode_path="static", max_new_tokens=6,
                               pad_token_id=PAD, **kwargs)


def test_static_layouts_do_not_keep_models_alive():
    target, draft = make_pair("llama")
    _static(target, draft, num_draft_tokens=3)
    _static(target, None)
    assert len(static_layouts.kept_layouts(target)) == 2
    target_ref, draft_ref = weakref.ref(target), weakref.ref(draft)
    del target, draft
    gc.collect()
    assert target_ref() is None and draft_ref() is None
    assert all(ref is not target_ref for ref in static_layouts._LAYOUTS.keyrefs())


def test_a_freed_drafts_layouts_are_dropped():
    target, draft = make_pair("gpt2")
    _, other = make_pair("gpt2", seed=1)
    _static(target, draft, num_draft_tokens=2)
    _static(target, other, num_draft_tokens=2)
    assert len(static_layouts.kept_layouts(target)) == 2
    draft_ref = weakref.ref(draft)
    del draft
    gc.collect()
    assert draft_ref() is None
    assert len(static_layouts.kept_layouts(target)) == 1
    static_loop.clear_static_sessions()


def test_layout_is_rebuilt_when_weights_are_replaced():
    target, draft = make_pair("llama")
    first = _static(target, draft, num_draft_tokens=2).sequences
    (layout,) = static_layouts.kept_layouts(target)
    again = _static(target, draft, num_draft_tokens=2).sequences
    assert torch.equal(first, again)
    assert list(static_layouts.kept_layouts(target)) == [layout]  # same weights: reused
    with torch.no_grad():
        for param in target.parameters():
            param.data = param.data * 1.5  # same Parameter objects, new storage
    replaced = _static(target, draft, num_draft_tokens=2).sequences
    (rebuilt,) = static_layouts.kept_layouts(target)
    assert rebuilt is not layout
    ids, mask = left_padded([4, 6], seed=3)
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=6, pad_token_id=PAD)
    assert torch.equal(replaced, expected)
    static_loop.clear_static_sessions()


class _Old(torch.nn.Module):
    def forward(self, input_ids=None, past_key_values=None, use_cache=None):  # an older release's spelling
        return input_ids


class _New(torch.nn.Module):
    def forward(self, input_ids=None, cache=None, past_key_values=None, use_cache=None):
        return input_ids


class _Wrapper(_New):
    def forward(self, *args, **kwargs):  # wraps its parent: takes the parent's spelling
        return super().forward(*args, **kwargs)


class _Neither(torch.nn.Module):
    def forward(self, *args, **kwargs):  # passes everything on: the installed transformers' spelling
        return None


@pytest.mark.parametrize("cls, keyword", [(_Old, "past_key_values"), (_New, "cache"), (_Wrapper, "cache"),
                                          (_Neither, None)])
def test_cache_keyword_per_class(cls, keyword):
    if keyword is None:
        import inspect

        from transformers import LlamaForCausalLM

        keyword = "cache" if "cache" in inspect.signature(LlamaForCausalLM.forward).parameters else "past_key_values"
    model = cls()
    assert cache_io.cache_keyword(model) == keyword
    assert cache_io.cache_kwargs(model, "C") == {keyword: "C", "use_cache": True}


def test_cache_keyword_of_installed_transformers():
    import inspect

    from transformers import LlamaForCausalLM

    target, _ = make_pair("llama")
    taken = inspect.signature(LlamaForCausalLM.forward).parameters
    expected = "cache" if "cache" in taken else "past_key_values"
    assert cache_io.cache_keyword(target) == expected
    out = target(input_ids=torch.tensor([[1, 2]]), **cache_io.cache_kwargs(target, specdecode.models.new_cache()))
    assert cache_io.returned_cache(out).get_seq_length() == 2
    with pytest.raises(ValueError, match="output"):
        cache_io.returned_cache(object())
