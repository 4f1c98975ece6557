"""The ablation helper (rules x prompts x seeds -> one table whose rows carry their settings,
per-position and per-step statistics, and the mean with its spread across seeds), and the
example script that reproduces the rules' tokens per call with exact-test verdicts."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from test_generate_models import make_pair

from specdecode.ablation import ablate

ROOT = Path(__file__).resolve().parent.parent


def _prompts():
    gen = torch.Generator().manual_seed(4)
    return [torch.randint(3, 60, (1, n), generator=gen) for n in (5, 7)]


def test_one_table_with_settings_and_spread():
    target, draft = make_pair("llama")
    configs = ["token", {"rule": "typical", "epsilon": 0.2, "label": "typ"}]
    table = ablate(target, draft, _prompts(), configs=configs, seeds=[0, 1], max_new_tokens=6, pad_token_id=0,
                   num_draft_tokens=3, output="records")
    runs = [r for r in table if r["kind"] == "run"]
    summaries = [r for r in table if r["kind"] == "summary"]
    assert len(runs) == 2 * 2 * 2 and [s["config"] for s in summaries] == ["token", "typ"]
    typical = [r for r in runs if r["config"] == "typ"]
    assert all(r["rule"] == "typical" and r["rule_options"] == {"epsilon": 0.2} for r in typical)
    assert {(r["prompt"], r["seed"]) for r in typical} == {(0, 0), (0, 1), (1, 0), (1, 1)}
    for r in runs:
        assert r["sampling"]["temperature"] == 1.0 and r["num_draft_tokens"] == 3
        assert len(r["accepted_lengths"]) == r["steps"] and len(r["acceptance_by_position"]) <= 3
    s = summaries[1]
    per_seed = [sum(r["new_tokens"] for r in typical if r["seed"] == seed)
                / sum(r["row_steps"] for r in typical if r["seed"] == seed) for seed in (0, 1)]
    assert s["tokens_per_call_per_seed"] == pytest.approx(per_seed)
    assert s["tokens_per_call"] == pytest.approx(sum(per_seed) / 2)
    assert s["tokens_per_call_std"] == pytest.approx(abs(per_seed[0] - per_seed[1]) / 2 ** 0.5)
    again = ablate(target, draft, _prompts(), configs=configs, seeds=[0, 1], max_new_tokens=6, pad_token_id=0,
                   num_draft_tokens=3, output="records")
    assert [r["accepted_lengths"] for r in again if r["kind"] == "run"] == [r["accepted_lengths"] for r in runs]


def test_dataframe_when_pandas_is_there(monkeypatch):
    target, draft = make_pair("llama")
    fake = types.ModuleType("pandas")
    fake.DataFrame = lambda rows: ("frame", rows)
    monkeypatch.setitem(sys.modules, "pandas", fake)
    kind, rows = ablate(target, draft, _prompts()[:1], configs=["token"], seeds=[0], max_new_tokens=3, pad_token_id=0)
    assert kind == "frame" and [r["kind"] for r in rows] == ["run", "summary"]
    monkeypatch.setitem(sys.modules, "pandas", None)  # not installed
    rows = ablate(target, draft, _prompts()[:1], configs=["token"], seeds=[0], max_new_tokens=3, pad_token_id=0)
    assert isinstance(rows, list)
    with pytest.raises(ImportError, match="pandas"):
        ablate(target, draft, _prompts()[:1], configs=["token"], seeds=[0], max_new_tokens=3, output="dataframe")


@pytest.mark.parametrize("kwargs,message", [
    (dict(configs="token"), "configs"), (dict(configs=[3]), r"configs\[0\]"), (dict(seeds=[]), "seeds"),
    (dict(prompts=["text"]), r"prompts\[0\]: a text prompt needs tokenizer="), (dict(output="csv"), "output"),
    (dict(generator=torch.Generator()), "generator"),
])
def test_bad_arguments_are_named(kwargs, message):
    target, draft = make_pair("llama")
    arguments = dict(prompts=_prompts(), configs=["token"], seeds=[0], max_new_tokens=3)
    arguments.update(kwargs)
    with pytest.raises((TypeError, ValueError), match=message):
        ablate(target, draft, **arguments)


def test_example_script_reproduces_rules_with_verdicts():
    """examples/rule_ablation.py (under 60 lines), on small numbers: every configuration gets a
    summary line, the lossless rules pass their exact test and the lossy custom rule fails."""
    script = ROOT / "examples" / "rule_ablation.py"
    assert len(script.read_text().splitlines()) < 60
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    proc = subprocess.run([sys.executable, str(script), "6", "1", "1"], capture_output=True, text=True, env=env,
                          timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    for config in ("token", "block", "typical", "top_beta", "power (power=0.5)", "tree rrs (without_replacement)",
                   "tree spechub (hub)", "tree my_top_k (deterministic)"):
        assert f"\n{config} " in out, config
    for name in ("token", "block", "tree rrs", "tree my_top_k"):
        assert f"exact test, {name}: consistent with the target (pass)" in out
    assert "exact test, power: differs from the target (FAIL)" in out
