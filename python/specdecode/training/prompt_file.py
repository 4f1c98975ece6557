"""Prompt files: the widened prompts made once, ahead of a run (``python -m specdecode
prompts``), and read by the data stage instead of asking the target for them.

A prompt file is gzip-compressed JSON lines (``.jsonl.gz``). The first line is the header::

    {"format": "specdecode-prompts", "version": 1, "target": {"name": ..., "weights_hash": ...},
     "mix": "self-instruct=1,multi-turn=1", "seed": 0, "counts": {"self-instruct": 2500, ...},
     "settings": {...}, "held_out": {"guard": ..., "prompts": 36, "sha256": ...}, "made": ...}

then one line per prompt, tokenizer-independent: ``{"source": "self-instruct", "prompt":
"..."}`` for a request (sources ``self-instruct``, ``code``, ``prose``, ``long``), and
``{"source": "multi-turn", "messages": [{"role": "user", "content": ...}, {"role":
"assistant", ...}, {"role": "user", ...}]}`` for an exchange (the target's own first answer,
then a follow-up; the chat template is applied when a run reads it).

The held-out guard (:func:`~specdecode.training.prompt_sources.is_held_out`) runs when a file
is made; the header records the held-out prompts it ran against (their SHA-256), and a file
read when they have changed since is checked again, its user turns that the guard now drops
left out.

The kit ships the file made for SmolLM2-135M-Instruct (:func:`shipped_prompt_file`).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdecode.training.prompt_sources import held_out_prompts, is_held_out

__all__ = ["FORMAT", "SUFFIX", "TEXT_SOURCES", "PromptFile", "held_out_record", "read_header", "read_prompt_file",
           "shipped_prompt_file", "write_prompt_file"]

FORMAT = "specdecode-prompts"
_VERSION = 1
#: The file name's ending (gzip-compressed JSON lines).
SUFFIX = ".jsonl.gz"
#: Sources stored as one request each (``multi-turn`` is stored as chat messages).
TEXT_SOURCES: tuple[str, ...] = ("self-instruct", "code", "prose", "long")
_SOURCES = (*TEXT_SOURCES, "multi-turn")
_SHIPPED_FOLDER = Path(__file__).resolve().parent / "prompt_files"
#: Target name -> the file shipped for it in ``prompt_files/``.
_SHIPPED = {"smollm2": "smollm2.jsonl.gz"}


@dataclass(frozen=True)
class PromptFile:
    """A read prompt file: its ``header`` (a dict, as written) and its ``prompts`` by source
    (requests as text; ``multi-turn`` exchanges as chat messages), each in the file's order."""

    path: Path
    header: dict[str, Any]
    prompts: dict[str, list[Any]]


def held_out_record() -> dict[str, Any]:
    """What the held-out guard ran against: the guard, the number of held-out prompts and
    their SHA-256 (written into a file's header)."""
    texts = held_out_prompts()
    digest = hashlib.sha256(json.dumps(list(texts)).encode()).hexdigest()
    return {"guard": "specdecode.training.prompt_sources.is_held_out (content-word ROUGE-L F >= 0.75, or 80% of "
                     "a held-out prompt's content words in order)",
            "sets": "specdecode.prompt_sets: CHAT_PROMPT_SETS and PROMPT_SETS, tune and report halves",
            "prompts": len(texts), "sha256": digest}


