"""Content digests of the user files a stage reads: a reward file, a tokenizer or model directory.

A stage's cache key holds what a file *contains*, not where it is (flows/cache/keys.py), so an
edit in place is a miss and the same file under another path is a hit.

``path_digest(path)`` is ``"blake3:" + hex`` where the hex is BLAKE3 over

* a file: its bytes;
* a directory: for every file below it, sorted by relative name, ``name \\0 BLAKE3(bytes) \\n``
  (so renaming, adding or deleting a file changes it);

and ``None`` for no path (an unset optional key). A path that does not exist on this machine (a
hub id such as ``Qwen/Qwen2.5-0.5B``, fetched by the library at load time) is keyed by its text,
``"name:" + path``: there is nothing local to hash, and the stage loading it fails on its own if
it cannot be had. Files are hashed once per process while their size and mtime stay (BLAKE3 on
several threads, about 1.5 GB/s on this project's 2-core CPU; the demo's model directory is a
few MB).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import blake3


@functools.lru_cache(maxsize=8192)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
    if size:
        hasher.update_mmap(path)
    return hasher.hexdigest()


def file_blake3(path: str | os.PathLike) -> str:
    """BLAKE3 hex of one file's bytes (remembered per process for its size and mtime)."""
    stat = os.stat(path)
    return _file_digest(os.fspath(path), stat.st_size, stat.st_mtime_ns)


def directory_blake3(root: str | os.PathLike) -> str:
    """BLAKE3 hex over a directory's files (module docstring)."""
    base = Path(root)
    hasher = blake3.blake3()
    for file in sorted(p for p in base.rglob("*") if p.is_file()):
        name = file.relative_to(base).as_posix()
        hasher.update(f"{name}\0{file_blake3(file)}\n".encode())
    return hasher.hexdigest()


def path_digest(path: str | os.PathLike | None) -> str | None:
    """The content digest of ``path`` (module docstring).

    >>> path_digest(None) is None, path_digest("org/not-a-local-model")
    (True, 'name:org/not-a-local-model')
    """
    if path is None:
        return None
    local = Path(os.path.expanduser(os.fspath(path)))
    if local.is_file():
        return "blake3:" + file_blake3(local)
    if local.is_dir():
        return "blake3:" + directory_blake3(local)
    return f"name:{os.fspath(path)}"
