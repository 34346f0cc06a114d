"""Where the MLflow store is and whether it can be used: the tracking URI, a health check of a local SQLite store
before anything is computed, SQLite's failure words turned into one clear message, and the `MlflowClient`.

    uri = resolve_tracking_uri(params.common.tracking_uri)   # env var, then params, then ./mlflow.db
    check_store(uri)                                         # UserError naming the file and what to do
    with store_errors(uri):
        client = mlflow_client(uri)                          # + relocate_artifacts(uri): a moved or copied project

The project's own store (``mlflow.db`` beside ``mlartifacts/`` in the project root) names its artifact folder by an
absolute path (MLflow resolves every local artifact location when it creates an experiment), so a moved or copied
project would show and write the original's artifacts; `relocate_artifacts` points it at the project's own copy.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import sqlite3
import tempfile
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from asp.errors import UserError

if TYPE_CHECKING:
    from mlflow import MlflowClient

ARTIFACT_DIR = "mlartifacts"
log = logging.getLogger("asp.tracking")


def resolve_tracking_uri(configured: str | None = None, root: str | Path = ".") -> str:
    """The store to use: env var, then params, then the repo's SQLite file."""
    uri = os.environ.get("MLFLOW_TRACKING_URI") or configured
    if uri:
        return uri
    return f"sqlite:///{(Path(root).resolve() / 'mlflow.db').as_posix()}"


def mlflow_client(uri: str) -> MlflowClient:
    """An `MlflowClient` for `uri`, after `check_store` and `relocate_artifacts` (telemetry off unless set)."""
    check_store(uri)
    relocate_artifacts(uri)
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
    """Refuse a store MLflow could not use, before anything is computed or logged.

    A folder (a bare path or ``file:`` URI, MLflow's filesystem backend, which MLflow 3 refuses unless
    ``MLFLOW_ALLOW_FILE_STORE`` is set) is refused with the SQLite URI to use instead (`file_store_problem`). A local
    SQLite store: the file (when it exists) is readable, passes SQLite's ``PRAGMA quick_check`` (the whole file up
    to `FULL_CHECK_BYTES`, beyond that every table but the metric history ``metrics``), and with `writable` the file
    opens for writing and its folder takes a new file (SQLite writes a journal beside it); a new store's missing
    folders are created here (MLflow would create them) so a folder that cannot be created is reported. These are
    tried, not read from permission bits, so they hold for root and read-only file systems too. A 0-byte file (MLflow
    sets up a new store in it) is a warning. Once per process and store; other stores (a server, a database
    service) are not checked here.

    Raises:
        UserError: naming the store and what to do (move a damaged file aside, fix permissions, another store).
    """
    if (uri, writable) in _CHECKED:
        return
    problem = file_store_problem(uri)
    if problem:
        raise UserError(problem)
    path = sqlite_file(uri)
    if path is None:
        return
    where = f"the MLflow store {uri}"
    if not path.exists():  # MLflow creates it, and missing folders above it
        if writable:
            _check_new_store(where, path)
    elif not path.is_file() or not os.access(path, os.R_OK):
        what = "is not a file" if not path.is_file() else "cannot be read by this user"
        raise UserError(f"{where}: {path} {what}. Fix it (permissions: chmod u+rw {path}), {_OTHER_STORE}.")
    else:
        _check_existing_store(where, path, writable)
    _CHECKED.add((uri, writable))


def file_store_problem(uri: str) -> str | None:
    """Why `uri` cannot be used when it names a folder (MLflow's filesystem backend), else None."""
    scheme = urllib.parse.urlsplit(uri).scheme
    allowed = os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() in ("1", "true")
    if allowed or uri.startswith("databricks") or (scheme not in ("", "file") and len(scheme) > 1):
        return None
    folder = Path(urllib.parse.unquote(urllib.parse.urlsplit(uri).path) if scheme == "file" else uri)
    suggestion = f"sqlite:///{(folder.expanduser().absolute() / 'mlflow.db').as_posix()}"
    what = "is a folder" if folder.expanduser().is_dir() else f"is a path ({folder} does not exist) read as a folder"
    return (
        f"the MLflow store {uri} (MLFLOW_TRACKING_URI or common.tracking_uri) {what}, MLflow's filesystem "
        f"backend, which this MLflow refuses. Use an SQLite store instead, e.g. MLFLOW_TRACKING_URI={suggestion}, "
        "or unset MLFLOW_TRACKING_URI for the project's own mlflow.db (ASP_TRACKING=0 runs without tracking)."
    )


def _check_new_store(where: str, path: Path) -> None:
    """Create the folders of a new SQLite store and check a file can be created there (else `UserError`)."""
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise UserError(f"{where} cannot be created: {ancestor} is a file, not a folder. Fix that, {_OTHER_STORE}.")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(
            f"{where} cannot be created: the folder {path.parent} cannot be made ({exc.strerror or exc}). "
            f"Fix that, {_OTHER_STORE}."
        ) from None
    why = _not_writable(path.parent)
    if why:
        raise UserError(f"{where} cannot be created: {path.parent} {why}. Fix that, {_OTHER_STORE}.")


