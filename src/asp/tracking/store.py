"""Where the MLflow store is and whether it can be used: the tracking URI, a health check of a local SQLite store
before anything is computed, SQLite's failure words turned into one clear message, and the `MlflowClient`.

    uri = resolve_tracking_uri(params.common.tracking_uri)   # env var, then params, then ./mlflow.db
    check_store(uri)                                         # UserError naming the file and what to do
    with store_errors(uri):
        client = mlflow_client(uri)
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from asp.errors import UserError

if TYPE_CHECKING:
    from mlflow import MlflowClient

ARTIFACT_DIR = "mlartifacts"


def resolve_tracking_uri(configured: str | None = None, root: str | Path = ".") -> str:
    """The store to use: env var, then params, then the repo's SQLite file."""
    uri = os.environ.get("MLFLOW_TRACKING_URI") or configured
    if uri:
        return uri
    return f"sqlite:///{(Path(root).resolve() / 'mlflow.db').as_posix()}"


def mlflow_client(uri: str) -> MlflowClient:
    """An `MlflowClient` for `uri`, after `check_store` (telemetry off unless set)."""
    check_store(uri)
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri)


# ---- the store's health: checked once per process before the first run opens ---------------------------------------
FULL_CHECK_BYTES = 64 * 2**20  # larger stores skip the metric history in the integrity check (about 2 ms per MB)
_CHECKED: set[tuple[str, bool]] = set()
_OTHER_STORE = "or set MLFLOW_TRACKING_URI to another store (ASP_TRACKING=0 runs without tracking)"


def sqlite_file(uri: str) -> Path | None:
    """The database file of a ``sqlite:///PATH`` tracking URI (PATH relative to the working directory, or absolute
    with a fourth slash); None for other stores and in-memory databases."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri.removeprefix("sqlite:///").split("?", 1)[0]
    return None if path in ("", ":memory:") else Path(path)


def check_store(uri: str, writable: bool = True) -> None:
    """Refuse a local SQLite store that MLflow could not use, before anything is computed or logged.

    Checks that the file (when it exists) is readable, passes SQLite's ``PRAGMA quick_check`` (the whole file up to
    `FULL_CHECK_BYTES`, beyond that every table but the metric history ``metrics``), and with `writable` that the file
    and its folder (SQLite writes a journal beside it) are writable, or, for a new store, the nearest existing folder
    above it (MLflow creates the file and missing folders). Once per process and store; other stores (a server, a
    database service) are not checked here.

    Raises:
        UserError: naming the store and what to do (move a damaged file aside, fix permissions, another store).
    """
    path = sqlite_file(uri)
    if path is None or (uri, writable) in _CHECKED:
        return
    where = f"the MLflow store {uri}"
    folder = path.parent
    if not path.exists():  # MLflow creates it, and missing folders above it
        ancestor = folder
        while not ancestor.exists() and ancestor != ancestor.parent:
            ancestor = ancestor.parent
        if writable and not (ancestor.is_dir() and os.access(ancestor, os.W_OK | os.X_OK)):
            why = "is read-only for this user" if ancestor.is_dir() else "is a file, not a folder"
            raise UserError(f"{where} cannot be created: {ancestor} {why}. Fix that, {_OTHER_STORE}.")
    elif not path.is_file() or not os.access(path, os.R_OK):
        what = "is not a file" if not path.is_file() else "cannot be read by this user"
        raise UserError(f"{where}: {path} {what}. Fix it (permissions: chmod u+rw {path}), {_OTHER_STORE}.")
    else:
        damage = sqlite_damage(path)
        if damage is not None:
            raise UserError(
                f"{where}: {path} is damaged ({damage}); MLflow cannot use it. Move it aside to start a new store "
                f"(mv {path} {path}.damaged; runs logged there are no longer listed), restore it from a backup, "
                f"{_OTHER_STORE}."
            )
        if writable and not os.access(path, os.W_OK):
            raise UserError(
                f"{where}: {path} is read-only for this user, so no run can be logged. Fix its permissions "
                f"(chmod u+w {path}), {_OTHER_STORE}."
            )
        if writable and not os.access(folder, os.W_OK | os.X_OK):
            raise UserError(
                f"{where}: the folder {folder} is read-only for this user, and SQLite writes its journal next to "
                f"{path.name} there, so no run can be logged. Fix the folder's permissions, {_OTHER_STORE}."
            )
    _CHECKED.add((uri, writable))


def sqlite_damage(path: Path) -> str | None:
    """What SQLite's quick check finds wrong with the database at `path` (opened read-only), or None when it is
    intact or busy (a writer holds it longer than the 10 s timeout: not damage)."""
    import sqlite3

    try:
        con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=10)
    except sqlite3.Error as exc:
        return str(exc)
    try:
        pragmas = ["PRAGMA quick_check"]
        if path.stat().st_size > FULL_CHECK_BYTES:
            tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            names = [t for t in tables if t != "metrics" and t.isidentifier()]  # MLflow's tables: plain names
            pragmas = [f"PRAGMA quick_check({t})" for t in names]
        for pragma in pragmas:
            row = con.execute(pragma).fetchone()
            if row is None or row[0] != "ok":
                return str(row[0]) if row else "the integrity check returned nothing"
    except sqlite3.Error as exc:
        if getattr(exc, "sqlite_errorname", "") in ("SQLITE_BUSY", "SQLITE_LOCKED"):
            return None
        return str(exc)
    finally:
        con.close()
    return None


STORE_FAILURES = {  # SQLite's words (inside MLflow's and SQLAlchemy's exceptions) -> what to do
    "database disk image is malformed": "the file is damaged: move it aside to start a new store or restore a backup",
    "file is not a database": "the file is not an SQLite database: move it aside to start a new store",
    "attempt to write a readonly database": "the file or its folder is read-only for this user: fix the permissions",
    "unable to open database file": "the file or its folder cannot be opened: check that it exists and is writable",
    "database or disk is full": "the disk is full: free space",
}


@contextlib.contextmanager
def store_errors(uri: str) -> Iterator[None]:
    """Turn an MLflow / SQLAlchemy error that SQLite's words above explain into a `UserError` naming the store
    (what `check_store` cannot see up front: damage in the metric history of a large store, a disk filling)."""
    try:
        yield
    except Exception as exc:
        text = str(exc)
        found = next((words for words in STORE_FAILURES if words in text), None)
        if found is None or isinstance(exc, UserError):
            raise
        raise UserError(f"the MLflow store {uri} failed ({found}): {STORE_FAILURES[found]}, {_OTHER_STORE}.") from None
