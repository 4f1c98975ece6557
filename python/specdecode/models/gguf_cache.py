"""A per-user cache of what transformers converts from a GGUF file: its config and its tokenizer.

Reading a GGUF file's config or tokenizer makes transformers parse every metadata field of the
file, the vocabulary arrays included (49,152 tokens and their merges for SmolLM2, 262,144
tokens and scores for Gemma 3), and then convert the vocabulary into a ``tokenizers``
tokenizer: seconds to tens of seconds per load, paid again by every process. The converted
config and tokenizer are small (3 MB for SmolLM2, 32 MB for Gemma 3), so they are written once
with ``save_pretrained`` and read back in a fraction of the time. The weights are not cached: dequantized to float32
they would take hundreds of MB per model.

Where the cache lives (:func:`cache_root`): ``$SPECDECODE_CACHE`` if set, else
``$XDG_CACHE_HOME/specdecode``, else ``~/.cache/specdecode``; the entries are folders under its
``gguf/`` folder, which can be deleted at any time.

An entry is named by a key of everything its content depends on (:func:`gguf_entry_key`): the
GGUF file's resolved path, size and modification time in nanoseconds, the cache format version
and the transformers and tokenizers versions. A file changed in place, or a new transformers,
gets a new entry, so an entry cannot go stale. An entry is written into a temporary folder and
renamed into place when complete, so processes that build the same entry at once (pytest-xdist
workers) never see half of one; an entry that does not load (a corrupt or foreign folder) is
built again, and a cache that cannot be written only costs the conversion.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, Callable

__all__ = ["CACHE_FORMAT_VERSION", "cache_root", "cached_folder", "gguf_entry_key", "load_gguf_config_and_tokenizer"]

#: Bumped whenever what an entry holds or how it is written changes (old entries are then ignored).
CACHE_FORMAT_VERSION = 1
_COMPLETE = "specdecode-entry.json"  # written last: an entry without it is incomplete
_FLAGS = "specdecode-tokenizer.json"
_TOKENIZER_FLAGS = ("add_bos_token", "add_eos_token")


def cache_root() -> Path:
    """The cache folder: ``$SPECDECODE_CACHE``, else ``$XDG_CACHE_HOME/specdecode``, else
    ``~/.cache/specdecode`` (an empty variable counts as unset). Nothing is created here."""
    explicit = os.environ.get("SPECDECODE_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "specdecode"


def gguf_entry_key(gguf_path: str | Path) -> str:
    """The cache key of the GGUF file at ``gguf_path``: a sha256 (hex, 32 characters) of its
    resolved path, size and ``st_mtime_ns``, :data:`CACHE_FORMAT_VERSION` and the transformers
    and tokenizers versions. ``FileNotFoundError`` if there is no such file."""
    import tokenizers
    import transformers

    path = Path(gguf_path).resolve()
    stat = path.stat()
    facts = {"format": CACHE_FORMAT_VERSION, "path": str(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
             "transformers": transformers.__version__, "tokenizers": tokenizers.__version__}
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:32]


def cached_folder(kind: str, key: str, write: Callable[[Path], Any], read: Callable[[Path], Any]) -> Any:
    """``read(folder)`` of the cache entry ``<cache_root>/<kind>/<key>``; when the entry is
    missing, incomplete or fails to read, what ``write(folder)`` returns as it builds the entry.

    ``write`` fills an empty temporary folder (and returns the object it wrote, so that a miss
    reads nothing back), which is renamed into place once complete: a concurrent builder of the
    same entry wins or loses the rename, and either way the entry is whole. Anything ``read``
    raises for an existing entry means a rebuild, never an error; when the cache cannot be
    written (read-only, disk full), ``write`` fills a throw-away folder.
    """
    if not isinstance(kind, str) or not kind or os.sep in kind or kind.startswith("."):
        raise ValueError(f"kind: expected a plain folder name, got {kind!r}")
    if not isinstance(key, str) or not key or os.sep in key or key.startswith("."):
        raise ValueError(f"key: expected a plain folder name, got {key!r}")
    parent = cache_root() / kind
    entry = parent / key
    try:
        return _read_whole(entry, read)
    except Exception:  # missing, incomplete or corrupt: built below
        pass
    try:
        parent.mkdir(parents=True, exist_ok=True)
        temporary = parent / f".tmp-{key}-{os.getpid()}-{uuid.uuid4().hex}"
        temporary.mkdir()
    except OSError:  # no writable cache: build in a throw-away folder
        import tempfile

        parent, temporary = None, Path(tempfile.mkdtemp(prefix="specdecode-"))
    try:
        built = write(temporary)
        (temporary / _COMPLETE).write_text(json.dumps({"format": CACHE_FORMAT_VERSION, "key": key}))
        if parent is not None:
            try:
                temporary.rename(entry)  # atomic; fails when a non-empty entry is there
            except OSError:  # another process's entry (whole: kept) or the damaged one (replaced)
                try:
                    _read_whole(entry, read)
                except Exception:
                    stale = parent / f".stale-{key}-{uuid.uuid4().hex}"
                    try:
                        entry.rename(stale)
                        temporary.rename(entry)
                    except OSError:  # lost to another process again: its entry stays
                        pass
                    shutil.rmtree(stale, ignore_errors=True)
        return built
    finally:
        shutil.rmtree(temporary, ignore_errors=True)


def _read_whole(entry: Path, read: Callable[[Path], Any]) -> Any:
    """``read(entry)`` of a complete entry; ``FileNotFoundError`` for a missing or incomplete one."""
    if not (entry / _COMPLETE).is_file():
        raise FileNotFoundError(entry / _COMPLETE)
    return read(entry)


def load_gguf_config_and_tokenizer(folder: str | Path, gguf_file: str) -> tuple[Any, Any]:
    """``(config, tokenizer)`` of the GGUF file ``folder/gguf_file``, as
    ``AutoConfig.from_pretrained(folder, gguf_file=gguf_file)`` and
    ``AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)`` give them, read from the cache
    (:func:`cached_folder`, entry kind ``"gguf"``) after the first conversion.

    ``ValueError`` naming ``gguf_file`` when the file does not exist. Pass the config to
    ``AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file, config=config)`` so that
    the weights load does not parse the metadata for the config once more.
    """
    path = Path(folder) / gguf_file
    if not path.is_file():
        raise ValueError(f"gguf_file: no such file: {str(path)!r}")
    from transformers import AutoConfig, AutoTokenizer

    def write(entry: Path) -> tuple[Any, Any]:
        config = AutoConfig.from_pretrained(folder, gguf_file=gguf_file)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)
        config.save_pretrained(entry)
        tokenizer.save_pretrained(entry)
        # save_pretrained leaves these out (tokenizer.json's post-processor holds their effect),
        # but the converted tokenizer reports them: kept so that the attributes read the same
        flags = {name: bool(getattr(tokenizer, name, False)) for name in _TOKENIZER_FLAGS}
        (entry / _FLAGS).write_text(json.dumps(flags))
        return config, tokenizer

    def read(entry: Path) -> tuple[Any, Any]:
        config, tokenizer = AutoConfig.from_pretrained(entry), AutoTokenizer.from_pretrained(entry)
        flags = json.loads((entry / _FLAGS).read_text())
        for name in _TOKENIZER_FLAGS:
            if bool(getattr(tokenizer, name, False)) != flags[name]:
                setattr(tokenizer, name, flags[name])  # rebuilds the post-processor as the conversion did
        config._name_or_path = tokenizer.name_or_path = str(folder)  # as if read from the GGUF file
        return config, tokenizer

    stem = "".join(c if c.isalnum() or c in "-_" else "_" for c in path.stem)[:64]
    return cached_folder("gguf", f"{stem}-{gguf_entry_key(path)}", write, read)