def write_prompt_file(path: str | Path, header: dict[str, Any], prompts: dict[str, list[Any]]) -> Path:
    """Write ``prompts`` (source -> requests, or chat messages for ``multi-turn``) under
    ``header`` (``format``, ``version`` and ``counts`` are filled in) into ``path``, a
    ``.jsonl.gz`` file, atomically (a temporary file renamed). The bytes depend only on the
    content (no time stamp in the gzip header)."""
    path = Path(path)
    if not path.name.endswith(SUFFIX):
        raise ValueError(f"out: a prompt file's name ends with {SUFFIX}, got {str(path)!r}")
    unknown = sorted(set(prompts) - set(_SOURCES))
    if unknown:
        raise ValueError(f"prompts: unknown sources {unknown}; expected among {', '.join(_SOURCES)}")
    full = {"format": FORMAT, "version": _VERSION, **header,
            "counts": {name: len(items) for name, items in prompts.items() if items}}
    lines = [json.dumps(full, sort_keys=True)]
    for name, items in prompts.items():
        key = "messages" if name == "multi-turn" else "prompt"
        lines += [json.dumps({"source": name, key: item}, ensure_ascii=False) for item in items]
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(temporary, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as out:
        out.write(("\n".join(lines) + "\n").encode("utf-8"))
    temporary.replace(path)
    return path


def _open_lines(path: Path, what: str) -> Any:
    if not path.name.endswith(SUFFIX):
        raise ValueError(f"{what}: a prompt file (python -m specdecode prompts) ends with {SUFFIX}, "
                         f"got {str(path)!r}")
    if not path.is_file():
        raise ValueError(f"{what}: no such file {str(path)!r}")
    return gzip.open(path, "rt", encoding="utf-8")


def _header(line: str, path: Path, what: str) -> dict[str, Any]:
    try:
        header = json.loads(line)
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise ValueError(f"{what}: {str(path)!r} is not a prompt file of python -m specdecode prompts")
    if header.get("version") != _VERSION:
        raise ValueError(f"{what}: {str(path)!r} is a prompt file of version {header.get('version')!r}; this "
                         f"specdecode reads version {_VERSION}")
    counts = header.get("counts")
    if not isinstance(counts, dict) or set(counts) - set(_SOURCES):
        raise ValueError(f"{what}: {str(path)!r} has a header without valid counts by source")
    return header


def read_header(path: str | Path, what: str = "prompts") -> dict[str, Any]:
    """The header of the prompt file ``path`` (its first line only), or ``ValueError`` naming
    ``what`` when the file is missing or not a prompt file."""
    path = Path(path)
    try:
        with _open_lines(path, what) as lines:
            return _header(lines.readline(), path, what)
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise ValueError(f"{what}: {str(path)!r} cannot be read as a prompt file ({exc})") from None


def _messages(value: Any) -> bool:
    """Whether ``value`` is an exchange: user and assistant turns alternating, from a user turn
    to a user turn, each with text."""
    return (isinstance(value, list) and len(value) % 2 == 1 and all(
        isinstance(m, dict) and set(m) == {"role", "content"} and isinstance(m["content"], str) and m["content"]
        and m["role"] == ("user" if i % 2 == 0 else "assistant") for i, m in enumerate(value)))


def read_prompt_file(path: str | Path, what: str = "prompts") -> PromptFile:
    """Read the prompt file ``path``: ``ValueError`` naming ``what`` and the line when anything
    in it is not as written by :func:`write_prompt_file`. When the benchmark's held-out prompts
    have changed since the file was made, its user turns are checked again and the prompts the
    guard drops now are left out."""
    path = Path(path)
    try:
        with _open_lines(path, what) as lines:
            header = _header(lines.readline(), path, what)
            rows = [(number, line) for number, line in enumerate(lines, start=2) if line.strip()]
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise ValueError(f"{what}: {str(path)!r} cannot be read as a prompt file ({exc})") from None
    prompts: dict[str, list[Any]] = {}
    for number, line in rows:
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        source = row.get("source") if isinstance(row, dict) else None
        if source == "multi-turn" and _messages(row.get("messages")):
            prompts.setdefault(source, []).append(row["messages"])
        elif source in TEXT_SOURCES and isinstance(row.get("prompt"), str) and row["prompt"].strip():
            prompts.setdefault(source, []).append(row["prompt"])
        else:
            raise ValueError(f"{what}: {str(path)!r} line {number} is not a prompt of a known source")
    counts = {name: len(items) for name, items in prompts.items()}
    if counts != {name: n for name, n in header["counts"].items() if n}:
        raise ValueError(f"{what}: {str(path)!r} holds {counts}, its header says {header['counts']} (cut short?)")
    if header.get("held_out", {}).get("sha256") != held_out_record()["sha256"]:
        prompts = {name: [p for p in items if not any(
            is_held_out(m["content"]) for m in (p if name == "multi-turn" else [{"content": p}])
            if m.get("role", "user") == "user")] for name, items in prompts.items()}
    return PromptFile(path, header, prompts)


def shipped_prompt_file(target_name: str | None = None, weights_hash: str | None = None) -> Path | None:
    """The prompt file shipped with the kit for a target, by its name (``"smollm2"``) or, for
    a target passed as a model, by its weights hash (the ``weights_hash`` recorded in the
    shipped file's header, :func:`specdecode.training.artifacts.target_fingerprint`); None when
    none is shipped for it."""
    for name, file in _SHIPPED.items():
        path = _SHIPPED_FOLDER / file
        if not path.is_file():
            continue
        if target_name == name or (weights_hash is not None and
                                   read_header(path).get("target", {}).get("weights_hash") == weights_hash):
            return path
    return None
