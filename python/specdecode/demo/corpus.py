"""Corpus helpers for the embedded demo pair: the Python standard library's own sources.

The demo target/draft models are trained on the ``.py`` files of the running
interpreter's standard library.  Every file is assigned to exactly one split by
hashing its path *relative to the stdlib root* (POSIX separators), so the split
is deterministic and independent of file-system order or machine:

* ``train``   -- 90% of the files (hash bucket 0..899 of 1000)
* ``val``     --  5% of the files (bucket 900..949): validation loss
* ``heldout`` --  5% of the files (bucket 950..999): never seen in training,
  used only to build benchmark / acceptance-rate prompts.

Excluded from the corpus (decided once, documented here):

* ``site-packages`` -- third-party code, not the stdlib;
* any directory named ``test``, ``tests`` or ``idle_test`` -- test suites (huge, repetitive,
  full of deliberately odd code);
* ``encodings`` -- mostly machine-generated codec tables (``cp1252.py`` ...);
* ``pydoc_data`` -- a single generated ~750 KB string literal of documentation text.

``idlelib``, ``lib2to3`` (minus its tests), ``turtledemo`` etc. are kept: they are
ordinary hand-written Python.

This module only uses the standard library, so it imports instantly.
"""

from __future__ import annotations

import hashlib
import re
import sysconfig
from pathlib import Path
from typing import Iterator, Literal

__all__ = [
    "EXCLUDED_DIRS",
    "Split",
    "stdlib_root",
    "split_of",
    "iter_stdlib_sources",
    "extract_prompts",
]

Split = Literal["train", "val", "heldout"]

#: Directory names that exclude every file beneath them.
EXCLUDED_DIRS: frozenset[str] = frozenset(
    {"site-packages", "test", "tests", "idle_test", "encodings", "pydoc_data", "__pycache__"}
)

_SPLIT_BUCKETS = 1000
_TRAIN_END = 900  # [0, 900) -> train
_VAL_END = 950  # [900, 950) -> val, [950, 1000) -> heldout


def stdlib_root() -> Path:
    """Return the directory of the running interpreter's pure-Python standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def split_of(relpath: str) -> Split:
    """Deterministically assign a stdlib-relative POSIX path to ``train``/``val``/``heldout``.

    >>> split_of("argparse.py") in ("train", "val", "heldout")
    True
    """
    digest = hashlib.sha256(relpath.encode("utf-8")).hexdigest()
    bucket = int(digest[:12], 16) % _SPLIT_BUCKETS
    if bucket < _TRAIN_END:
        return "train"
    if bucket < _VAL_END:
        return "val"
    return "heldout"


def iter_stdlib_sources(root: Path | None = None) -> Iterator[tuple[str, str, Split]]:
    """Yield ``(relpath, text, split)`` for every corpus file, sorted by relative path.

    Files that are not valid UTF-8 or are empty are skipped.  ``relpath`` uses ``/``.
    """
    root = stdlib_root() if root is None else Path(root)
    paths = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if any(part in EXCLUDED_DIRS for part in rel.parts[:-1]):
            continue
        paths.append((rel.as_posix(), path))
    paths.sort(key=lambda item: item[0])
    for rel, path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if not text.strip():
            continue
        yield rel, text, split_of(rel)


_DEF_LINE = re.compile(r"^[ \t]*(?:async[ \t]+def|def|class)[ \t]+\w")


def extract_prompts(
    text: str,
    per_file: int = 4,
    max_chars: int = 400,
    min_chars: int = 120,
) -> list[str]:
    """Cut up to ``per_file`` prompt windows out of one source file, deterministically.

    Candidate windows start at a line that opens a ``def``/``class`` (prompts then look
    like "the beginning of a function"), are at most ``max_chars`` characters long and
    are cut back to the last complete line (so every prompt ends with ``"\\n"``).
    Windows shorter than ``min_chars`` are dropped.  When a file has more candidates than
    ``per_file``, evenly spaced ones are taken (first, ..., last), so the choice depends
    only on the text.
    """
    lines = text.splitlines(keepends=True)
    offsets = []
    pos = 0
    for line in lines:
        if _DEF_LINE.match(line):
            offsets.append(pos)
        pos += len(line)
    if not offsets or per_file <= 0:
        return []
    if len(offsets) > per_file:
        if per_file == 1:
            offsets = [offsets[0]]
        else:
            step = (len(offsets) - 1) / (per_file - 1)
            offsets = [offsets[round(i * step)] for i in range(per_file)]
    prompts: list[str] = []
    for start in offsets:
        window = text[start : start + max_chars]
        cut = window.rfind("\n")
        if cut < 0:
            continue
        window = window[: cut + 1]
        if len(window) >= min_chars and window not in prompts:
            prompts.append(window)
    return prompts
