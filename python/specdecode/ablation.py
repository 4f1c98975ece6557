"""Ablations of verification rules: several rules x prompts x seeds -> one table.

:func:`ablate` runs :func:`specdecode.generate` once per (configuration, prompt, seed) and
returns one row per run, every row carrying the settings that made it (the configuration's
label and arguments, the prompt, the seed, and what the statistics recorded: sampling, rule and
its options, configured draft length, tree shape) with its per-position and per-step
statistics; then one ``"summary"`` row per configuration with the mean and the spread (sample
standard deviation) across seeds of each seed's tokens per call, acceptance rate and alpha,
pooled over the prompts. A list of dicts, or a ``pandas.DataFrame`` when pandas is installed
(``output="dataframe"``; ``"auto"``, the default, picks it when it can).

>>> import specdecode
>>> from specdecode.ablation import ablate
>>> target, draft, tok = specdecode.load_demo_pair()  # doctest: +SKIP
>>> table = ablate(target, draft, ["def f(x):"], tokenizer=tok, seeds=[0, 1], max_new_tokens=16,
...                configs=["token", "block", {"rule": "typical", "epsilon": 0.2}], output="records")  # doctest: +SKIP
>>> [(r["config"], round(r["tokens_per_call"], 2)) for r in table if r["kind"] == "summary"]  # doctest: +SKIP
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch
from torch import Tensor

from specdecode.integrations.hf import generate

#: The statistics copied into every run row (see :class:`specdecode.SpeculativeStats`).
RUN_FIELDS = ("rule", "tree_rule", "rule_options", "sampling", "num_draft_tokens", "draft_schedule", "tree_shape",
              "drafter", "new_tokens", "steps", "row_steps", "drafted_tokens", "accepted_tokens", "acceptance_rate",
              "alpha", "acceptance_rate_per_position", "conditional_acceptance_per_position",
              "acceptance_by_position", "acceptance_by_rank", "accepted_lengths", "tokens_per_second")
#: The per-seed quantities a summary row gives the mean and spread of.
SUMMARY_FIELDS = ("tokens_per_call", "acceptance_rate", "alpha")


def _config(config: str | dict[str, Any], index: int) -> tuple[str, dict[str, Any]]:
    """``(label, generate arguments)`` of one configuration: a rule name, or a dict of
    ``generate`` keywords (with an optional ``"label"``)."""
    if isinstance(config, str):
        return config, {"rule": config}
    if not isinstance(config, dict):
        raise TypeError(f"configs[{index}]: expected a rule name or a dict of generate arguments, "
                        f"got {type(config).__name__}")
    arguments = {k: v for k, v in config.items() if k != "label"}
    options = ", ".join(f"{k}={v!r}" for k, v in arguments.items() if k != "rule")
    label = config.get("label") or f"{arguments.get('rule') or 'default'}" + (f" ({options})" if options else "")
    return str(label), arguments


def _prompt_ids(prompt: str | Tensor, tokenizer: Any, index: int) -> Tensor:
    if isinstance(prompt, Tensor):
        if prompt.dim() != 2 or prompt.shape[0] != 1:
            raise ValueError(f"prompts[{index}]: expected token ids of shape [1, L], got {tuple(prompt.shape)}")
        return prompt
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError(f"prompts[{index}]: a text prompt needs tokenizer=")
        return tokenizer(prompt, return_tensors="pt").input_ids
    raise TypeError(f"prompts[{index}]: expected a str or a [1, L] tensor of token ids, got {type(prompt).__name__}")


def _spread(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    mean = math.fsum(values) / len(values)
    if len(values) < 2:
        return mean, 0.0
    return mean, math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))


def _summary(label: str, arguments: dict[str, Any], runs: list[dict[str, Any]], seeds: Sequence[int]
             ) -> dict[str, Any]:
    """One configuration's row: per seed, the quantities pooled over prompts; then their mean
    and spread across seeds, and the per-position acceptance pooled over every run."""
    per_seed: dict[str, list[float]] = {name: [] for name in SUMMARY_FIELDS}
    for seed in seeds:
        mine = [r for r in runs if r["seed"] == seed]
        steps = sum(r["row_steps"] for r in mine)
        drafted, accepted = sum(r["drafted_tokens"] for r in mine), sum(r["accepted_tokens"] for r in mine)
        rejections = sum(r["_rejections"] for r in mine)
        per_seed["tokens_per_call"].append(sum(r["new_tokens"] for r in mine) / steps if steps else 0.0)
        per_seed["acceptance_rate"].append(accepted / drafted if drafted else 0.0)
        per_seed["alpha"].append(accepted / (accepted + rejections) if accepted + rejections else 0.0)
    row: dict[str, Any] = {"kind": "summary", "config": label, "arguments": dict(arguments), "prompt": None,
                           "seed": None, "seeds": list(seeds), "num_runs": len(runs)}
    for name, values in per_seed.items():
        row[name], row[f"{name}_std"] = _spread(values)
        row[f"{name}_per_seed"] = values
    width = max((len(r["_position_drafted"]) for r in runs), default=0)
    drafting = sum(r["_position_drafted"][0] for r in runs if r["_position_drafted"])
    accepted = [sum(r["_position_accepted"][i] for r in runs if i < len(r["_position_accepted"]))
                for i in range(width)]
    row["acceptance_by_position"] = [a / drafting if drafting else 0.0 for a in accepted]
    return row


def ablate(target: torch.nn.Module, draft: Any, prompts: Sequence[str | Tensor], *,
           configs: Sequence[str | dict[str, Any]], seeds: Sequence[int] = (0, 1, 2), tokenizer: Any = None,
           output: str = "auto", **generate_kwargs: Any) -> Any:
    """Run every configuration on every prompt with every seed; returns the table described
    in the module docstring (run rows, then one summary row per configuration).

    ``configs``: rule names, or dicts of :func:`specdecode.generate` keywords (``rule``, its
    options, ``tree=``, ``tree_children=``, ``num_draft_tokens``, ...; ``label`` names the
    configuration). ``generate_kwargs`` apply to every run (``max_new_tokens``, ``do_sample``
    and ``temperature``; default: sampling at temperature 1). Each run's generator is seeded
    with its seed, so a row is reproduced by the same call.

    Shape:
        prompts: text (needs ``tokenizer``) or token ids ``[1, L]`` each.
    """
    if output not in ("auto", "records", "dataframe"):
        raise ValueError(f"output: expected 'auto', 'records' or 'dataframe', got {output!r}")
    if isinstance(configs, (str, dict)) or not configs:
        raise ValueError("configs: expected a non-empty list of rule names or dicts of generate arguments")
    if isinstance(seeds, int) or not seeds or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise ValueError(f"seeds: expected a non-empty list of ints, got {seeds!r}")
    if isinstance(prompts, (str, Tensor)) or not prompts:
        raise ValueError("prompts: expected a non-empty list of prompts")
    if "generator" in generate_kwargs:
        raise ValueError("generator: ablate seeds a generator per run from seeds=; pass seeds instead")
    common = {"do_sample": True, "temperature": 1.0, **generate_kwargs}
    ids = [_prompt_ids(p, tokenizer, i) for i, p in enumerate(prompts)]
    parsed = [_config(c, i) for i, c in enumerate(configs)]
    rows: list[dict[str, Any]] = []
    summaries = []
    for label, arguments in parsed:
        runs = []
        for p, prompt_ids in enumerate(ids):
            for seed in seeds:
                out = generate(target, draft, prompt_ids, **{**common, **arguments},
                                          generator=torch.Generator().manual_seed(seed))
                stats = out.stats.to_dict()
                row = {"kind": "run", "config": label, "arguments": dict(arguments), "prompt": p, "seed": seed,
                       "tokens_per_call": out.stats.block_efficiency}
                row.update({name: stats[name] for name in RUN_FIELDS})
                runs.append({**row, "_rejections": stats["rejections"], "_position_drafted": stats["position_drafted"],
                             "_position_accepted": stats["position_accepted"]})
        summaries.append(_summary(label, arguments, runs, seeds))
        rows += [{k: v for k, v in r.items() if not k.startswith("_")} for r in runs]
    rows += summaries
    if output == "records":
        return rows
    try:
        import pandas
    except ImportError:
        if output == "dataframe":
            raise ImportError("output='dataframe' needs pandas: pip install pandas") from None
        return rows
    return pandas.DataFrame(rows)
