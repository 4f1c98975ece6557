"""The data stage's continuations on specdecode's own decode path
(:mod:`specdecode.training.continuations`; the static path on the CPU here):

- greedy continuations equal Hugging Face's greedy ``generate`` token for token (llama, gpt2,
  qwen2; batches of 1, 3 and 17 left-padded prompts of different lengths; EOS in the middle of
  a continuation; extra padding columns and rows);
- sampled continuations follow the target's own law exactly: many seeded batches of 51 rows
  (two prompts of different lengths, interleaved) against the exact joint of three new tokens
  computed from the target's logits at temperature 0.7 (chi-square), and three broken variants
  the same test rejects (temperature not applied, coins shared by the rows of a batch, the batch
  seed ignored);
- a target the static path refuses falls back to Hugging Face generate with a one-line warning;
- bad arguments are refused naming them; the data stage keeps its tokens/s and frees its layouts.
"""

from __future__ import annotations

import itertools
import warnings

import pytest
import torch
from stat_utils import goodness_of_fit, inverse_cdf
from test_generate_models import PAD, _one_thread, make_model  # noqa: F401

import specdecode.engine.static_checks as static_checks
import specdecode.engine.static_state as static_state
import specdecode.training.continuations as continuations
import specdecode.training.data as data
from specdecode.engine.static_layouts import clear_static_sessions, kept_layouts
from specdecode.training.continuations import continue_and_label, continue_prompts, data_decode_path
from specdecode.training.data import DataSettings, DataStats, distill_examples

PASS_P, FAIL_P = 1e-4, 1e-6
V, K, T = 7, 3, 0.7  # the law test: vocabulary, new tokens, temperature
LAW_PROMPTS = ([3, 5, 2, 6, 4], [6, 2])
LAW_BATCH, LAW_BATCHES = 51, 120


@pytest.fixture(autouse=True)
def _fresh_sessions():
    clear_static_sessions()
    yield
    clear_static_sessions()


