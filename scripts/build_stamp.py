"""Decide quickly (without importing torch) whether ``scripts/setup.sh`` has work to do.

    python scripts/build_stamp.py check   # exit 0: the installed build matches this source tree
    python scripts/build_stamp.py write   # record the current state after a successful setup

The stamp is a SHA-256 of everything that changes what setup installs or compiles (``csrc/``,
``CMakeLists.txt``, ``pyproject.toml``, ``requirements-dev.txt``, ``scripts/setup.sh``), plus
the interpreter and the installed torch version. ``check`` also requires that the specdecode
installed in this interpreter is the editable install of *this* checkout and that its compiled
extension file exists. Python sources need no stamp: the editable install reads them in place.
"""

from __future__ import annotations

import hashlib
import json
import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAMP = ROOT / "build" / "setup-stamp"
INPUTS = ("csrc", "CMakeLists.txt", "pyproject.toml", "requirements-dev.txt", "scripts/setup.sh")


def _files() -> list[Path]:
    files: list[Path] = []
    for name in INPUTS:
        path = ROOT / name
        files += sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return files


def current() -> str:
    digest = hashlib.sha256()
    for path in _files():
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0")
        digest.update(path.read_bytes() if path.exists() else b"<missing>")
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = "none"
    digest.update(f"{sys.executable}\0{torch_version}".encode())
    return digest.hexdigest()


def installed_here() -> bool:
    """True when this interpreter's specdecode is an editable install of ROOT with its extension."""
    try:
        dist = metadata.distribution("specdecode")
    except metadata.PackageNotFoundError:
        return False
    url = json.loads(dist.read_text("direct_url.json") or "{}")
    if not url.get("dir_info", {}).get("editable") or url.get("url") != ROOT.as_uri():
        return False
    return any(str(f).startswith("specdecode/_C") and Path(dist.locate_file(f)).exists() for f in dist.files or ())


def main(argv: list[str]) -> int:
    if argv == ["write"]:
        STAMP.parent.mkdir(parents=True, exist_ok=True)
        STAMP.write_text(current() + "\n")
        return 0
    if argv == ["check"]:
        recorded = STAMP.read_text().strip() if STAMP.exists() else ""
        return 0 if recorded == current() and installed_here() else 1
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
