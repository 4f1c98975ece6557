"""The layers import downwards only: the training kit imports nothing from the benchmarks (both
read the held-out prompts from :mod:`specdecode.prompt_sets`, which imports nothing from
specdecode). Checked on the source (every import statement, at any depth), not by importing."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "python" / "specdecode"


def _imported(source: str, package: str) -> list[str]:
    """The absolute module names that ``source``, a module of ``package``, imports anywhere
    (relative imports resolved)."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            names += [base] + [f"{base}.{alias.name}" for alias in node.names]
    return names


def _module_imports(path: Path) -> list[str]:
    package = ".".join(path.relative_to(PACKAGE.parent).parts[:-1])
    return _imported(path.read_text(encoding="utf-8"), package)


def test_the_check_sees_relative_and_nested_imports():
    text = "def f():\n    from ..bench import harness\n    if True:\n        import specdecode.bench.trees\n"
    names = _imported(text, "specdecode.training")
    assert "specdecode.bench.harness" in names and "specdecode.bench.trees" in names
    assert "specdecode.training.data" in _imported("from .data import x\n", "specdecode.training")


def test_training_imports_nothing_from_the_benchmarks():
    files = sorted((PACKAGE / "training").rglob("*.py"))
    assert len(files) > 10
    for path in files:
        bad = [n for n in _module_imports(path) if n == "specdecode.bench" or n.startswith("specdecode.bench.")]
        assert not bad, f"{path.name} imports {bad}"


def test_the_prompt_sets_import_nothing_from_specdecode():
    names = _module_imports(PACKAGE / "prompt_sets.py")
    assert not [n for n in names if n.split(".")[0] == "specdecode"], names
