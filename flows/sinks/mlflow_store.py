"""Which MLflow store a run logs to, and opening a SQLite store that several runs share.

:func:`select_tracking_uri` takes the first of these that is set:

1. ``ppoflow.mlflow_tracking_uri`` (the config key wins, so a config file pins its store);
2. the ``MLFLOW_TRACKING_URI`` environment variable (a deployment's server, docs/deployment.md);
3. ``recorded``: the store named in the run_info.json of the run a ``ppoflow rerun`` branches
   from, so a branch lands next to its parent;
4. the project store ``sqlite:///<ppoflow.artifact_dir>/mlflow.db``, one SQLite file for every
   run under that artifact directory, so one ``mlflow ui`` shows them all. A relative
   ``artifact_dir`` is resolved against the working directory when the run starts; the
   artifacts go to ``<artifact_dir>/mlflow-artifacts`` (:func:`artifact_location`, set as the
   experiment's artifact location when ppoflow creates the experiment).

An ``artifact_dir`` that is not a local path (an fsspec URL such as ``s3://bucket/runs``) cannot
hold a SQLite file, and no local default would be shared by the machines that share such a run,
so step 4 raises a ``ValueError`` naming the two settings that choose a store instead. (A remote
``--run-dir`` with a local ``artifact_dir`` uses the local project store.)

Several runs writing one SQLite file: SQLite serialises writers, and MLflow's SQL store waits up
to 20 s for the file's lock (it sets ``PRAGMA busy_timeout = 20000`` on every session). A call
that still finds it locked raises ``MlflowException`` ``TEMPORARILY_UNAVAILABLE`` wrapping
``sqlalchemy.exc.OperationalError: database is locked``, which
:class:`flows.sinks.mlflow_logger.MLflowLogger` treats as an outage (queued, retried, never lost).
Measured on the 2-core machine: three processes each logging 200 batches of 100 metrics into one
file at once all finish, without one locked call. Creating the file is the one step that is not
safe to race: two processes that both find
no tables both run MLflow's schema migrations, and one fails (``No such index`` from alembic). So
the client of a local SQLite store is built under :func:`creation_lock`, an exclusive
``fcntl.flock`` on a lock file named after the database (:func:`lock_file`).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

SQLITE_PREFIX = "sqlite:///"
DB_FILE = "mlflow.db"
ARTIFACTS_DIR = "mlflow-artifacts"
ENV_VAR = "MLFLOW_TRACKING_URI"


def default_tracking_uri(directory: str | os.PathLike) -> str:
    """``sqlite:///<abs directory>/mlflow.db`` (the directory is created).

    Raises:
        ValueError: ``directory`` is an fsspec URL, which cannot hold a SQLite file.
    """
    if "://" in os.fspath(directory):
        raise ValueError(
            f"{os.fspath(directory)!r} is not a local path, so it cannot hold the default "
            "SQLite store; pass tracking_uri or set MLFLOW_TRACKING_URI"
        )
    root = Path(directory).absolute()
    root.mkdir(parents=True, exist_ok=True)
    return f"{SQLITE_PREFIX}{root / DB_FILE}"


def select_tracking_uri(
    config_uri: str | None,
    artifact_dir: str,
    *,
    recorded: str | None = None,
    environ: Mapping[str, str] = os.environ,
) -> str:
    """The tracking URI of a run (module docstring: config key, env var, recorded, project).

    Args:
        config_uri: ``ppoflow.mlflow_tracking_uri``.
        artifact_dir: ``ppoflow.artifact_dir``; relative = below the working directory.
        recorded: the store a parent run recorded (``ppoflow rerun``), or None.
        environ: where ``MLFLOW_TRACKING_URI`` is read.

    Example:
        >>> select_tracking_uri("http://mlflow:5000", "runs", environ={ENV_VAR: "sqlite:///x"})
        'http://mlflow:5000'
        >>> select_tracking_uri(None, "runs", environ={ENV_VAR: "http://mlflow:5000"})
        'http://mlflow:5000'
        >>> select_tracking_uri(None, "/data/runs", recorded="http://old:5000", environ={})
        'http://old:5000'
        >>> select_tracking_uri(None, "/data/runs", environ={})
        'sqlite:////data/runs/mlflow.db'
    """
    for uri in (config_uri, environ.get(ENV_VAR), recorded):
        if uri:
            return uri
    if "://" in artifact_dir:
        raise ValueError(
            f"ppoflow.artifact_dir {artifact_dir!r} is not a local path, so it cannot hold the "
            "project's SQLite MLflow store; set ppoflow.mlflow_tracking_uri (e.g. "
            "http://mlflow:5000) or MLFLOW_TRACKING_URI"
        )
    return f"{SQLITE_PREFIX}{Path(artifact_dir).absolute() / DB_FILE}"


def sqlite_file(tracking_uri: str) -> Path | None:
    """The database file of a local SQLite URI (query string dropped), else None.

    >>> sqlite_file("sqlite:////r/mlflow.db?timeout=1"), sqlite_file("http://h:5000")
    (PosixPath('/r/mlflow.db'), None)
    """
    if not tracking_uri.startswith(SQLITE_PREFIX):
        return None
    return Path(tracking_uri.removeprefix(SQLITE_PREFIX).split("?", 1)[0])


def artifact_location(tracking_uri: str) -> str | None:
    """``<dir of the db>/mlflow-artifacts`` as a file URI for a local SQLite store; None (the
    server's default) for any other store.

    >>> artifact_location("sqlite:////r/mlflow.db"), artifact_location("http://h:5000")
    ('file:///r/mlflow-artifacts', None)
    """
    db_file = sqlite_file(tracking_uri)
    if db_file is None:
        return None
    return (db_file.parent / ARTIFACTS_DIR).absolute().as_uri()


def lock_file(tracking_uri: str) -> Path | None:
    """The lock file that guards the creation of a local SQLite store (module docstring): in
    the temporary directory, named after the database's absolute path, so the store's own
    directory holds nothing but MLflow's files; None for any other store.

    >>> lock_file("http://h:5000") is None, lock_file("sqlite:////r/mlflow.db").suffix
    (True, '.lock')
    """
    db_file = sqlite_file(tracking_uri)
    if db_file is None:
        return None
    digest = hashlib.sha256(str(db_file.absolute()).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"ppoflow-mlflow-{digest}.lock"


@contextmanager
def creation_lock(tracking_uri: str) -> Iterator[None]:
    """Hold an exclusive ``fcntl.flock`` on :func:`lock_file` for the block (nothing for a
    store that is not a local SQLite file): build the ``MlflowClient`` inside it, since building
    one creates the file and its tables when they are missing."""
    path = lock_file(tracking_uri)
    if path is None:
        yield
        return
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


__all__ = [
    "artifact_location",
    "creation_lock",
    "default_tracking_uri",
    "lock_file",
    "select_tracking_uri",
    "sqlite_file",
]
