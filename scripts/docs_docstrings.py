"""Docstrings as the API reference renders them: a Griffe extension that mkdocstrings loads
(``mkdocs.yml``, handler option ``extensions``) and that rewrites each docstring's text, at
build time only, into the Markdown the site renders. The source docstrings stay as written for
``help()``: reStructuredText-flavoured Google style.

What it changes (nothing else):

- Sphinx roles (``:func:`specdecode.generate```, ``:class:`~specdecode.drafters.Drafter```,
  ``:meth:`reset```) become cross-references: the name is resolved in the docstring's own
  scope (a class's members, its module's names and imports, then the parents'), and is a link
  where the site renders that object, plain code otherwise (an *optional* autorefs reference,
  so a name the site does not render never fails the strict build).
- Doctest lines (``>>>`` and ``...`` with their output) outside an ``Examples:`` section, which
  Markdown would read as nested quotes, become ``pycon`` code blocks; ``# doctest:`` directives
  are dropped from every ``>>>`` line.
- reST literal blocks (a paragraph ending in ``::`` and an indented block after it) become
  fenced text blocks, the paragraph ending in one colon.
- A ``Shape:`` section with several entries (each starting ``name: ...`` at the section's
  indentation, continued on more indented lines) becomes a list, one entry per item, instead of
  one run-on paragraph.

``markdown_docstring`` is the text transformation (pure, tested in ``tests/test_docs_site.py``);
``DocstringsToMarkdown`` applies it to every object of a loaded package.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from dataclasses import dataclass

ROLE = re.compile(r":(?:py:)?(func|class|meth|mod|attr|data|exc|obj|const|type):`([^`]+)`")
SECTION = re.compile(r"^([A-Z][A-Za-z ]*):\s*$")  # a Google-style section title, at indentation 0
EXAMPLE_SECTIONS = {"Examples"}  # Griffe renders their doctests itself ("Example:" is an admonition to it)
DIRECTIVE = re.compile(r"\s*#\s*doctest:.*$")
SHAPE_ENTRY = re.compile(r"^[A-Za-z_][\w ,/.]*:(\s|$)")  # "name: ...", "p, q: ...", "tree / parents: ..."

Resolver = Callable[[str, str], "str | None"]  # (name, role) -> full path, or None


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _is_doctest(line: str) -> bool:
    stripped = line.strip()
    return stripped == ">>>" or stripped.startswith(">>> ")


def role_reference(role: str, target: str, resolve: Resolver) -> str:
    """One role's target as Markdown: an optional cross-reference to the resolved object, shown
    as code (``~`` shows only the last name, as in Sphinx)."""
    short = target.startswith("~")
    name = target.lstrip("~!.").removesuffix("()")
    shown = name.rsplit(".", 1)[-1] if short else target.lstrip("!")
    identifier = resolve(name, role)
    if identifier is None:
        return f"`{shown}`"
    return f'<autoref identifier="{html.escape(identifier, quote=True)}" optional>`{shown}`</autoref>'


def _roles(line: str, resolve: Resolver) -> str:
    return ROLE.sub(lambda m: role_reference(m.group(1), m.group(2), resolve), line)


def _fence(block: list[str], indent: int, language: str) -> list[str]:
    """``block`` (its common indentation removed) inside a fence at ``indent``."""
    common = min(_indent(line) for line in block if line.strip())
    pad = " " * indent
    body = [pad + line[common:] if line.strip() else "" for line in block]
    return [pad + "```" + language, *body, pad + "```"]


def _separated(out: list[str], block: list[str]) -> None:
    """Append ``block`` to ``out`` with a blank line before it (Markdown needs one), unless it
    opens a section (Griffe needs the section's title right above its body)."""
    if out and out[-1].strip() and not SECTION.match(out[-1]):
        out.append("")
    out.extend(block)


def _shape_items(lines: list[str]) -> list[str]:
    """A ``Shape:`` section's body as a Markdown list when it holds several entries."""
    base = min(_indent(line) for line in lines if line.strip())
    entries: list[list[str]] = []
    for line in lines:
        if not line.strip():
            continue
        starts = _indent(line) == base and SHAPE_ENTRY.match(line.strip())
        if starts or not entries:
            entries.append([line.strip()])
        else:
            entries[-1].append(line.strip())
    if len(entries) < 2:
        return lines
    pad = " " * base
    return [line for entry in entries for line in (f"{pad}- {entry[0]}", *(f"{pad}  {rest}" for rest in entry[1:]))]


@dataclass(frozen=True)
class _Place:
    """Where a line of a docstring is: its section (``""`` outside one), the indentation of
    that section's body, and how roles resolve there."""

    section: str
    base: int
    resolve: Resolver


def _copied_fence(lines: list[str], i: int, out: list[str], place: _Place) -> int | None:
    """A fence written in the docstring: copied as it is."""
    if not lines[i].lstrip().startswith("```"):
        return None
    end = next((j for j in range(i + 1, len(lines)) if lines[j].strip().startswith("```")), len(lines) - 1)
    out.extend(lines[i:end + 1])
    return end + 1


def _doctest_block(lines: list[str], i: int, out: list[str], place: _Place) -> int | None:
    """``>>>`` lines with their output (up to a blank line) as a ``pycon`` block."""
    line = lines[i]
    if not _is_doctest(line):
        return None
    end = i + 1
    while end < len(lines) and lines[end].strip() and _indent(lines[end]) >= _indent(line):
        end += 1
    block = [DIRECTIVE.sub("", row) if _is_doctest(row) else row for row in lines[i:end]]
    if place.section in EXAMPLE_SECTIONS or _indent(line) >= place.base + 4:  # Griffe's, or an indented code block
        out.extend(block)
    else:
        _separated(out, _fence(block, _indent(line), "pycon"))
        if end < len(lines) and lines[end].strip():
            out.append("")
    return end


def _literal_block(lines: list[str], i: int, out: list[str], place: _Place) -> int | None:
    """A paragraph ending in ``::`` and the indented block after it: the paragraph ending in
    one colon, the block fenced."""
    line = lines[i]
    if not line.rstrip().endswith("::") or i + 1 >= len(lines) or lines[i + 1].strip():
        return None
    start = end = i + 2
    while end < len(lines) and (not lines[end].strip() or _indent(lines[end]) > _indent(line)):
        end += 1
    while end > start and not lines[end - 1].strip():
        end -= 1
    if end == start or _indent(lines[start]) <= _indent(line):
        return None
    lead = line.rstrip()[:-2]  # "text::" reads "text:"; a "::" alone, nothing
    if lead.strip():
        out.append(_roles(lead.rstrip() + ":", place.resolve))
    out.append("")  # always: "The law:" right above the fence would read as a section title
    out.extend(_fence(lines[start:end], _indent(line), "text"))
    if end < len(lines) and lines[end].strip():
        out.append("")
    return end


def _shape_section(lines: list[str], i: int, out: list[str], place: _Place) -> int | None:
    """A ``Shape:`` section, its entries as a list (``_shape_items``)."""
    if lines[i] != "Shape:":
        return None
    end = i + 1
    while end < len(lines) and (not lines[end].strip() or _indent(lines[end]) > 0):
        end += 1
    body = lines[i + 1:end]
    while body and not body[-1].strip():
        body.pop()
    out.append(lines[i])
    out.extend(_roles(row, place.resolve) for row in (_shape_items(body) if body else []))
    out.extend(lines[i + 1 + len(body):end])
    return end


def markdown_docstring(text: str, resolve: Resolver) -> str:
    """``text`` (a docstring, indentation already cleaned) as the Markdown the site renders.

    ``resolve(name, role)`` gives the full path of a name written in a role (``role``: ``func``,
    ``mod``, ...; ``None``: unknown, shown as plain code)."""
    lines = text.splitlines()
    out: list[str] = []
    place = _Place("", 0, resolve)
    i = 0
    while i < len(lines):
        line = lines[i]
        title = SECTION.match(line)
        if title:
            body_indent = next((_indent(row) for row in lines[i + 1:] if row.strip()), 0)
            place = _Place(title.group(1), body_indent, resolve)
        elif line.strip() and _indent(line) == 0:
            place = _Place("", 0, resolve)
        for convert in (_copied_fence, _doctest_block, _literal_block, _shape_section):
            end = convert(lines, i, out, place)
            if end is not None:
                i = end
                break
        else:
            out.append(_roles(line, resolve))
            i += 1
    return "\n".join(out)


def _file_module(package: object, path: str) -> object | None:
    """The module ``path`` names as the import system finds it (by file), or None."""
    parts = path.split(".")
    if parts[0] != getattr(package, "name", None):
        return None
    current = package
    for name in parts[1:]:
        current = current.members.get(name)  # type: ignore[attr-defined]
        if current is None or current.is_alias or not current.is_module:
            return None
    return current


def _attribute(owner: object, name: str, hops: int) -> object | None:
    """``owner.name`` at run time: a module's name bound by an import of something else than
    its own same-named submodule is what that import gave."""
    if hops > 16:  # an import cycle
        return None
    member = owner.members.get(name)  # type: ignore[attr-defined]
    imported = owner.imports.get(name) if owner.is_module else None  # type: ignore[attr-defined]
    if imported is None and member is not None and member.is_alias:
        imported = member.target_path
    if imported is not None and imported != f"{owner.path}.{name}":  # type: ignore[attr-defined]
        module_path, _, attribute = imported.rpartition(".")  # from module_path import attribute
        module = _file_module(owner.package, module_path)  # type: ignore[attr-defined]
        return None if module is None else _attribute(module, attribute, hops + 1)
    return member


def runtime_path(package: object, path: str) -> str:
    """``path`` as Python finds it at run time, where Griffe finds something else. Griffe gives
    a submodule precedence over a same-named function its package imports
    (``specdecode.generate`` and ``specdecode.verify`` are modules to Griffe, functions at run
    time, since ``__init__`` imports them after the submodules load); such a path becomes the
    function's own path. Any other path is returned as it is."""
    parts = path.split(".")
    if parts[0] != getattr(package, "name", None):
        return path
    found: object | None = package
    for name in parts[1:]:
        found = _attribute(found, name, 0)
        if found is None:
            return path
    try:
        griffes = package[".".join(parts[1:])] if len(parts) > 1 else package  # type: ignore[index]
        griffes = griffes.final_target if griffes.is_alias else griffes
    except Exception:  # noqa: BLE001 - a name Griffe cannot place or an alias it cannot resolve
        griffes = None
    return path if griffes is not None and griffes.path == found.path else found.path  # type: ignore[attr-defined]


def scope_resolver(obj: object) -> Resolver:
    """Resolves a role's name as Python would read it in ``obj``'s docstring: a full
    ``specdecode.`` path as it is, otherwise its first name in ``obj``'s scope (members, the
    module's names and imports, the parents'), the rest appended; a name other than a module's
    (``:mod:``) then as Python finds it at run time (``runtime_path``)."""

    def resolve(name: str, role: str = "") -> str | None:
        first, _, rest = name.partition(".")
        if first == "specdecode":
            found = name
        else:
            try:
                found = obj.resolve(first)  # type: ignore[attr-defined]
            except Exception:  # noqa: BLE001 - Griffe's NameResolutionError, or a name it cannot place
                return None
            found = f"{found}.{rest}" if rest else found
        return found if role == "mod" else runtime_path(obj.package, found)  # type: ignore[attr-defined]

    return resolve


try:
    import griffe
except ImportError:  # the docs requirements are not installed: markdown_docstring still works
    griffe = None  # type: ignore[assignment]

if griffe is not None:

    class DocstringsToMarkdown(griffe.Extension):
        """Rewrites every docstring of a loaded package with ``markdown_docstring``."""

        def on_package(self, *, pkg: griffe.Module, **kwargs: object) -> None:
            pending: list[griffe.Object] = [pkg]
            while pending:
                obj = pending.pop()
                if obj.docstring is not None:
                    obj.docstring.value = markdown_docstring(obj.docstring.value, scope_resolver(obj))
                pending.extend(member for member in obj.members.values() if not member.is_alias)