def _check_existing_store(where: str, path: Path, writable: bool) -> None:
    """Refuse an existing SQLite store file that is damaged or (with `writable`) cannot be written."""
    if path.stat().st_size == 0:
        log.warning(
            "%s: %s is empty (0 bytes); MLflow sets up a new, empty store in it. If runs were logged there, "
            "restore the file from a backup before running.",
            where,
            path,
        )
    damage = sqlite_damage(path)
    if damage is not None:
        raise UserError(
            f"{where}: {path} is damaged ({damage}); MLflow cannot use it. Move it aside to start a new store "
            f"(mv {path} {path}.damaged; runs logged there are no longer listed), restore it from a backup, "
            f"{_OTHER_STORE}."
        )
    refused = _cannot_open_for_writing(path) if writable else None
    if refused == errno.EROFS:  # chmod cannot help there
        raise UserError(
            f"{where}: {path} is on a read-only filesystem (a read-only mount), so no run can be logged. Mount it "
            f"read-write or copy the store to a writable disk, {_OTHER_STORE}."
        )
    if refused is not None:
        raise UserError(
            f"{where}: {path} is read-only for this user, so no run can be logged. Fix its permissions "
            f"(chmod u+w {path}), {_OTHER_STORE}."
        )
    if writable and _not_writable(path.parent):
        raise UserError(
            f"{where}: the folder {path.parent} is read-only for this user, and SQLite writes its journal next to "
            f"{path.name} there, so no run can be logged. Fix the folder's permissions, {_OTHER_STORE}."
        )


def _cannot_open_for_writing(path: Path) -> int | None:
    """None when `path` opens for writing (tried: permission bits do not bind root; read-only mounts), else the
    error number (EROFS: a read-only filesystem; 0 when the system gave none)."""
    try:
        with path.open("r+b"):
            return None
    except OSError as exc:
        return exc.errno or 0


def _not_writable(folder: Path) -> str | None:
    """Why no file can be created in `folder` (tried with a temporary file), or None."""
    if not folder.is_dir():
        return "is a file, not a folder"
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".asp-store-check-"):
            return None
    except OSError:
        return "is read-only for this user"


def sqlite_damage(path: Path) -> str | None:
    """What SQLite's quick check finds wrong with the database at `path` (opened read-only), or None when it is
    intact or busy (a writer holds it longer than the 10 s timeout: not damage)."""
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


# ---- a moved or copied project: its store points at its own artifacts ----------------------------------------------
# Every column of MLflow's schema (pinned mlflow==3.17.2) that holds an artifact URI of an experiment's runs;
# tests/test_tracking_store_moved.py checks them through MLflow's own API after a move and a copy.
ARTIFACT_COLUMNS = (
    ("experiments", "artifact_location"),
    ("runs", "artifact_uri"),
    ("logged_models", "artifact_location"),
    ("model_versions", "source"),
    ("model_versions", "storage_location"),
)
_RELOCATED: set[tuple[str, Path]] = set()


def relocate_artifacts(uri: str, root: str | Path = ".") -> dict[str, str]:
    """Point the experiments of the project's own store at the project's own artifact folder after a move or copy.

    The project's own store is the SQLite file of `uri` when it lies in `root` (``mlflow.db`` beside
    ``mlartifacts/``). An experiment of it whose artifact location is another folder's ``mlartifacts`` (the place
    the project was created or copied from) is rewritten to ``<root>/mlartifacts``, with the artifact URIs of its
    runs, logged models and registered model versions, when its artifacts came along (the folder of one of its runs
    is in ``<root>/mlartifacts``) or the old folder is gone. Other stores (a server, a database service, an SQLite
    file elsewhere, shared by several projects) are left alone. Once per process and store; a warning says what was
    rewritten.

    Returns:
        {old location: new location} of the experiments rewritten (empty when nothing was).
    """
    path = sqlite_file(uri)
    root = Path(root).resolve()
    if path is None or (uri, root) in _RELOCATED or not path.is_file() or path.resolve().parent != root:
        return {}
    _RELOCATED.add((uri, root))
    new = (root / ARTIFACT_DIR).as_uri()

    con = sqlite3.connect(path, timeout=30, isolation_level=None)
    try:
        try:
            experiments = con.execute("SELECT experiment_id, artifact_location FROM experiments").fetchall()
        except sqlite3.OperationalError:  # a store MLflow has not set up yet
            return {}
        moved = {}
        for exp_id, old in experiments:
            runs = con.execute(
                "SELECT run_uuid FROM runs WHERE experiment_id = ? ORDER BY start_time DESC LIMIT 100", (exp_id,)
            ).fetchall()
            if _moved_here(old, [r[0] for r in runs], root, new):
                moved[old] = new
        if not moved:
            return {}
        if not os.access(path, os.W_OK) or not os.access(path.parent, os.W_OK):
            log.warning(
                "the MLflow store %s keeps artifacts in %s, not in this project's %s, and is read-only here; "
                "the MLflow UI shows (and runs write) the artifacts there. Make it writable to relocate it.",
                path,
                ", ".join(sorted(moved)),
                new,
            )
            return {}
        con.execute("BEGIN IMMEDIATE")
        for old in moved:
            for table, column in ARTIFACT_COLUMNS:
                con.execute(
                    f"UPDATE {table} SET {column} = ? || substr({column}, ?) "
                    f"WHERE {column} = ? OR substr({column}, 1, ?) = ?",
                    (new, len(old) + 1, old, len(old) + 1, old + "/"),
                )
        con.execute("COMMIT")
    finally:
        con.close()
    for old in sorted(moved):
        log.warning("the MLflow store %s (moved or copied) kept artifacts in %s: now in %s", path, old, new)
    return moved


def _moved_here(location: str | None, run_ids: list[str], root: Path, new: str) -> bool:
    """Whether an experiment's artifact `location` is another project's ``mlartifacts`` folder whose runs' artifacts
    came along to `root` (a run's folder is in ``<root>/mlartifacts``), or that no longer exists."""
    if not location or location == new or not location.startswith("file://"):
        return False
    old = Path(urllib.parse.unquote(urllib.parse.urlsplit(location).path))
    if old.name != ARTIFACT_DIR:
        return False
    return not old.exists() or any((root / ARTIFACT_DIR / run_id).is_dir() for run_id in run_ids)