def _prompts(lengths: list[int], vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


def _hf_greedy(target, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Hugging Face's greedy generate of the left-padded prompts, each cut after its first EOS."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[PAD] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    device = next(target.parameters()).device
    out = target.generate(ids.to(device), attention_mask=mask.to(device), do_sample=False,
                          max_new_tokens=max_new_tokens, pad_token_id=PAD)
    eos = target.generation_config.eos_token_id
    result = []
    for prompt, row in zip(prompts, out[:, width:].tolist()):
        cut = next((i + 1 for i, t in enumerate(row) if t == eos), len(row))
        result.append(prompt + row[:cut])
    return result


# ------------------------------------------------------------------------ greedy identity


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2"])
@pytest.mark.parametrize("batch", [1, 3, 17])
def test_greedy_continuations_equal_hf_generate(arch, batch):
    target = make_model(arch, vocab=96, init=0.08, seed=batch)
    target.generation_config.eos_token_id = None
    settings = DataSettings(max_new_tokens=12, temperature=0.0, batch_size=batch)
    lengths = [1 + (5 * i) % 11 for i in range(batch)]
    prompts = _prompts(lengths, 96, seed=batch)
    free = _hf_greedy(target, prompts, 12)
    # an EOS that the first row reaches in the middle of its continuation
    target.generation_config.eos_token_id = free[0][len(prompts[0]) + 5]
    want = _hf_greedy(target, prompts, 12)
    assert len(want[0]) < len(free[0])
    given = [list(p) for p in prompts]
    assert continue_prompts(target, given, settings, batch_seed=3) == want
    assert given == prompts  # not modified in place
    wider = continue_prompts(target, prompts, settings, batch_seed=3, width=max(lengths) + 6, rows=batch + 2)
    assert wider == want


def test_every_row_ending_early_and_one_token_prompts():
    target = make_model("llama", vocab=40, init=0.08, seed=5)
    target.generation_config.eos_token_id = None
    prompts = [[7], [9], [11, 12]]
    free = _hf_greedy(target, prompts, 10)
    target.generation_config.eos_token_id = free[0][1]  # row 0 ends at its first new token
    settings = DataSettings(max_new_tokens=10, temperature=0.0, batch_size=3)
    assert continue_prompts(target, prompts, settings, 0) == _hf_greedy(target, prompts, 10)


# ------------------------------------------------------------------------ the sampled law


@pytest.fixture(scope="module")
def law_target():
    target = make_model("llama", vocab=V, init=0.3, seed=1)  # peaked, context-dependent rows
    target.generation_config.eos_token_id = None  # every row samples all K tokens
    return target


def exact_joint(target, prompt: list[int]) -> torch.Tensor:
    """The exact law of the first ``K`` new tokens, ``[V ** K]`` float64: products of
    ``softmax(logits / T)`` of the target's own logits, enumerated over every prefix."""
    rows = {}
    with torch.no_grad():
        for n in range(K):
            for prefix in itertools.product(range(V), repeat=n):
                logits = target(torch.tensor([prompt + list(prefix)])).logits[0, -1].double()
                rows[prefix] = torch.softmax(logits / T, -1)
    joint = torch.tensor([float(torch.prod(torch.stack([rows[x[:i]][x[i]] for i in range(K)])))
                          for x in itertools.product(range(V), repeat=K)], dtype=torch.float64)
    assert abs(float(joint.sum()) - 1.0) < 1e-9
    return joint


def sample_counts(target, seeds) -> list[torch.Tensor]:
    """Counts ``[V ** K]`` of each law prompt's continuations over one batch per seed, the
    prompts interleaved in batches of ``LAW_BATCH`` rows."""
    settings = DataSettings(max_new_tokens=K, temperature=T, batch_size=LAW_BATCH)
    prompts = [list(LAW_PROMPTS[i % 2]) for i in range(LAW_BATCH)]
    counts = [torch.zeros(V ** K, dtype=torch.float64) for _ in LAW_PROMPTS]
    for seed in seeds:
        for i, seq in enumerate(continue_prompts(target, prompts, settings, seed)):
            new = seq[len(prompts[i]):]
            assert len(new) == K
            counts[i % 2][sum(t * V ** (K - 1 - j) for j, t in enumerate(new))] += 1
    return counts


def law_pvalues(target) -> list[float]:
    counts = sample_counts(target, range(LAW_BATCHES))
    return [goodness_of_fit(c, exact_joint(target, list(p))).pvalue for c, p in zip(counts, LAW_PROMPTS)]


def test_sampled_continuations_follow_the_targets_law(law_target):
    assert min(law_pvalues(law_target)) > PASS_P


def _break_temperature(monkeypatch):
    """Broken: the continuations are sampled at temperature 1, not the data's temperature."""
    original = continuations._engine_settings
    monkeypatch.setattr(continuations, "_engine_settings",
                        lambda target, temperature, *args: original(target, 1.0, *args))


def _break_row_coins(monkeypatch):
    """Broken: every row of a batch draws its token with the same uniform (coins reused across rows)."""

    def sample(self, logits):
        g = torch.Generator().manual_seed(int(self.philox_seed) + int(self.philox_offset))
        self.philox_offset.add_(1)
        u = torch.rand(1, generator=g, dtype=torch.float64).expand(logits.shape[0])
        return inverse_cdf(torch.softmax(logits.double() / self.sampling.temperature, -1), u)

    monkeypatch.setattr(static_state.StaticState, "sample", sample)


def _break_batch_seed(monkeypatch):
    """Broken: the batch seed is not passed on (every batch draws the same coins)."""
    original = continuations._static_generate
    monkeypatch.setattr(continuations, "_static_generate",
                        lambda target, ids, mask, settings, path, seed: original(target, ids, mask, settings, path, 0))


@pytest.mark.parametrize("broken", ["temperature", "row_coins", "batch_seed"])
def test_broken_continuations_fail_the_same_test(law_target, broken, monkeypatch):
    {"temperature": _break_temperature, "row_coins": _break_row_coins,
     "batch_seed": _break_batch_seed}[broken](monkeypatch)
    assert min(law_pvalues(law_target)) < FAIL_P


def test_a_batch_is_a_function_of_its_seed(law_target):
    settings = DataSettings(max_new_tokens=K, temperature=T, batch_size=3)
    prompts = [list(p) for p in (LAW_PROMPTS[0], LAW_PROMPTS[1], LAW_PROMPTS[0])]
    first = continue_prompts(law_target, prompts, settings, 11)
    continue_prompts(law_target, prompts, settings, 12)  # whatever ran before
    torch.manual_seed(123)  # and whatever the global generator holds
    assert continue_prompts(law_target, prompts, settings, 11) == first
    assert continue_prompts(law_target, prompts, settings, 11, rows=5, width=9) == first  # extra rows, columns
    others = [continue_prompts(law_target, prompts, settings, s) for s in range(13, 19)]
    assert any(o != first for o in others)


# ------------------------------------------------------------------------ fallback and bad input


def test_a_refused_target_falls_back_to_hf_generate_with_a_warning(monkeypatch):
    target = make_model("llama", vocab=50, init=0.08, seed=2)
    settings = DataSettings(max_new_tokens=8, temperature=0.0, batch_size=3)
    prompts = _prompts([4, 2, 6], 50, seed=4)
    monkeypatch.setattr(static_checks.facts, "accepts_custom_4d_mask", lambda model: False)
    with pytest.warns(UserWarning, match="fall back to Hugging Face generate: target: .*custom 4D attention mask"):
        out = continue_prompts(target, prompts, settings, 0)
    assert out == _hf_greedy(target, prompts, 8)
    with pytest.warns(UserWarning, match="fall back"):
        assert data_decode_path(target, settings) == "hf_generate"


def test_a_short_sliding_window_stays_on_the_static_path():
    """Prompt plus continuation longer than the window: the static path (no fallback), each row
    what the model's own generate gives it alone (Hugging Face's padded batch would count the
    padding in the window)."""
    target = make_model("mistral", vocab=50, init=0.08, seed=3, sliding_window=6)
    settings = DataSettings(max_new_tokens=10, temperature=0.0, batch_size=2)
    prompts = _prompts([9, 3], 50, seed=5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning
        out = continue_prompts(target, prompts, settings, 0)
    assert out == [row for prompt in prompts for row in _hf_greedy(target, [prompt], 10)]


def test_bad_arguments_are_named():
    target = make_model("llama", vocab=30, seed=0)
    settings = DataSettings(max_new_tokens=4, temperature=0.0, batch_size=2)
    cases = [
        (dict(prompts=[]), ValueError, "prompts"),
        (dict(prompts=[[3, 4], []]), ValueError, r"prompts\[1\]"),
        (dict(prompts=[[3, "a"]]), ValueError, r"prompts\[0\]"),
        (dict(batch_seed="1"), TypeError, "batch_seed"),
        (dict(decode_path="fast"), ValueError, "decode_path"),
        (dict(decode_path="graphed"), ValueError, "CUDA device"),
        (dict(width=1), ValueError, "width"),
        (dict(rows=1), ValueError, "rows"),
    ]
    with pytest.raises(TypeError, match="settings"):
        continue_prompts(target, [[3, 4]], {"temperature": 0.0}, 0)
    for overrides, error, match in cases:
        kwargs = {"prompts": [[3, 4], [5]], "batch_seed": 0, **overrides}
        if "graphed" in overrides.values():
            # asked for explicitly, the graphed path on the CPU is refused (with the fallback)
            with pytest.warns(UserWarning, match=match):
                continue_prompts(target, settings=settings, **kwargs)
            continue
        with pytest.raises(error, match=match):
            continue_prompts(target, settings=settings, **kwargs)


# ------------------------------------------------------------------------ the data stage


def test_the_data_stage_keeps_its_rates_and_frees_its_layouts(tmp_path, capsys):
    target = make_model("llama", vocab=60, init=0.08, seed=6)
    settings = DataSettings(max_length=16, max_new_tokens=6, batch_size=3, top_k=8, temperature=0.7)
    sequences = _prompts([3, 5, 2, 7, 4], 60, seed=7)
    stats = DataStats()
    examples, batches = distill_examples(target, sequences, True, settings, tmp_path, "hash", stats=stats)
    assert batches == 2 and len(examples) == 5
    assert stats.decode_path == "static" and stats.batches == 2
    # each example: the prompt and every new token but the last (labelled by the decode steps)
    assert stats.generated_tokens == sum(len(e.input_ids) - len(s) + 1 for e, s in zip(examples, sequences)) > 0
    assert stats.labelled_tokens == sum(len(e.input_ids) for e in examples)
    assert stats.generated_per_second > 0 and stats.tokens_per_second > 0
    assert "target tokens generated (static path)" in capsys.readouterr().err
    assert kept_layouts(target) == []  # the stage gave its caches back
    again = DataStats()  # a second run reads the cache: nothing computed, nothing counted
    cached, _ = distill_examples(target, sequences, True, settings, tmp_path, "hash", stats=again, progress=False)
    assert again.batches == 0 and again.tokens_per_second == 0.0
    assert all(torch.equal(a.input_ids, b.input_ids) for a, b in zip(cached, examples))
    with pytest.raises(TypeError, match="stats"):
        distill_examples(target, sequences, True, settings, tmp_path, "hash", stats={})


def test_clearing_one_targets_layouts_keeps_the_others():
    settings = DataSettings(max_new_tokens=3, temperature=0.0, batch_size=2)
    first, second = (make_model("llama", vocab=30, seed=s) for s in (20, 21))
    for target in (first, second):
        continue_prompts(target, [[3, 4], [5]], settings, 0)
    assert len(kept_layouts(first)) == len(kept_layouts(second)) == 1
    clear_static_sessions(first)
    assert kept_layouts(first) == [] and len(kept_layouts(second)) == 1


def test_graphed_stage_batches_share_one_width_and_row_count(tmp_path, monkeypatch):
    """On CUDA every batch is padded to the stage's longest prompt and its batch size (one static
    layout for the stage); checked here through the arguments the stage passes."""
    target = make_model("llama", vocab=60, init=0.08, seed=8)
    settings = DataSettings(max_length=16, max_new_tokens=6, batch_size=3, top_k=8, temperature=0.0)
    sequences = _prompts([3, 5, 2, 7, 4, 12, 2], 60, seed=9)
    shapes = []

    def recording(target, prompts, settings, seed, *, decode_path, **shape):
        shapes.append(shape)
        return continue_and_label(target, prompts, settings, seed, decode_path="static", **shape)

    monkeypatch.setattr(data, "data_decode_path", lambda target, settings: "graphed")
    monkeypatch.setattr(data, "continue_and_label", recording)
    examples, _ = distill_examples(target, sequences, True, settings, tmp_path, "hash", progress=False)
    assert shapes == [dict(width=10, rows=3)] * 3  # 10 = max_length - max_new_tokens, the longest kept
    want = _hf_greedy(target, [s[-10:] for s in sequences], 6)
    assert [e.input_ids.tolist() for e in examples] == [w[:-1] for w in want]  # all new tokens but the last


def test_a_run_records_the_data_stage_rate(tmp_path):
    from specdecode.training import train_drafter
    from specdecode.training.loop import LoopSettings

    target = make_model("llama", vocab=60, init=0.08, seed=10)
    result = train_drafter("draft", target, tmp_path, data=_prompts([4, 6, 3, 5], 60, seed=11), max_steps=1,
                           progress=False, data_settings=DataSettings(max_length=16, max_new_tokens=6, batch_size=2,
                                                                      top_k=8),
                           loop_settings=LoopSettings(batch_size=2, warmup_steps=1))
    t = result.record["training"]
    assert t["data_decode_path"] == "static" and t["data_tokens_per_second"] > 0


# ------------------------------------------------------------------------ CUDA: the graphed path


@pytest.fixture
def cuda() -> torch.device:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    return torch.device("cuda")


@pytest.mark.cuda
@pytest.mark.parametrize("batch", [1, 3, 17])
def test_graphed_greedy_continuations_equal_hf_generate(cuda, batch):
    target = make_model("llama", vocab=96, init=0.08, seed=batch).to(cuda)
    target.generation_config.eos_token_id = None
    settings = DataSettings(max_new_tokens=12, temperature=0.0, batch_size=batch)
    assert data_decode_path(target, settings) == "graphed"
    prompts = _prompts([1 + (5 * i) % 11 for i in range(batch)], 96, seed=batch)
    target.generation_config.eos_token_id = _hf_greedy(target, prompts, 12)[0][len(prompts[0]) + 5]
    want = _hf_greedy(target, prompts, 12)
    assert continue_prompts(target, prompts, settings, batch_seed=3) == want
    assert continue_prompts(target, prompts, settings, batch_seed=3, width=14, rows=batch + 2) == want


@pytest.mark.cuda
def test_graphed_sampled_continuations_follow_the_targets_law(cuda, law_target, monkeypatch):
    import copy

    target = copy.deepcopy(law_target).to(cuda)
    counts = sample_counts(target, range(LAW_BATCHES))
    pvalues = [goodness_of_fit(c, exact_joint(law_target, list(p))).pvalue for c, p in zip(counts, LAW_PROMPTS)]
    assert min(pvalues) > PASS_P
    clear_static_sessions()
    _break_temperature(monkeypatch)
    counts = sample_counts(target, range(LAW_BATCHES))
    pvalues = [goodness_of_fit(c, exact_joint(law_target, list(p))).pvalue for c, p in zip(counts, LAW_PROMPTS)]
    assert min(pvalues) < FAIL_P


@pytest.mark.cuda
def test_a_graphed_stage_replays_one_layout_and_frees_it(cuda, tmp_path, monkeypatch):
    target = make_model("llama", vocab=60, init=0.08, seed=12).to(cuda)
    settings = DataSettings(max_length=16, max_new_tokens=6, batch_size=3, top_k=8, temperature=0.7)
    sequences = _prompts([3, 5, 2, 7, 4, 12, 2], 60, seed=13)
    layouts = []
    original = continuations._static_generate

    def counting(*args):
        out = original(*args)
        layouts.append(len(kept_layouts(target)))
        return out

    monkeypatch.setattr(continuations, "_static_generate", counting)
    stats = DataStats()
    distill_examples(target, sequences, True, settings, tmp_path, "hash", stats=stats, progress=False)
    assert stats.decode_path == "graphed" and layouts == [1, 1, 1]
    assert kept_layouts(target) == []


@pytest.mark.cuda
def test_a_bfloat16_target_continues_on_the_graphed_path(cuda):
    target = make_model("llama", vocab=60, init=0.08, seed=14).to(cuda, torch.bfloat16)
    target.generation_config.eos_token_id = None
    settings = DataSettings(max_new_tokens=8, temperature=0.7, batch_size=5)
    prompts = _prompts([3, 5, 2, 7, 4], 60, seed=15)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback
        out = continue_prompts(target, prompts, settings, 0)
    assert [len(o) - len(p) for o, p in zip(out, prompts)] == [8] * 5
    assert all(o[:len(p)] == p and all(0 <= t < 60 for t in o) for o, p in zip(out, prompts))
    assert continue_prompts(target, prompts, settings, 0) == out
