"""Checks a built documentation site (``build/site/``) for what a strict MkDocs build lets
through but a reader sees: docstring markup that was not converted, and code that did not
render as code. ``bash scripts/build_docs.sh`` runs it after the build; ``tests/test_docs_site.py``
runs it on a build of its own.

Each HTML page is read as a browser shows it, and these are reported:

- a Sphinx role printed as text (``:func:`` before a name, outside a code block): a docstring
  role that ``scripts/docs_docstrings.py`` did not turn into a reference;
- a doctest prompt ``>>>`` outside a code block, or a quote nested in a quote (what Markdown
  makes of ``>>> code`` lines): a doctest flattened into a paragraph;
- a fence marker (three backticks) in the text: a fenced block that did not render as one.

Usage: ``python scripts/check_docs_site.py [SITE_DIR]`` (default ``build/site``); prints one
line per problem and exits 1 when there is one.
"""

from __future__ import annotations

import re
import sys
from html.parser import HTMLParser
from pathlib import Path

RAW_ROLE = re.compile(r"(?<![\w:]):(?:py:)?(?:func|class|meth|mod|attr|data|exc|obj|const|type):(?=`|$)")
FENCE = "`" * 3


class _PageText(HTMLParser):
    """Collects a page's problems while it is parsed."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.open: list[str] = []  # the elements the parser is inside, innermost last
        self.problems: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "blockquote" and "blockquote" in self.open:
            self.problems.append("a quote inside a quote (a flattened doctest?)")
        if tag not in {"br", "hr", "img", "input", "meta", "link", "wbr", "source", "col", "area", "base", "embed"}:
            self.open.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag in self.open:
            while self.open and self.open.pop() != tag:
                pass

    def handle_data(self, data: str) -> None:
        if "script" in self.open or "style" in self.open:
            return
        excerpt = " ".join(data.split())[:100]
        if FENCE in data:
            self.problems.append(f"a fence marker in the text (a code block that did not render): {excerpt!r}")
        if "pre" in self.open or "code" in self.open:
            return
        if RAW_ROLE.search(data.rstrip()):
            self.problems.append(f"a raw Sphinx role: {excerpt!r}")
        if ">>>" in data:
            self.problems.append(f"a doctest prompt outside a code block: {excerpt!r}")


def page_problems(html: str) -> list[str]:
    """What a reader of this page would see that the docs should not show."""
    parser = _PageText()
    parser.feed(html)
    parser.close()
    return parser.problems


def site_problems(site: Path) -> list[str]:
    """``page: problem`` for every problem of every HTML page under ``site``."""
    found = []
    for page in sorted(site.rglob("*.html")):
        found += [f"{page.relative_to(site)}: {problem}" for problem in page_problems(page.read_text(encoding="utf-8"))]
    return found


def main(argv: list[str]) -> int:
    site = Path(argv[0] if argv else "build/site")
    if not (site / "index.html").is_file():
        print(f"check_docs_site: no built site in {site} (bash scripts/build_docs.sh builds it)", file=sys.stderr)
        return 2
    problems = site_problems(site)
    for problem in problems:
        print(f"check_docs_site: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
