"""Shared pytest setup of the specdecode test suite.

- ``tests/`` is put on ``sys.path`` so every test file can ``import stat_utils``.
- ``user_rules``: registers PyTorch rules for one test and always unregisters them afterwards,
  so a failing test cannot leak a rule into the registry of the next one.
- ``rng``: a seeded ``torch.Generator`` (CPU) for tests that need random data.
- Without an explicit ``draft_schedule``, generations run the constant schedule (the default,
  ``"auto"``, times its steps); tests marked ``auto_schedule`` run the real default.
- torch runs intra-op work on ONE thread during the tests (override with the environment
  variable ``SPECDECODE_TEST_THREADS``): the tests use many small tensors, and on a small
  shared machine intra-op threads spin against other processes (measured 10-20x slower with 2
  threads under load). test_reference_equality checks that the compiled ops give identical
  results with several threads.

No CUDA query happens at import time; CUDA tests select themselves with the ``cuda`` marker.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if TESTS_DIR not in sys.path:
    sys.path.insert(0, TESTS_DIR)


def pytest_configure(config):
    torch.set_num_threads(int(os.environ.get("SPECDECODE_TEST_THREADS", "1")))
    config.addinivalue_line("markers", "auto_schedule: runs generate's real default draft schedule ('auto')")


@pytest.fixture(autouse=True)
def _constant_default_schedule(request, monkeypatch):
    """The default draft schedule (``"auto"``) picks gammas from wall-clock timings, so counts of
    steps, drafts and acceptances would vary with the machine's load: without an explicit
    ``draft_schedule``, tests run the constant one, except those marked ``auto_schedule``
    (tests/test_schedule_adaptive.py tests the real default)."""
    if request.node.get_closest_marker("auto_schedule") is None:
        import importlib

        for name in ("specdecode.integrations.hf.generate", "specdecode.integrations.hf.plugin"):
            monkeypatch.setattr(importlib.import_module(name), "default_schedule", lambda *args: "constant")


@pytest.fixture
def rng() -> torch.Generator:
    """A CPU generator with a fixed seed: every test that uses it is deterministic."""
    return torch.Generator().manual_seed(1234)


@pytest.fixture
def user_rules():
    """``register(name, fn, **kwargs)`` -> RuleInfo; every name registered through it is
    removed from the registry when the test ends, pass or fail."""
    import specdecode

    names: list[str] = []

    def register(name, fn, **kwargs):
        info = specdecode.register_rule(name, fn, **kwargs)
        names.append(name)
        return info

    yield register
    registered = {r.name for r in specdecode.list_rules() if not r.builtin}
    for name in names:
        if name in registered:
            specdecode.unregister_rule(name)
            registered.discard(name)
