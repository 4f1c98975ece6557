"""The ``"auto"`` draft schedule (:class:`AdaptiveSchedule`) and plain steps (gamma 0) on the eager
path: the choice from measured costs, exactness when a generation switches between gamma 0 and
gamma > 0 (greedy: the target's output; sampling: an exact chi-square test, and a broken plain
step that the same test rejects), and the choices in the statistics."""

from __future__ import annotations

import pytest
import torch
from test_drafter_eagle import eagle, target_model
from test_drafters import hf_greedy
from test_generate_models import PAD, _one_thread, left_padded, make_pair  # noqa: F401
from test_generate_sampling import K, N, PROMPT, chi_square_p, exact_joint
from test_generate_sampling import pair as sampling_pair  # noqa: F401

import specdecode
import specdecode.engine.loop as engine_loop
from specdecode import ModelDrafter
from specdecode.engine.schedules import AdaptiveSchedule, DraftSchedule, default_schedule, make_schedule
from specdecode.engine.stats import SpeculativeStats
from specdecode.sampling import SamplingParams

PASS_P, FAIL_P = 1e-4, 1e-6
pytestmark = pytest.mark.auto_schedule  # generate's real default schedule (conftest.py pins it elsewhere)


class Scripted(DraftSchedule):
    """Gammas from a list, one per step (the last one repeated): switches between 0 and > 0."""

    name = "scripted"

    def __init__(self, gammas: list[int]) -> None:
        super().__init__(max(max(gammas), 1))
        self.gammas, self.step = list(gammas), 0

    def plan(self, *, batch_size, stats):
        gamma = self.gammas[min(self.step, len(self.gammas) - 1)]
        self.step += 1
        return gamma


def _stats(accepted=(6, 4, 2), reached=(10, 6, 4), rejections=8) -> SpeculativeStats:
    return SpeculativeStats(position_accepted=list(accepted), position_reached=list(reached),
                            accepted_tokens=sum(accepted), rejections=rejections)


def _seeded(target_ms: dict[int, float], draft_ms: float = 1.0, other_ms: float = 0.5, batch: int = 8,
            schedule: AdaptiveSchedule | None = None) -> AdaptiveSchedule:
    schedule = schedule or AdaptiveSchedule(3)
    for n, ms in target_ms.items():
        for _ in range(3):
            schedule.observe(batch, n - 1, target_seconds=ms / 1e3, draft_seconds=(n - 1) * draft_ms / 1e3,
                             other_seconds=other_ms / 1e3)
    return schedule


# --------------------------------------------------------------------------- the choice


def test_explores_a_drafting_then_a_plain_step_per_batch_size():
    schedule, stats = AdaptiveSchedule(3), _stats()
    assert schedule.plan(batch_size=4, stats=stats) == 3  # nothing timed: today's gamma
    schedule.observe(4, 3, target_seconds=0.02, draft_seconds=0.003, other_seconds=0.001)
    assert schedule.plan(batch_size=4, stats=stats) == 0  # then a plain step
    assert schedule.plan(batch_size=5, stats=stats) == 3  # another batch size is timed on its own


def test_chooses_from_the_measured_costs():
    stats = _stats()
    flat = _seeded({1: 10.0, 4: 11.0})  # a verify call costs about one step: draft the most
    assert flat.plan(batch_size=8, stats=stats) == 3
    steep = _seeded({1: 10.0, 4: 40.0})  # each scored token costs a step: no draft
    assert steep.plan(batch_size=8, stats=stats) == 0
    assert stats.schedule_rates[8][0] == max(stats.schedule_rates[8])
    middle = _seeded({1: 10.0, 2: 11.0, 4: 40.0})  # one draft nearly free, more expensive
    assert middle.plan(batch_size=8, stats=stats) == 1
    # per batch size: the flat costs at batch 1 keep the full draft there
    both = _seeded({1: 10.0, 4: 11.0}, batch=1, schedule=_seeded({1: 10.0, 4: 40.0}))
    assert both.plan(batch_size=1, stats=stats) == 3 and both.plan(batch_size=8, stats=stats) == 0


def test_low_acceptance_turns_drafting_off():
    schedule = _seeded({1: 10.0, 4: 12.0}, draft_ms=2.0)
    assert schedule.plan(batch_size=8, stats=_stats()) > 0
    never = _stats(accepted=(0, 0, 0), reached=(200, 0, 0), rejections=200)
    assert schedule.plan(batch_size=8, stats=never) == 0


def test_probes_a_drafting_step_while_plain_steps_win():
    schedule, stats = _seeded({1: 10.0, 4: 40.0}), _stats()
    schedule.probe_every = 3
    gammas = [schedule.plan(batch_size=8, stats=stats) for _ in range(6)]
    assert gammas.count(0) == 4 and gammas[2] > 0 and gammas[5] > 0


def test_expected_tokens_follow_the_acceptance_by_position():
    stats = _stats(accepted=(10, 5), reached=(10, 10), rejections=5)
    one, two = (AdaptiveSchedule.expected_tokens(g, stats) for g in (1, 2))
    assert AdaptiveSchedule.expected_tokens(0, stats) == 1.0
    assert 1.8 < one < 2.0 and 2.2 < two < 2.5


