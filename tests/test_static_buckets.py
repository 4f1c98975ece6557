"""Bucketed attention widths (:mod:`specdecode.engine.attention_widths`): a chain step of the
static and graphed paths attends over the columns a row can have reached, rounded up to a
bucket, and the graphed path keeps one recording per bucket reached.

- the buckets: at most 8 per layout, multiples of 64 columns, the capacity last, never below
  the bound;
- the static path with the real buckets (64 columns), prompts that cross a bucket edge during
  the generation: greedy output equals the target's own ``generate`` (batch 1, a left-padded
  batch of 3; a draft model and the target alone), every step's keys as wide as its bucket;
- the exact whole-loop sampling test with small buckets (every step another width), which a
  width one bucket short (a bound that cuts a column a row can have reached) fails;
- :class:`~specdecode.engine.graphs.StepProgram` with a fake CUDA graph class (monkeypatched
  here, in the test only): one recording per variant, made the first time it runs (captures
  counted; one memory pool), later runs replay it, and what the host reads between steps is
  always the last step's result (after a recording: the warm-up's; after a replay: the replayed
  variant's), which a program that does not restore its owners' attributes fails.

The graphed path itself on a GPU: tests/test_cuda_static.py.
"""

from __future__ import annotations

import pytest
import torch
from test_generate_models import PAD, _one_thread, left_padded, make_pair  # noqa: F401
from test_generate_sampling import K, PROMPT, chi_square_p, exact_joint
from test_static_generate import FAIL_P, PASS_P, pair  # noqa: F401

import specdecode.engine.attention_widths as attention_widths
import specdecode.engine.graphs as graphs
import specdecode.engine.static_loop as static_loop
from specdecode import generate
from specdecode.engine.attention_widths import (attended_columns, bucket_columns, bucket_widths, bucketed_width,
                                                visible_columns)
from specdecode.engine.static_state import StepScratch
from specdecode.models.static_cache import ColumnCache


@pytest.fixture(autouse=True)
def _fresh_sessions():
    static_loop.clear_static_sessions()
    yield
    static_loop.clear_static_sessions()


@pytest.mark.parametrize("capacity", [1, 16, 63, 64, 65, 111, 200, 512, 513, 1025, 4096, 10007])
def test_buckets_are_few_multiples_of_64_and_cover_the_bound(capacity):
    widths = bucket_widths(capacity)
    assert 1 <= len(widths) <= attention_widths.MAX_BUCKETS and widths[-1] == capacity
    assert widths == sorted(set(widths)) and all(w % 64 == 0 for w in widths[:-1])
    assert all(w % bucket_columns(capacity) == 0 for w in widths[:-1])
    for gamma in (0, 1, 4):
        for prompt_width in {1, min(capacity, 9), capacity}:
            for step in range(0, capacity, 7):
                bound = visible_columns(prompt_width, step, gamma, capacity)
                width = attended_columns(prompt_width, step, gamma, capacity)
                assert width in widths and bound <= width and width - bound < bucket_columns(capacity)
    assert bucketed_width(capacity, capacity) == capacity


@pytest.mark.parametrize("capacity", [0, -3, 2.5, True, "64"])
def test_a_bad_capacity_is_refused(capacity):
    with pytest.raises(ValueError, match="capacity"):
        bucket_columns(capacity)


def _record_widths(monkeypatch, num_columns: int) -> tuple[list[int], list[object]]:
    """The key length of every forward of the target cache (layer 0) that feeds ``num_columns``
    columns, and the variant every step program was run with."""
    keys, variants = [], []
    update, run = ColumnCache.update, graphs.StepProgram.run

    def recording_update(self, key_states, value_states, layer_idx, *args, **kwargs):
        out = update(self, key_states, value_states, layer_idx, *args, **kwargs)
        if layer_idx == 0 and key_states.shape[2] == num_columns:
            keys.append(out[0].shape[2])
        return out

    def recording_run(self, variant=None):
        if "target prefill" not in self.seconds:
            variants.append(variant)
        return run(self, variant)

    monkeypatch.setattr(ColumnCache, "update", recording_update)
    monkeypatch.setattr(graphs.StepProgram, "run", recording_run)
    return keys, variants


