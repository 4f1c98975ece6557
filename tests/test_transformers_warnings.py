"""No deprecation warning from transformers is caused by the project's own calls.

Every generation path runs once with all warnings recorded (``always``: a warning shown earlier
in the session is shown again) and transformers' "warn once" log cache emptied, so a renamed
argument or output field fails here on the day a release deprecates it. Covered: the eager chain
loop, token trees, the static path, ``custom_generate``, the target alone, every drafter that
runs a model (``ModelDrafter``, ``LayerSkipDrafter``, ``NgramDrafter``), and the demo's own
measurements (decode step time, acceptance estimate).
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from typing import Iterator

import pytest
import torch
from test_generate_models import PAD, _one_thread, left_padded, make_pair  # noqa: F401

import specdecode

DEPRECATION_WORDS = ("deprecat", "will be removed", "is no longer")


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def deprecations() -> Iterator[list[str]]:
    """Collects the deprecation messages (warnings of any category, and transformers' log
    records) raised inside the block."""
    from transformers.utils import logging as hf_logging

    found: list[str] = []
    once = getattr(logging.Logger, "warning_once", None)
    if hasattr(once, "cache_clear"):
        once.cache_clear()  # transformers logs some deprecations once per process
    handler = _Records()
    root = hf_logging.get_logger("transformers")
    root.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield found
    finally:
        root.removeHandler(handler)
    messages = [str(w.message) for w in caught] + handler.messages
    found.extend(m for m in messages if any(word in m.lower() for word in DEPRECATION_WORDS))


def _run_paths(target, draft, ids, mask) -> None:
    common = dict(max_new_tokens=6, pad_token_id=PAD)
    specdecode.generate(target, draft, ids, mask, num_draft_tokens=3, **common)
    specdecode.generate(target, draft, ids, mask, num_draft_tokens=3, do_sample=True, temperature=1.0,
                        generator=torch.Generator().manual_seed(0), **common)
    specdecode.generate(target, draft, ids, mask, tree="dynamic", num_nodes=6, **common)
    specdecode.generate(target, draft, ids, mask, num_draft_tokens=2, decode_path="static", **common)
    specdecode.generate(target, draft, ids, mask, tree="dynamic", num_nodes=6, tree_depth=3, decode_path="static",
                        **common)
    specdecode.generate(target, None, ids, mask, decode_path="static", **common)
    specdecode.generate(target, specdecode.LayerSkipDrafter(target, 1), ids, mask, num_draft_tokens=2, **common)
    specdecode.generate(target, specdecode.NgramDrafter(), ids, mask, num_draft_tokens=2, **common)
    target.generate(ids, attention_mask=mask, custom_generate=specdecode.custom_generate, draft_model=draft,
                    num_draft_tokens=2, do_sample=False, **common)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_generation_paths_raise_no_deprecation(arch):
    target, draft = make_pair(arch)
    ids, mask = left_padded([4, 6], seed=2)
    with deprecations() as found:
        _run_paths(target, draft, ids, mask)
    assert found == [], f"transformers deprecations raised by the project's calls: {sorted(set(found))}"


def test_demo_measurements_raise_no_deprecation():
    from specdecode.demo import decode_step_seconds, demo_prompts
    from specdecode.demo.acceptance import estimate_acceptance

    target, draft, tok = specdecode.load_demo_pair()
    with deprecations() as found:
        decode_step_seconds(target, context_len=8, steps=2, warmup=1, repeats=1)
        estimate_acceptance(target, draft, tok, [p[-80:] for p in demo_prompts(1)], max_new_tokens=4)
    assert found == [], f"transformers deprecations raised by the project's calls: {sorted(set(found))}"


def test_the_check_sees_a_deprecated_spelling():
    """The check is not blind: the old cache keyword, where the installed transformers has
    renamed it, is reported."""
    import inspect

    target, _ = make_pair("llama")
    if "cache" not in inspect.signature(type(target).forward).parameters:
        pytest.skip("this transformers release still takes past_key_values= (no rename to detect)")
    with deprecations() as found:
        target(input_ids=torch.tensor([[1, 2]]), past_key_values=specdecode.models.new_cache(), use_cache=True)
    assert found