def test_names_defaults_and_bad_arguments():
    schedule = make_schedule("auto", 4)
    assert isinstance(schedule, AdaptiveSchedule) and schedule.maximum == 4
    assert make_schedule("auto", 4, 9).maximum == 9
    greedy, sampled = SamplingParams(temperature=0.0), SamplingParams(temperature=1.0)
    assert default_schedule("eager", greedy, torch.Generator()) == "auto"
    assert default_schedule("eager", sampled, None) == "auto"
    assert default_schedule("eager", sampled, torch.Generator()) == "constant"  # a seed fixes the output
    assert default_schedule("static", greedy, None) == "constant"
    for kwargs, name in (({"window": 0}, "window"), ({"probe_every": 1.5}, "probe_every"),
                         ({"margin": 0.5}, "margin"), ({"margin": True}, "margin")):
        with pytest.raises(ValueError, match=name):
            AdaptiveSchedule(3, **kwargs)
    with pytest.raises(ValueError, match="draft_schedule"):
        make_schedule("adaptive", 3)


# --------------------------------------------------------------------------- greedy


@pytest.mark.parametrize("kind", ["model", "eagle"])
@pytest.mark.parametrize("gammas", [[0, 3, 0, 0, 2], [3, 0, 1, 0], "auto"])
def test_greedy_equals_the_target_when_switching(kind, gammas):
    if kind == "model":
        target, draft = make_pair("llama", vocab=111, seed=4)
        drafter = ModelDrafter(draft)
    else:
        target = target_model("llama", seed=4)
        drafter = eagle(target)
    one = left_padded([7], vocab=111, seed=2)[0]
    ids, mask = left_padded([5, 9, 2], vocab=111, seed=3)
    for prompt, prompt_mask in ((one, None), (ids, mask)):
        schedule = AdaptiveSchedule(3) if gammas == "auto" else Scripted(gammas)
        out = specdecode.generate(target, drafter, prompt, prompt_mask, num_draft_tokens=3, max_new_tokens=14,
                                  draft_schedule=schedule)
        assert torch.equal(out.sequences, hf_greedy(target, prompt, prompt_mask, max_new_tokens=14))
        s = out.stats
        assert len(s.planned_num_draft_tokens) == s.steps == len(s.num_draft_tokens_history)
        assert s.plain_steps == s.num_draft_tokens_history.count(0) > 0 and max(s.num_draft_tokens_history) > 0
        if gammas == "auto":
            # a drafting step is timed first (again when the first was also the prompt's prefill), then a plain one
            assert s.planned_num_draft_tokens[0] == 3 and 0 in s.planned_num_draft_tokens[1:3]


def test_the_default_is_auto_on_the_eager_path_and_shown():
    target, draft = make_pair("llama", vocab=111, seed=4)
    ids, mask = left_padded([5, 9, 2], vocab=111, seed=3)
    out = specdecode.generate(target, draft, ids, mask, num_draft_tokens=3, max_new_tokens=12)
    assert out.stats.draft_schedule == "auto" and out.stats.planned_num_draft_tokens[0] == 3
    assert 0 in out.stats.planned_num_draft_tokens[1:3]
    assert "plain (gamma 0)" in str(out.stats) and "auto schedule" in str(out.stats)
    assert out.stats.to_dict()["plain_steps"] == out.stats.plain_steps >= 1
    seeded = specdecode.generate(target, draft, ids, mask, num_draft_tokens=3, max_new_tokens=6, do_sample=True,
                                 generator=torch.Generator().manual_seed(0))
    assert seeded.stats.draft_schedule == "constant"
    static = specdecode.generate(target, draft, ids, mask, num_draft_tokens=3, max_new_tokens=6,
                                 decode_path="static")
    assert static.stats.draft_schedule == "constant"
    assert torch.equal(static.sequences, hf_greedy(target, ids, mask, max_new_tokens=6))


# --------------------------------------------------------------------------- sampling


def _sample(target, drafter, schedule):
    ids = torch.tensor([PROMPT]).expand(N, -1)
    out = specdecode.generate(target, drafter, ids, num_draft_tokens=2, do_sample=True, max_new_tokens=K,
                              eos_token_id=[], pad_token_id=PAD, draft_schedule=schedule,
                              generator=torch.Generator().manual_seed(5))
    assert out.sequences.shape == (N, len(PROMPT) + K)
    return out


@pytest.mark.parametrize("kind,gammas", [("model", [0, 2]), ("model", "auto"), ("eagle", [0, 2]),
                                         ("eagle", [2, 0])])
def test_sampling_is_exact_when_switching(sampling_pair, kind, gammas):
    target, draft = sampling_pair
    joint = exact_joint(target, PROMPT)
    drafter = ModelDrafter(draft) if kind == "model" else eagle(target, seed=1)
    out = _sample(target, drafter, AdaptiveSchedule(2) if gammas == "auto" else Scripted(gammas))
    history = out.stats.num_draft_tokens_history
    assert 0 in history and max(history) > 0 and out.stats.drafted_tokens > 0
    assert chi_square_p(out.sequences[:, len(PROMPT):], joint) > PASS_P


def test_a_broken_plain_step_fails_the_same_test(sampling_pair, monkeypatch):
    """Broken: a plain step emits the target's argmax instead of a sample."""
    target, draft = sampling_pair
    joint = exact_joint(target, PROMPT)
    monkeypatch.setattr(engine_loop, "sample_logits", lambda logits, sampling, uniforms=None: logits.argmax(-1))
    out = _sample(target, ModelDrafter(draft), Scripted([0, 2]))
    assert chi_square_p(out.sequences[:, len(PROMPT):], joint) < FAIL_P
