#!/usr/bin/env bash
# Builds the documentation site (mkdocs.yml: the pages of docs/ and the API reference from the
# docstrings) in strict mode: a broken link, anchor or API reference fails the build; then checks
# the built pages for what strict mode lets through (scripts/check_docs_site.py: a raw Sphinx role,
# a flattened doctest, a fence that did not render). Installs
# requirements-docs.txt into the current Python first (pip's output in build/docs-setup.log,
# shown only on failure). The site lands in build/site/ (open build/site/index.html). Extra
# arguments go to `mkdocs build`.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
mkdir -p build
if ! "$PYTHON" -m pip install -r requirements-docs.txt >build/docs-setup.log 2>&1; then
  echo "build_docs: FAILED to install requirements-docs.txt; pip's output follows:" >&2
  tail -n 40 build/docs-setup.log >&2
  exit 1
fi
NO_MKDOCS_2_WARNING=1 "$PYTHON" -m mkdocs build --strict "$@"
"$PYTHON" scripts/check_docs_site.py build/site
echo "docs: built build/site/index.html"