@pytest.mark.parametrize("gamma", [0, 3])
@pytest.mark.parametrize("lengths", [[45], [45, 38, 52]])
def test_static_greedy_across_bucket_edges_equals_the_target(gamma, lengths, monkeypatch):
    """Prompts of about 45 tokens and 30 new ones: the steps start in the 64-column bucket and
    end in the next (the capacity), each step's keys exactly its bucket's width."""
    target, draft = make_pair("llama", vocab=111)
    ids, mask = left_padded(lengths, vocab=111, seed=5)
    mask = mask if len(lengths) > 1 else None
    new = 30
    want = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=new, pad_token_id=PAD,
                           eos_token_id=None)
    keys, variants = _record_widths(monkeypatch, gamma + 1)
    out = generate(target, draft if gamma else None, ids, mask, num_draft_tokens=max(gamma, 1), max_new_tokens=new,
                   eos_token_id=[], pad_token_id=PAD, decode_path="static")
    assert torch.equal(out.sequences, want)
    prompt_width = ids.shape[1] + 1
    capacity = -(-(prompt_width + new + gamma + 1) // static_loop.CAPACITY_MULTIPLE) * static_loop.CAPACITY_MULTIPLE
    assert variants == keys == [attended_columns(prompt_width, s, gamma, capacity) for s in range(len(keys))]
    assert sorted(set(keys)) == bucket_widths(capacity) == [64, capacity]  # both buckets reached
    if gamma:
        assert out.stats.accepted_tokens > 0 and out.stats.rejections > 0


def _sample(target, draft, seed=0):
    ids = torch.tensor([PROMPT]).expand(20000, -1)
    out = generate(target, draft, ids, num_draft_tokens=2, rule="token", do_sample=True, max_new_tokens=K,
                   eos_token_id=[], pad_token_id=PAD, generator=torch.Generator().manual_seed(seed),
                   decode_path="static")
    return out.sequences[:, len(PROMPT):]


def test_sampling_with_bucketed_widths_is_lossless_and_a_width_one_bucket_short_fails(pair, monkeypatch):
    """Buckets of 4 columns on a 16-column layout: the three steps attend over 8, 12 and 16
    columns (the bound: 7, 10, 13), so every step attends over columns no row has reached, which
    the mask must hide; one bucket short (4, 8, 12) cuts columns a row can need."""
    target, draft = pair
    monkeypatch.setattr(attention_widths, "BUCKET_COLUMNS", 4)
    assert [attended_columns(len(PROMPT) + 1, s, 2, 16) for s in range(3)] == [8, 12, 16]
    joint = exact_joint(target, PROMPT)
    assert chi_square_p(_sample(target, draft), joint) > PASS_P
    static_loop.clear_static_sessions()
    original = static_loop.attended_columns
    monkeypatch.setattr(static_loop, "attended_columns",
                        lambda *args: original(*args) - attention_widths.bucket_columns(args[3]))
    assert chi_square_p(_sample(target, draft), joint) < FAIL_P


# ------------------------------------------------------------------------ a fake CUDA graph


class _FakeGraph:
    """Records the kernels launched while it captures (running none of them); replays them."""

    capturing: "_FakeGraph | None" = None

    def __init__(self) -> None:
        self.kernels: list = []

    def replay(self) -> None:
        for kernel in self.kernels:
            kernel()


def _launch(kernel) -> None:
    """A kernel of a test phase: run now, or recorded (not run) while a fake graph captures."""
    if _FakeGraph.capturing is None:
        kernel()
    else:
        _FakeGraph.capturing.kernels.append(kernel)


class _FakeCuda:
    """What :class:`StepProgram` uses of ``torch.cuda``, without a device."""

    def __init__(self, monkeypatch) -> None:
        self.pools: list[object] = []
        self.handles = 0
        fake = self

        class Capture:
            def __init__(self, graph, pool=None):
                self.graph = graph
                fake.pools.append(pool)

            def __enter__(self):
                _FakeGraph.capturing = self.graph

            def __exit__(self, *exc):
                _FakeGraph.capturing = None

        class Stream:
            def __init__(self, *args, **kwargs):
                pass

            def wait_stream(self, other):
                pass

        class Event:
            def __init__(self, *args, **kwargs):
                pass

            def record(self):
                pass

            def elapsed_time(self, other):
                return 0.0

        def pool_handle():
            fake.handles += 1
            return object()

        class NoStream:
            def __init__(self, stream):
                pass

            def __enter__(self):
                pass

            def __exit__(self, *exc):
                pass

        for name, value in (("CUDAGraph", _FakeGraph), ("graph", Capture), ("graph_pool_handle", pool_handle),
                            ("Stream", Stream), ("stream", NoStream), ("current_stream", lambda device=None: Stream()),
                            ("Event", Event)):
            monkeypatch.setattr(torch.cuda, name, value)


def _program(phase_timing: bool):
    """A step of two phases over a persistent counter ``x``: ``score`` produces
    ``x * 1000 + width`` as ``scratch.accepted`` (a new tensor, as a phase does), ``commit``
    advances ``x``; the host reads ``scratch.accepted`` before each step."""
    x = torch.zeros(1)
    scratch = StepScratch()
    width = {"now": 0}
    reads: list[float | None] = []

    def score() -> None:
        w = width["now"]
        out = torch.full((1,), float("nan"))
        _launch(lambda: out.copy_(x * 1000 + w))
        scratch.accepted = out

    def commit() -> None:
        _launch(lambda: x.add_(1))

    def host() -> None:
        reads.append(None if scratch.accepted is None else float(scratch.accepted))

    program = graphs.StepProgram([("target", score), ("bookkeeping", commit)], torch.device("cuda"), graphed=True,
                                 phase_timing=phase_timing, host=host, owners=(scratch,))
    return program, width, reads


# two generations of one layout: the second starts again in the first bucket
WIDTHS = [64, 64, 128, 128, 128, 64, 64, 128, 192]


def _run(program, width, reads, widths=WIDTHS):
    for w in widths:
        width["now"] = w
        program.run(w)
    program.host()  # what the host reads after the last step
    return reads


@pytest.mark.parametrize("phase_timing", [False, True])
def test_step_program_records_one_graph_per_variant_and_restores_its_outputs(phase_timing, monkeypatch):
    fake = _FakeCuda(monkeypatch)
    program, width, reads = _program(phase_timing)
    want = [None] + [step * 1000 + w for step, w in enumerate(WIDTHS)]
    assert _run(program, width, reads) == want
    assert program.captures == 3 and sorted(program.recorded) == [64, 128, 192]
    assert fake.handles == 1 and len(fake.pools) == 3 * (2 if phase_timing else 1)
    assert len({id(pool) for pool in fake.pools}) == 1  # one pool shared by every recording
    assert program.variant == 192 and len(program.graphs) == (2 if phase_timing else 1)
    program.collect_timings()
    before = program.captures
    width["now"] = 64
    program.run(64)  # a later generation: replayed
    assert program.captures == before and float(program.owners[0].accepted) == len(WIDTHS) * 1000 + 64


def test_without_restoring_its_outputs_the_host_reads_another_variants_tensors(monkeypatch):
    _FakeCuda(monkeypatch)
    monkeypatch.setattr(graphs.StepProgram, "_restore", lambda self, snapshot: None)
    program, width, reads = _program(False)
    want = [None] + [step * 1000 + w for step, w in enumerate(WIDTHS)]
    got = _run(program, width, reads)
    assert got != want and program.captures == 3
