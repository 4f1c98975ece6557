"""The documentation site as a reader sees it: docstrings render in the API reference (Sphinx
roles as references, doctests and literal blocks as code, ``Shape:`` sections as lists; the
build-time conversion is ``scripts/docs_docstrings.py``), and the built site holds no raw role,
flattened doctest or unrendered fence (``scripts/check_docs_site.py``, which
``scripts/build_docs.sh`` also runs). The last tests build the site once (about 10 s) and skip
where the docs requirements are not installed (``pip install -r requirements-docs.txt``)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS_PACKAGES = ("mkdocs", "mkdocstrings", "mkdocstrings_handlers.python", "material", "griffe", "pymdownx")


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


docstrings = _script("docs_docstrings")
check = _script("check_docs_site")
KNOWN = {"generate": "specdecode.integrations.hf.generate.generate", "Drafter": "specdecode.drafters.base.Drafter"}


def resolve(name: str, role: str) -> str | None:
    return name if name.startswith("specdecode.") else KNOWN.get(name)


def test_roles_become_optional_references_shown_as_code() -> None:
    got = docstrings.markdown_docstring(
        "Result of :func:`generate`; see :class:`~specdecode.drafters.Drafter` and :meth:`unknown_name`.", resolve)
    assert got == ('Result of <autoref identifier="specdecode.integrations.hf.generate.generate" optional>`generate`'
                   '</autoref>; see <autoref identifier="specdecode.drafters.Drafter" optional>`Drafter`</autoref>'
                   " and `unknown_name`.")


def test_doctests_become_code_blocks_outside_examples_sections() -> None:
    text = "Intro.\n\n>>> x = 1  # doctest: +SKIP\n>>> x\n1\n\nAfter."
    assert docstrings.markdown_docstring(text, resolve) == "Intro.\n\n```pycon\n>>> x = 1\n>>> x\n1\n```\n\nAfter."
    # An "Example:" section (an admonition to Griffe): the fence stays right under the title.
    text = "Intro.\n\nExample:\n    >>> f(:func:`generate`)\n    2"
    assert docstrings.markdown_docstring(text, resolve) == "Intro.\n\nExample:\n    ```pycon\n    >>> f(:func:`generate`)\n    2\n    ```"
    # Griffe renders "Examples:" itself; an indented code block is code already.
    for text in ("Examples:\n    >>> x = 1  # doctest: +SKIP", "Run it.\n\n    $ cmd\n\n    >>> x = 1  # doctest: +SKIP"):
        assert docstrings.markdown_docstring(text, resolve) == text.replace("  # doctest: +SKIP", "")


def test_literal_blocks_and_shape_sections() -> None:
    text = "The law::\n\n    p(x) = q(x)\n      + r(x)\n\nMore."
    assert docstrings.markdown_docstring(text, resolve) == "The law:\n\n```text\np(x) = q(x)\n  + r(x)\n```\n\nMore."
    text = "Doc.\n\nShape:\n    a: ``[B]`` int64, continued\n        here; b: ``[B, N]``.\n    returns: :class:`Drafter`."
    assert docstrings.markdown_docstring(text, resolve) == (
        "Doc.\n\nShape:\n    - a: ``[B]`` int64, continued\n      here; b: ``[B, N]``.\n"
        '    - returns: <autoref identifier="specdecode.drafters.base.Drafter" optional>`Drafter`</autoref>.')
    one = "Shape:\n    a: ``[B]``; b: ``[B, N]``\n    (padding rows: -1)."  # one entry: left a paragraph
    assert docstrings.markdown_docstring(one, resolve) == one


def test_griffe_names_resolve_as_python_finds_them() -> None:
    griffe = pytest.importorskip("griffe", reason="the docs requirements (requirements-docs.txt) are not installed")
    package = griffe.load("specdecode", search_paths=[str(ROOT / "python")])
    # Griffe reads these names as the submodules they shadow; at run time they are functions.
    assert docstrings.runtime_path(package, "specdecode.generate") == "specdecode.integrations.hf.generate.generate"
    assert docstrings.runtime_path(package, "specdecode.verify") == "specdecode.verify.verify"
    for path in ("specdecode.verify_logits", "specdecode.trees.sequoia_shape", "specdecode.engine.syncs", "torch.Tensor"):
        assert docstrings.runtime_path(package, path) == path
    stats = package["engine.stats.SpeculativeStats"]  # the class itself, as the extension walks it
    resolve_in_stats = docstrings.scope_resolver(stats)
    assert resolve_in_stats("host_syncs_per_step", "attr") == "specdecode.engine.stats.SpeculativeStats.host_syncs_per_step"
    assert resolve_in_stats("specdecode.engine.syncs", "mod") == "specdecode.engine.syncs"


def test_the_check_rejects_what_a_reader_should_not_see() -> None:
    good = "<p>See <a href='#x'><code>generate</code></a>.</p><pre><code>&gt;&gt;&gt; x = 1\n</code></pre>"
    assert check.page_problems(good) == []
    bad = {
        "<p>Result of :func:<code>specdecode.generate</code>.</p>": "raw Sphinx role",
        "<blockquote><blockquote><blockquote><p>import torch</p></blockquote></blockquote></blockquote>": "quote inside a quote",
        "<p>&gt;&gt;&gt; import torch</p>": "doctest prompt",
        "<p>```python no-run</p><h1>Needs a GPU</h1>": "fence marker",
    }
    for html, problem in bad.items():
        found = check.page_problems(html)
        assert found and problem in found[0], (html, found)


def _missing_docs_packages() -> list[str]:
    return [name for name in DOCS_PACKAGES if importlib.util.find_spec(name.split(".")[0]) is None
            or importlib.util.find_spec(name) is None]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    missing = _missing_docs_packages()
    if missing:
        pytest.skip(f"the docs requirements are not installed ({', '.join(missing)}): pip install -r requirements-docs.txt")
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return out


def test_the_built_site_has_no_raw_role_flattened_doctest_or_unrendered_fence(site: Path) -> None:
    assert check.site_problems(site) == []


def test_the_api_reference_links_and_renders_its_examples(site: Path) -> None:
    api = (site / "api" / "index.html").read_text(encoding="utf-8")
    # The two functions Griffe reads as submodules are in the reference, and roles link to them.
    for anchor in ("specdecode.integrations.hf.generate.generate", "specdecode.verify.verify"):
        assert f'id="{anchor}"' in api
    assert api.count('href="#specdecode.integrations.hf.generate.generate"') >= 5
    # The package docstring's example is a code block: its prompts inside <pre>, not quotes.
    package = api.split('id="specdecode"', 1)[1].split('id="specdecode.integrations.hf.generate.generate"', 1)[0]
    code = re.sub(r"<[^>]+>", "", package.split("<pre>", 1)[1].split("</pre>", 1)[0])
    assert "&gt;&gt;&gt; import torch, specdecode\n" in code and "specdecode.verify(p, q, x" in code
