"""Where an artifact's files live: a local directory or an fsspec filesystem (``memory://``, ``s3://``).

The one place that knows the difference: local paths use ``os`` (so tensors can be memory-mapped
and a directory rename is atomic), every other URL uses the fsspec filesystem API. The commit
protocol and what atomicity each side gives are described in ``dataproto/artifact.py``.

A write that finds no room (:data:`DISK_FULL_ERRNOS`: no space, over a quota, over a file-size
limit) raises its ``OSError`` naming the file being written: a failed ``write`` or ``close``
names none, so the file objects of :meth:`Store.open_write` and :func:`naming_failed_writes`
add it, and the command line's one error line (``flows/cli/disk_full.py``) can say where.
"""

from __future__ import annotations

import errno
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from dataproto.fingerprint import DEFAULT_DIGEST, Digest, digest_file, digest_stream

MANIFEST = "manifest.json"
#: a write found no room: no space left, over a disk quota, over a file-size limit (EFBIG:
#: ``ulimit -f``, or the file system's largest file)
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


@contextmanager
def naming_failed_writes(path: str | os.PathLike) -> Iterator[None]:
    """An ``OSError`` raised in the block without a file name gets ``path`` as its ``filename``
    (a ``write`` or ``close`` that finds the disk full names no file).

    >>> with naming_failed_writes("/data/x.bin"):
    ...     raise OSError(errno.ENOSPC, "No space left on device")
    Traceback (most recent call last):
    OSError: [Errno 28] No space left on device: '/data/x.bin'
    """
    try:
        yield
    except OSError as err:
        if err.filename is None:
            err.filename = os.fspath(path)
        raise


class _NamedFile:
    """A binary file for writing whose failed ``write`` / ``close`` name its path."""

    def __init__(self, handle: Any, path: str) -> None:
        self._handle, self.path = handle, path

    def write(self, data: Any) -> int:
        with naming_failed_writes(self.path):
            return self._handle.write(data)

    def close(self) -> None:
        with naming_failed_writes(self.path):
            self._handle.close()

    def __enter__(self) -> _NamedFile:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class Store:
    """One artifact directory on a local disk or an fsspec filesystem."""

    def __init__(self, url: str) -> None:
        self.url = str(url)
        self.fs, root = fsspec.core.url_to_fs(self.url)
        self.is_local = isinstance(self.fs, LocalFileSystem)
        self.root = os.path.abspath(root) if self.is_local else root.rstrip("/")

    def path(self, name: str, root: str | None = None) -> str:
        """The filesystem path of ``name`` inside the artifact (or inside ``root``)."""
        return f"{root or self.root}/{name}"

    def ref_path(self) -> str:
        """The artifact's location for an ArtifactRef: absolute for plain local paths, else the URL."""
        return self.root if self.is_local and "://" not in self.url else self.url

    def where(self, name: str) -> str:
        """``name`` as a user-facing location for messages (with the URL scheme when remote)."""
        return self.path(name) if self.is_local else f"{self.url.rstrip('/')}/{name}"

    def exists(self, root: str | None = None) -> bool:
        return (
            os.path.exists(root or self.root)
            if self.is_local
            else self.fs.exists(root or self.root)
        )

    def size(self, name: str) -> int | None:
        target = self.path(name)
        if self.is_local:
            return os.path.getsize(target) if os.path.isfile(target) else None
        return self.fs.size(target) if self.fs.isfile(target) else None

    def read(self, name: str) -> bytes:
        if self.is_local:
            with open(self.path(name), "rb") as handle:
                return handle.read()
        return self.fs.cat_file(self.path(name))

    def hash_file(self, name: str, digest: Digest = DEFAULT_DIGEST) -> str:
        """The file digest ``digest`` (dataproto/fingerprint.py) of ``name``, hashed in parallel."""
        if self.is_local:
            return digest_file(self.path(name), digest)[0]
        with self.fs.open(self.path(name), "rb") as handle:
            return digest_stream(handle, digest)[0]

    def temp_root(self) -> str:
        parent, base = self.root.rsplit("/", 1) if "/" in self.root else ("", self.root)
        return f"{parent}/.{base}.tmp-{uuid.uuid4().hex[:12]}"

    def open_write(self, root: str, name: str) -> _NamedFile:
        """``root/name`` opened for writing; a failed write or close names the file."""
        path = self.path(name, root)
        with naming_failed_writes(path):
            handle = (open if self.is_local else self.fs.open)(path, "wb")  # _NamedFile closes it
        return _NamedFile(handle, path)

    def make_dir(self, root: str) -> None:
        if self.is_local:
            os.makedirs(root)
        else:
            self.fs.makedirs(root, exist_ok=True)

    def remove(self, root: str) -> None:
        if self.is_local:
            shutil.rmtree(root, ignore_errors=False)
        elif self.fs.exists(root):
            self.fs.rm(root, recursive=True)

    def commit(self, temp: str, names: list[str], overwrite: bool) -> None:
        """Move the finished temp dir under the final name (module docstring: atomicity)."""
        if self.is_local:
            os.makedirs(os.path.dirname(self.root), exist_ok=True)
            aside = None
            if os.path.exists(self.root) and overwrite:
                aside = f"{self.temp_root()}-old"
                os.rename(self.root, aside)
            try:
                os.rename(temp, self.root)
            except OSError:
                if aside is not None:
                    os.rename(aside, self.root)
                raise
            if aside is not None:  # the new artifact is in place; a leftover old copy is harmless
                shutil.rmtree(aside, ignore_errors=True)
            return
        if overwrite and self.fs.exists(self.root):
            if self.fs.exists(
                self.path(MANIFEST)
            ):  # manifest first: never a manifest without files
                self.fs.rm(self.path(MANIFEST))
            self.fs.rm(self.root, recursive=True)
        self.fs.makedirs(self.root, exist_ok=True)
        for name in [*names, MANIFEST]:
            self.fs.mv(self.path(name, temp), self.path(name))
        self.remove(temp)
